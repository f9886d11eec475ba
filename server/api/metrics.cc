#include "server/api/metrics.h"

#include <algorithm>
#include <cctype>
#include <optional>
#include <tuple>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/restart_reason.h"
#include "prometheus/gauge.h"

namespace trainyard {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

// Bounded so that a job reporting every step for days costs a fixed amount of memory; the
// window is far longer than any sane save takes in steps.
constexpr size_t kTrackedSteps = 512;

std::string Lower(absl::string_view s) { return absl::AsciiStrToLower(s); }

std::string JobStateLabel(v1::JobState state) { return Lower(v1::JobState_Name(state)); }

std::string WorkerStateLabel(v1::WorkerState state) { return Lower(v1::WorkerState_Name(state)); }

// "SEARCH_RUNNING" -> "running", "TRIAL_STOPPED" -> "stopped".
std::string SearchStateLabel(v1::SearchState state) {
  return Lower(v1::SearchState_Name(state).substr(sizeof("SEARCH_") - 1));
}
std::string TrialStateLabel(v1::TrialState state) {
  return Lower(v1::TrialState_Name(state).substr(sizeof("TRIAL_") - 1));
}

constexpr v1::JobState kJobStates[] = {v1::PENDING,   v1::SCHEDULED, v1::RUNNING,  v1::RESTARTING,
                                       v1::SUCCEEDED, v1::FAILED,    v1::CANCELLED};
constexpr v1::WorkerState kWorkerStates[] = {v1::READY, v1::DRAINING, v1::SUSPECT, v1::UNREACHABLE,
                                             v1::LOST};
const v1::RestartReason kRestartReasons[] = {v1::PREEMPTED, v1::WORKER_LOST,
                                             v1::HANG,      v1::INFRASTRUCTURE,
                                             v1::FAILURE,   v1::SCHEDULER_PREEMPTED};
const char* const kRecoveryPhases[] = {"detection",  "scheduling",      "start",
                                       "rendezvous", "checkpoint_load", "first_step"};
const char* const kPreemptionReasons[] = {"cloud_notice", "termination_signal", "other"};

// Families built at scrape time.
class FamilyBuilder {
 public:
  FamilyBuilder(std::vector<MetricFamily>& out, std::string name, std::string help, MetricType type)
      : out_(out) {
    family_.name = std::move(name);
    family_.help = std::move(help);
    family_.type = type;
  }
  ~FamilyBuilder() {
    // An empty family would print a HELP line with no samples; leave it out.
    if (!family_.metric.empty()) out_.push_back(std::move(family_));
  }
  FamilyBuilder& Add(std::vector<ClientMetric::Label> labels, double value) {
    ClientMetric m;
    m.label = std::move(labels);
    if (family_.type == MetricType::Counter) {
      m.counter.value = value;
    } else {
      m.gauge.value = value;
    }
    family_.metric.push_back(std::move(m));
    return *this;
  }

 private:
  std::vector<MetricFamily>& out_;
  MetricFamily family_;
};

// Latencies of the control plane: from milliseconds (an idle cluster) to hours (a deep queue).
prometheus::Histogram::BucketBoundaries SchedulingBuckets() {
  return {0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 1800, 3600, 7200, 21600};
}

// A checkpoint save and commit: sub-second for small models on local disk, minutes for large
// models on object storage.
prometheus::Histogram::BucketBoundaries CommitBuckets() {
  return {0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800};
}

// Loss detected to first step again: seconds on a warm cluster, minutes when capacity is short.
prometheus::Histogram::BucketBoundaries RecoveryBuckets() {
  return {0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 1800, 3600};
}

}  // namespace

