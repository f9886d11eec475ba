// The JobManager's front: its state, how changes are written and applied, and JobService.

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
#include "server/job_manager_internal.h"
#include "server/job_state.h"
#include "server/restart_policy.h"
#include "server/scheduler.h"

namespace trainyard {

using job_manager_internal::IsShard;
using job_manager_internal::kDefaultPageSize;
using job_manager_internal::kFinalLogGrace;
using job_manager_internal::kLogChunkBytes;
using job_manager_internal::kMaxPageSize;
using job_manager_internal::kPageTokenPrefix;
using job_manager_internal::kStoppingHold;
using job_manager_internal::kStreamPoll;

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
  // Finished jobs stay in the store (counted), unless their trainers may still be stopping.
  absl::StatusOr<StoreContents> contents = store_->LoadActive();
  if (!contents.ok()) return contents.status();
  absl::MutexLock lock(&mu_);
  next_seq_ = std::max<int64_t>(contents->next_job_seq, 1);
  for (const auto& [state, n] : contents->not_loaded) {
    table_.CountStored(state, static_cast<int>(n));
  }
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

absl::StatusOr<v1::Job> JobManager::SubmitJobYaml(absl::string_view spec_yaml,
                                                  const Principal* by) {
  if (static_cast<int64_t>(spec_yaml.size()) > options_.max_spec_yaml_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("spec_yaml: ", spec_yaml.size(),
                                                   " bytes is over the limit of ",
                                                   options_.max_spec_yaml_bytes));
  }
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(spec_yaml);
  if (!spec.ok()) return spec.status();
  return SubmitValidated(*std::move(spec), by);
}

absl::StatusOr<v1::Job> JobManager::SubmitJob(v1::JobSpec spec, const Principal* by,
                                              const SubmitOptions& options) {
  ApplyJobSpecDefaults(spec);
  if (absl::Status s = ValidateJobSpec(spec); !s.ok()) return s;
  return SubmitValidated(std::move(spec), by, options);
}

absl::StatusOr<std::string> JobManager::JobOwner(absl::string_view id) const {
  {
    absl::MutexLock lock(&mu_);
    if (const JobEntry* entry = FindLocked(id); entry != nullptr) return entry->job.owner();
  }
  absl::StatusOr<StoredJobRecord> record = LoadEvicted(id);
  if (!record.ok()) return record.status();
  return record->job.job.owner();
}

