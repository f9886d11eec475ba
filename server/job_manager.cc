#include "server/job_manager.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/job_spec.h"
#include "common/log.h"
#include "common/restart_reason.h"
#include "common/uri.h"
#include "server/capacity.h"
#include "server/checkpoint_registry.h"
#include "server/job_state.h"
#include "server/restart_policy.h"
#include "server/scheduler.h"

namespace trainyard {
namespace {

constexpr int kDefaultPageSize = 100;
// How long a stopping trainer of an ended job may hold its capacity without its agent reporting
// it gone: above the agents' default stop grace period, bounded for tasks an agent never saw.
constexpr absl::Duration kStoppingHold = absl::Seconds(60);
constexpr int kMaxPageSize = 1000;
// Between passes triggered by changes, the scheduler looks at the whole queue at least this
// often (everything time-driven, such as backoffs and holds, is also woken up on time).
constexpr absl::Duration kFullSchedulePeriod = absl::Seconds(10);
constexpr int64_t kLogChunkBytes = 64 * 1024;
constexpr char kPageTokenPrefix[] = "before:";
// How often blocked streams look at client cancellation and shutdown.
constexpr absl::Duration kStreamPoll = absl::Milliseconds(250);
// After a job ends, how long a followed log waits for the last pieces the agents ship.
constexpr absl::Duration kFinalLogGrace = absl::Milliseconds(500);

bool TaskSucceeded(const v1::TaskInfo& t) {
  return t.state() == v1::TASK_EXITED && t.exit_code() == 0 && t.signal() == 0;
}

std::string TaskId(absl::string_view job_id, int64_t generation, int rank) {
  return absl::StrCat(job_id, ".g", generation, ".r", rank);
}

std::string ShardTaskId(absl::string_view job_id, int64_t generation, int shard) {
  return absl::StrCat(job_id, ".g", generation, ".s", shard);
}

bool IsShard(const v1::TaskInfo& t) { return t.role() == v1::TASK_ROLE_SHARD; }

// "rank 2" or "shard 0", as messages name a task.
std::string TaskName(const v1::TaskInfo& t) {
  return IsShard(t) ? absl::StrCat("shard ", t.shard()) : absl::StrCat("rank ", t.rank());
}

// Why a task's end fails its job: "rank 0 exited with code 2: data.train: no files match ...".
std::string TaskFailureReason(const v1::TaskInfo& t) {
  std::string reason;
  switch (t.state()) {
    case v1::TASK_FAILED_TO_START:
      reason = absl::StrCat(TaskName(t), " failed to start");
      break;
    case v1::TASK_STOPPED:
      reason = absl::StrCat(TaskName(t), " stopped unexpectedly");
      break;
    default:
      reason = t.signal() != 0 ? absl::StrCat(TaskName(t), " killed by signal ", t.signal())
                               : absl::StrCat(TaskName(t), " exited with code ", t.exit_code());
  }
  if (!t.message().empty()) absl::StrAppend(&reason, ": ", t.message());
  return reason;
}

void RankRange(const v1::JobSpec& spec, int& min_ranks, int& max_ranks) {
  if (spec.strategy() == v1::SINGLE || spec.strategy() == v1::STRATEGY_UNSPECIFIED) {
    min_ranks = max_ranks = 1;
    return;
  }
  min_ranks = std::max(spec.workers().min(), 1);
  max_ranks = std::max(spec.workers().max(), min_ranks);
}

absl::Time LastEventTime(const v1::Job& job, v1::JobState to) {
  for (int i = job.events_size() - 1; i >= 0; --i) {
    if (job.events(i).to() == to && job.events(i).from() != to) {
      return absl::FromUnixMillis(job.events(i).time_unix_ms());
    }
  }
  return absl::InfinitePast();
}

int ShardCount(const v1::JobSpec& spec) {
  return spec.strategy() == v1::PARAMETER_SERVER ? std::max(spec.parameter_servers().shards(), 0)
                                                 : 0;
}

// Ranks (not shards) of one attempt.
int RanksOf(const v1::Job& job, int64_t generation) {
  int ranks = 0;
  for (const v1::TaskInfo& t : job.tasks()) ranks += t.generation() == generation && !IsShard(t);
  return ranks;
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
      workers_(clock, options_.worker_timeout) {}

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
  absl::StatusOr<StoreContents> contents = store_->LoadAll();
  if (!contents.ok()) return contents.status();
  absl::MutexLock lock(&mu_);
  next_seq_ = std::max<int64_t>(contents->next_job_seq, 1);
  for (StoredJob& stored : contents->jobs) {
    JobEntry& entry = table_.Add(stored.seq, std::move(stored.job));
    // Stall and stop clocks restart with the coordinator: it cannot know what happened while
    // it was away.
    entry.last_step_change = clock_.Now();
    entry.last_step_seen = entry.job.progress().step();
    if (entry.job.state() == v1::RESTARTING) entry.restarting_since = clock_.Now();
    entry.attempt_placed = clock_.Now();
    // After a restart, trainers of jobs that ended just before may still be stopping.
    if (IsFinalJobState(entry.job.state())) entry.ended = clock_.Now();
    next_seq_ = std::max(next_seq_, entry.seq + 1);
  }
  for (StoredCheckpoint& c : contents->checkpoints) {
    if (JobEntry* entry = table_.Find(c.checkpoint.job_id()); entry != nullptr) {
      entry->checkpoints.push_back(std::move(c));
    }
  }
  for (v1::Worker& w : contents->workers) workers_.Restore(std::move(w));
  LogInfo("loaded ", table_.size(), " jobs (", table_.active().size(), " active), ",
          contents->workers.size(), " workers, ", contents->checkpoints.size(), " checkpoints");
  tick_requested_ = true;
  return absl::OkStatus();
}

JobManager::JobEntry* JobManager::FindLocked(absl::string_view id) { return table_.Find(id); }

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

// ---- JobService ----

absl::StatusOr<v1::Job> JobManager::SubmitJobYaml(absl::string_view spec_yaml) {
  if (static_cast<int64_t>(spec_yaml.size()) > options_.max_spec_yaml_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("spec_yaml: ", spec_yaml.size(),
                                                   " bytes is over the limit of ",
                                                   options_.max_spec_yaml_bytes));
  }
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(spec_yaml);
  if (!spec.ok()) return spec.status();
  return SubmitValidated(*std::move(spec));
}

absl::StatusOr<v1::Job> JobManager::SubmitJob(v1::JobSpec spec) {
  ApplyJobSpecDefaults(spec);
  if (absl::Status s = ValidateJobSpec(spec); !s.ok()) return s;
  return SubmitValidated(std::move(spec));
}

absl::StatusOr<v1::Job> JobManager::SubmitValidated(v1::JobSpec spec) {
  if (!IsSafeFileName(spec.name())) {
    return absl::InvalidArgumentError(
        absl::StrCat("name: '", spec.name(), "' must be letters, digits, '.', '_' or '-'"));
  }
  v1::Job job;
  int64_t seq = 0;
  std::shared_ptr<GroupCommitter::Ticket> ticket;
  {
    absl::MutexLock lock(&mu_);
    const int active = static_cast<int>(table_.active().size()) + submitting_;
    if (active >= options_.max_active_jobs) {
      return absl::ResourceExhaustedError(absl::StrCat("too many active jobs: ", active, " (limit ",
                                                       options_.max_active_jobs, ")"));
    }
    if (!spec.checkpoint().resume_from().empty() &&
        FindLocked(spec.checkpoint().resume_from()) == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint.resume_from: no job '", spec.checkpoint().resume_from(), "'"));
    }
    // The number is taken now; a submission whose write fails leaves a gap.
    seq = next_seq_++;
    const int64_t now_ms = absl::ToUnixMillis(clock_.Now());
    job.set_id(absl::StrCat(spec.name(), "-", seq));
    job.set_name(spec.name());
    job.set_state(v1::PENDING);
    job.set_reason("submitted");
    job.set_generation(0);
    job.set_created_unix_ms(now_ms);
    job.set_updated_unix_ms(now_ms);
    job.set_committed_step(-1);
    const std::string& base =
        spec.checkpoint().uri().empty() ? options_.checkpoint_root : spec.checkpoint().uri();
    job.set_checkpoint_uri(JoinUri(base, job.id()));
    *job.mutable_spec() = std::move(spec);
    v1::JobEvent* event = job.add_events();
    event->set_time_unix_ms(now_ms);
    event->set_from(v1::JOB_STATE_UNSPECIFIED);
    event->set_to(v1::PENDING);
    event->set_reason("submitted");
    StoreMutation m;
    m.jobs.push_back({seq, job});
    m.events.emplace_back(job.id(), *event);
    m.next_job_seq = seq + 1;
    // Queued under the lock, committed without it: submissions from many clients share one
    // transaction, and the job becomes visible only once it is durable.
    ticket = committer_.Enqueue(std::move(m));
    ++submitting_;
  }
  const absl::Status written = committer_.Wait(ticket);
  absl::MutexLock lock(&mu_);
  --submitting_;
  if (!written.ok()) return written;
  JobEntry& entry = table_.Add(seq, job);
  new_pending_.insert(JobTable::KeyOf(entry));
  LogInfo("job ", job.id(), " submitted");
  if (options_.event_sink != nullptr) options_.event_sink->OnJobSubmitted(job);
  RequestTickLocked();
  changed_.SignalAll();
  return job;
}

absl::StatusOr<v1::Job> JobManager::GetJob(absl::string_view id) const {
  absl::MutexLock lock(&mu_);
  const JobEntry* entry = FindLocked(id);
  if (entry == nullptr) return absl::NotFoundError(absl::StrCat("job '", id, "' not found"));
  return entry->job;
}

absl::StatusOr<ListJobsResult> JobManager::ListJobs(const std::vector<v1::JobState>& states,
                                                    int page_size,
                                                    absl::string_view page_token) const {
  if (page_size < 0) return absl::InvalidArgumentError("page_size: must be >= 0");
  if (page_size == 0) page_size = kDefaultPageSize;
  page_size = std::min(page_size, kMaxPageSize);
  int64_t before = INT64_MAX;
  if (!page_token.empty()) {
    std::string raw;
    if (!absl::WebSafeBase64Unescape(page_token, &raw) ||
        !absl::StartsWith(raw, kPageTokenPrefix) ||
        !absl::SimpleAtoi(absl::string_view(raw).substr(sizeof(kPageTokenPrefix) - 1), &before)) {
      return absl::InvalidArgumentError("page_token: not a token from ListJobs");
    }
  }
  const std::set<v1::JobState> wanted(states.begin(), states.end());
  absl::MutexLock lock(&mu_);
  ListJobsResult result;
  int64_t last_seq = 0;
  for (auto it = std::make_reverse_iterator(table_.by_seq().lower_bound(before));
       it != table_.by_seq().rend(); ++it) {
    const JobEntry* entry = FindLocked(it->second);
    if (entry == nullptr) continue;
    if (!wanted.empty() && !wanted.count(entry->job.state())) continue;
    if (static_cast<int>(result.jobs.size()) == page_size) {
      result.next_page_token = absl::WebSafeBase64Escape(absl::StrCat(kPageTokenPrefix, last_seq));
      break;
    }
    v1::Job job = entry->job;
    job.clear_events();
    result.jobs.push_back(std::move(job));
    last_seq = it->first;
  }
  return result;
}

absl::StatusOr<v1::Job> JobManager::CancelJob(absl::string_view id, absl::string_view reason) {
  absl::MutexLock lock(&mu_);
  JobEntry* entry = FindLocked(id);
  if (entry == nullptr) return absl::NotFoundError(absl::StrCat("job '", id, "' not found"));
  if (IsFinalJobState(entry->job.state())) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", id, " is already ", JobStateName(entry->job.state())));
  }
  const std::string why =
      reason.empty() ? std::string("cancelled by user") : absl::StrCat("cancelled: ", reason);
  if (absl::Status s = TransitionLocked(*entry, entry->job, v1::CANCELLED, why, {}); !s.ok()) {
    return s;
  }
  return entry->job;
}