std::string PreemptionReasonLabel(absl::string_view message) {
  // The coordinator writes "preemption notice for worker w (SOURCE)"; SOURCE is how the agent
  // learnt of it: SIGTERM, or the cloud's metadata endpoint (gce, aws).
  // Only the notice's own part: the task's reason after the ':' may name a signal too.
  const std::string m = Lower(message.substr(0, message.find(':')));
  if (absl::StrContains(m, "(sigterm")) return "termination_signal";
  if (absl::StrContains(m, "(gce") || absl::StrContains(m, "(aws") ||
      absl::StrContains(m, "(notice")) {
    return "cloud_notice";
  }
  return "other";
}

CoordinatorMetrics::CoordinatorMetrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      submissions_(prometheus::BuildCounter()
                       .Name("trainyard_job_submissions_total")
                       .Help("Jobs accepted by SubmitJob.")
                       .Register(*registry_)
                       .Add({})),
      finished_(prometheus::BuildCounter()
                    .Name("trainyard_jobs_finished_total")
                    .Help("Jobs that reached a final state, by that state.")
                    .Register(*registry_)),
      scheduling_latency_(prometheus::BuildHistogram()
                              .Name("trainyard_job_scheduling_latency_seconds")
                              .Help("Time a job waited in PENDING before all its ranks were "
                                    "placed (PENDING -> SCHEDULED).")
                              .Register(*registry_)
                              .Add({}, SchedulingBuckets())),
      restarts_(prometheus::BuildCounter()
                    .Name("trainyard_restarts_total")
                    .Help("Job restarts (RESTARTING), by cause: preempted, worker_lost, hang, "
                          "infrastructure, failure.")
                    .Register(*registry_)),
      preemptions_(prometheus::BuildCounter()
                       .Name("trainyard_preemptions_total")
                       .Help("Job restarts caused by a preemption, by how it was announced.")
                       .Register(*registry_)),
      out_of_memory_(prometheus::BuildCounter()
                         .Name("trainyard_tasks_out_of_memory_total")
                         .Help("Ranks (role=rank) and parameter-server shards (role=shard) "
                               "killed for going over their memory limit.")
                         .Register(*registry_)),
      leader_(prometheus::BuildGauge()
                  .Name("trainyard_coordinator_leader")
                  .Help("1 while this coordinator leads (always, on SQLite), 0 while it stands "
                        "by for the leader of a PostgreSQL store.")
                  .Register(*registry_)
                  .Add({})),
      steps_lost_(prometheus::BuildCounter()
                      .Name("trainyard_restart_lost_steps_total")
                      .Help("Steps trained but not committed when a job restarted: work to "
                            "redo.")
                      .Register(*registry_)
                      .Add({})),
      recovery_(prometheus::BuildHistogram()
                    .Name("trainyard_restart_recovery_seconds")
                    .Help("Time from the coordinator detecting the end of an attempt to the "
                          "first step report of the next attempt.")
                    .Register(*registry_)
                    .Add({}, RecoveryBuckets())),
      recovery_phases_(prometheus::BuildHistogram()
                           .Name("trainyard_restart_recovery_phase_seconds")
                           .Help("Parts of a recovery: detection (failure to detection), "
                                 "scheduling (to placement: stopping the old ranks, backoff, "
                                 "capacity), start (to every rank running), rendezvous, "
                                 "checkpoint_load, first_step.")
                           .Register(*registry_)),
      commit_latency_(prometheus::BuildHistogram()
                          .Name("trainyard_checkpoint_commit_latency_seconds")
                          .Help("Time from the job reaching a checkpoint's step (from its "
                                "progress reports) to the coordinator recording the commit.")
                          .Register(*registry_)
                          .Add({}, CommitBuckets())),
      workers_lost_(prometheus::BuildCounter()
                        .Name("trainyard_workers_lost_total")
                        .Help("Workers marked LOST because their lease expired.")
                        .Register(*registry_)
                        .Add({})) {
  // Every label value exists from the start so that rate() and alerts see a zero, not nothing.
  for (v1::JobState state : {v1::SUCCEEDED, v1::FAILED, v1::CANCELLED}) {
    finished_.Add({{"state", JobStateLabel(state)}});
  }
  for (v1::RestartReason reason : kRestartReasons) {
    restarts_.Add({{"reason", RestartReasonName(reason)}});
  }
  for (const char* reason : kPreemptionReasons) preemptions_.Add({{"reason", reason}});
  for (const char* role : {"rank", "shard"}) out_of_memory_.Add({{"role", role}});
  for (const char* phase : kRecoveryPhases) {
    recovery_phases_.Add({{"phase", phase}}, RecoveryBuckets());
  }
}

