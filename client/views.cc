#include "client/views.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "client/format.h"
#include "common/restart_reason.h"
#include "common/spec/memory_estimate.h"
#include "google/protobuf/util/json_util.h"
#include "yaml-cpp/yaml.h"

namespace trainyard::cli {
namespace {

std::string StepText(const v1::JobProgress& p) {
  if (p.total_steps() > 0) return absl::StrCat(p.step(), "/", p.total_steps());
  if (p.step() > 0) return absl::StrCat(p.step());
  return "-";
}

// "Name:             value" ("-" for an empty value), one line of a describe view.
void AppendField(std::string& out, const std::string& name, const std::string& value) {
  absl::StrAppend(&out, absl::StrFormat("%-17s %s\n", name + ":", value.empty() ? "-" : value));
}

std::string LossText(const v1::JobProgress& p) {
  if (p.step() == 0 && p.loss() == 0) return "-";
  return absl::StrFormat("%.4f", p.loss());
}

}  // namespace

std::string JobsTable(const std::vector<v1::Job>& jobs, absl::Time now, bool terminal) {
  std::vector<std::vector<std::string>> rows;
  for (const v1::Job& job : jobs) {
    const std::string text = job.state() == v1::PENDING ? WaitText(job) : job.reason();
    const std::string reason = terminal ? Truncate(text, 60) : text;
    rows.push_back({job.id(), job.name(), job.owner().empty() ? "-" : job.owner(),
                    JobStateName(job.state()), StepText(job.progress()), LossText(job.progress()),
                    ShortAge(now - absl::FromUnixMillis(job.created_unix_ms())), reason});
  }
  return Table({"ID", "NAME", "OWNER", "STATE", "STEP", "LOSS", "AGE", "REASON"}, rows);
}

std::string WaitText(const v1::Job& job, absl::TimeZone zone) {
  std::string out;
  if (job.position() > 0) out = absl::StrCat("#", job.position(), " in line: ");
  absl::StrAppend(&out, job.reason());
  if (job.estimated_start_unix_ms() > 0) {
    absl::StrAppend(&out, "; starts by ", LocalTime(job.estimated_start_unix_ms(), zone));
  }
  return out;
}

std::string DescribeQueue(const v1::Queue& q) {
  const v1::QueueStatus& s = q.status();
  std::string out;
  auto field = [&out](const std::string& name, const std::string& value) {
    AppendField(out, name, value);
  };
  auto limit = [](int32_t n, absl::string_view unit) {
    return n < 0 ? absl::StrCat("unlimited ", unit) : absl::StrCat(n, " ", unit);
  };
  field("Queue", q.name());
  field("Quota",
        absl::StrCat(limit(s.quota_slots(), "slots"), ", ", limit(s.quota_gpus(), "GPUs"),
                     s.implicit() || (q.name() == "default" && q.quota_slots() != s.quota_slots())
                         ? " (what other queues' quotas leave)"
                         : ""));
  field("Borrowing", absl::StrCat("up to ", limit(q.borrow_slots(), "slots"), ", ",
                                  limit(q.borrow_gpus(), "GPUs"), " beyond the quota"));
  field("Weight", absl::StrCat(q.weight() > 0 ? q.weight() : 1));
  field("Users", q.users_size() == 0 ? "everyone" : absl::StrJoin(q.users(), ", "));
  field("Max priority", q.has_max_priority()
                            ? absl::StrCat(q.max_priority(), " for users' jobs (admins' exempt)")
                            : "none");
  field("Holds", absl::StrCat(s.used_slots(), " slots (", s.borrowed_slots(), " borrowed), ",
                              s.used_gpus(), " GPUs (", s.borrowed_gpus(), " borrowed)"));
  field("Jobs", absl::StrCat(s.running_jobs(), " running, ", s.pending_jobs(), " pending"));
  field("Preempted", absl::StrCat(s.preemptions(), " jobs since the coordinator started"));
  if (!s.implicit() && q.created_unix_ms() > 0) {
    field("Created", absl::StrCat(LocalTime(q.created_unix_ms()), " by ",
                                  q.created_by().empty() ? "-" : q.created_by()));
  }
  return out;
}

std::string QueueJobsTable(std::vector<v1::Job> jobs, bool terminal) {
  std::stable_sort(jobs.begin(), jobs.end(), [](const v1::Job& a, const v1::Job& b) {
    auto key = [](const v1::Job& j) {
      return j.state() == v1::PENDING && j.position() > 0 ? j.position() : INT32_MAX;
    };
    return key(a) < key(b);
  });
  std::vector<std::vector<std::string>> rows;
  for (const v1::Job& job : jobs) {
    const std::string text = job.state() == v1::PENDING ? WaitText(job) : job.reason();
    rows.push_back({job.id(), job.owner().empty() ? "-" : job.owner(), JobStateName(job.state()),
                    absl::StrCat(job.spec().priority()), terminal ? Truncate(text, 70) : text});
  }
  return Table({"ID", "OWNER", "STATE", "PRIORITY", "REASON"}, rows);
}

std::string SearchStateName(v1::SearchState state) {
  return v1::SearchState_Name(state).substr(sizeof("SEARCH_") - 1);
}

std::string TrialStateName(v1::TrialState state) {
  return v1::TrialState_Name(state).substr(sizeof("TRIAL_") - 1);
}

namespace {

std::string BestText(const v1::Search& search) {
  if (search.best_trial() < 0) return "-";
  return absl::StrFormat("%.4f (trial %d)", search.best_metric(), search.best_trial());
}

}  // namespace

std::string SearchesTable(const std::vector<v1::Search>& searches, absl::Time now, bool terminal) {
  std::vector<std::vector<std::string>> rows;
  for (const v1::Search& s : searches) {
    const std::string reason = terminal ? Truncate(s.reason(), 50) : s.reason();
    rows.push_back(
        {s.id(), s.name(), s.owner().empty() ? "-" : s.owner(), SearchStateName(s.state()),
         absl::StrCat(s.spec().searcher().name(), " ", s.spec().searcher().metric()),
         absl::StrCat(s.trials_running(), "/", s.trials_created(), "/",
                      s.spec().searcher().max_trials()),
         BestText(s), ShortAge(now - absl::FromUnixMillis(s.created_unix_ms())), reason});
  }
  return Table(
      {"ID", "NAME", "OWNER", "STATE", "SEARCHER", "TRIALS RUN/MADE/MAX", "BEST", "AGE", "REASON"},
      rows);
}

std::string DescribeSearch(const v1::Search& s, absl::TimeZone zone) {
  const v1::SearcherSpec& searcher = s.spec().searcher();
  std::string out;
  absl::StrAppend(&out, "ID:          ", s.id(), "\n");
  absl::StrAppend(&out, "Name:        ", s.name(), "\n");
  if (!s.owner().empty()) absl::StrAppend(&out, "Owner:       ", s.owner(), "\n");
  absl::StrAppend(&out, "State:       ", SearchStateName(s.state()), " (", s.reason(), ")\n");
  std::string how =
      absl::StrCat(searcher.name(), ", ", searcher.smaller_is_better() ? "minimise " : "maximise ",
                   searcher.metric());
  if (searcher.name() == "asha") {
    absl::StrAppend(&how, ", max_length ", searcher.max_length(), ", divisor ", searcher.divisor(),
                    ", ", searcher.max_rungs(), " rungs");
  }
  absl::StrAppend(&out, "Searcher:    ", how, "\n");
  absl::StrAppend(&out, "Trials:      ", s.trials_created(), " of ", searcher.max_trials(), ", ",
                  s.trials_running(), " running (at most ", searcher.max_concurrent_trials(), "), ",
                  s.trials_failed(), " failed (at most ", searcher.max_failed_trials(), ")\n");
  absl::StrAppend(
      &out, "Created:     ",
      absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::FromUnixMillis(s.created_unix_ms()), zone), "\n");
  if (s.best_trial() >= 0) {
    absl::StrAppend(&out, "Best trial:  ", s.best_trial(), ", ", searcher.metric(), " ",
                    absl::StrFormat("%.6g", s.best_metric()), "\n");
    if (!s.best_model_uri().empty()) {
      absl::StrAppend(&out, "Best model:  ", s.best_model_uri(), "\n");
    }
  }
  std::vector<std::string> paths;
  for (const v1::Hyperparameter& h : s.spec().hyperparameters()) paths.push_back(h.path());
  std::vector<std::string> header = {"TRIAL", "STATE", "RUNG", "STEP", searcher.metric()};
  for (const std::string& p : paths) header.push_back(p);
  header.push_back("JOB");
  std::vector<std::vector<std::string>> rows;
  for (const v1::Trial& t : s.trials()) {
    std::vector<std::string> row = {
        absl::StrCat(t.number(), t.number() == s.best_trial() ? " *" : ""),
        TrialStateName(t.state()), absl::StrCat(t.rung()), absl::StrCat(t.step()),
        t.has_metric() ? absl::StrFormat("%.4f", t.metric()) : "-"};
    for (const std::string& p : paths) {
      auto it = t.hyperparameters().find(p);
      row.push_back(it == t.hyperparameters().end() ? "-" : it->second);
    }
    row.push_back(t.job_id());
    rows.push_back(std::move(row));
  }
  absl::StrAppend(&out, "\n", Table(header, rows));
  for (const v1::Trial& t : s.trials()) {
    if (t.state() == v1::TRIAL_FAILED) {
      absl::StrAppend(&out, "trial ", t.number(), " failed: ", t.message(), "\n");
    }
  }
  return out;
}