absl::Status JobManager::WatchJob(absl::string_view id,
                                  const std::function<bool(const v1::Job&)>& sink,
                                  const std::function<bool()>& cancelled) {
  uint64_t seen = 0;
  bool first = true;
  while (true) {
    v1::Job copy;
    {
      absl::MutexLock lock(&mu_);
      const JobEntry* entry = FindLocked(id);
      if (entry == nullptr) return absl::NotFoundError(absl::StrCat("job '", id, "' not found"));
      while (!first && entry->version == seen && !shutdown_ && !cancelled()) {
        changed_.WaitWithTimeout(&mu_, kStreamPoll);
      }
      if (shutdown_) return absl::UnavailableError("coordinator is shutting down");
      if (cancelled()) return absl::CancelledError("watch cancelled");
      copy = entry->job;
      seen = entry->version;
    }
    first = false;
    if (!sink(copy)) return absl::OkStatus();
    if (IsFinalJobState(copy.state())) return absl::OkStatus();
  }
}

absl::Status JobManager::StreamLogs(
    absl::string_view id, LogSelection selection, bool follow,
    const std::function<bool(const v1::TaskInfo&, absl::string_view)>& sink,
    const std::function<bool()>& cancelled) {
  const int rank = selection.rank;
  if (rank < -1) return absl::InvalidArgumentError(absl::StrCat("rank: ", rank, " < -1"));
  if (selection.shard.has_value() && *selection.shard < 0) {
    return absl::InvalidArgumentError(absl::StrCat("shard: ", *selection.shard, " < 0"));
  }
  std::map<std::string, int64_t> offsets;
  while (true) {
    // Read the version before the files so that an append racing with the reads wakes us.
    const uint64_t log_version = logs_->version(id);
    std::vector<std::pair<int64_t, v1::TaskInfo>> tasks;  // (generation, task)
    bool final = false;
    std::string job_id;
    {
      absl::MutexLock lock(&mu_);
      const JobEntry* entry = FindLocked(id);
      if (entry == nullptr) return absl::NotFoundError(absl::StrCat("job '", id, "' not found"));
      if (shutdown_) return absl::UnavailableError("coordinator is shutting down");
      job_id = entry->job.id();
      final = IsFinalJobState(entry->job.state());
      for (const v1::TaskInfo& t : entry->job.tasks()) {
        const bool wanted = selection.shard.has_value()
                                ? IsShard(t) && t.shard() == *selection.shard
                                : rank == -1 || (!IsShard(t) && t.rank() == rank);
        if (wanted) tasks.emplace_back(t.generation(), t);
      }
    }
    // By attempt, ranks before shards.
    std::stable_sort(tasks.begin(), tasks.end(), [](const auto& a, const auto& b) {
      return std::make_tuple(a.first, a.second.role(), a.second.rank(), a.second.shard()) <
             std::make_tuple(b.first, b.second.role(), b.second.rank(), b.second.shard());
    });
    bool sent = false;
    for (const auto& [generation, task] : tasks) {
      int64_t& offset = offsets[task.task_id()];
      while (true) {
        absl::StatusOr<std::string> data =
            logs_->Read(job_id, task.task_id(), offset, kLogChunkBytes);
        if (!data.ok()) return data.status();
        if (data->empty()) break;
        offset += static_cast<int64_t>(data->size());
        sent = true;
        if (!sink(task, *data)) return absl::OkStatus();
      }
    }
    if (!follow) return absl::OkStatus();
    if (cancelled()) return absl::CancelledError("log stream cancelled");
    if (final && !sent) {
      if (logs_->WaitForAppend(id, log_version, kFinalLogGrace) == log_version) {
        return absl::OkStatus();
      }
      continue;
    }
    if (!sent) logs_->WaitForAppend(id, log_version, kStreamPoll);
  }
}

std::vector<v1::Worker> JobManager::ListWorkers() const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::Worker> out;
  const std::map<std::string, WorkerUsage> used = UsedCapacityLocked();
  for (const WorkerRecord* record : workers_.All()) out.push_back(WorkerViewLocked(*record, used));
  return out;
}

std::map<std::string, WorkerUsage> JobManager::UsedCapacityLocked() const {
  return UsedCapacity(table_, clock_.Now(), kStoppingHold, [this](absl::string_view worker_id) {
    const WorkerRecord* worker = workers_.Find(worker_id);
    return worker == nullptr || worker->info.state() == v1::LOST;
  });
}

v1::Worker JobManager::WorkerViewLocked(const WorkerRecord& record,
                                        const std::map<std::string, WorkerUsage>& used) const {
  v1::Worker view = record.info;
  auto it = used.find(view.id());
  if (it != used.end()) {
    view.set_slots_used(it->second.slots);
    view.set_gpus_used(it->second.gpus);
    for (const std::string& id : it->second.task_ids) view.add_task_ids(id);
  }
  return view;
}

absl::StatusOr<std::vector<v1::Checkpoint>> JobManager::ListCheckpoints(
    absl::string_view job_id) const {
  absl::MutexLock lock(&mu_);
  const JobEntry* entry = FindLocked(job_id);
  if (entry == nullptr) return absl::NotFoundError(absl::StrCat("job '", job_id, "' not found"));
  std::vector<v1::Checkpoint> out;
  for (auto it = entry->checkpoints.rbegin(); it != entry->checkpoints.rend(); ++it) {
    if (!it->retired) out.push_back(it->checkpoint);
  }
  return out;
}

// ---- AgentService ----