CoordinatorMetrics::~CoordinatorMetrics() = default;

void CoordinatorMetrics::SetSnapshotSource(std::function<ClusterMetricsSnapshot()> source) {
  absl::MutexLock lock(&mu_);
  source_ = std::move(source);
}

void CoordinatorMetrics::SetLeader(bool leading) { leader_.Set(leading ? 1 : 0); }

void CoordinatorMetrics::OnJobSubmitted(const v1::Job& job) { submissions_.Increment(); }

void CoordinatorMetrics::OnJobTransition(const v1::Job& job, v1::JobState from, v1::JobState to,
                                         absl::string_view reason, absl::Time now) {
  if (from == v1::PENDING && to == v1::SCHEDULED) {
    // The events end with this transition; the one before it that entered PENDING starts the
    // wait (submission, or the end of a restart).
    absl::Time pending_since = absl::FromUnixMillis(job.created_unix_ms());
    for (int i = job.events_size() - 2; i >= 0; --i) {
      if (job.events(i).to() == v1::PENDING) {
        pending_since = absl::FromUnixMillis(job.events(i).time_unix_ms());
        break;
      }
    }
    scheduling_latency_.Observe(std::max(0.0, absl::ToDoubleSeconds(now - pending_since)));
  }
  if (to == v1::SUCCEEDED || to == v1::FAILED || to == v1::CANCELLED) {
    finished_.Add({{"state", JobStateLabel(to)}}).Increment();
  }
  if (to == v1::SUCCEEDED || to == v1::FAILED || to == v1::CANCELLED) {
    absl::MutexLock lock(&mu_);
    tracks_.erase(job.id());
  }
}

void CoordinatorMetrics::OnRestart(const v1::Job& job, const v1::Restart& restart) {
  const std::string label = RestartReasonName(restart.reason());
  restarts_.Add({{"reason", label}}).Increment();
  if (restart.reason() == v1::PREEMPTED) {
    preemptions_.Add({{"reason", PreemptionReasonLabel(restart.message())}}).Increment();
  }
  absl::MutexLock lock(&mu_);
  auto it = tracks_.find(job.id());
  if (it != tracks_.end()) it->second.steps.clear();
}

void CoordinatorMetrics::OnTaskOutOfMemory(const v1::Job& job, const v1::TaskInfo& task) {
  (void)job;
  out_of_memory_.Add({{"role", task.role() == v1::TASK_ROLE_SHARD ? "shard" : "rank"}}).Increment();
}

void CoordinatorMetrics::OnRecovered(const v1::Job& job, const v1::Restart& restart) {
  if (restart.steps_lost() > 0) steps_lost_.Increment(static_cast<double>(restart.steps_lost()));
  recovery_.Observe(restart.recovery_seconds());
  const std::pair<const char*, double> phases[] = {
      {"detection", restart.detection_seconds()},
      {"scheduling", restart.scheduling_seconds()},
      {"start", restart.start_seconds()},
      {"rendezvous", restart.rendezvous_seconds()},
      {"checkpoint_load", restart.checkpoint_load_seconds()},
      {"first_step", restart.first_step_seconds()}};
  for (const auto& [phase, seconds] : phases) {
    recovery_phases_.Add({{"phase", phase}}, RecoveryBuckets()).Observe(seconds);
  }
}

