// The JobManager's front: its state, how changes are written and applied, and what it tells
// the metrics. The job service's calls are in job_manager_jobs.cc.

#include "server/jobs/job_manager.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/restart_reason.h"
#include "common/spec/job_spec.h"
#include "common/storage/uri.h"
#include "server/jobs/capacity.h"
#include "server/jobs/checkpoint_registry.h"
#include "server/jobs/job_manager_internal.h"
#include "server/jobs/restart_policy.h"
#include "server/lifecycle/job_state.h"
#include "server/scheduling/scheduler.h"

namespace trainyard {

using job_manager_internal::IsShard;

namespace {
// By name: LeasePolicy gains fields, and a positional list would shift onto the wrong ones.
LeasePolicy LeasePolicyOf(const JobManagerOptions& options) {
  LeasePolicy policy;
  policy.timeout = options.worker_timeout;
  policy.stream_grace = options.worker_stream_grace;
  policy.mass_loss_hold = options.mass_loss_hold;
  policy.beat_timeout = options.lease_beat_timeout;
  return policy;
}
}  // namespace

JobManager::JobManager(const Clock& clock, std::unique_ptr<JobStore> store,
                       std::unique_ptr<LogStore> logs, JobManagerOptions options)
    : clock_(clock),
      options_(std::move(options)),
      store_(std::move(store)),
      committer_(store_.get()),
      logs_(std::move(logs)),
      rendezvous_(clock),
      workers_(clock, LeasePolicyOf(options_)) {}

JobManager::~JobManager() = default;

absl::StatusOr<std::unique_ptr<JobManager>> JobManager::Create(const Clock& clock,
                                                               std::unique_ptr<JobStore> store,
                                                               std::unique_ptr<LogStore> logs,
                                                               JobManagerOptions options) {
  std::unique_ptr<JobManager> manager(
      new JobManager(clock, std::move(store), std::move(logs), std::move(options)));
  if (absl::Status s = manager->Load(); !s.ok()) return s;
  return manager;
}

absl::Status JobManager::Load() {
  // Finished jobs stay in the store (counted), unless their trainers may still be stopping.
  absl::StatusOr<StoreContents> contents = store_->LoadActive();
  if (!contents.ok()) return contents.status();
  absl::StatusOr<std::vector<v1::Queue>> queues = store_->LoadQueues();
  if (!queues.ok()) return queues.status();
  // The metric histories of the jobs that may still report, to be thinned as they grow.
  std::vector<std::string> reporting;
  for (const StoredJob& stored : contents->jobs) {
    if (!IsFinalJobState(stored.job.state())) reporting.push_back(stored.job.id());
  }
  absl::StatusOr<std::map<std::string, std::vector<std::pair<int64_t, int64_t>>>> history_keys =
      store_->LoadMetricKeys(reporting);
  if (!history_keys.ok()) return history_keys.status();
  absl::MutexLock lock(&mu_);
  for (v1::Queue& q : *queues) queues_[q.name()] = std::move(q);
  next_seq_ = std::max<int64_t>(contents->next_job_seq, 1);
  for (const auto& [state, n] : contents->not_loaded) {
    table_.CountStored(state, static_cast<int>(n));
  }
  for (StoredJob& stored : contents->jobs) {
    JobEntry& entry = table_.Add(stored.seq, std::move(stored.job));
    // Stall and stop clocks restart with the coordinator: it cannot know what happened while
    // it was away.
    // (A program that never reported a step has no stall clock until it does.)
    const bool never_reported =
        entry.job.spec().has_program() &&
        (entry.job.progress().updated_unix_ms() == 0 || entry.job.progress().steps_unknown());
    entry.last_step_change = never_reported ? absl::InfinitePast() : clock_.Now();
    entry.last_step_seen = entry.job.progress().step();
    if (entry.job.state() == v1::RESTARTING) entry.restarting_since = clock_.Now();
    entry.attempt_placed = clock_.Now();
    // After a restart, trainers of jobs that ended just before may still be stopping.
    if (IsFinalJobState(entry.job.state())) entry.ended = clock_.Now();
    next_seq_ = std::max(next_seq_, entry.seq + 1);
  }
  for (const auto& [job_id, keys] : *history_keys) {
    if (JobEntry* entry = table_.Find(job_id); entry != nullptr) {
      for (const auto& [unix_ms, step] : keys) entry->history.Load({unix_ms, step});
    }
  }
  for (StoredCheckpoint& c : contents->checkpoints) {
    if (JobEntry* entry = table_.Find(c.checkpoint.job_id()); entry != nullptr) {
      entry->checkpoints.push_back(std::move(c));
    }
  }
  // The finished jobs that jobs not finished resume from come back with their checkpoints.
  std::set<std::string> sources;
  for (int64_t seq : table_.active()) {
    const std::string& from = table_.FindBySeq(seq)->job.spec().checkpoint().resume_from();
    if (!from.empty() && table_.Find(from) == nullptr) sources.insert(from);
  }
  for (const std::string& id : sources) {
    absl::StatusOr<const JobEntry*> source = ResumeSourceLocked(id);
    if (absl::IsNotFound(source.status())) {
      LogWarning("job ", id, ", which a job resumes from, is not in the store");
    } else if (!source.ok()) {
      return source.status();
    }
  }
  for (v1::Worker& w : contents->workers) workers_.Restore(std::move(w));
  int64_t stored_only = 0;
  for (const auto& [state, n] : contents->not_loaded) stored_only += n;
  LogInfo("loaded ", table_.size(), " jobs (", table_.active().size(), " active; ",
          stored_only - static_cast<int64_t>(sources.size()), " finished ones stay in the store), ",
          contents->workers.size(), " workers, ", contents->checkpoints.size(), " checkpoints");
  tick_requested_ = true;
  return absl::OkStatus();
}

JobManager::JobEntry* JobManager::FindLocked(absl::string_view id) { return table_.Find(id); }

absl::StatusOr<StoredJobRecord> JobManager::LoadEvicted(absl::string_view id) const {
  absl::StatusOr<StoredJobRecord> record = store_->LoadJob(id);
  if (absl::IsNotFound(record.status())) {
    return absl::NotFoundError(absl::StrCat("job '", id, "' not found"));
  }
  return record;
}

absl::StatusOr<const JobManager::JobEntry*> JobManager::ResumeSourceLocked(absl::string_view id) {
  if (const JobEntry* entry = FindLocked(id); entry != nullptr) return entry;
  // Read under the lock, which retention holds while it removes jobs: what is read stays true.
  absl::StatusOr<StoredJobRecord> record = store_->LoadJob(id);
  if (!record.ok()) return record.status();
  JobEntry& entry = table_.Readmit(record->job.seq, std::move(record->job.job));
  entry.checkpoints = std::move(record->checkpoints);
  return &entry;
}

void JobManager::EvictFinishedLocked() {
  std::vector<std::string> evict;
  for (const auto& [finished_ms, seq] : table_.finished()) {
    if (table_.stopping().count(seq)) continue;
    const JobEntry* entry = table_.FindBySeq(seq);
    if (entry == nullptr || entry->progress_applied != entry->progress_reports) continue;
    const std::string& id = entry->job.id();
    if (table_.IsResumedFrom(id) || pinned_sources_.count(id)) continue;
    evict.push_back(id);
  }
  for (const std::string& id : evict) table_.Evict(id);
}

const JobManager::JobEntry* JobManager::FindLocked(absl::string_view id) const {
  return table_.Find(id);
}

void JobManager::RequestTickLocked() {
  tick_requested_ = true;
  tick_wanted_.SignalAll();
}

std::vector<std::pair<const JobManager::JobEntry*, const v1::TaskInfo*>>
JobManager::ActiveTasksLocked(absl::string_view worker_id) const {
  return table_.ActiveTasksOn(worker_id);
}

absl::Status JobManager::WriteLocked(StoreMutation m) {
  if (unit_.has_value()) {
    MergeMutation(unit_->mutation, std::move(m));
    return absl::OkStatus();
  }
  return committer_.Apply(std::move(m));
}

void JobManager::AfterCommitLocked(std::function<void()> fn) {
  if (unit_.has_value()) {
    unit_->after_commit.push_back(std::move(fn));
  } else {
    fn();
  }
}

void JobManager::BeginUnitLocked() { unit_.emplace(); }

void JobManager::SaveWorkerLocked(absl::string_view id) {
  if (!unit_.has_value() || unit_->saved_workers.count(id)) return;
  const WorkerRecord* record = workers_.Find(id);
  unit_->saved_workers.emplace(
      std::string(id), record == nullptr ? std::nullopt : std::optional<WorkerRecord>(*record));
}

absl::Status JobManager::EndUnitLocked() {
  UnitOfWork unit = std::move(*unit_);
  unit_.reset();
  absl::Status written =
      unit.mutation.empty() ? absl::OkStatus() : committer_.Apply(std::move(unit.mutation));
  if (written.ok()) {
    for (std::function<void()>& fn : unit.after_commit) fn();
    return absl::OkStatus();
  }
  LogError("store write failed, changes undone: ", written.ToString());
  for (auto& [seq, saved] : unit.saved_jobs) {
    JobEntry* entry = table_.FindBySeq(seq);
    if (entry == nullptr) continue;
    const v1::Job undone = std::move(entry->job);
    const uint64_t version = entry->version;
    *entry = std::move(saved);
    entry->version = version + 1;  // watchers see the change back as a change
    ReindexLocked(*entry, undone);
  }
  for (auto& [id, saved] : unit.saved_workers) {
    if (saved.has_value()) {
      workers_.PutBack(*std::move(saved));
    } else {
      workers_.Remove(id);
    }
    WakeWorkerLocked(id);
  }
  ClusterChangedLocked();
  schedule_all_ = true;
  RequestTickLocked();
  changed_.SignalAll();
  return written;
}

void JobManager::ReindexLocked(JobEntry& entry, const v1::Job& before) {
  // Workers whose set of active tasks changed get a new desired-state version.
  for (const std::string& worker_id : table_.Reindex(entry, before)) {
    workers_.BumpVersion(worker_id);
    WakeWorkerLocked(worker_id);
  }
  if (!IsFinalJobState(before.state()) && IsFinalJobState(entry.job.state())) {
    RequestTickLocked();  // capacity came free
  }
}

void JobManager::CapHistory(v1::Job& job, StoreMutation& m) const {
  const int max_events = std::max(options_.max_job_events, 2 * kKeptFirstEvents);
  if (job.events_size() > max_events) {
    // The first ten say how the job began; the latest what it does now.
    const int keep_first = kKeptFirstEvents;
    const int excess = job.events_size() - max_events;
    job.mutable_events()->DeleteSubrange(keep_first, excess);
    job.set_events_dropped(job.events_dropped() + excess);
    m.trimmed_events.push_back({job.id(), keep_first, excess});
  }
  const int max_restarts = std::max(options_.max_job_restart_records, 1);
  if (job.restarts_size() > max_restarts) {
    const int excess = job.restarts_size() - max_restarts;
    for (int i = 0; i < excess; ++i) {
      switch (BudgetOf(job.restarts(i).reason())) {
        case RestartBudget::kFailures:
          job.set_dropped_failure_restarts(job.dropped_failure_restarts() + 1);
          break;
        case RestartBudget::kInfrastructure:
          job.set_dropped_infrastructure_restarts(job.dropped_infrastructure_restarts() + 1);
          break;
        case RestartBudget::kPreemptions:
          job.set_dropped_preemption_restarts(job.dropped_preemption_restarts() + 1);
          break;
        case RestartBudget::kNone:
          break;
      }
    }
    job.mutable_restarts()->DeleteSubrange(0, excess);
    job.set_restarts_dropped(job.restarts_dropped() + excess);
  }
}

absl::Status JobManager::CommitLocked(JobEntry& entry, v1::Job updated,
                                      const std::vector<v1::JobEvent>& events,
                                      const std::vector<std::string>& changed_task_ids,
                                      StoreMutation extra) {
  StoreMutation m = std::move(extra);
  for (const v1::JobEvent& e : events) m.events.emplace_back(updated.id(), e);
  CapHistory(updated, m);
  m.jobs.push_back({entry.seq, updated});
  bool task_ended = false;
  for (const std::string& task_id : changed_task_ids) {
    for (const v1::TaskInfo& t : updated.tasks()) {
      if (t.task_id() != task_id) continue;
      m.tasks.emplace_back(updated.id(), t);
      task_ended = task_ended || TaskEnded(t.state());
    }
  }
  if (unit_.has_value()) unit_->saved_jobs.try_emplace(entry.seq, entry);
  if (absl::Status s = WriteLocked(std::move(m)); !s.ok()) {
    LogError("job ", updated.id(), ": store write failed: ", s.ToString());
    return s;
  }
  const v1::JobState old_state = entry.job.state();
  v1::Job before = std::move(entry.job);
  entry.job = std::move(updated);
  entry.version++;
  ReindexLocked(entry, before);
  // Capacity comes free when a task ends; a job joins the queue again after a restart.
  if ((entry.job.state() != old_state &&
       (entry.job.state() == v1::PENDING || IsFinalJobState(entry.job.state()))) ||
      task_ended) {
    schedule_all_ = true;
  }
  if (!IsFinalJobState(old_state) && IsFinalJobState(entry.job.state())) {
    entry.ended = clock_.Now();
    AfterCommitLocked([this, id = entry.job.id(), generation = entry.job.generation()] {
      rendezvous_.EndAttempts(id, generation);
    });
  }
  changed_.SignalAll();
  return absl::OkStatus();
}

absl::Status JobManager::TransitionLocked(JobEntry& entry, v1::Job updated, v1::JobState to,
                                          absl::string_view reason,
                                          const std::vector<std::string>& changed_task_ids) {
  const v1::JobState from = updated.state();
  absl::StatusOr<v1::JobEvent> event = TransitionJob(updated, to, reason, clock_.Now());
  if (!event.ok()) return event.status();
  if (absl::Status s = CommitLocked(entry, std::move(updated), {*event}, changed_task_ids);
      !s.ok()) {
    return s;
  }
  auto report = [this, from, to](const v1::Job& job, absl::string_view reason) {
    LogInfo("job ", job.id(), ": ", JobStateName(from), " -> ", JobStateName(to), " (", reason,
            ")");
    if (options_.event_sink == nullptr) return;
    options_.event_sink->OnJobTransition(job, from, to, reason,
                                         absl::FromUnixMillis(job.updated_unix_ms()));
    // Counted once its cause is settled: the first report of an attempt's end is often a
    // consequence (a peer's lost connection), named better by a later one.
    if (from == v1::RESTARTING && job.restarts_size() > 0) {
      options_.event_sink->OnRestart(job, job.restarts(job.restarts_size() - 1));
    }
  };
  if (unit_.has_value()) {
    AfterCommitLocked(
        [report, job = entry.job, reason = std::string(reason)] { report(job, reason); });
  } else {
    report(entry.job, reason);
  }
  return absl::OkStatus();
}

ClusterMetricsSnapshot JobManager::MetricsSnapshot() const {
  absl::MutexLock lock(&mu_);
  ClusterMetricsSnapshot snap;
  snap.now = clock_.Now();
  for (const auto& [state, n] : table_.counts()) snap.jobs_by_state[state] = n;
  snap.queues = ListQueuesLocked();
  const std::map<std::string, WorkerUsage> used = UsedCapacityLocked();
  for (const WorkerRecord* record : workers_.All()) {
    snap.workers_by_state[workers_.ShownState(*record, QuietLimitLocked(), nullptr)]++;
    if (record->info.state() != v1::LOST && record->unreachable()) snap.workers_unreachable++;
    if (record->info.state() == v1::READY && !record->unreachable()) {
      snap.slots_total += record->info.slots();
      snap.gpus_total += record->info.gpus();
    }
    auto it = used.find(record->info.id());
    if (it != used.end()) {
      snap.slots_used += it->second.slots;
      snap.gpus_used += it->second.gpus;
    }
  }
  // Jobs never placed wait since their submission, in sequence order: the first is the oldest.
  for (int64_t seq : table_.active()) {
    const JobEntry* entry = table_.FindBySeq(seq);
    if (entry == nullptr || entry->job.generation() > 0) continue;
    snap.oldest_pending_since = absl::FromUnixMillis(entry->job.created_unix_ms());
    break;
  }
  for (int64_t seq : table_.attempts()) {
    const JobEntry* entry = table_.FindBySeq(seq);
    if (entry == nullptr) continue;
    const v1::Job& job = entry->job;
    if (job.state() == v1::PENDING) {  // after a restart
      absl::Time since = absl::FromUnixMillis(job.created_unix_ms());
      for (const v1::JobEvent& e : job.events()) {
        if (e.to() == v1::PENDING) since = absl::FromUnixMillis(e.time_unix_ms());
      }
      if (snap.oldest_pending_since == absl::InfinitePast() || since < snap.oldest_pending_since) {
        snap.oldest_pending_since = since;
      }
    }
    JobMetricsSnapshot j;
    j.id = job.id();
    j.state = job.state();
    j.generation = job.generation();
    j.progress = job.progress();
    j.committed_step = job.committed_step();
    j.checkpointing = job.spec().checkpoint().every_steps() > 0;
    for (auto it = entry->checkpoints.rbegin(); it != entry->checkpoints.rend(); ++it) {
      if (it->retired) continue;
      j.last_checkpoint = absl::FromUnixMillis(it->checkpoint.created_unix_ms());
      break;
    }
    if (job.started_unix_ms() > 0) j.started = absl::FromUnixMillis(job.started_unix_ms());
    j.max_runtime = absl::Seconds(job.spec().max_runtime_seconds());
    std::map<int64_t, int> ranks_by_generation;
    for (const v1::TaskInfo& t : job.tasks()) ranks_by_generation[t.generation()] += !IsShard(t);
    j.ranks = ranks_by_generation[job.generation()];
    if (job.state() == v1::SCHEDULED || job.state() == v1::RUNNING) {
      j.gpus = j.ranks * GpusPerRank(job.spec());
    }
    // The n-th move to SCHEDULED starts attempt n, so the events alone give each interval's
    // GPU count.
    int64_t generation = 0;
    absl::Time holding_since = absl::InfinitePast();
    int holding_gpus = 0;
    for (const v1::JobEvent& e : job.events()) {
      const absl::Time t = absl::FromUnixMillis(e.time_unix_ms());
      if (holding_since != absl::InfinitePast()) {
        j.gpu_seconds += holding_gpus * absl::ToDoubleSeconds(t - holding_since);
        holding_since = absl::InfinitePast();
      }
      if (e.to() == v1::SCHEDULED) generation++;
      if (e.to() == v1::SCHEDULED || e.to() == v1::RUNNING) {
        holding_since = t;
        holding_gpus = ranks_by_generation[generation] * GpusPerRank(job.spec());
      }
    }
    if (holding_since != absl::InfinitePast() && snap.now > holding_since) {
      j.gpu_seconds += holding_gpus * absl::ToDoubleSeconds(snap.now - holding_since);
    }
    snap.jobs.push_back(std::move(j));
  }
  return snap;
}

bool JobManager::WaitForTickRequest(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  const absl::Time deadline = RealClock::Get().Now() + timeout;
  while (!tick_requested_ && !shutdown_) {
    if (tick_wanted_.WaitWithDeadline(&mu_, deadline)) break;
  }
  return tick_requested_;
}

std::shared_ptr<absl::CondVar> JobManager::WorkerWakeupLocked(absl::string_view worker_id) {
  std::shared_ptr<absl::CondVar>& cv = worker_wakeups_[worker_id];
  if (cv == nullptr) cv = std::make_shared<absl::CondVar>();
  return cv;
}

void JobManager::WakeWorkerLocked(absl::string_view worker_id) {
  auto it = worker_wakeups_.find(worker_id);
  if (it != worker_wakeups_.end()) it->second->SignalAll();
}

void JobManager::Shutdown() {
  absl::MutexLock lock(&mu_);
  for (auto& [id, cv] : worker_wakeups_) cv->SignalAll();
  shutdown_ = true;
  rendezvous_.Shutdown();
  changed_.SignalAll();
  tick_wanted_.SignalAll();
}

bool JobManager::IsShutDown() const {
  absl::MutexLock lock(&mu_);
  return shutdown_;
}

}  // namespace trainyard