absl::Status JobManager::PersistWorkerLocked(absl::string_view id) {
  const WorkerRecord* record = workers_.Find(id);
  if (record == nullptr) return absl::NotFoundError(absl::StrCat("worker '", id, "' unknown"));
  StoreMutation m;
  m.workers.push_back(record->info);
  return WriteLocked(std::move(m));
}

absl::StatusOr<v1::RegisterWorkerResponse> JobManager::RegisterWorker(
    const v1::RegisterWorkerRequest& request) {
  if (!IsSafeFileName(request.name())) {
    return absl::InvalidArgumentError(
        absl::StrCat("name: '", request.name(), "' must be letters, digits, '.', '_' or '-'"));
  }
  if (request.slots() < 0 || request.gpus() < 0) {
    return absl::InvalidArgumentError("slots, gpus: must be >= 0");
  }
  absl::MutexLock lock(&mu_);
  const int64_t now_ms = absl::ToUnixMillis(clock_.Now());
  v1::Worker info;
  info.set_id(request.name());
  info.set_address(request.address());
  info.set_slots(request.slots());
  info.set_gpus(request.gpus());
  info.set_memory_bytes(request.memory_bytes());
  info.set_hostname(request.hostname());
  info.set_pid(request.pid());
  info.set_state(v1::READY);
  // The same agent process registering again (after a coordinator restart) is still being
  // preempted; a new process under the name is a machine that came back.
  if (const WorkerRecord* known = workers_.Find(request.name());
      known != nullptr && known->info.state() == v1::DRAINING &&
      known->info.pid() == request.pid() && known->info.hostname() == request.hostname()) {
    info.set_state(v1::DRAINING);
  }
  info.set_registered_unix_ms(now_ms);
  info.set_last_seen_unix_ms(now_ms);
  // The registration and what it finds out about the agent's tasks are one transaction.
  BeginUnitLocked();
  SaveWorkerLocked(info.id());
  StoreMutation m;
  m.workers.push_back(info);
  WriteLocked(std::move(m)).IgnoreError();  // deferred to EndUnitLocked
  workers_.Register(info);
  WakeWorkerLocked(info.id());  // a long poll of the agent's earlier life answers
  ClusterChangedLocked();
  AfterCommitLocked([info, reported = request.tasks_size()] {
    LogInfo("worker ", info.id(), " registered: ", info.slots(), " slots, ", info.gpus(), " GPUs, ",
            reported, " tasks reported");
  });

  std::set<std::string> reported;
  for (const v1::TaskStatus& status : request.tasks()) {
    reported.insert(status.task_id());
    ApplyTaskStatusLocked(info.id(), status).IgnoreError();
  }
  // A task the agent had confirmed running but no longer reports died with the agent.
  std::vector<std::pair<std::string, v1::TaskInfo>> missing;
  for (const auto& [entry, task] : ActiveTasksLocked(info.id())) {
    if (task->state() == v1::TASK_RUNNING && !reported.count(task->task_id())) {
      missing.emplace_back(entry->job.id(), *task);
    }
  }
  for (const auto& [job_id, task] : missing) {
    JobEntry* entry = FindLocked(job_id);
    if (entry == nullptr || IsFinalJobState(entry->job.state())) continue;
    v1::Job updated = entry->job;
    for (v1::TaskInfo& t : *updated.mutable_tasks()) {
      if (t.task_id() != task.task_id()) continue;
      t.set_state(v1::TASK_EXITED);
      t.set_exit_code(-1);
      t.set_message(absl::StrCat("lost: worker ", info.id(), " registered again without it"));
    }
    AttemptEnd end;
    end.reason = task.stop_deadline_unix_ms() > 0 ? v1::PREEMPTED : v1::WORKER_LOST;
    end.message =
        absl::StrCat(TaskName(task), " lost: worker ", info.id(), " registered again without it");
    end.failed = clock_.Now();
    if (entry->job.state() == v1::RESTARTING) {
      // The attempt is already over; a lost rank may name its cause better.
      v1::Restart* last = updated.mutable_restarts(updated.restarts_size() - 1);
      if (CauseRank(end.reason) > CauseRank(last->reason())) {
        last->set_reason(end.reason);
        last->set_message(end.message);
      }
      CommitLocked(*entry, std::move(updated), {}, {task.task_id()}).IgnoreError();
      MaybeFinishRestartLocked(*entry);
    } else {
      EndAttemptLocked(*entry, std::move(updated), std::move(end), {task.task_id()}).IgnoreError();
    }
  }
  if (absl::Status s = EndUnitLocked(); !s.ok()) return s;
  RequestTickLocked();
  changed_.SignalAll();
  v1::RegisterWorkerResponse response;
  response.set_worker_id(info.id());
  response.set_lease_timeout_ms(absl::ToInt64Milliseconds(options_.worker_timeout));
  return response;
}

absl::StatusOr<v1::SyncResponse> JobManager::Sync(const v1::SyncRequest& request) {
  v1::SyncResponse response;
  absl::MutexLock lock(&mu_);
  const WorkerRecord* record = workers_.Find(request.worker_id());
  // A worker known only from the store registers again first: its report of what it runs is
  // what finds the tasks that died while the coordinator was away.
  if (record == nullptr || record->info.state() == v1::LOST || record->restored) {
    response.set_reregister(true);
    return response;
  }
  workers_.Renew(request.worker_id()).IgnoreError();
  for (const v1::TaskStatus& status : request.tasks()) {
    absl::Status s = ApplyTaskStatusLocked(request.worker_id(), status);
    if (!s.ok() && !absl::IsNotFound(s)) {
      LogWarning("worker ", request.worker_id(), ": task ", status.task_id(), ": ", s.ToString());
    }
  }
  const absl::Duration wait =
      std::min(absl::Milliseconds(std::max<int64_t>(request.wait_ms(), 0)), options_.max_sync_wait);
  // The deadline of a blocking wait is real time by nature; leases use the injected clock.
  const absl::Time deadline = absl::Now() + wait;
  while (!shutdown_) {
    record = workers_.Find(request.worker_id());
    if (record == nullptr || record->info.state() == v1::LOST) {
      response.set_reregister(true);
      return response;
    }
    if (record->desired_version != request.known_version()) break;
    ++blocked_syncs_;
    // Its own condition: a change elsewhere does not wake a thousand idle long polls.
    const bool timed_out =
        WorkerWakeupLocked(request.worker_id())->WaitWithDeadline(&mu_, deadline);
    --blocked_syncs_;
    if (timed_out) break;
  }
  record = workers_.Find(request.worker_id());
  if (record == nullptr || record->info.state() == v1::LOST) {
    response.set_reregister(true);
    return response;
  }
  workers_.Renew(request.worker_id()).IgnoreError();
  response.set_version(record->desired_version);
  for (const auto& [entry, task] : ActiveTasksLocked(request.worker_id())) {
    *response.add_tasks() = BuildTaskLocked(*entry, *task);
  }
  return response;
}

v1::Task JobManager::BuildTaskLocked(const JobEntry& entry, const v1::TaskInfo& info) const {
  v1::Task task;
  task.set_task_id(info.task_id());
  task.set_job_id(entry.job.id());
  task.set_generation(info.generation());
  task.set_rank(info.rank());
  task.set_role(info.role());
  task.set_shard(info.shard());
  // A shard serves every rank of its attempt: the world it knows is the ranks'.
  task.set_world_size(RanksOf(entry.job, info.generation()));
  *task.mutable_spec() = entry.job.spec();
  task.set_checkpoint_uri(entry.job.checkpoint_uri());
  for (auto it = entry.checkpoints.rbegin(); it != entry.checkpoints.rend(); ++it) {
    if (!it->retired) task.add_resume_checkpoints(it->checkpoint.uri());
  }
  if (const JobEntry* from = FindLocked(entry.job.spec().checkpoint().resume_from());
      from != nullptr && from != &entry) {
    for (auto it = from->checkpoints.rbegin(); it != from->checkpoints.rend(); ++it) {
      if (!it->retired) task.add_resume_checkpoints(it->checkpoint.uri());
    }
  }
  const auto [slots, gpus] = TaskUsage(entry.job.spec(), info);
  task.set_slots(slots);
  task.set_gpus(gpus);
  task.set_stop_deadline_unix_ms(info.stop_deadline_unix_ms());
  if (const WorkerRecord* worker = workers_.Find(info.worker_id()); worker != nullptr) {
    task.set_worker_address(worker->info.address());
  }
  return task;
}

int JobManager::BlockedSyncsForTesting() const {
  absl::MutexLock lock(&mu_);
  return blocked_syncs_;
}