void CoordinatorMetrics::OnProgress(absl::string_view job_id, int64_t step, absl::Time now) {
  absl::MutexLock lock(&mu_);
  JobTrack& track = tracks_[job_id];
  if (!track.steps.empty() && track.steps.back().first >= step) return;
  track.steps.emplace_back(step, now);
  while (track.steps.size() > kTrackedSteps) track.steps.pop_front();
}

void CoordinatorMetrics::OnCheckpointCommitted(absl::string_view job_id, int64_t step,
                                               absl::Time now, absl::Time save_started) {
  absl::MutexLock lock(&mu_);
  auto it = tracks_.find(job_id);
  if (it == tracks_.end()) return;
  if (save_started != absl::InfinitePast()) {
    // The trainer said when it snapshotted the checkpoint: the latency is exact (up to the two
    // machines' clock offset).
    const double latency = std::max(0.0, absl::ToDoubleSeconds(now - save_started));
    commit_latency_.Observe(latency);
    it->second.last_commit_latency_seconds = latency;
    return;
  }
  if (it->second.steps.empty()) return;
  const std::deque<std::pair<int64_t, absl::Time>>& steps = it->second.steps;
  // When the job reached `step`: the first report showing it, or, when the commit overtook the
  // reports (they are paced, a fast job saves between two of them), the last report's time
  // extrapolated at the job's recent step rate, never later than now.
  std::optional<absl::Time> reached;
  for (const auto& [seen_step, when] : steps) {
    if (seen_step >= step) {
      reached = when;
      break;
    }
  }
  if (!reached.has_value()) {
    const auto& [last_step, last_time] = steps.back();
    reached = last_time;
    if (steps.size() >= 2) {
      const auto& [prev_step, prev_time] = steps[steps.size() - 2];
      const double seconds = absl::ToDoubleSeconds(last_time - prev_time);
      if (seconds > 0 && last_step > prev_step) {
        const double rate = static_cast<double>(last_step - prev_step) / seconds;
        reached = std::min(now, last_time + absl::Seconds((step - last_step) / rate));
      }
    }
  }
  const double latency = std::max(0.0, absl::ToDoubleSeconds(now - *reached));
  commit_latency_.Observe(latency);
  it->second.last_commit_latency_seconds = latency;
}

void CoordinatorMetrics::OnWorkerLost(absl::string_view worker_id) { workers_lost_.Increment(); }