absl::StatusOr<v1::Job> JobManager::SubmitValidated(v1::JobSpec spec, const Principal* by,
                                                    const SubmitOptions& options) {
  if (!IsSafeFileName(spec.name())) {
    return absl::InvalidArgumentError(
        absl::StrCat("name: '", spec.name(), "' must be letters, digits, '.', '_' or '-'"));
  }
  if (options_.allowed_local_paths.has_value()) {
    if (absl::Status s = CheckLocalPaths(spec, *options_.allowed_local_paths); !s.ok()) return s;
  }
  auto taken = [&](absl::string_view what) {
    return absl::AlreadyExistsError(absl::StrCat("job ", options.id, " exists (", what, ")"));
  };
  if (!options.id.empty() && !options.validate_only) {
    // A finished job may be in the store only; one in memory is checked again under the lock.
    absl::StatusOr<StoredJobRecord> stored = LoadEvicted(options.id);
    if (stored.ok()) return taken(JobStateName(stored->job.job.state()));
    if (!absl::IsNotFound(stored.status())) return stored.status();
  }
  v1::Job job;
  int64_t seq = 0;
  std::shared_ptr<GroupCommitter::Ticket> ticket;
  {
    absl::MutexLock lock(&mu_);
    const int active = static_cast<int>(table_.active().size()) + submitting_;
    if (!options.id.empty() && !options.validate_only) {
      if (const JobEntry* entry = FindLocked(options.id); entry != nullptr) {
        return taken(JobStateName(entry->job.state()));
      }
    }
    if (active >= options_.max_active_jobs) {
      return absl::ResourceExhaustedError(absl::StrCat("too many active jobs: ", active, " (limit ",
                                                       options_.max_active_jobs, ")"));
    }
    if (const std::string& from = spec.checkpoint().resume_from(); !from.empty()) {
      absl::StatusOr<const JobEntry*> source = ResumeSourceLocked(from);
      if (absl::IsNotFound(source.status())) {
        return absl::InvalidArgumentError(
            absl::StrCat("checkpoint.resume_from: no job '", from, "'"));
      }
      if (!source.ok()) return source.status();
      if (by != nullptr) {
        if (absl::Status s = AllowJob(*by, from, (*source)->job.owner()); !s.ok()) {
          return absl::PermissionDeniedError(absl::StrCat("checkpoint.resume_from: ", s.message()));
        }
      }
      if (!options.validate_only) pinned_sources_[from]++;  // until the job is added (or fails)
    }
    // The number is taken now; a submission whose write fails leaves a gap.
    seq = options.validate_only ? next_seq_ : next_seq_++;
    const int64_t now_ms = absl::ToUnixMillis(clock_.Now());
    job.set_id(options.id.empty() ? absl::StrCat(spec.name(), "-", seq) : options.id);
    if (!options.trial.search_id().empty()) *job.mutable_trial() = options.trial;
    job.set_name(spec.name());
    job.set_state(v1::PENDING);
    job.set_reason("submitted");
    job.set_generation(0);
    job.set_created_unix_ms(now_ms);
    job.set_updated_unix_ms(now_ms);
    job.set_committed_step(-1);
    if (by != nullptr) job.set_owner(by->name);
    const std::string& base =
        spec.checkpoint().uri().empty() ? options_.checkpoint_root : spec.checkpoint().uri();
    job.set_checkpoint_uri(JoinUri(base, job.id()));
    *job.mutable_spec() = std::move(spec);
    v1::JobEvent* event = job.add_events();
    event->set_time_unix_ms(now_ms);
    event->set_from(v1::JOB_STATE_UNSPECIFIED);
    event->set_to(v1::PENDING);
    event->set_reason(by != nullptr ? absl::StrCat("submitted by ", by->name) : "submitted");
    if (options.validate_only) return job;
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
  if (const std::string& from = job.spec().checkpoint().resume_from(); !from.empty()) {
    if (auto it = pinned_sources_.find(from); it != pinned_sources_.end() && --it->second == 0) {
      pinned_sources_.erase(it);
    }
  }
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
  {
    absl::MutexLock lock(&mu_);
    if (const JobEntry* entry = FindLocked(id); entry != nullptr) return entry->job;
  }
  absl::StatusOr<StoredJobRecord> record = LoadEvicted(id);
  if (!record.ok()) return record.status();
  return std::move(record->job.job);
}

absl::StatusOr<ListJobsResult> JobManager::ListJobs(const std::vector<v1::JobState>& states,
                                                    int page_size, absl::string_view page_token,
                                                    absl::string_view owner) const {
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
  // The jobs in memory, then the finished ones in the store (read without the lock). A job
  // leaves memory only once it is final and written, so each job is in one of the two reads
  // or both (then memory's copy is shown).
  std::map<int64_t, v1::Job, std::greater<>> page;  // newest first
  {
    absl::MutexLock lock(&mu_);
    for (auto it = std::make_reverse_iterator(table_.by_seq().lower_bound(before));
         it != table_.by_seq().rend() && static_cast<int>(page.size()) <= page_size; ++it) {
      const JobEntry* entry = FindLocked(it->second);
      if (entry == nullptr) continue;
      if (!wanted.empty() && !wanted.count(entry->job.state())) continue;
      if (!owner.empty() && entry->job.owner() != owner) continue;
      v1::Job job = entry->job;
      job.clear_events();
      page.emplace(it->first, std::move(job));
    }
  }
  absl::StatusOr<std::vector<StoredJob>> stored =
      store_->ListFinishedJobs(states, before, page_size + 1, owner);
  if (!stored.ok()) return stored.status();
  for (StoredJob& j : *stored) {
    if (!states.empty() && !wanted.count(j.job.state())) continue;
    page.emplace(j.seq, std::move(j.job));  // no-op where memory had it
  }
  ListJobsResult result;
  int64_t last_seq = 0;
  for (auto& [seq, job] : page) {
    if (static_cast<int>(result.jobs.size()) == page_size) {
      result.next_page_token = absl::WebSafeBase64Escape(absl::StrCat(kPageTokenPrefix, last_seq));
      break;
    }
    result.jobs.push_back(std::move(job));
    last_seq = seq;
  }
  return result;
}

absl::StatusOr<v1::Job> JobManager::CancelJob(absl::string_view id, absl::string_view reason,
                                              absl::string_view by) {
  {
    absl::MutexLock lock(&mu_);
    if (JobEntry* entry = FindLocked(id); entry != nullptr) {
      return CancelLocked(*entry, reason, by);
    }
  }
  // Not in memory: a finished job, or none.
  absl::StatusOr<StoredJobRecord> record = LoadEvicted(id);
  if (!record.ok()) return record.status();
  return absl::FailedPreconditionError(
      absl::StrCat("job ", id, " is already ", JobStateName(record->job.job.state())));
}

absl::StatusOr<v1::Job> JobManager::CancelLocked(JobEntry& entry, absl::string_view reason,
                                                 absl::string_view by) {
  if (IsFinalJobState(entry.job.state())) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", entry.job.id(), " is already ", JobStateName(entry.job.state())));
  }
  std::string why = by.empty() ? "cancelled" : absl::StrCat("cancelled by ", by);
  if (!reason.empty()) {
    absl::StrAppend(&why, ": ", reason);
  } else if (by.empty()) {
    why = "cancelled by user";
  }
  if (absl::Status s = TransitionLocked(entry, entry.job, v1::CANCELLED, why, {}); !s.ok()) {
    return s;
  }
  return entry.job;
}