absl::StatusOr<v1::Task> JobManager::TaskFor(absl::string_view task_id) const {
  absl::MutexLock lock(&mu_);
  const JobEntry* entry = table_.FindByTask(task_id);
  if (entry != nullptr) {
    for (const v1::TaskInfo& t : entry->job.tasks()) {
      if (t.task_id() == task_id) return BuildTaskLocked(*entry, t);
    }
  }
  return absl::NotFoundError(absl::StrCat("task '", task_id, "' unknown"));
}

absl::Status JobManager::ReportTaskStatus(absl::string_view worker_id,
                                          const v1::TaskStatus& status) {
  // Only the worker a task runs on may report it.
  if (worker_id.empty()) return absl::InvalidArgumentError("worker_id: required");
  absl::MutexLock lock(&mu_);
  workers_.Renew(worker_id).IgnoreError();
  return ApplyTaskStatusLocked(worker_id, status);
}

absl::Status JobManager::ApplyTaskStatusLocked(absl::string_view worker_id,
                                               const v1::TaskStatus& status) {
  // The message becomes the job's reason and an event: bounded, whatever an agent sends.
  constexpr size_t kMaxTaskMessageBytes = 4096;
  if (status.message().size() > kMaxTaskMessageBytes) {
    v1::TaskStatus shortened = status;
    shortened.mutable_message()->resize(kMaxTaskMessageBytes);
    return ApplyTaskStatusLocked(worker_id, shortened);
  }
  JobEntry* entry = table_.FindByTask(status.task_id());
  int index = -1;
  if (entry != nullptr) {
    for (int i = 0; i < entry->job.tasks_size(); ++i) {
      if (entry->job.tasks(i).task_id() == status.task_id()) index = i;
    }
  }
  if (index < 0) return absl::NotFoundError(absl::StrCat("task '", status.task_id(), "' unknown"));
  const v1::TaskInfo& current = entry->job.tasks(index);
  if (current.worker_id() != worker_id) {
    return absl::FailedPreconditionError(absl::StrCat("task ", status.task_id(), " runs on ",
                                                      current.worker_id(), ", not ", worker_id));
  }
  // Statuses repeat on every Sync: only news changes anything, and the first end wins.
  if (status.state() == v1::TASK_STATE_UNSPECIFIED || TaskEnded(current.state())) {
    return absl::OkStatus();
  }
  if (status.state() == current.state()) return absl::OkStatus();
  if (current.state() == v1::TASK_RUNNING && status.state() == v1::TASK_STARTING) {
    return absl::OkStatus();
  }
  if (TaskEnded(status.state())) {
    // Its agent shipped the whole log before reporting the end: say what the cap dropped.
    AfterCommitLocked([this, job_id = entry->job.id(), task_id = status.task_id()] {
      if (absl::Status s = logs_->Seal(job_id, task_id); !s.ok()) {
        LogWarning("task ", task_id, ": log not sealed: ", s.ToString());
      }
    });
  }
  v1::Job updated = entry->job;
  v1::TaskInfo* task = updated.mutable_tasks(index);
  task->set_state(status.state());
  task->set_exit_code(status.exit_code());
  task->set_signal(status.signal());
  task->set_message(status.message());
  const std::vector<std::string> changed = {task->task_id()};
  // PENDING after a restart still carries the ended attempt's generation: its late reports
  // change only the task.
  const bool current_attempt =
      (updated.state() == v1::SCHEDULED || updated.state() == v1::RUNNING ||
       updated.state() == v1::RESTARTING) &&
      task->generation() == updated.generation();
  if (!current_attempt) return CommitLocked(*entry, std::move(updated), {}, changed);

  switch (status.state()) {
    case v1::TASK_RUNNING:
      if (updated.state() == v1::SCHEDULED) {
        const std::string reason = absl::StrCat(TaskName(*task), " running on ", task->worker_id());
        // The stall clock starts when the attempt runs, and counts this attempt's steps: it may
        // resume below the step the last one reached.
        entry->last_step_change = clock_.Now();
        entry->last_step_seen = -1;
        return TransitionLocked(*entry, std::move(updated), v1::RUNNING, reason, changed);
      }
      break;
    case v1::TASK_EXITED:
    case v1::TASK_FAILED_TO_START:
    case v1::TASK_STOPPED: {
      if (!TaskSucceeded(*task)) {
        AttemptEnd end;
        end.reason = ClassifyTaskEnd(*task);
        end.message = TaskFailureReason(*task);
        end.failed = clock_.Now();
        if (updated.state() != v1::RESTARTING) {
          return EndAttemptLocked(*entry, std::move(updated), std::move(end), changed);
        }
        // The attempt is already over: a rank that failed on its own (not one we stopped) may
        // name the cause better than the first report did.
        v1::Restart* last = updated.mutable_restarts(updated.restarts_size() - 1);
        if (status.state() == v1::TASK_EXITED && CauseRank(end.reason) > CauseRank(last->reason())) {
          last->set_reason(end.reason);
          last->set_message(end.message);
        }
        absl::Status s = CommitLocked(*entry, std::move(updated), {}, changed);
        if (s.ok()) MaybeFinishRestartLocked(*entry);
        return s;
      }
      int ranks = 0;
      int shards = 0;
      bool all_done = true;
      for (const v1::TaskInfo& t : updated.tasks()) {
        if (t.generation() != updated.generation()) continue;
        (IsShard(t) ? shards : ranks)++;
        all_done = all_done && TaskSucceeded(t);
      }
      if (all_done) {
        std::string reason = ranks == 1 ? std::string("training finished: rank 0")
                                        : absl::StrCat("training finished: all ", ranks, " ranks");
        if (shards > 0) {
          absl::StrAppend(&reason, " and ", shards, shards == 1 ? " shard" : " shards");
        }
        absl::StrAppend(&reason, " exited with code 0");
        return TransitionLocked(*entry, std::move(updated), v1::SUCCEEDED, reason, changed);
      }
      if (updated.state() == v1::SCHEDULED) {
        const std::string reason = absl::StrCat(TaskName(*task), " finished");
        return TransitionLocked(*entry, std::move(updated), v1::RUNNING, reason, changed);
      }
      if (updated.state() == v1::RESTARTING) {
        absl::Status s = CommitLocked(*entry, std::move(updated), {}, changed);
        if (s.ok()) MaybeFinishRestartLocked(*entry);
        return s;
      }
      break;
    }
    default:
      break;
  }
  return CommitLocked(*entry, std::move(updated), {}, changed);
}

absl::StatusOr<int64_t> JobManager::ShipLogs(absl::string_view worker_id, absl::string_view task_id,
                                             int64_t offset, absl::string_view data) {
  std::string job_id;
  {
    absl::MutexLock lock(&mu_);
    const JobEntry* entry = table_.FindByTask(task_id);
    if (entry == nullptr) return absl::NotFoundError(absl::StrCat("task '", task_id, "' unknown"));
    // Only the worker a task runs on may write its log.
    bool owner = false;
    for (const v1::TaskInfo& t : entry->job.tasks()) {
      owner |= t.task_id() == task_id && t.worker_id() == worker_id;
    }
    if (!owner) {
      return absl::FailedPreconditionError(
          absl::StrCat("task ", task_id, " does not run on worker '", worker_id, "'"));
    }
    job_id = entry->job.id();
  }
  return logs_->Append(job_id, task_id, offset, data);
}

absl::StatusOr<JobManager::JobEntry*> JobManager::FencedLocked(absl::string_view job_id,
                                                               int64_t generation) {
  JobEntry* entry = FindLocked(job_id);
  if (entry == nullptr) return absl::NotFoundError(absl::StrCat("job '", job_id, "' not found"));
  if (generation < entry->job.generation()) {
    return absl::FailedPreconditionError(
        absl::StrCat("stale generation ", generation, ", current ", entry->job.generation()));
  }
  if (generation > entry->job.generation()) {
    return absl::FailedPreconditionError(
        absl::StrCat("unknown generation ", generation, ", current ", entry->job.generation()));
  }
  // Only a placed attempt reports: a PENDING job has none (generation 0 is no attempt).
  if (IsFinalJobState(entry->job.state()) || entry->job.state() == v1::PENDING) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, " is ", JobStateName(entry->job.state())));
  }
  return entry;
}