std::vector<MetricFamily> CoordinatorMetrics::Collect() const {
  std::vector<MetricFamily> out = registry_->Collect();
  std::function<ClusterMetricsSnapshot()> source;
  absl::flat_hash_map<std::string, double> commit_latency;
  {
    absl::MutexLock lock(&mu_);
    source = source_;
    for (const auto& [id, track] : tracks_) {
      if (track.last_commit_latency_seconds >= 0) {
        commit_latency[id] = track.last_commit_latency_seconds;
      }
    }
  }
  if (!source) return out;
  const ClusterMetricsSnapshot snap = source();

  {
    FamilyBuilder jobs(out, "trainyard_jobs",
                       "Jobs the coordinator knows, by state (final ones included).",
                       MetricType::Gauge);
    for (v1::JobState state : kJobStates) {
      auto it = snap.jobs_by_state.find(state);
      jobs.Add({{"state", JobStateLabel(state)}}, it == snap.jobs_by_state.end() ? 0 : it->second);
    }
  }
  {
    FamilyBuilder workers(out, "trainyard_workers", "Registered workers, by state.",
                          MetricType::Gauge);
    for (v1::WorkerState state : kWorkerStates) {
      auto it = snap.workers_by_state.find(state);
      workers.Add({{"state", WorkerStateLabel(state)}},
                  it == snap.workers_by_state.end() ? 0 : it->second);
    }
  }
  FamilyBuilder(
      out, "trainyard_workers_unreachable",
      "Workers held unreachable, not lost: most leases ended at once, so this coordinator "
      "is likelier the one cut off; their jobs go on, nothing new is placed there.",
      MetricType::Gauge)
      .Add({}, snap.workers_unreachable);
  FamilyBuilder(out, "trainyard_gpus",
                "GPUs of READY workers: free for the scheduler, or used by running tasks.",
                MetricType::Gauge)
      .Add({{"state", "free"}}, std::max<int64_t>(snap.gpus_total - snap.gpus_used, 0))
      .Add({{"state", "used"}}, snap.gpus_used);
  FamilyBuilder(out, "trainyard_slots",
                "CPU slots of READY workers: free for the scheduler, or used by running tasks.",
                MetricType::Gauge)
      .Add({{"state", "free"}}, std::max<int64_t>(snap.slots_total - snap.slots_used, 0))
      .Add({{"state", "used"}}, snap.slots_used);
  FamilyBuilder(out, "trainyard_pending_oldest_age_seconds",
                "How long the job waiting longest in PENDING has waited; 0 when none waits.",
                MetricType::Gauge)
      .Add({}, snap.oldest_pending_since == absl::InfinitePast()
                   ? 0.0
                   : std::max(0.0, absl::ToDoubleSeconds(snap.now - snap.oldest_pending_since)));

  {
    FamilyBuilder quota(out, "trainyard_queue_quota",
                        "A queue's quota, as the scheduler applies it (the READY workers' "
                        "capacity when it has no limit).",
                        MetricType::Gauge);
    FamilyBuilder used(out, "trainyard_queue_used", "What a queue's jobs hold.", MetricType::Gauge);
    FamilyBuilder borrowed(out, "trainyard_queue_borrowed",
                           "What a queue's jobs hold beyond its quota, from idle capacity.",
                           MetricType::Gauge);
    FamilyBuilder pending(out, "trainyard_queue_pending_jobs", "Jobs waiting in a queue.",
                          MetricType::Gauge);
    FamilyBuilder preempted(out, "trainyard_queue_preemptions_total",
                            "A queue's jobs the scheduler preempted (saved at an agreed step, "
                            "back in the queue), since the coordinator started.",
                            MetricType::Counter);
    for (const v1::Queue& q : snap.queues) {
      const v1::QueueStatus& s = q.status();
      for (const auto& [resource, limit, held, over, total] :
           {std::tuple{"slots", s.quota_slots(), s.used_slots(), s.borrowed_slots(),
                       snap.slots_total},
            std::tuple{"gpus", s.quota_gpus(), s.used_gpus(), s.borrowed_gpus(),
                       snap.gpus_total}}) {
        quota.Add({{"queue", q.name()}, {"resource", resource}},
                  limit >= 0 ? static_cast<double>(limit) : static_cast<double>(total));
        used.Add({{"queue", q.name()}, {"resource", resource}}, held);
        borrowed.Add({{"queue", q.name()}, {"resource", resource}}, over);
      }
      pending.Add({{"queue", q.name()}}, s.pending_jobs());
      preempted.Add({{"queue", q.name()}}, static_cast<double>(s.preemptions()));
    }
  }
  AddJobFamilies(snap, commit_latency, out);
  AddSearchFamilies(snap, out);
  return out;
}