std::string SearchProgressLine(const v1::Search& s) {
  int done = 0;
  for (const v1::Trial& t : s.trials()) done += t.state() != v1::TRIAL_RUNNING;
  std::string out = absl::StrCat("search ", s.id(), " ", SearchStateName(s.state()), ": ",
                                 s.trials_running(), " running, ", done, " done");
  if (s.trials_failed() > 0) absl::StrAppend(&out, " (", s.trials_failed(), " failed)");
  // Grid's max_trials 0 is the whole grid, whose size the client does not know.
  const int planned = s.spec().searcher().max_trials();
  absl::StrAppend(&out, planned > 0 ? absl::StrCat(" of ", planned) : "", " trials");
  if (s.best_trial() >= 0) {
    absl::StrAppend(&out, "; best ", s.spec().searcher().metric(), " ",
                    absl::StrFormat("%.4f", s.best_metric()), " (trial ", s.best_trial(), ")");
  }
  return out;
}

namespace {

// "2.6.0+cuda+nccl"; "-" when the agent did not say.
std::string LibTorchColumn(const v1::Worker& w) {
  if (w.libtorch_version().empty()) return "-";
  std::string out = w.libtorch_version();
  for (const std::string& f : w.features()) absl::StrAppend(&out, "+", f);
  return out;
}

// "4.0 GiB/15.0 GiB": memory its tasks reserve of what it offers; "-" when it did not say.
std::string MemoryColumn(const v1::Worker& w) {
  if (w.memory_bytes() <= 0) return "-";
  return absl::StrCat(w.memory_used_bytes() > 0 ? HumanBytes(w.memory_used_bytes()) : "0", "/",
                      HumanBytes(w.memory_bytes()));
}

// The state, and a drained worker's drain where the state shown is about its lease.
std::string WorkerStateColumn(const v1::Worker& w) {
  const std::string state = WorkerStateName(w.state());
  return w.draining() && w.state() != v1::DRAINING && w.state() != v1::LOST
             ? absl::StrCat(state, "+DRAINING")
             : state;
}

}  // namespace