absl::Status JobManager::ReportProgress(absl::string_view job_id, int64_t generation, int rank,
                                        const v1::JobProgress& progress) {
  v1::JobProgress stored;
  uint64_t report = 0;
  std::shared_ptr<GroupCommitter::Ticket> ticket;
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<JobEntry*> fenced = FencedLocked(job_id, generation);
    if (!fenced.ok()) return fenced.status();
    JobEntry& entry = **fenced;
    const absl::Time now = clock_.Now();
    if (progress.step() > entry.last_step_seen) {
      entry.last_step_seen = progress.step();
      entry.last_step_change = now;
    }
    if (entry.job.state() == v1::RESTARTING) {
      // The ended attempt's last word (its final step) tells how many steps the restart loses.
      v1::Restart* last = entry.job.mutable_restarts(entry.job.restarts_size() - 1);
      if (progress.step() > last->last_step()) last->set_last_step(progress.step());
    }
    // Rank 0 speaks for the job; other ranks only fill in while rank 0 lags behind. Compared
    // with the latest report queued, which may not be written yet.
    const v1::JobProgress& latest =
        entry.progress_reports > 0 ? entry.queued_progress : entry.job.progress();
    if (rank != 0 && progress.step() < latest.step() &&
        latest.attempt_start_step() == progress.attempt_start_step()) {
      return absl::OkStatus();
    }
    stored = progress;
    stored.set_updated_unix_ms(absl::ToUnixMillis(now));
    entry.queued_progress = stored;
    report = ++entry.progress_reports;
    // Written before it is acknowledged or shown, in a transaction shared with whatever else is
    // being written meanwhile (other jobs' reports, submissions).
    StoreMutation m;
    m.progress.emplace_back(std::string(job_id), stored);
    ticket = committer_.Enqueue(std::move(m));
  }
  const absl::Status written = committer_.Wait(ticket);
  absl::MutexLock lock(&mu_);
  if (!written.ok()) return written;
  JobEntry* entry = FindLocked(job_id);
  // A later report of this job that was written first stays.
  if (entry == nullptr || report <= entry->progress_applied) return absl::OkStatus();
  entry->progress_applied = report;
  *entry->job.mutable_progress() = stored;
  const absl::Time now = clock_.Now();
  if (options_.event_sink != nullptr) options_.event_sink->OnProgress(job_id, stored.step(), now);
  entry->version++;
  changed_.SignalAll();
  if (entry->job.restarts_size() > 0 && entry->job.generation() == generation) {
    const v1::Restart& last = entry->job.restarts(entry->job.restarts_size() - 1);
    if (!last.recovered() && last.generation() < generation &&
        (entry->job.state() == v1::RUNNING || entry->job.state() == v1::SCHEDULED)) {
      RecordRecoveryLocked(*entry, stored);
    }
  }
  return absl::OkStatus();
}

void JobManager::RecordRecoveryLocked(JobEntry& entry, const v1::JobProgress& progress) {
  const absl::Time now = clock_.Now();
  v1::Job updated = entry.job;
  v1::Restart& r = *updated.mutable_restarts(updated.restarts_size() - 1);
  const absl::Time failed = absl::FromUnixMillis(r.failed_unix_ms());
  const absl::Time detected = absl::FromUnixMillis(r.detected_unix_ms());
  absl::Time placed = LastEventTime(updated, v1::SCHEDULED);
  absl::Time running = LastEventTime(updated, v1::RUNNING);
  if (placed < detected) placed = detected;
  if (running < placed) running = now;
  auto seconds = [](absl::Time from, absl::Time to) {
    return std::max(0.0, absl::ToDoubleSeconds(to - from));
  };
  r.set_recovered(true);
  r.set_recovered_unix_ms(absl::ToUnixMillis(now));
  r.set_resumed_step(progress.attempt_start_step());
  r.set_steps_lost(std::max<int64_t>(0, r.last_step() - progress.attempt_start_step()));
  r.set_recovery_seconds(seconds(detected, now));
  r.set_detection_seconds(seconds(failed, detected));
  r.set_scheduling_seconds(seconds(detected, placed));
  r.set_start_seconds(seconds(placed, running));
  r.set_rendezvous_seconds(std::max(0.0, progress.rendezvous_seconds()));
  r.set_checkpoint_load_seconds(std::max(0.0, progress.checkpoint_load_seconds()));
  r.set_first_step_seconds(std::max(0.0, r.recovery_seconds() - r.scheduling_seconds() -
                                             r.start_seconds() - r.rendezvous_seconds() -
                                             r.checkpoint_load_seconds()));
  v1::JobEvent event;
  event.set_time_unix_ms(absl::ToUnixMillis(now));
  event.set_from(updated.state());
  event.set_to(updated.state());
  event.set_reason(absl::StrFormat(
      "recovered from %s: attempt %d resumed at step %d, %d steps lost, first step %.1fs after "
      "detection (detection %.1fs, scheduling %.1fs, start %.1fs, rendezvous %.1fs, checkpoint "
      "load %.1fs, first step %.1fs)",
      RestartReasonName(r.reason()), updated.generation(), r.resumed_step(), r.steps_lost(),
      r.recovery_seconds(), r.detection_seconds(), r.scheduling_seconds(), r.start_seconds(),
      r.rendezvous_seconds(), r.checkpoint_load_seconds(), r.first_step_seconds()));
  *updated.add_events() = event;
  const v1::Restart recovered = r;
  if (absl::Status s = CommitLocked(entry, std::move(updated), {event}, {}); !s.ok()) {
    return;  // the next report tries again
  }
  LogInfo("job ", entry.job.id(), ": ", event.reason());
  if (options_.event_sink != nullptr) options_.event_sink->OnRecovered(entry.job, recovered);
}

absl::StatusOr<std::vector<std::string>> JobManager::CommitCheckpoint(
    const v1::CommitCheckpointRequest& request) {
  if (request.step() < 0) return absl::InvalidArgumentError("step: must be >= 0");
  if (request.uri().empty()) return absl::InvalidArgumentError("uri: required");
  absl::MutexLock lock(&mu_);
  absl::StatusOr<JobEntry*> fenced = FencedLocked(request.job_id(), request.generation());
  if (!fenced.ok()) return fenced.status();
  JobEntry& entry = **fenced;
  // Retention later hands this URI back for deletion: it must be the job's own step folder.
  const std::string expected_uri =
      JoinUri(entry.job.checkpoint_uri(), absl::StrFormat("step-%012d", request.step()));
  if (request.uri() != expected_uri) {
    return absl::InvalidArgumentError(absl::StrCat("uri: '", request.uri(), "' is not step ",
                                                   request.step(), "'s folder ", expected_uri));
  }
  StoredCheckpoint added;
  added.checkpoint.set_job_id(entry.job.id());
  added.checkpoint.set_step(request.step());
  added.checkpoint.set_uri(request.uri());
  added.checkpoint.set_size_bytes(request.size_bytes());
  added.checkpoint.set_created_unix_ms(absl::ToUnixMillis(clock_.Now()));
  added.checkpoint.set_generation(request.generation());
  CheckpointCommitPlan plan = PlanCheckpointCommit(
      entry.checkpoints, added, entry.job.spec().checkpoint().keep_last(), request.keep_last());
  if (plan.retry) return plan.retired;
  StoreMutation extra;
  extra.checkpoints = std::move(plan.upserts);
  extra.removed_checkpoints = std::move(plan.removals);
  v1::Job updated = entry.job;
  updated.set_committed_step(std::max(updated.committed_step(), request.step()));
  updated.set_updated_unix_ms(absl::ToUnixMillis(clock_.Now()));
  if (absl::Status s = CommitLocked(entry, std::move(updated), {}, {}, std::move(extra)); !s.ok()) {
    return s;
  }
  entry.checkpoints = std::move(plan.records);
  if (options_.event_sink != nullptr) {
    options_.event_sink->OnCheckpointCommitted(
        entry.job.id(), request.step(), clock_.Now(),
        request.save_started_unix_ms() > 0 ? absl::FromUnixMillis(request.save_started_unix_ms())
                                           : absl::InfinitePast());
  }
  return plan.retired;
}

absl::Status JobManager::ReportModel(absl::string_view job_id, int64_t generation,
                                     absl::string_view uri) {
  if (uri.empty()) return absl::InvalidArgumentError("uri: required");
  absl::MutexLock lock(&mu_);
  absl::StatusOr<JobEntry*> fenced = FencedLocked(job_id, generation);
  if (!fenced.ok()) return fenced.status();
  v1::Job updated = (*fenced)->job;
  updated.set_model_uri(std::string(uri));
  return CommitLocked(**fenced, std::move(updated), {}, {});
}

absl::Status JobManager::ReportEvent(absl::string_view job_id, int64_t generation,
                                     absl::string_view message) {
  if (message.empty()) return absl::InvalidArgumentError("message: required");
  absl::MutexLock lock(&mu_);
  absl::StatusOr<JobEntry*> fenced = FencedLocked(job_id, generation);
  if (!fenced.ok()) return fenced.status();
  v1::Job updated = (*fenced)->job;
  v1::JobEvent event;
  event.set_time_unix_ms(absl::ToUnixMillis(clock_.Now()));
  event.set_from(updated.state());
  event.set_to(updated.state());
  event.set_reason(absl::StrCat("warning: ", message.substr(0, 1024)));
  *updated.add_events() = event;
  updated.set_updated_unix_ms(event.time_unix_ms());
  LogWarning("job ", job_id, ": ", event.reason());
  return CommitLocked(**fenced, std::move(updated), {event}, {});
}

