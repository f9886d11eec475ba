// The JobManager's job service: submitting, reading, listing, cancelling, deleting and
// following jobs, and the views of workers and checkpoints.

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/byte_size.h"
#include "common/clock.h"
#include "common/job_paths.h"
#include "common/job_spec.h"
#include "common/log.h"
#include "common/memory_estimate.h"
#include "common/restart_reason.h"
#include "common/uri.h"
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

using job_manager_internal::IsJobIdForm;
using job_manager_internal::IsShard;
using job_manager_internal::kDefaultPageSize;
using job_manager_internal::kFinalLogGrace;
using job_manager_internal::kLogChunkBytes;
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

std::string JobManager::NoWorkerHoldsLocked(const v1::JobSpec& spec,
                                            const v1::MemoryEstimate& estimate) const {
  const WorkerRecord* largest = nullptr;
  for (const WorkerRecord* w : LiveWorkersLocked()) {
    if (w->info.memory_bytes() > 0 &&
        (largest == nullptr || w->info.memory_bytes() > largest->info.memory_bytes())) {
      largest = w;
    }
  }
  if (largest == nullptr) return "";
  const int64_t offered = largest->info.memory_bytes();
  auto check = [&](const char* task, int64_t asked, const char* field,
                   const v1::TaskMemoryEstimate& estimated) -> std::string {
    const std::string where = absl::StrCat("more than any worker offers (the largest, ",
                                           largest->info.id(), ", ", HumanBytes(offered), ")");
    if (asked > offered) {
      return absl::StrCat(field, ": ", HumanBytes(asked), " per ", task, " is ", where);
    }
    if (asked == 0 && estimated.total_bytes() > offered) {
      return absl::StrCat("a ", task, " needs ", DescribeEstimate(estimated), " by estimate, ",
                          where);
    }
    return "";
  };
  // A pipeline with memory per stage: its largest stage's.
  int64_t rank_memory = spec.resources().memory_bytes();
  const char* rank_field = "resources.memory";
  for (int64_t m : spec.pipeline().memory_bytes()) {
    if (m > rank_memory) {
      rank_memory = m;
      rank_field = "pipeline.memory";
    }
  }
  std::string none = check("rank", rank_memory, rank_field, estimate.rank());
  if (none.empty() && estimate.has_shard()) {
    none = check("shard", spec.parameter_servers().memory_bytes(), "parameter_servers.memory",
                 estimate.shard());
  }
  return none;
}

std::string JobManager::CheckpointFolder(const v1::JobSpec& spec, absl::string_view owner,
                                         absl::string_view id) const {
  const std::string& uri = spec.checkpoint().uri();
  const absl::StatusOr<Uri> root = ParseUri(options_.checkpoint_root);
  const absl::StatusOr<Uri> asked = ParseUri(uri);
  const bool at_root = uri.empty() || (root.ok() && asked.ok() && IsWithin(*root, *asked) &&
                                       IsWithin(*asked, *root));
  if (!at_root) return JoinUri(uri, id);
  // Under the coordinator's root, each owner's jobs in a folder of their own.
  if (owner.empty()) return JoinUri(options_.checkpoint_root, id);
  return JoinUri(JoinUri(options_.checkpoint_root, OwnerFolder(owner)), id);
}