std::string WorkersTable(const std::vector<v1::Worker>& workers, absl::Time now) {
  std::vector<std::vector<std::string>> rows;
  for (const v1::Worker& w : workers) {
    const std::string seen =
        w.last_seen_unix_ms() == 0
            ? "-"
            : ShortAge(now - absl::FromUnixMillis(w.last_seen_unix_ms())) + " ago";
    // Host and process id: what a person needs to signal (preempt, kill) a worker's agent.
    rows.push_back(
        {w.id(), w.address(), w.hostname().empty() ? "-" : w.hostname(),
         w.pid() > 0 ? absl::StrCat(w.pid()) : "-", WorkerStateColumn(w),
         absl::StrCat(w.slots_used(), "/", w.slots()),
         absl::StrCat(
             w.gpus_used(), "/", w.gpus(),
             w.gpu_faults().empty() ? "" : absl::StrCat(" (", w.gpu_faults_size(), " out)")),
         MemoryColumn(w), w.isolation().empty() ? "-" : w.isolation(), LibTorchColumn(w), seen,
         w.task_ids().empty() ? "-" : absl::StrJoin(w.task_ids(), ",")});
  }
  std::string out = Table({"ID", "ADDRESS", "HOST", "PID", "STATE", "SLOTS", "GPUS", "MEMORY",
                           "LIMITS", "LIBTORCH", "LAST SEEN", "TASKS"},
                          rows);
  // Why a worker is SUSPECT or UNREACHABLE, under the table.
  for (const v1::Worker& w : workers) {
    if (w.state_reason().empty()) continue;
    absl::StrAppend(&out, w.id(), " is ", WorkerStateName(w.state()), ": ", w.state_reason(), "\n");
  }
  // Which GPUs their agents took out of service, and why.
  for (const v1::Worker& w : workers) {
    for (const v1::GpuFault& f : w.gpu_faults()) {
      absl::StrAppend(&out, w.id(), " GPU ", f.index(), " out of service since ",
                      LocalTime(f.since_unix_ms()), ": ", f.reason(), "\n");
    }
  }
  return out;
}