absl::Status JobManager::ReportPreemption(const v1::ReportPreemptionRequest& request) {
  if (request.worker_id().empty()) return absl::InvalidArgumentError("worker_id: required");
  absl::MutexLock lock(&mu_);
  const WorkerRecord* record = workers_.Find(request.worker_id());
  if (record == nullptr) {
    return absl::NotFoundError(absl::StrCat("worker '", request.worker_id(), "' unknown"));
  }
  if (record->info.state() == v1::LOST) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker '", request.worker_id(), "' is LOST: register again"));
  }
  const absl::Time now = clock_.Now();
  // A deadline in the past or absent still asks for the fastest stop.
  const int64_t deadline_ms = std::max<int64_t>(request.deadline_unix_ms(), absl::ToUnixMillis(now));
  // DRAINING and the stop deadlines of every rank on the worker are one transaction.
  BeginUnitLocked();
  if (record->info.state() != v1::DRAINING) {
    SaveWorkerLocked(request.worker_id());
    workers_.SetState(request.worker_id(), v1::DRAINING).IgnoreError();  // known: found above
    ClusterChangedLocked();
    PersistWorkerLocked(request.worker_id()).IgnoreError();  // deferred to EndUnitLocked
    AfterCommitLocked([id = request.worker_id(), source = request.source(),
                       left = absl::FromUnixMillis(deadline_ms) - now] {
      LogWarning("worker ", id, " is being preempted (", source, "): DRAINING, deadline in ",
                 absl::FormatDuration(absl::Trunc(left, absl::Milliseconds(100))));
    });
  }
  std::set<std::string> job_ids;
  for (const auto& [entry, task] : ActiveTasksLocked(request.worker_id())) {
    job_ids.insert(entry->job.id());
  }
  const std::string source = request.source().empty() ? "notice" : request.source();
  for (const std::string& job_id : job_ids) {
    JobEntry* entry = FindLocked(job_id);
    if (entry == nullptr) continue;
    v1::Job updated = entry->job;
    std::vector<std::string> changed;
    for (v1::TaskInfo& t : *updated.mutable_tasks()) {
      if (t.generation() != updated.generation() || TaskEnded(t.state()) ||
          t.stop_deadline_unix_ms() > 0) {
        continue;
      }
      t.set_stop_deadline_unix_ms(deadline_ms);
      changed.push_back(t.task_id());
    }
    if (changed.empty()) continue;  // asked already
    v1::JobEvent event;
    event.set_time_unix_ms(absl::ToUnixMillis(now));
    event.set_from(updated.state());
    event.set_to(updated.state());
    std::string message = request.message().substr(0, 256);
    event.set_reason(absl::StrFormat(
        "preemption notice for worker %s (%s%s%s): every rank saves at the next step they agree "
        "on and stops within %.1fs; the job then restarts elsewhere",
        request.worker_id(), source, message.empty() ? "" : ": ", message,
        absl::ToDoubleSeconds(absl::FromUnixMillis(deadline_ms) - now)));
    *updated.add_events() = event;
    updated.set_updated_unix_ms(event.time_unix_ms());
    CommitLocked(*entry, std::move(updated), {event}, changed).IgnoreError();  // deferred
    entry->preemption_notice = absl::StrCat("worker ", request.worker_id(), " (", source, ")");
    // The tasks' stop deadlines must reach their workers: wake their long polls.
    for (const v1::TaskInfo& t : entry->job.tasks()) {
      if (t.stop_deadline_unix_ms() == deadline_ms && IsActiveTask(*entry, t)) {
        workers_.BumpVersion(t.worker_id());
        WakeWorkerLocked(t.worker_id());
      }
    }
    AfterCommitLocked([job_id, reason = event.reason()] { LogInfo("job ", job_id, ": ", reason); });
  }
  if (absl::Status s = EndUnitLocked(); !s.ok()) return s;
  RequestTickLocked();
  changed_.SignalAll();
  return absl::OkStatus();
}

absl::Status JobManager::RendezvousSet(absl::string_view job_id, int64_t generation,
                                       absl::string_view key, std::string value) {
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<JobEntry*> fenced = FencedLocked(job_id, generation);
    if (!fenced.ok()) return fenced.status();
  }
  // An attempt that ends between the check and the call is refused by the store itself.
  return rendezvous_.Set(job_id, generation, key, std::move(value));
}

absl::StatusOr<std::string> JobManager::RendezvousGet(absl::string_view job_id, int64_t generation,
                                                      absl::string_view key, absl::Duration wait) {
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<JobEntry*> fenced = FencedLocked(job_id, generation);
    if (!fenced.ok()) return fenced.status();
  }
  return rendezvous_.Get(job_id, generation, key, std::min(wait, options_.max_rendezvous_wait));
}