void CoordinatorMetrics::AddSearchFamilies(const ClusterMetricsSnapshot& snap,
                                           std::vector<MetricFamily>& out) {
  FamilyBuilder searches(out, "trainyard_searches",
                         "Hyperparameter searches the coordinator knows, by state.",
                         MetricType::Gauge);
  FamilyBuilder trials(out, "trainyard_search_trials",
                       "Trials of each running search, by state (running, completed, stopped: "
                       "ASHA ended it at a rung, failed, cancelled).",
                       MetricType::Gauge);
  FamilyBuilder best(out, "trainyard_search_best_metric",
                     "The best trial's metric so far, for each running search (label metric: "
                     "val_accuracy or loss).",
                     MetricType::Gauge);
  std::map<v1::SearchState, int> by_state;
  for (const SearchMetrics& s : snap.searches) {
    by_state[s.state]++;
    if (s.state != v1::SEARCH_RUNNING) continue;
    for (v1::TrialState state : {v1::TRIAL_RUNNING, v1::TRIAL_COMPLETED, v1::TRIAL_STOPPED,
                                 v1::TRIAL_FAILED, v1::TRIAL_CANCELLED}) {
      auto it = s.trials.find(state);
      trials.Add({{"search", s.id}, {"state", TrialStateLabel(state)}},
                 it == s.trials.end() ? 0 : it->second);
    }
    if (s.has_best) best.Add({{"search", s.id}, {"metric", s.metric}}, s.best_metric);
  }
  for (v1::SearchState state :
       {v1::SEARCH_RUNNING, v1::SEARCH_SUCCEEDED, v1::SEARCH_FAILED, v1::SEARCH_CANCELLED}) {
    searches.Add({{"state", SearchStateLabel(state)}}, by_state[state]);
  }
}