std::string CheckpointsTable(const std::vector<v1::Checkpoint>& checkpoints, absl::TimeZone zone) {
  std::vector<std::vector<std::string>> rows;
  for (const v1::Checkpoint& c : checkpoints) {
    rows.push_back({absl::StrCat(c.step()), LocalTime(c.created_unix_ms(), zone),
                    HumanBytes(c.size_bytes()), c.uri()});
  }
  return Table({"STEP", "TIME", "SIZE", "URI"}, rows);
}

std::string StateLine(const v1::Job& job) {
  std::string line = JobStateName(job.state());
  if (job.state() == v1::RUNNING || job.state() == v1::SCHEDULED) {
    std::set<std::string> workers;
    for (const v1::TaskInfo& task : job.tasks()) {
      if (task.generation() == job.generation() && !task.worker_id().empty()) {
        workers.insert(task.worker_id());
      }
    }
    if (!workers.empty()) {
      absl::StrAppend(&line, " on ", absl::StrJoin(workers, ", "));
      return line;
    }
  }
  if (!job.reason().empty()) {
    absl::StrAppend(&line, ": ", job.reason());
  }
  return line;
}

namespace {

// Who and what the job is: its names, state, queue, search and where it stops.
void IdentityFields(const v1::Job& job, absl::TimeZone zone, std::string& out) {
  auto field = [&out](const std::string& name, const std::string& value) {
    AppendField(out, name, value);
  };
  field("ID", job.id());
  field("Name", job.name());
  field("Owner", job.owner());
  field("State", JobStateName(job.state()));
  field("Reason", job.state() == v1::PENDING ? WaitText(job, zone) : job.reason());
  if (!job.spec().queue().empty() || job.spec().priority() != 0 || job.spec().has_preemptible()) {
    field("Queue", absl::StrCat(job.spec().queue().empty() ? "default" : job.spec().queue(),
                                ", priority ", job.spec().priority(),
                                job.spec().has_preemptible() && !job.spec().preemptible()
                                    ? ", not preemptible"
                                    : ", preemptible"));
  }
  field("Generation", absl::StrCat(job.generation()));
  if (job.spec().has_program()) {
    // Each word as it goes to the program: quoted where it holds a space.
    std::vector<std::string> words;
    for (const std::string& w : job.spec().program().command()) {
      words.push_back(absl::StrContains(w, ' ') || w.empty() ? absl::StrCat("'", w, "'") : w);
    }
    field("Program", absl::StrJoin(words, " "));
    field("Workdir", job.spec().program().workdir());
  }
  if (!job.trial().search_id().empty()) {
    field("Search", absl::StrCat(job.trial().search_id(), ", trial ", job.trial().trial(),
                                 ", rung ", job.trial().rung()));
  }
  if (job.spec().stop_at_step() > 0) {
    field("Stops at",
          absl::StrCat(
              "step ", job.spec().stop_at_step(),
              job.spec().max_steps() > 0 ? absl::StrCat(" of ", job.spec().max_steps()) : ""));
  }
}

// What each rank and shard takes, and the parameter servers.
void ResourceFields(const v1::Job& job, std::string& out) {
  auto field = [&out](const std::string& name, const std::string& value) {
    AppendField(out, name, value);
  };
  if (const v1::Resources& r = job.spec().resources();
      r.cpus() > 0 || r.memory_bytes() > 0 || r.gpus_per_worker() > 0) {
    std::vector<std::string> parts;
    if (r.gpus_per_worker() > 0) {
      parts.push_back(
          absl::StrCat(r.gpus_per_worker(), r.gpus_per_worker() == 1 ? " GPU" : " GPUs"));
    }
    if (r.cpus() > 0) parts.push_back(absl::StrCat(r.cpus(), r.cpus() == 1 ? " CPU" : " CPUs"));
    if (r.memory_bytes() > 0) parts.push_back(HumanBytes(r.memory_bytes()));
    field("Per rank", absl::StrJoin(parts, ", "));
  }
  // What the coordinator worked out at submission.
  auto estimate = [](const v1::TaskMemoryEstimate& e) {
    return absl::StrCat(e.lower_bound() ? "" : "about ", DescribeEstimate(e));
  };
  if (job.memory_estimate().rank().total_bytes() > 0) {
    field("Rank memory", estimate(job.memory_estimate().rank()));
  }
  if (job.memory_estimate().shard().total_bytes() > 0) {
    field("Shard memory", estimate(job.memory_estimate().shard()));
  }
  if (job.data_memory_bytes() > 0) {
    field("Data memory", absl::StrCat(HumanBytes(job.data_memory_bytes()),
                                      " (its first workers' smallest task memory: every attempt "
                                      "fits its data order to it)"));
  }
  if (job.spec().strategy() == v1::PARAMETER_SERVER) {
    const v1::ParameterServerSpec& ps = job.spec().parameter_servers();
    std::string servers = absl::StrCat(ps.shards(), ps.shards() == 1 ? " shard, " : " shards, ",
                                       ps.mode().empty() ? "sync" : ps.mode());
    if (ps.mode() == "async") absl::StrAppend(&servers, ", max_staleness ", ps.max_staleness());
    if (!ps.dense().empty()) absl::StrAppend(&servers, ", dense ", ps.dense());
    if (ps.memory_bytes() > 0)
      absl::StrAppend(&servers, ", ", HumanBytes(ps.memory_bytes()), " each");
    field("Param servers", servers);
  }
}

// A pipeline's stages, their memory and their bubbles.
void PipelineFields(const v1::Job& job, std::string& out) {
  auto field = [&out](const std::string& name, const std::string& value) {
    AppendField(out, name, value);
  };
  const v1::JobProgress& p = job.progress();
  const v1::PipelineSpec& pipeline = job.spec().pipeline();
  const int replicas = job.spec().workers().max() / std::max(1, pipeline.stages());
  std::string text = absl::StrCat(pipeline.stages(), " stages x ", replicas,
                                  replicas == 1 ? " replica, " : " replicas, ",
                                  pipeline.microbatches(), " micro-batches, ", pipeline.schedule());
  if (pipeline.partition_counts_size() > 0) {
    absl::StrAppend(&text, ", layers ", absl::StrJoin(pipeline.partition_counts(), "/"));
  } else if (!pipeline.partition().empty()) {
    absl::StrAppend(&text, ", ", pipeline.partition());
  }
  field("Pipeline", text);
  // Each stage's memory: its own size where the spec gives one, and the estimate.
  std::vector<std::string> stages;
  const v1::MemoryEstimate& m = job.memory_estimate();
  for (int st = 0; st < std::max(pipeline.memory_bytes_size(), m.stages_size()); ++st) {
    std::string one = absl::StrCat("stage ", st);
    if (st < pipeline.memory_bytes_size()) {
      absl::StrAppend(&one, " ", HumanBytes(pipeline.memory_bytes(st)));
    }
    if (st < m.stages_size()) {
      absl::StrAppend(&one, st < pipeline.memory_bytes_size() ? " (needs " : " needs ",
                      m.stages(st).lower_bound() ? "at least " : "about ",
                      HumanBytes(m.stages(st).total_bytes()),
                      st < pipeline.memory_bytes_size() ? ")" : "");
    }
    stages.push_back(one);
  }
  if (!stages.empty()) field("Stage memory", absl::StrJoin(stages, ", "));
  if (p.pipeline_stages_size() > 0) {
    std::vector<std::string> stages;
    for (const v1::PipelineStageTime& s : p.pipeline_stages()) {
      stages.push_back(absl::StrFormat("stage %d %.0f%%", s.stage(), 100 * s.bubble()));
    }
    field("Bubble", absl::StrFormat("%s (ideal %.0f%%)", absl::StrJoin(stages, ", "),
                                    100 * p.pipeline_stages(0).ideal_bubble()));
  }
}

// When it ran, how far it got, what it wrote and how many restarts it has spent.
void ProgressFields(const v1::Job& job, absl::TimeZone zone, std::string& out) {
  auto field = [&out](const std::string& name, const std::string& value) {
    AppendField(out, name, value);
  };
  const v1::JobProgress& p = job.progress();
  field("Created", LocalTime(job.created_unix_ms(), zone));
  field("Started", LocalTime(job.started_unix_ms(), zone));
  field("Finished", LocalTime(job.finished_unix_ms(), zone));
  std::string progress = StepText(p);
  if (p.total_steps() > 0) {
    absl::StrAppend(&progress, absl::StrFormat(" (%d%%)", static_cast<int>(100.0 * p.step() /
                                                                           p.total_steps())));
  }
  // A program that does not use the module reports no steps: they are not known, not 0.
  const bool unknown = job.spec().has_program() && (p.updated_unix_ms() == 0 || p.steps_unknown());
  field("Step", unknown ? "unknown (the program reports no steps: trainyard.report)" : progress);
  field("Loss", LossText(p));
  field("Samples/s", p.samples_per_second() > 0
                         ? GroupThousands(static_cast<int64_t>(p.samples_per_second() + 0.5))
                         : "-");
  field("Val accuracy",
        p.has_val_accuracy() ? absl::StrFormat("%.2f%%", p.val_accuracy() * 100) : "-");
  if (p.has_val_loss()) {
    // Per token for a language model, whose perplexity is its exponential.
    std::string text = absl::StrFormat("%.4f", p.val_loss());
    if (job.spec().data().tokens().size() > 0) {
      absl::StrAppendFormat(&text, " (perplexity %.2f)", std::exp(p.val_loss()));
    }
    field("Val loss", text);
  }
  if (!p.metrics().empty()) {
    // A program's own figures, by name.
    std::vector<std::pair<std::string, double>> sorted(p.metrics().begin(), p.metrics().end());
    std::sort(sorted.begin(), sorted.end());
    std::vector<std::string> parts;
    for (const auto& [name, value] : sorted)
      parts.push_back(absl::StrFormat("%s=%.6g", name, value));
    field("Metrics", absl::StrJoin(parts, " "));
  }
  field("Committed step", job.committed_step() >= 0 ? absl::StrCat(job.committed_step()) : "-");
  field("Checkpoints", job.checkpoint_uri());
  field("Model", job.model_uri());
  const v1::RestartPolicy& policy = job.spec().restart();
  auto budget = [&](RestartBudget b) {
    const std::optional<int32_t> limit = BudgetLimit(policy, b);
    return absl::StrCat(RestartsOn(job, b), " of ",
                        limit.has_value() ? absl::StrCat(*limit) : std::string("unlimited"));
  };
  field("Restarts",
        absl::StrCat(job.restarts_size() + job.restarts_dropped(), " (failures ",
                     budget(RestartBudget::kFailures),
                     " allowed; hangs and "
                     "infrastructure errors ",
                     budget(RestartBudget::kInfrastructure), "; preemptions and lost workers ",
                     budget(RestartBudget::kPreemptions), ")"));
}

// Each restart: why, what it cost and how long recovery took.
void RestartsSection(const v1::Job& job, absl::TimeZone zone, std::string& out) {
  absl::StrAppend(&out, "\nRestarts:\n");
  if (job.restarts_dropped() > 0) {
    absl::StrAppend(&out, "  (", job.restarts_dropped(), " earlier restarts not kept)\n");
  }
  std::vector<std::vector<std::string>> rows;
  for (const v1::Restart& r : job.restarts()) {
    std::string recovery = "-";
    if (r.recovered()) {
      recovery = absl::StrFormat(
          "%.1fs (detect %.1f, schedule %.1f, start %.1f, rendezvous %.1f, load %.1f, step %.1f)",
          r.recovery_seconds(), r.detection_seconds(), r.scheduling_seconds(), r.start_seconds(),
          r.rendezvous_seconds(), r.checkpoint_load_seconds(), r.first_step_seconds());
    }
    rows.push_back({absl::StrCat(r.generation()), RestartReasonName(r.reason()),
                    LocalTime(r.detected_unix_ms(), zone), absl::StrCat(r.last_step()),
                    r.recovered() ? absl::StrCat(r.resumed_step()) : "-",
                    !r.recovered()           ? "-"
                    : r.steps_lost_unknown() ? "unknown"
                                             : absl::StrCat(r.steps_lost()),
                    recovery, r.message()});
  }
  std::string table = Table(
      {"GEN", "REASON", "DETECTED", "LAST STEP", "RESUMED", "LOST", "RECOVERY", "MESSAGE"}, rows);
  for (absl::string_view line : absl::StrSplit(table, '\n', absl::SkipEmpty())) {
    absl::StrAppend(&out, "  ", line, "\n");
  }
  // Which rank held the others up, where the ranks' flight records said.
  for (const v1::Restart& r : job.restarts()) {
    if (!r.diagnosis().empty()) {
      absl::StrAppend(&out, "  gen ", r.generation(), " diagnosis: ", r.diagnosis(), "\n");
    }
  }
}

// The tasks of the job: where they ran, how they ended, the memory they held.
void TasksSection(const v1::Job& job, std::string& out) {
  absl::StrAppend(&out, "\nTasks:\n");
  if (job.tasks().empty()) {
    absl::StrAppend(&out, "  (none)\n");
  } else {
    std::vector<std::vector<std::string>> rows;
    for (const v1::TaskInfo& t : job.tasks()) {
      std::string exit = "-";
      if (t.state() == v1::TASK_EXITED || t.state() == v1::TASK_STOPPED ||
          t.state() == v1::TASK_FAILED_TO_START) {
        exit = t.signal() != 0 ? absl::StrCat("signal ", t.signal()) : absl::StrCat(t.exit_code());
        if (t.out_of_memory()) exit = "OOM";
      }
      // The most it held, of its limit: "812.0 MiB/1.0 GiB".
      std::string memory = t.memory_peak_bytes() > 0 ? HumanBytes(t.memory_peak_bytes()) : "-";
      if (t.memory_limit_bytes() > 0)
        absl::StrAppend(&memory, "/", HumanBytes(t.memory_limit_bytes()));
      rows.push_back({t.role() == v1::TASK_ROLE_SHARD ? absl::StrCat("shard ", t.shard())
                                                      : absl::StrCat("rank ", t.rank()),
                      absl::StrCat(t.generation()), t.worker_id().empty() ? "-" : t.worker_id(),
                      TaskStateName(t.state()), exit, memory,
                      absl::StrReplaceAll(t.message(), {{"\n", " | "}})});
    }
    std::string table =
        Table({"TASK", "GEN", "WORKER", "STATE", "EXIT", "MEMORY", "MESSAGE"}, rows);
    for (absl::string_view line : absl::StrSplit(table, '\n', absl::SkipEmpty())) {
      absl::StrAppend(&out, "  ", line, "\n");
    }
  }
}

// The job's state changes.
void EventsSection(const v1::Job& job, absl::TimeZone zone, std::string& out) {
  absl::StrAppend(&out, "\nEvents:\n");
  if (job.events().empty()) absl::StrAppend(&out, "  (none)\n");
  for (int i = 0; i < job.events_size(); ++i) {
    const v1::JobEvent& e = job.events(i);
    // The coordinator drops events after the first ten: say where.
    if (job.events_dropped() > 0 && i == 10) {
      absl::StrAppend(&out, "  (", job.events_dropped(), " events not kept)\n");
    }
    absl::StrAppend(&out, "  ", LocalTime(e.time_unix_ms(), zone), "  ",
                    e.from() == v1::JOB_STATE_UNSPECIFIED ? "-" : JobStateName(e.from()), " -> ",
                    JobStateName(e.to()), e.reason().empty() ? "" : ": ", e.reason(), "\n");
  }
}

}  // namespace

std::string DescribeJob(const v1::Job& job, absl::TimeZone zone) {
  std::string out;
  IdentityFields(job, zone, out);
  ResourceFields(job, out);
  if (job.spec().strategy() == v1::PIPELINE) PipelineFields(job, out);
  ProgressFields(job, zone, out);
  if (!job.restarts().empty()) RestartsSection(job, zone, out);
  TasksSection(job, out);
  EventsSection(job, zone, out);
  return out;
}

std::string ToJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  std::string json;
  if (!google::protobuf::util::MessageToJsonString(message, &json, options).ok()) return "{}\n";
  if (json.empty() || json.back() != '\n') json.push_back('\n');
  return json;
}

}  // namespace trainyard::cli
