// Submission: where a job may read and write, what it needs in memory, whether the cluster can
// take it, and the job written.

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/byte_size.h"
#include "common/log.h"
#include "common/spec/job_paths.h"
#include "common/spec/memory_estimate.h"
#include "common/storage/uri.h"
#include "server/auth/auth.h"
#include "server/jobs/job_manager.h"
#include "server/jobs/job_manager_internal.h"
#include "server/jobs/model_needs.h"
#include "server/lifecycle/job_state.h"

namespace trainyard {

using job_manager_internal::IsJobIdForm;

namespace {

// What a rank, a shard and each stage need by estimate, checked against what the spec asks for:
// INVALID_ARGUMENT naming the field that is too small.
absl::StatusOr<v1::MemoryEstimate> CheckJobMemory(const v1::JobSpec& spec,
                                                  const std::optional<v1::ModelNeeds>& needs) {
  // A program's needs are its own: nothing here can tell them (resources.memory says them).
  if (spec.has_program()) return v1::MemoryEstimate();
  const JobMemory memory = EstimateJobMemory(spec, needs.has_value() ? &*needs : nullptr);
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
  return estimate;
}

}  // namespace

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

absl::Status JobManager::AdmitLocked(v1::JobSpec& spec, const Principal* by,
                                     const SubmitOptions& options,
                                     const std::optional<v1::ModelNeeds>& needs,
                                     const v1::MemoryEstimate& estimate) {
  const int active = static_cast<int>(table_.active().size()) + submitting_;
  if (!options.id.empty() && !options.validate_only) {
    if (const JobEntry* entry = FindLocked(options.id); entry != nullptr) {
      return absl::AlreadyExistsError(
          absl::StrCat("job ", options.id, " exists (", JobStateName(entry->job.state()), ")"));
    }
  }
  if (active >= options_.max_active_jobs) {
    return absl::ResourceExhaustedError(
        absl::StrCat("too many active jobs: ", active, " (limit ", options_.max_active_jobs, ")"));
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
  if (needs.has_value()) {
    if (std::string none = NoWorkerRuns(*needs, LiveWorkersLocked()); !none.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat(absl::StrJoin(needs->read(), ", "), ": ", none));
    }
  }
  if (std::string none = NoWorkerHoldsLocked(spec, estimate); !none.empty()) {
    return absl::FailedPreconditionError(none);
  }
  return AdmitToQueueLocked(spec, by);
}

v1::Job JobManager::NewJobLocked(v1::JobSpec spec, const Principal* by,
                                 const SubmitOptions& options, int64_t seq) const {
  const int64_t now_ms = absl::ToUnixMillis(clock_.Now());
  v1::Job job;
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
  v1::JobEvent* event = job.add_events();
  event->set_time_unix_ms(now_ms);
  event->set_from(v1::JOB_STATE_UNSPECIFIED);
  event->set_to(v1::PENDING);
  event->set_reason(by != nullptr ? absl::StrCat("submitted by ", by->name) : "submitted");
  return job;
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
  absl::StatusOr<v1::MemoryEstimate> estimate = CheckJobMemory(spec, *needs);
  if (!estimate.ok()) return estimate.status();
  if (!options.id.empty() && !options.validate_only) {
    // A finished job may be in the store only; one in memory is checked again under the lock.
    absl::StatusOr<StoredJobRecord> stored = LoadEvicted(options.id);
    if (stored.ok()) {
      return absl::AlreadyExistsError(absl::StrCat("job ", options.id, " exists (",
                                                   JobStateName(stored->job.job.state()), ")"));
    }
    if (!absl::IsNotFound(stored.status())) return stored.status();
  }
  v1::Job job;
  int64_t seq = 0;
  std::shared_ptr<GroupCommitter::Ticket> ticket;
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = AdmitLocked(spec, by, options, *needs, *estimate); !s.ok()) return s;
    // Every check passed: the job it resumes from stays in memory until the job is added (or
    // its write fails).
    if (const std::string& from = spec.checkpoint().resume_from();
        !from.empty() && !options.validate_only) {
      pinned_sources_[from]++;
    }
    // The number is taken now; a submission whose write fails leaves a gap.
    seq = options.validate_only ? next_seq_ : next_seq_++;
    job = NewJobLocked(std::move(spec), by, options, seq);
    if (needs->has_value()) *job.mutable_model_needs() = **needs;
    *job.mutable_memory_estimate() = *estimate;
    v1::JobEvent* event = job.mutable_events(0);
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

}  // namespace trainyard