ClusterMetricsSnapshot JobManager::MetricsSnapshot() const {
  absl::MutexLock lock(&mu_);
  ClusterMetricsSnapshot snap;
  snap.now = clock_.Now();
  for (const auto& [state, n] : table_.counts()) snap.jobs_by_state[state] = n;
  const std::map<std::string, WorkerUsage> used = UsedCapacityLocked();
  for (const WorkerRecord* record : workers_.All()) {
    snap.workers_by_state[record->info.state()]++;
    if (record->info.state() == v1::READY) {
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

// ---- Background ----

void JobManager::Tick() {
  std::vector<std::string> removed;
  {
    absl::MutexLock lock(&mu_);
    tick_requested_ = false;
    ExpireWorkersLocked();
    RestartLostOrStalledLocked();
    EnforceRuntimeLocked();
    ScheduleLocked();
    removed = ForgetExpiredLocked();
  }
  for (const std::string& id : removed) {
    if (absl::Status s = logs_->RemoveJob(id); !s.ok()) {
      LogWarning("job ", id, ": logs not removed: ", s.ToString());
    }
  }
}

std::vector<std::string> JobManager::ForgetExpiredLocked() {
  // A batch at a time: a coordinator that was down for long catches up over a few ticks without
  // holding the lock for one long transaction.
  constexpr int kBatch = 500;
  const absl::Time now = clock_.Now();
  StoreMutation m;
  std::vector<int64_t> seqs;
  if (options_.job_retention != absl::InfiniteDuration()) {
    const int64_t cutoff_ms = absl::ToUnixMillis(now - options_.job_retention);
    for (auto it = table_.finished().begin();
         it != table_.finished().end() && it->first <= cutoff_ms &&
         static_cast<int>(seqs.size()) < kBatch;
         ++it) {
      if (table_.stopping().count(it->second)) continue;  // its trainers may still be stopping
      const JobEntry* entry = table_.FindBySeq(it->second);
      if (entry == nullptr) continue;
      seqs.push_back(it->second);
      m.removed_jobs.push_back(entry->job.id());
    }
  }
  for (const WorkerRecord* w : workers_.All()) {
    if (w->info.state() == v1::LOST &&
        now - absl::FromUnixMillis(w->info.last_seen_unix_ms()) >= options_.lost_worker_retention) {
      m.removed_workers.push_back(w->info.id());
    }
  }
  if (m.empty()) return {};
  if (absl::Status s = committer_.Apply(m); !s.ok()) {
    LogWarning("removing expired jobs and workers: ", s.ToString(), " (tried again later)");
    return {};
  }
  for (const std::string& id : m.removed_workers) {
    workers_.Remove(id);
    WakeWorkerLocked(id);
    worker_wakeups_.erase(id);
    LogInfo("worker ", id, " forgotten: LOST for ",
            absl::FormatDuration(options_.lost_worker_retention));
  }
  for (size_t i = 0; i < seqs.size(); ++i) {
    rendezvous_.Forget(m.removed_jobs[i]);
    table_.Remove(m.removed_jobs[i]);
  }
  if (!m.removed_jobs.empty()) {
    LogInfo("removed ", m.removed_jobs.size(), " jobs finished more than ",
            absl::FormatDuration(options_.job_retention), " ago");
    changed_.SignalAll();
  }
  return m.removed_jobs;
}

bool JobManager::WaitForTickRequest(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  const absl::Time deadline = absl::Now() + timeout;
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

void JobManager::ExpireWorkersLocked() {
  const std::vector<std::string> lost = workers_.ExpireLeases();
  for (const std::string& id : lost) WakeWorkerLocked(id);  // told to register again
  if (!lost.empty()) ClusterChangedLocked();
  for (const std::string& worker_id : lost) {
    if (absl::Status s = PersistWorkerLocked(worker_id); !s.ok()) {
      LogError("worker ", worker_id, ": persisting LOST failed: ", s.ToString());
    }
    LogWarning("worker ", worker_id, " lost: no heartbeat for ",
               absl::FormatDuration(options_.worker_timeout));
    if (options_.event_sink != nullptr) options_.event_sink->OnWorkerLost(worker_id);
  }
  // The jobs with ranks there restart in RestartLostOrStalledLocked, which looks at the state
  // rather than at this edge, so a failed write is retried on the next tick.
  if (!lost.empty()) changed_.SignalAll();
}

void JobManager::RestartLostOrStalledLocked() {
  const absl::Time now = clock_.Now();
  std::vector<std::pair<std::string, AttemptEnd>> ends;
  std::vector<std::string> restarting;
  for (int64_t seq : table_.attempts()) {
    JobEntry& entry = *table_.FindBySeq(seq);
    const v1::Job& job = entry.job;
    if (job.state() == v1::RESTARTING) {
      restarting.push_back(job.id());
      continue;
    }
    if (job.state() != v1::SCHEDULED && job.state() != v1::RUNNING) continue;
    std::optional<AttemptEnd> end;
    for (const v1::TaskInfo& t : job.tasks()) {
      if (!IsActiveTask(entry, t)) continue;
      const WorkerRecord* worker = workers_.Find(t.worker_id());
      if (worker != nullptr && worker->info.state() != v1::LOST) continue;
      AttemptEnd lost;
      lost.reason = t.stop_deadline_unix_ms() > 0 ? v1::PREEMPTED : v1::WORKER_LOST;
      lost.message =
          absl::StrCat(TaskName(t), " lost: worker ", t.worker_id(),
                       worker == nullptr ? " is unknown" : " lost (no heartbeat for ",
                       worker == nullptr ? "" : absl::FormatDuration(options_.worker_timeout),
                       worker == nullptr ? "" : ")");
      lost.failed = worker == nullptr ? now : absl::FromUnixMillis(worker->info.last_seen_unix_ms());
      end = std::move(lost);
      break;
    }
    if (!end.has_value() && now - entry.attempt_placed >= options_.start_timeout) {
      // Ranks an agent never started (a broken agent, a trainer that cannot be launched) would
      // keep the job SCHEDULED, or its started ranks waiting at the rendezvous, forever.
      std::vector<std::string> starting;
      for (const v1::TaskInfo& t : job.tasks()) {
        if (IsActiveTask(entry, t) && t.state() == v1::TASK_STARTING) {
          starting.push_back(absl::StrCat(TaskName(t), " on ", t.worker_id()));
        }
      }
      if (!starting.empty()) {
        AttemptEnd stuck;
        stuck.reason = v1::INFRASTRUCTURE;
        stuck.message =
            absl::StrCat(absl::StrJoin(starting, ", "), " did not start within ",
                         absl::FormatDuration(options_.start_timeout), " (--start_timeout)");
        stuck.failed = now;
        end = std::move(stuck);
      }
    }
    if (!end.has_value() && job.state() == v1::RUNNING) {
      const int64_t stall_s = job.spec().stall_timeout_seconds() > 0
                                  ? job.spec().stall_timeout_seconds()
                                  : kDefaultStallTimeoutSeconds;
      const absl::Duration stall = absl::Seconds(stall_s);
      if (entry.last_step_change != absl::InfinitePast() && now - entry.last_step_change >= stall) {
        AttemptEnd hang;
        hang.reason = v1::HANG;
        hang.message = absl::StrCat("no step progress for ", absl::FormatDuration(stall),
                                    " (stall_timeout; last step ", std::max<int64_t>(entry.last_step_seen, 0),
                                    ")");
        hang.failed = entry.last_step_change;
        end = std::move(hang);
      }
    }
    if (end.has_value()) ends.emplace_back(job.id(), *std::move(end));
  }
  for (auto& [job_id, end] : ends) {
    JobEntry* entry = FindLocked(job_id);
    if (entry == nullptr) continue;
    EndAttemptLocked(*entry, entry->job, std::move(end), {}).IgnoreError();
  }
  for (const std::string& job_id : restarting) {
    JobEntry* entry = FindLocked(job_id);
    if (entry != nullptr) MaybeFinishRestartLocked(*entry);
  }
}

absl::Status JobManager::EndAttemptLocked(JobEntry& entry, v1::Job updated, AttemptEnd end,
                                          const std::vector<std::string>& changed_task_ids) {
  if (end.reason == v1::PREEMPTED && !entry.preemption_notice.empty()) {
    end.message = absl::StrCat("preemption notice for ", entry.preemption_notice, ": ", end.message);
  }
  if (std::optional<std::string> spent = BudgetSpent(updated, end.reason, 1); spent.has_value()) {
    return TransitionLocked(entry, std::move(updated), v1::FAILED, end.message + *spent,
                            changed_task_ids);
  }
  const absl::Time now = clock_.Now();
  v1::Restart* r = updated.add_restarts();
  r->set_generation(updated.generation());
  r->set_reason(end.reason);
  r->set_message(end.message);
  r->set_failed_unix_ms(absl::ToUnixMillis(std::min(end.failed, now)));
  r->set_detected_unix_ms(absl::ToUnixMillis(now));
  r->set_last_step(std::max<int64_t>(updated.progress().step(), 0));
  const std::string reason = absl::StrCat("restarting (", RestartReasonName(end.reason), "): ",
                                          end.message);
  if (absl::Status s =
          TransitionLocked(entry, std::move(updated), v1::RESTARTING, reason, changed_task_ids);
      !s.ok()) {
    return s;
  }
  entry.restarting_since = now;
  entry.preemption_notice.clear();
  // Ranks still waiting to meet must not wait for peers that are being stopped.
  AfterCommitLocked([this, id = entry.job.id(), generation = entry.job.generation()] {
    rendezvous_.EndAttempts(id, generation);
  });
  RequestTickLocked();
  MaybeFinishRestartLocked(entry);
  return absl::OkStatus();
}

void JobManager::MaybeFinishRestartLocked(JobEntry& entry) {
  if (entry.job.state() != v1::RESTARTING || entry.job.restarts_size() == 0) return;
  const absl::Time now = clock_.Now();
  const v1::Restart& current = entry.job.restarts(entry.job.restarts_size() - 1);
  bool stopped = true;
  const v1::TaskInfo* lost = nullptr;  // a rank on a vanished worker
  const WorkerRecord* lost_worker = nullptr;
  for (const v1::TaskInfo& t : entry.job.tasks()) {
    if (t.generation() != entry.job.generation() || TaskEnded(t.state())) continue;
    const WorkerRecord* worker = workers_.Find(t.worker_id());
    if (worker == nullptr || worker->info.state() == v1::LOST) {
      if (lost == nullptr) {
        lost = &t;
        lost_worker = worker;
      }
      continue;
    }
    stopped = false;
  }
  // A rank on a vanished worker names the cause better than the errors of its peers.
  const bool relabel = lost != nullptr && CauseRank(current.reason()) < CauseRank(v1::WORKER_LOST);
  const bool waiting = !stopped && now - entry.restarting_since < options_.restart_stop_hold;
  if (waiting && !relabel) return;
  v1::Job updated = entry.job;
  v1::Restart& r = *updated.mutable_restarts(updated.restarts_size() - 1);
  if (relabel) {
    r.set_reason(lost->stop_deadline_unix_ms() > 0 ? v1::PREEMPTED : v1::WORKER_LOST);
    r.set_message(absl::StrCat(TaskName(*lost), " lost: worker ", lost->worker_id(), " lost"));
    // The cause is known only now, when the lease ran out; it happened by the last heartbeat at
    // the latest.
    if (lost_worker != nullptr) {
      r.set_failed_unix_ms(std::min(r.failed_unix_ms(), lost_worker->info.last_seen_unix_ms()));
    }
    r.set_detected_unix_ms(absl::ToUnixMillis(now));
  }
  if (waiting) {
    // Recorded now, so that the detection time is when the cause was found.
    CommitLocked(entry, std::move(updated), {}, {}).IgnoreError();
    return;
  }
  // The cause may have changed kind while the old ranks stopped.
  if (std::optional<std::string> spent = BudgetSpent(updated, r.reason(), 0); spent.has_value()) {
    const std::string reason = r.message() + *spent;
    TransitionLocked(entry, std::move(updated), v1::FAILED, reason, {}).IgnoreError();
    return;
  }
  // Restarts in a row whose attempt never got to a step back off further and further.
  const absl::Duration delay =
      RestartBackoff(updated, options_.restart_backoff, options_.restart_backoff_max,
                     absl::Uniform(jitter_, 0.5, 1.0));
  r.set_backoff_ms(absl::ToInt64Milliseconds(delay));
  updated.set_next_attempt_unix_ms(absl::ToUnixMillis(now + delay));
  const std::string reason =
      delay > absl::ZeroDuration()
          ? absl::StrCat("restart ", updated.restarts_size(), " (", RestartReasonName(r.reason()),
                         "): next attempt in ", absl::FormatDuration(delay), " (backoff)")
          : absl::StrCat("restart ", updated.restarts_size(), " (", RestartReasonName(r.reason()),
                         "): ready for the next attempt");
  TransitionLocked(entry, std::move(updated), v1::PENDING, reason, {}).IgnoreError();
}

void JobManager::EnforceRuntimeLocked() {
  const int64_t now_ms = absl::ToUnixMillis(clock_.Now());
  std::vector<std::string> over;
  for (int64_t seq : table_.attempts()) {
    const JobEntry* entry = table_.FindBySeq(seq);
    if (entry == nullptr) continue;
    const int64_t limit_s = entry->job.spec().max_runtime_seconds();
    const int64_t started = entry->job.started_unix_ms();
    // Time spent restarting or waiting for capacity after a restart counts too.
    if (limit_s <= 0 || started <= 0) continue;
    if (now_ms - started >= limit_s * 1000) over.push_back(entry->job.id());
  }
  for (const std::string& id : over) {
    JobEntry* entry = FindLocked(id);
    const std::string reason =
        absl::StrCat("exceeded max_runtime ",
                     absl::FormatDuration(absl::Seconds(entry->job.spec().max_runtime_seconds())));
    TransitionLocked(*entry, entry->job, v1::FAILED, reason, {}).IgnoreError();
  }
}

SchedJob JobManager::SchedJobLocked(const JobEntry& entry) const {
  SchedJob job;
  job.id = entry.job.id();
  job.priority = entry.job.spec().priority();
  job.seq = entry.seq;
  RankRange(entry.job.spec(), job.min_ranks, job.max_ranks);
  job.batch_size = entry.job.spec().batch_size();
  job.slots_per_rank = SlotsPerRank(entry.job.spec());
  job.gpus_per_rank = GpusPerRank(entry.job.spec());
  job.shards = ShardCount(entry.job.spec());
  job.slots_per_shard = SlotsPerShard(entry.job.spec());
  return job;
}

void JobManager::ClusterChangedLocked() {
  cluster_epoch_++;
  schedule_all_ = true;
}

void JobManager::ScheduleLocked() {
  const absl::Time now = clock_.Now();
  if (parked_epoch_ != cluster_epoch_) {
    table_.UnparkAll();
    parked_epoch_ = cluster_epoch_;
    schedule_all_ = true;
  }
  const bool timed = now >= next_full_schedule_;
  if (!schedule_all_ && !timed && new_pending_.empty()) return;
  std::vector<SchedWorker> workers;
  std::map<std::string, WorkerUsage> used = UsedCapacityLocked();
  for (const WorkerRecord* record : workers_.All()) {
    SchedWorker w;
    w.id = record->info.id();
    w.ready = record->info.state() == v1::READY;
    w.total_slots = record->info.slots();
    w.total_gpus = record->info.gpus();
    w.free_slots = w.total_slots - used[w.id].slots;
    w.free_gpus = w.total_gpus - used[w.id].gpus;
    workers.push_back(std::move(w));
  }
  absl::Time next = now + kFullSchedulePeriod;
  const JobEntry* blocker = nullptr;
  if (const JobEntry* b = table_.Find(schedule_blocker_);
      b != nullptr && table_.pending().count(JobTable::KeyOf(*b))) {
    blocker = b;
  }
  // The queue in order; with `stop_at_blocker`, only up to the job that blocked it last time,
  // and the new submissions behind it.
  auto queue = [&](bool stop_at_blocker) {
    std::vector<SchedJob> jobs;
    auto add = [&](const JobEntry& entry) {
      const absl::Time not_before = absl::FromUnixMillis(entry.job.next_attempt_unix_ms());
      if (not_before > now) {
        next = std::min(next, not_before);  // a restart's backoff ends
        return;
      }
      jobs.push_back(SchedJobLocked(entry));
    };
    const std::map<QueueKey, JobEntry*>& pending = table_.pending();
    for (const auto& [key, entry] : pending) {
      add(*entry);
      if (stop_at_blocker && entry == blocker) {
        for (auto n = new_pending_.upper_bound(key); n != new_pending_.end(); ++n) {
          if (auto p = pending.find(*n); p != pending.end()) add(*p->second);
        }
        break;
      }
    }
    return jobs;
  };
  ScheduleDecision decision = Schedule(queue(blocker != nullptr), workers);
  if (blocker != nullptr) {
    // The blocker was placed or another job went before it: what waits behind it may move.
    auto reason = decision.pending_reasons.find(blocker->job.id());
    if (!decision.placements.empty() || reason == decision.pending_reasons.end() ||
        !absl::StartsWith(reason->second, "waiting for capacity")) {
      decision = Schedule(queue(false), workers);
    }
  }
  // Capacity held by stopping ranks comes free by itself after kStoppingHold.
  for (int64_t seq : table_.attempts()) {
    const JobEntry* entry = table_.FindBySeq(seq);
    if (entry != nullptr && entry->restarting_since + kStoppingHold > now) {
      next = std::min(next, entry->restarting_since + kStoppingHold);
    }
  }
  // Ended jobs whose trainers all reported gone (or past the hold) no longer hold anything.
  std::vector<int64_t> stopped;
  for (int64_t seq : table_.stopping()) {
    const JobEntry* entry = table_.FindBySeq(seq);
    bool holding = false;
    if (entry != nullptr && now - entry->ended < kStoppingHold) {
      for (const v1::TaskInfo& t : entry->job.tasks()) {
        if (t.generation() == entry->job.generation() && !TaskEnded(t.state())) holding = true;
      }
    }
    if (holding) {
      next = std::min(next, entry->ended + kStoppingHold);
    } else {
      stopped.push_back(seq);
    }
  }
  for (int64_t seq : stopped) table_.StoppedHolding(seq);
  schedule_all_ = false;
  next_full_schedule_ = next;
  new_pending_.clear();
  // Jobs that cannot run on this cluster wait, out of the passes, until it changes.
  for (const std::string& id : decision.unfit) {
    if (const JobEntry* entry = table_.Find(id); entry != nullptr) {
      table_.Park(JobTable::KeyOf(*entry));
    }
  }
  schedule_blocker_.clear();
  for (const Placement& placement : decision.placements) {
    JobEntry* entry = FindLocked(placement.job_id);
    if (entry == nullptr) continue;
    v1::Job updated = entry->job;
    const int64_t generation = updated.generation() + 1;
    updated.set_generation(generation);
    std::vector<std::string> changed;
    for (int rank = 0; rank < static_cast<int>(placement.rank_workers.size()); ++rank) {
      v1::TaskInfo* task = updated.add_tasks();
      task->set_task_id(TaskId(updated.id(), generation, rank));
      task->set_rank(rank);
      task->set_worker_id(placement.rank_workers[rank]);
      task->set_state(v1::TASK_STARTING);
      task->set_generation(generation);
      changed.push_back(task->task_id());
    }
    for (int shard = 0; shard < static_cast<int>(placement.shard_workers.size()); ++shard) {
      v1::TaskInfo* task = updated.add_tasks();
      task->set_task_id(ShardTaskId(updated.id(), generation, shard));
      task->set_role(v1::TASK_ROLE_SHARD);
      task->set_shard(shard);
      task->set_worker_id(placement.shard_workers[shard]);
      task->set_state(v1::TASK_STARTING);
      task->set_generation(generation);
      changed.push_back(task->task_id());
    }
    std::string reason = absl::StrCat("placed on ", absl::StrJoin(placement.rank_workers, ", "));
    if (!placement.shard_workers.empty()) {
      absl::StrAppend(&reason, "; parameter-server shards on ",
                      absl::StrJoin(placement.shard_workers, ", "));
    }
    if (TransitionLocked(*entry, std::move(updated), v1::SCHEDULED, reason, changed).ok()) {
      entry->attempt_placed = clock_.Now();
    }
    // Ranks of an earlier attempt must not meet the new ones.
    rendezvous_.EndAttempts(placement.job_id, generation - 1);
  }
  // Only the reason changed: derived again by every pass, it is shown but not written (a change
  // at the head of a long queue would otherwise rewrite every queued job), and gets no event,
  // so that a waiting job does not flood its history.
  bool reasons_changed = false;
  for (const auto& [job_id, reason] : decision.pending_reasons) {
    JobEntry* entry = FindLocked(job_id);
    if (entry == nullptr) continue;
    if (schedule_blocker_.empty() && absl::StartsWith(reason, "waiting for capacity")) {
      schedule_blocker_ = job_id;
    }
    if (entry->job.reason() == reason) continue;
    entry->job.set_reason(reason);
    entry->version++;
    reasons_changed = true;
  }
  if (reasons_changed) changed_.SignalAll();
}

}  // namespace trainyard