absl::Status JobManager::DeleteJob(absl::string_view id, bool validate_only) {
  {
    absl::MutexLock lock(&mu_);
    v1::JobState state = v1::JOB_STATE_UNSPECIFIED;
    const JobEntry* entry = FindLocked(id);
    if (entry != nullptr) {
      state = entry->job.state();
      if (!IsFinalJobState(state)) {
        return absl::FailedPreconditionError(
            absl::StrCat("job ", id, " is ", JobStateName(state), ": cancel it first"));
      }
      if (table_.stopping().count(entry->seq) ||
          entry->progress_applied != entry->progress_reports) {
        return absl::FailedPreconditionError(absl::StrCat(
            "job ", id, ": its trainers may still be stopping; try again in a minute"));
      }
    } else {
      // Read under the lock, which retention also holds while it removes jobs.
      absl::StatusOr<StoredJobRecord> stored = store_->LoadJob(id);
      if (absl::IsNotFound(stored.status())) {
        return absl::NotFoundError(absl::StrCat("job '", id, "' not found"));
      }
      if (!stored.ok()) return stored.status();
      state = stored->job.job.state();
    }
    if (table_.IsResumedFrom(id) || pinned_sources_.count(id)) {
      std::string follower = "a submission being written";
      for (int64_t seq : table_.active()) {
        const JobEntry* e = table_.FindBySeq(seq);
        if (e->job.spec().checkpoint().resume_from() == id) follower = "job " + e->job.id();
      }
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", id, ": ", follower, " resumes from its checkpoints (checkpoint.resume_from)"));
    }
    if (validate_only) return absl::OkStatus();
    StoreMutation m;
    m.removed_jobs.push_back(std::string(id));
    if (absl::Status s = WriteLocked(std::move(m)); !s.ok()) return s;
    rendezvous_.Forget(id);
    if (entry != nullptr) {
      table_.Remove(id);
    } else {
      table_.CountStored(state, -1);
    }
    changed_.SignalAll();
    LogInfo("job ", id, " deleted on request");
  }
  if (absl::Status s = logs_->RemoveJob(id); !s.ok()) {
    LogWarning("job ", id, ": logs not removed: ", s.ToString());
  }
  return absl::OkStatus();
}

absl::Status JobManager::WatchJob(absl::string_view id,
                                  const std::function<bool(const v1::Job&)>& sink,
                                  const std::function<bool()>& cancelled) {
  uint64_t seen = 0;
  bool first = true;
  while (true) {
    v1::Job copy;
    bool in_memory = true;
    {
      absl::MutexLock lock(&mu_);
      const JobEntry* entry = FindLocked(id);
      while (entry != nullptr && !first && entry->version == seen && !shutdown_ && !cancelled()) {
        changed_.WaitWithTimeout(&mu_, kStreamPoll);
        // Looked up again: a finished job may leave memory while the lock is let go.
        entry = FindLocked(id);
      }
      if (shutdown_) return absl::UnavailableError("coordinator is shutting down");
      if (entry != nullptr && cancelled()) return absl::CancelledError("watch cancelled");
      if (entry != nullptr) {
        copy = entry->job;
        seen = entry->version;
      } else {
        in_memory = false;
      }
    }
    if (!in_memory) {
      // Finished and in the store only (or removed, or never there).
      absl::StatusOr<StoredJobRecord> record = LoadEvicted(id);
      if (!record.ok()) return record.status();
      copy = std::move(record->job.job);
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
    if (IsShutDown()) return absl::UnavailableError("coordinator is shutting down");
    absl::StatusOr<v1::Job> job = GetJob(id);
    if (!job.ok()) return job.status();
    const std::string& job_id = job->id();
    const bool final = IsFinalJobState(job->state());
    std::vector<std::pair<int64_t, v1::TaskInfo>> tasks;  // (generation, task)
    for (const v1::TaskInfo& t : job->tasks()) {
      const bool wanted = selection.shard.has_value()
                              ? IsShard(t) && t.shard() == *selection.shard
                              : rank == -1 || (!IsShard(t) && t.rank() == rank);
      if (wanted) tasks.emplace_back(t.generation(), t);
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
  std::vector<StoredCheckpoint> records;
  bool in_memory = false;
  {
    absl::MutexLock lock(&mu_);
    if (const JobEntry* entry = FindLocked(job_id); entry != nullptr) {
      records = entry->checkpoints;
      in_memory = true;
    }
  }
  if (!in_memory) {
    absl::StatusOr<StoredJobRecord> record = LoadEvicted(job_id);
    if (!record.ok()) return record.status();
    records = std::move(record->checkpoints);
  }
  std::vector<v1::Checkpoint> out;
  for (auto it = records.rbegin(); it != records.rend(); ++it) {
    if (!it->retired) out.push_back(it->checkpoint);
  }
  return out;
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

}  // namespace trainyard
