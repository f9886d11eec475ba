// The JobManager's job service: submitting, reading, listing, cancelling, deleting and
// following jobs, and the views of workers and checkpoints.

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/byte_size.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/restart_reason.h"
#include "common/spec/job_paths.h"
#include "common/spec/job_spec.h"
#include "common/spec/memory_estimate.h"
#include "common/storage/uri.h"
#include "server/auth/auth.h"
#include "server/jobs/capacity.h"
#include "server/jobs/checkpoint_registry.h"
#include "server/jobs/job_manager.h"
#include "server/jobs/job_manager_internal.h"
#include "server/jobs/model_needs.h"
#include "server/jobs/restart_policy.h"
#include "server/lifecycle/job_state.h"
#include "server/scheduling/scheduler.h"

namespace trainyard {

using job_manager_internal::IsShard;
using job_manager_internal::kDefaultPageSize;
using job_manager_internal::kFinalLogGrace;
using job_manager_internal::kLogChunkBytes;
using job_manager_internal::kMaxListScan;
using job_manager_internal::kMaxPageSize;
using job_manager_internal::kPageTokenPrefix;
using job_manager_internal::kStoppingHold;
using job_manager_internal::kStreamPoll;

absl::StatusOr<v1::Job> JobManager::SubmitJobYaml(absl::string_view spec_yaml, const Principal* by,
                                                  const SubmitOptions& options) {
  if (static_cast<int64_t>(spec_yaml.size()) > options_.max_spec_yaml_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("spec_yaml: ", spec_yaml.size(),
                                                   " bytes is over the limit of ",
                                                   options_.max_spec_yaml_bytes));
  }
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(spec_yaml);
  if (!spec.ok()) return spec.status();
  // The job it names is checked by SubmitValidated, as for one the spec names.
  if (!options.resume_from.empty())
    spec->mutable_checkpoint()->set_resume_from(options.resume_from);
  return SubmitValidated(*std::move(spec), by, options);
}

absl::StatusOr<v1::Job> JobManager::SubmitJob(v1::JobSpec spec, const Principal* by,
                                              const SubmitOptions& options) {
  if (!options.resume_from.empty()) {
    spec.mutable_checkpoint()->set_resume_from(options.resume_from);
  }
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

absl::StatusOr<v1::Job> JobManager::GetJob(absl::string_view id) const {
  {
    absl::MutexLock lock(&mu_);
    if (const JobEntry* entry = FindLocked(id); entry != nullptr) return entry->job;
  }
  absl::StatusOr<StoredJobRecord> record = LoadEvicted(id);
  if (!record.ok()) return record.status();
  return std::move(record->job.job);
}

bool JobFilter::Matches(const v1::Job& job) const {
  if (!owner.empty() && job.owner() != owner) return false;
  if (!name_contains.empty() &&
      !absl::StrContains(absl::AsciiStrToLower(job.name()), absl::AsciiStrToLower(name_contains))) {
    return false;
  }
  if (!queue.empty()) {
    const std::string& q = job.spec().queue();
    if (q != queue && !(q.empty() && queue == kDefaultQueue)) return false;
  }
  return true;
}

absl::StatusOr<ListJobsResult> JobManager::ListJobs(const std::vector<v1::JobState>& states,
                                                    int page_size, absl::string_view page_token,
                                                    const JobFilter& filter) const {
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
      if (!filter.Matches(entry->job)) continue;
      v1::Job job = entry->job;
      job.clear_events();
      page.emplace(it->first, std::move(job));
    }
  }
  // The store's finished jobs, read in batches while filters leave the page short; `floor` is
  // where a read cut short by kMaxListScan stopped (jobs below it are for the next page).
  int64_t cursor = before;
  int64_t floor = 0;
  int matched = 0;
  for (int scanned = 0; matched <= page_size;) {
    const int batch = filter.by_content() ? std::max(page_size + 1, 200) : page_size + 1;
    absl::StatusOr<std::vector<StoredJob>> stored =
        store_->ListFinishedJobs(states, cursor, batch, filter.owner);
    if (!stored.ok()) return stored.status();
    for (StoredJob& j : *stored) {
      cursor = std::min(cursor, j.seq);
      if (!states.empty() && !wanted.count(j.job.state())) continue;
      if (!filter.Matches(j.job)) continue;
      ++matched;
      page.emplace(j.seq, std::move(j.job));  // no-op where memory had it
    }
    scanned += static_cast<int>(stored->size());
    if (static_cast<int>(stored->size()) < batch) break;  // the store has no more
    if (scanned >= kMaxListScan && matched <= page_size) {
      floor = cursor;
      break;
    }
  }
  ListJobsResult result;
  int64_t last_seq = 0;
  for (auto& [seq, job] : page) {
    if (seq < floor) break;
    if (static_cast<int>(result.jobs.size()) == page_size) {
      result.next_page_token = absl::WebSafeBase64Escape(absl::StrCat(kPageTokenPrefix, last_seq));
      break;
    }
    result.jobs.push_back(std::move(job));
    last_seq = seq;
  }
  if (floor > 0 && result.next_page_token.empty()) {
    result.next_page_token = absl::WebSafeBase64Escape(absl::StrCat(kPageTokenPrefix, floor));
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
    auto stopping = [&] {
      return table_.stopping().count(entry->seq) > 0 ||
             entry->progress_applied != entry->progress_reports;
    };
    // A job that has just ended: its trainers are seen gone within moments of exiting. On the
    // manager's clock, so that a test decides when the wait runs out.
    const absl::Time wait_until = clock_.Now() + options_.delete_stop_wait;
    while (entry != nullptr && IsFinalJobState(entry->job.state()) && stopping() && !shutdown_) {
      if (clock_.WaitWithDeadline(changed_, mu_, wait_until)) break;
      entry = FindLocked(id);
    }
    if (entry != nullptr) {
      state = entry->job.state();
      if (!IsFinalJobState(state)) {
        return absl::FailedPreconditionError(
            absl::StrCat("job ", id, " is ", JobStateName(state), ": cancel it first"));
      }
      if (stopping()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "job ", id, ": its trainers are still stopping after ",
            absl::FormatDuration(options_.delete_stop_wait), "; try again in a minute"));
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
    // A task the job can never have would give an empty stream forever: say so instead.
    const int ranks = std::max(1, job->spec().workers().max());
    const int shards = job->spec().parameter_servers().shards();
    if (rank >= ranks) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank: job ", job_id, " has ranks 0 to ", ranks - 1, ", not ", rank));
    }
    if (selection.shard.has_value() && *selection.shard >= shards) {
      return absl::InvalidArgumentError(
          shards == 0 ? absl::StrCat("shard: job ", job_id, " has no parameter-server shards")
                      : absl::StrCat("shard: job ", job_id, " has shards 0 to ", shards - 1,
                                     ", not ", *selection.shard));
    }
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
  view.set_draining(record.info.state() == v1::DRAINING);
  view.set_state(workers_.ShownState(record, QuietLimitLocked(), view.mutable_state_reason()));
  auto it = used.find(view.id());
  if (it != used.end()) {
    view.set_slots_used(it->second.slots);
    view.set_gpus_used(it->second.gpus);
    view.set_memory_used_bytes(it->second.memory_bytes);
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

}  // namespace trainyard