absl::Status JobManager::CheckJobSpaces(const v1::JobSpec& spec, const Principal* by) const {
  if (by == nullptr || by->admin()) return absl::OkStatus();
  absl::StatusOr<std::vector<JobLocation>> locations = JobLocations(spec);
  if (!locations.ok()) return locations.status();
  const absl::StatusOr<Uri> root = ParseUri(options_.checkpoint_root);
  const absl::StatusOr<Uri> own =
      ParseUri(JoinUri(options_.checkpoint_root, OwnerFolder(by->name)));
  for (const JobLocation& location : *locations) {
    Uri fixed = location.uri;
    fixed.path = FixedPart(location.uri.path);
    const bool pattern = fixed.path != location.uri.path;
    // The job whose folder holds it: a segment of the path names the job.
    bool in_a_job = false;
    for (absl::string_view segment : absl::StrSplit(fixed.path, '/', absl::SkipEmpty())) {
      if (!IsJobIdForm(segment)) continue;
      v1::Job job;  // its owner, folder and who it is shared with
      {
        absl::MutexLock lock(&mu_);
        if (const JobEntry* entry = FindLocked(segment); entry != nullptr) {
          job.set_owner(entry->job.owner());
          job.set_checkpoint_uri(entry->job.checkpoint_uri());
          *job.mutable_spec()->mutable_checkpoint()->mutable_share_with() =
              entry->job.spec().checkpoint().share_with();
        }
      }
      if (job.checkpoint_uri().empty()) {
        absl::StatusOr<StoredJobRecord> stored = LoadEvicted(segment);
        if (absl::IsNotFound(stored.status())) continue;
        if (!stored.ok()) return stored.status();
        job = std::move(stored->job.job);
      }
      absl::StatusOr<Uri> job_folder = ParseUri(job.checkpoint_uri());
      if (!job_folder.ok() || !IsWithin(fixed, *job_folder)) continue;
      if (location.written) {
        return absl::InvalidArgumentError(absl::StrCat(
            location.field, ": '", location.value, "' is inside the checkpoints of job ", segment));
      }
      if (absl::Status s =
              AllowCheckpoints(*by, segment, job.owner(), job.spec().checkpoint().share_with());
          !s.ok()) {
        return absl::PermissionDeniedError(
            absl::StrCat(location.field, ": '", location.value, "' is in the checkpoints of job ",
                         segment, ", which belongs to another user and is not shared with you"));
      }
      in_a_job = true;
      break;
    }
    // Below the checkpoint root, every folder is an owner's: only the caller's own, or a job's
    // the caller may see; the root itself stands for the caller's own folder when written.
    if (in_a_job || !root.ok() || !own.ok() || IsWithin(fixed, *own)) continue;
    if (location.written) {
      if (IsWithin(fixed, *root) && !IsWithin(*root, fixed)) {
        return absl::PermissionDeniedError(absl::StrCat(
            location.field, ": '", location.value, "' is under the checkpoint root outside ",
            own->ToString(), ", the folder of your jobs' checkpoints"));
      }
      continue;
    }
    if (IsWithin(fixed, *root) || (pattern && IsWithin(*root, fixed))) {
      return absl::PermissionDeniedError(
          absl::StrCat(location.field, ": '", location.value,
                       "' reads the checkpoint root outside your own folder (", own->ToString(),
                       ") and any job you may see"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::Job> JobManager::SubmitValidated(v1::JobSpec spec, const Principal* by,
                                                    const SubmitOptions& options) {
  // The name passed IsValidName (ValidateJobSpec), which also makes it a safe file name for the
  // log store.
  if (options_.allowed_local_paths.has_value()) {
    if (absl::Status s = CheckLocalPaths(spec, *options_.allowed_local_paths); !s.ok()) return s;
  }
  if (absl::Status s = CheckJobSpaces(spec, by); !s.ok()) return s;
  // No data or no model is refused now where this machine can tell, not on the workers.
  absl::StatusOr<std::vector<std::string>> unchecked = CheckLocalFiles(spec);
  if (!unchecked.ok()) return unchecked.status();
  // What its models need of a worker's LibTorch, read where this machine can read them.
  absl::StatusOr<std::optional<v1::ModelNeeds>> needs = ReadModelNeeds(spec, options_.model_stores);
  if (!needs.ok()) return needs.status();
  // What a rank and a shard need in memory: more than the job asks for cannot run.
  const JobMemory memory = EstimateJobMemory(spec, needs->has_value() ? &**needs : nullptr);
  v1::MemoryEstimate estimate;
  *estimate.mutable_rank() = memory.rank.ToProto();
  if (memory.has_shard) *estimate.mutable_shard() = memory.shard.ToProto();
  for (const TaskMemory& stage : memory.stages) *estimate.add_stages() = stage.ToProto();
  // Memory per stage: each stage's own estimate against its own size.
  const v1::PipelineSpec& pipeline = spec.pipeline();
  for (int s = 0; s < pipeline.memory_bytes_size() && s < static_cast<int>(memory.stages.size());
       ++s) {
    if (memory.stages[s].Total() > pipeline.memory_bytes(s)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "pipeline.memory[", s, "]: ", HumanBytes(pipeline.memory_bytes(s)),
          " is less than stage ", s, " needs by estimate: ", DescribeEstimate(estimate.stages(s))));
    }
  }
  if (const int64_t asked = spec.resources().memory_bytes();
      asked > 0 && memory.rank.Total() > asked) {
    return absl::InvalidArgumentError(absl::StrCat(
        "resources.memory: ", HumanBytes(asked),
        " is less than a rank needs by estimate: ", DescribeEstimate(estimate.rank())));
  }
  if (const int64_t asked = spec.parameter_servers().memory_bytes();
      memory.has_shard && asked > 0 && memory.shard.Total() > asked) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parameter_servers.memory: ", HumanBytes(asked),
        " is less than a shard needs by estimate: ", DescribeEstimate(estimate.shard())));
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
        if (absl::Status s = AllowCheckpoints(*by, from, (*source)->job.owner(),
                                              (*source)->job.spec().checkpoint().share_with());
            !s.ok()) {
          return absl::PermissionDeniedError(absl::StrCat("checkpoint.resume_from: ", s.message()));
        }
      }
    }
    if (needs->has_value()) {
      if (std::string none = NoWorkerRuns(**needs, LiveWorkersLocked()); !none.empty()) {
        return absl::FailedPreconditionError(
            absl::StrCat(absl::StrJoin((*needs)->read(), ", "), ": ", none));
      }
    }
    if (std::string none = NoWorkerHoldsLocked(spec, estimate); !none.empty()) {
      return absl::FailedPreconditionError(none);
    }
    if (absl::Status s = AdmitToQueueLocked(spec, by); !s.ok()) return s;
    // Every check passed: the job it resumes from stays in memory until the job is added (or
    // its write fails).
    if (const std::string& from = spec.checkpoint().resume_from();
        !from.empty() && !options.validate_only) {
      pinned_sources_[from]++;
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
    job.set_checkpoint_uri(CheckpointFolder(spec, job.owner(), job.id()));
    *job.mutable_spec() = std::move(spec);
    if (needs->has_value()) *job.mutable_model_needs() = **needs;
    *job.mutable_memory_estimate() = estimate;
    v1::JobEvent* event = job.add_events();
    event->set_time_unix_ms(now_ms);
    event->set_from(v1::JOB_STATE_UNSPECIFIED);
    event->set_to(v1::PENDING);
    event->set_reason(by != nullptr ? absl::StrCat("submitted by ", by->name) : "submitted");
    if (!unchecked->empty()) {
      absl::StrAppend(event->mutable_reason(), "; not checked: ", absl::StrJoin(*unchecked, ", "));
    }
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