void CoordinatorMetrics::AddJobFamilies(
    const ClusterMetricsSnapshot& snap,
    const absl::flat_hash_map<std::string, double>& commit_latency,
    std::vector<MetricFamily>& out) {
  // The builders add their families to `out` when they go out of scope, at the end of this
  // function.
  FamilyBuilder state(out, "trainyard_job_state",
                      "1 for the state each placed, unfinished job is in.", MetricType::Gauge);
  FamilyBuilder restarts(out, "trainyard_job_restarts_total",
                         "Restarts of each placed, unfinished job (attempts - 1).",
                         MetricType::Counter);
  FamilyBuilder step(out, "trainyard_job_step", "Last step the job reported.", MetricType::Gauge);
  FamilyBuilder total_steps(out, "trainyard_job_total_steps", "Steps the job will train.",
                            MetricType::Gauge);
  FamilyBuilder committed(out, "trainyard_job_committed_step",
                          "Step of the job's latest committed checkpoint; -1 when none.",
                          MetricType::Gauge);
  FamilyBuilder loss(out, "trainyard_job_loss", "Training loss at the last reported step.",
                     MetricType::Gauge);
  FamilyBuilder throughput(out, "trainyard_job_samples_per_second",
                           "Training samples per second over the whole job (all ranks).",
                           MetricType::Gauge);
  FamilyBuilder step_time(out, "trainyard_job_step_time_seconds",
                          "Mean time per step by phase since the previous report: data_wait "
                          "(blocked on input), compute, communication (collectives not hidden "
                          "by overlap), checkpoint (blocked on saves).",
                          MetricType::Gauge);
  FamilyBuilder world(out, "trainyard_job_world_size", "Ranks of the job's current attempt.",
                      MetricType::Gauge);
  FamilyBuilder gpus(out, "trainyard_job_gpus", "GPUs the job's current attempt holds.",
                     MetricType::Gauge);
  FamilyBuilder gpu_seconds(out, "trainyard_job_gpu_seconds_total",
                            "GPUs held times seconds SCHEDULED or RUNNING, over every attempt.",
                            MetricType::Counter);
  FamilyBuilder running(out, "trainyard_job_running_seconds",
                        "Time since the job first started RUNNING.", MetricType::Gauge);
  FamilyBuilder max_runtime(out, "trainyard_job_max_runtime_seconds",
                            "The job's max_runtime, for jobs that set one.", MetricType::Gauge);
  FamilyBuilder checkpoint_age(out, "trainyard_job_last_checkpoint_age_seconds",
                               "Time since the job's latest committed checkpoint (since it "
                               "started when none is committed yet); jobs that checkpoint only.",
                               MetricType::Gauge);
  FamilyBuilder last_commit(out, "trainyard_job_last_checkpoint_commit_latency_seconds",
                            "Commit latency of the job's latest checkpoint (see "
                            "trainyard_checkpoint_commit_latency_seconds).",
                            MetricType::Gauge);
  FamilyBuilder stage_time(out, "trainyard_pipeline_stage_seconds",
                           "Pipeline jobs: mean seconds per update each stage (of the first "
                           "replica) spent running its passes (state busy) and waiting for the "
                           "stages beside it (state idle), since the previous report.",
                           MetricType::Gauge);
  FamilyBuilder bubble(out, "trainyard_pipeline_bubble_ratio",
                       "Pipeline jobs: each stage's measured bubble, idle / (busy + idle).",
                       MetricType::Gauge);
  FamilyBuilder ideal_bubble(out, "trainyard_pipeline_ideal_bubble_ratio",
                             "Pipeline jobs: the schedule's bubble with equal stages and free "
                             "transfers, (stages - 1) / (microbatches + stages - 1).",
                             MetricType::Gauge);
  for (const JobMetricsSnapshot& j : snap.jobs) {
    const std::vector<ClientMetric::Label> job = {{"job", j.id}};
    for (const v1::PipelineStageTime& s : j.progress.pipeline_stages()) {
      const std::string stage = absl::StrCat(s.stage());
      stage_time.Add({{"job", j.id}, {"stage", stage}, {"state", "busy"}}, s.busy_seconds());
      stage_time.Add({{"job", j.id}, {"stage", stage}, {"state", "idle"}}, s.idle_seconds());
      bubble.Add({{"job", j.id}, {"stage", stage}}, s.bubble());
    }
    if (j.progress.pipeline_stages_size() > 0) {
      ideal_bubble.Add(job, j.progress.pipeline_stages(0).ideal_bubble());
    }
    state.Add({{"job", j.id}, {"state", JobStateLabel(j.state)}}, 1);
    restarts.Add(job, static_cast<double>(std::max<int64_t>(j.generation - 1, 0)));
    step.Add(job, static_cast<double>(j.progress.step()));
    if (j.progress.total_steps() > 0) {
      total_steps.Add(job, static_cast<double>(j.progress.total_steps()));
    }
    committed.Add(job, static_cast<double>(j.committed_step));
    if (j.progress.updated_unix_ms() > 0) {
      loss.Add(job, j.progress.loss());
      throughput.Add(job, j.progress.samples_per_second());
      step_time.Add({{"job", j.id}, {"phase", "data_wait"}}, j.progress.data_wait_seconds());
      step_time.Add({{"job", j.id}, {"phase", "compute"}}, j.progress.compute_seconds());
      step_time.Add({{"job", j.id}, {"phase", "communication"}},
                    j.progress.communication_seconds());
      step_time.Add({{"job", j.id}, {"phase", "checkpoint"}}, j.progress.checkpoint_seconds());
      step_time.Add({{"job", j.id}, {"phase", "validation"}}, j.progress.validation_seconds());
    }
    world.Add(job, j.ranks);
    gpus.Add(job, j.gpus);
    gpu_seconds.Add(job, j.gpu_seconds);
    if (j.started != absl::InfinitePast()) {
      running.Add(job, std::max(0.0, absl::ToDoubleSeconds(snap.now - j.started)));
    }
    if (j.max_runtime > absl::ZeroDuration()) {
      max_runtime.Add(job, absl::ToDoubleSeconds(j.max_runtime));
    }
    if (j.checkpointing) {
      const absl::Time since =
          j.last_checkpoint != absl::InfinitePast() ? j.last_checkpoint : j.started;
      if (since != absl::InfinitePast()) {
        checkpoint_age.Add(job, std::max(0.0, absl::ToDoubleSeconds(snap.now - since)));
      }
    }
    if (auto it = commit_latency.find(j.id); it != commit_latency.end()) {
      last_commit.Add(job, it->second);
    }
  }
}

}  // namespace trainyard
