// What agents report: registration, leases and long polls, task statuses and logs (what
// trainers report is in job_manager_reports.cc).

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/byte_size.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/restart_reason.h"
#include "common/rpc/credentials.h"
#include "common/sha256.h"
#include "common/spec/job_spec.h"
#include "common/storage/checkpoint_layout.h"
#include "common/storage/uri.h"
#include "server/jobs/capacity.h"
#include "server/jobs/checkpoint_registry.h"
#include "server/jobs/job_manager.h"
#include "server/jobs/job_manager_internal.h"
#include "server/jobs/restart_policy.h"
#include "server/jobs/task_report.h"
#include "server/lifecycle/job_state.h"
#include "server/scheduling/scheduler.h"

namespace trainyard {

using job_manager_internal::LastEventTime;
using job_manager_internal::RanksOf;
using job_manager_internal::TaskName;

// ---- AgentService ----

absl::Status JobManager::PersistWorkerLocked(absl::string_view id) {
  const WorkerRecord* record = workers_.Find(id);
  if (record == nullptr) return absl::NotFoundError(absl::StrCat("worker '", id, "' unknown"));
  StoreMutation m;
  m.workers.push_back(record->info);
  return WriteLocked(std::move(m));
}

std::shared_ptr<const WorkerRuntime> JobManager::InternRuntimeLocked(
    const v1::TrainerRuntime& reported) {
  std::vector<std::string> ops(reported.ops().begin(), reported.ops().end());
  std::sort(ops.begin(), ops.end());
  ops.erase(std::unique(ops.begin(), ops.end()), ops.end());
  const std::string key =
      Sha256Hex(absl::StrCat(reported.libtorch_version(), "\n", reported.max_model_format_version(),
                             "\n", absl::StrJoin(ops, "\n")));
  auto found = runtimes_.find(key);
  if (found != runtimes_.end()) return found->second;
  // Forget those no worker holds any more (only the map does).
  for (auto it = runtimes_.begin(); it != runtimes_.end();) {
    it = it->second.use_count() == 1 ? runtimes_.erase(it) : std::next(it);
  }
  auto runtime = std::make_shared<WorkerRuntime>();
  runtime->key = key.substr(0, 12);
  runtime->libtorch_version = reported.libtorch_version();
  runtime->ops = std::move(ops);
  runtime->max_model_format_version = reported.max_model_format_version();
  runtimes_.emplace(key, runtime);
  return runtime;
}

std::vector<const WorkerRecord*> JobManager::LiveWorkersLocked() const {
  std::vector<const WorkerRecord*> live;
  for (const WorkerRecord* w : workers_.All()) {
    if (w->info.state() != v1::LOST) live.push_back(w);
  }
  return live;
}

absl::Status JobManager::CheckRegistration(const v1::RegisterWorkerRequest& request) const {
  if (!IsSafeFileName(request.name())) {
    return absl::InvalidArgumentError(
        absl::StrCat("name: '", request.name(), "' must be letters, digits, '.', '_' or '-'"));
  }
  if (request.slots() < 0 || request.gpus() < 0 || request.memory_bytes() < 0) {
    return absl::InvalidArgumentError("slots, gpus, memory_bytes: must be >= 0");
  }
  if (absl::Status s = options_.worker_limits.Check(request.name(), request.slots(), request.gpus(),
                                                    request.memory_bytes());
      !s.ok()) {
    LogWarning("refused the registration of worker ", request.name(), ": ", s.message());
    return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::RegisterWorkerResponse> JobManager::RegisterWorker(
    const v1::RegisterWorkerRequest& request) {
  if (absl::Status s = CheckRegistration(request); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  const int64_t now_ms = absl::ToUnixMillis(clock_.Now());
  v1::Worker info;
  info.set_id(request.name());
  info.set_address(request.address());
  info.set_slots(request.slots());
  info.set_gpus(request.gpus());
  info.set_memory_bytes(request.memory_bytes());
  info.set_isolation(request.isolation().substr(0, 64));
  info.set_hostname(request.hostname());
  info.set_pid(request.pid());
  info.set_state(v1::READY);
  for (const v1::GpuFault& f : request.gpu_faults()) {
    if (f.index() >= 0 && f.index() < info.gpus()) *info.add_gpu_faults() = f;
  }
  // What its trainer runs, when the agent could tell.
  const bool told_runtime = !request.runtime().libtorch_version().empty();
  if (told_runtime) {
    info.set_libtorch_version(request.runtime().libtorch_version());
    if (request.runtime().cuda()) info.add_features("cuda");
    if (request.runtime().nccl()) info.add_features("nccl");
  }
  // The same agent process registering again (after a coordinator restart) is still being
  // preempted; a new process under the name is a machine that came back.
  if (const WorkerRecord* known = workers_.Find(request.name());
      known != nullptr && known->info.state() == v1::DRAINING &&
      known->info.pid() == request.pid() && known->info.hostname() == request.hostname()) {
    info.set_state(v1::DRAINING);
  }
  info.set_registered_unix_ms(now_ms);
  info.set_last_seen_unix_ms(now_ms);
  const WorkerRecord* before = workers_.Find(info.id());
  const bool was_lost = before != nullptr && before->info.state() == v1::LOST;
  // The registration and what it finds out about the agent's tasks are one transaction.
  BeginUnitLocked();
  SaveWorkerLocked(info.id());
  StoreMutation m;
  m.workers.push_back(info);
  WriteLocked(std::move(m)).IgnoreError();  // deferred to EndUnitLocked
  workers_.Register(info, told_runtime ? InternRuntimeLocked(request.runtime()) : nullptr);
  WakeWorkerLocked(info.id());  // a long poll of the agent's earlier life answers
  ClusterChangedLocked();
  AfterCommitLocked([info, reported = request.tasks_size()] {
    LogInfo("worker ", info.id(), " registered: ", info.slots(), " slots, ", info.gpus(), " GPUs, ",
            HumanBytes(info.memory_bytes()), " for tasks (",
            info.isolation().empty() ? "isolation unknown" : info.isolation(), "), ",
            info.libtorch_version().empty() ? "LibTorch unknown"
                                            : absl::StrCat("LibTorch ", info.libtorch_version()),
            ", ", reported, " tasks reported");
  });

  std::set<std::string> reported;
  for (const v1::TaskStatus& status : request.tasks()) {
    reported.insert(status.task_id());
    ApplyTaskStatusLocked(info.id(), status).IgnoreError();
  }
  // A worker back from being LOST (cut off, frozen) may still run ranks of attempts that ended
  // and restarted elsewhere meanwhile: they must not write anything, so they die at once.
  if (was_lost) {
    for (const v1::TaskStatus& status : request.tasks()) {
      if (status.state() != v1::TASK_RUNNING && status.state() != v1::TASK_STARTING) continue;
      const JobEntry* entry = table_.FindByTask(status.task_id());
      if (entry == nullptr) continue;
      for (const v1::TaskInfo& t : entry->job.tasks()) {
        if (t.task_id() == status.task_id() && t.worker_id() == info.id() &&
            !JobTable::IsActiveTask(entry->job, t)) {
          kill_tasks_[info.id()].insert(t.task_id());
        }
      }
    }
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
  workers_.Heard(request.worker_id());
  workers_.Renew(request.worker_id()).IgnoreError();
  if (workers_.SetGpuFaults(request.worker_id(), request.gpu_faults())) {
    GpuFaultsChangedLocked(request.worker_id());
  }
  for (const v1::TaskStatus& status : request.tasks()) {
    absl::Status s = ApplyTaskStatusLocked(request.worker_id(), status);
    if (!s.ok() && !absl::IsNotFound(s)) {
      LogWarning("worker ", request.worker_id(), ": task ", status.task_id(), ": ", s.ToString());
    }
  }
  const absl::Duration wait =
      std::min(absl::Milliseconds(std::max<int64_t>(request.wait_ms(), 0)), options_.max_sync_wait);
  // The deadline of a blocking wait is real time by nature; leases use the injected clock.
  const absl::Time deadline = RealClock::Get().Now() + wait;
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
  if (auto kill = kill_tasks_.find(request.worker_id()); kill != kill_tasks_.end()) {
    for (auto it = kill->second.begin(); it != kill->second.end();) {
      // Kept until the agent reports the task ended, unless its job is gone.
      if (table_.FindByTask(*it) == nullptr) {
        it = kill->second.erase(it);
        continue;
      }
      response.add_kill_task_ids(*it);
      ++it;
    }
    if (kill->second.empty()) kill_tasks_.erase(kill);
  }
  for (v1::DebugAsk& ask : debug_asks_.For(request.worker_id())) {
    *response.add_debug_asks() = std::move(ask);
  }
  for (int index : GpuReturnsLocked(*record)) response.add_return_gpus(index);
  return response;
}

absl::StatusOr<LeaseTicket> JobManager::OpenLease(absl::string_view worker_id, bool beats,
                                                  std::function<void()> end) {
  absl::MutexLock lock(&mu_);
  const WorkerRecord* record = workers_.Find(worker_id);
  // As in Sync: a worker known only from the store registers again first.
  if (record != nullptr && record->restored) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker '", worker_id, "' has not registered with this coordinator"));
  }
  const bool was_unreachable = record != nullptr && record->unreachable();
  absl::StatusOr<LeaseTicket> ticket =
      workers_.OpenLease(worker_id, beats && BeatInterval() > absl::ZeroDuration(), std::move(end));
  if (ticket.ok() && was_unreachable) RequestTickLocked();  // reachable again
  return ticket;
}

void JobManager::LeaseBeat(absl::string_view worker_id, const LeaseTicket& ticket) {
  absl::MutexLock lock(&mu_);
  workers_.Beat(worker_id, ticket);
}

void JobManager::CloseLease(absl::string_view worker_id, const LeaseTicket& ticket) {
  absl::MutexLock lock(&mu_);
  if (!shutdown_) LogInfo("worker ", worker_id, ": lease stream ended");
  workers_.CloseLease(worker_id, ticket);
  // The tick finds the lease run out; within the grace, a new stream keeps it.
  RequestTickLocked();
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
  std::string resume_folder;
  if (const JobEntry* from = FindLocked(entry.job.spec().checkpoint().resume_from());
      from != nullptr && from != &entry) {
    resume_folder = from->job.checkpoint_uri();
    for (auto it = from->checkpoints.rbegin(); it != from->checkpoints.rend(); ++it) {
      if (!it->retired) task.add_resume_checkpoints(it->checkpoint.uri());
    }
  }
  const TaskResources resources = TaskUsage(entry.job.spec(), info);
  task.set_slots(resources.slots);
  task.set_gpus(resources.gpus);
  task.set_memory_limit_bytes(resources.memory_bytes);
  task.set_data_memory_bytes(entry.job.data_memory_bytes());
  task.set_cpu_limit(resources.cpu_limit);
  task.set_stop_deadline_unix_ms(info.stop_deadline_unix_ms());
  if (options_.allowed_local_paths.has_value()) {
    v1::LocalPaths& local = *task.mutable_local_paths();  // set even when empty: none then
    for (const std::string& folder : *options_.allowed_local_paths) local.add_allowed(folder);
    // Its own checkpoints, and those it resumes from, wherever the coordinator put them.
    for (const std::string& folder : {entry.job.checkpoint_uri(), resume_folder}) {
      if (absl::StatusOr<std::string> path = LocalPath(folder); path.ok()) local.add_allowed(*path);
    }
  }
  if (const WorkerRecord* worker = workers_.Find(info.worker_id()); worker != nullptr) {
    task.set_worker_address(worker->info.address());
  }
  if (!options_.task_credential_key.empty()) {
    TaskScope scope;
    scope.job_id = entry.job.id();
    scope.generation = info.generation();
    scope.shard = info.role() == v1::TASK_ROLE_SHARD;
    scope.index = scope.shard ? info.shard() : info.rank();
    task.set_credential(SignTaskCredential(options_.task_credential_key, scope));
    task.set_attempt_secret(
        AttemptSecret(options_.task_credential_key, entry.job.id(), info.generation()));
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
  if (TaskEnded(status.state())) {
    if (auto kill = kill_tasks_.find(worker_id); kill != kill_tasks_.end()) {
      kill->second.erase(status.task_id());
      if (kill->second.empty()) kill_tasks_.erase(kill);
    }
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
  const std::string job_id = entry->job.id();
  absl::Status recorded = RecordTaskStatusLocked(*entry, index, status);
  if (recorded.ok() && TaskEnded(status.state())) {
    // Its agent shipped the whole log before reporting the end: say what the cap dropped.
    AfterCommitLocked([this, job_id, task_id = status.task_id()] {
      if (absl::Status s = logs_->Seal(job_id, task_id); !s.ok()) {
        LogWarning("task ", task_id, ": log not sealed: ", s.ToString());
      }
    });
  }
  return recorded;
}

absl::Status JobManager::RecordTaskStatusLocked(JobEntry& job_entry, int index,
                                                const v1::TaskStatus& status) {
  JobEntry* entry = &job_entry;
  v1::Job updated = entry->job;
  v1::TaskInfo* task = updated.mutable_tasks(index);
  if (TaskEnded(status.state()) && status.has_record() && task->role() != v1::TASK_ROLE_SHARD) {
    entry->ended_ranks[task->rank()] = {task->generation(), task->worker_id(), status.record()};
  }
  if (TaskEnded(status.state())) {
    // A rank's last word on how far its attempt got: more exact than its last progress report.
    if (updated.restarts_size() > 0 && status.last_step() > 0) {
      v1::Restart* last = updated.mutable_restarts(updated.restarts_size() - 1);
      if (last->generation() == task->generation() && !last->recovered() &&
          status.last_step() > last->last_step()) {
        last->set_last_step(status.last_step());
      }
    }
  }
  const bool newly_out_of_memory = status.out_of_memory() && !task->out_of_memory();
  task->set_state(status.state());
  task->set_exit_code(status.exit_code());
  task->set_signal(status.signal());
  task->set_message(status.message());
  task->set_out_of_memory(status.out_of_memory());
  task->set_memory_limit_bytes(std::max<int64_t>(status.memory_limit_bytes(), 0));
  task->set_memory_peak_bytes(std::max<int64_t>(status.memory_peak_bytes(), 0));
  task->set_gpu_fault(status.gpu_fault().substr(0, 1024));
  if (newly_out_of_memory && options_.event_sink != nullptr) {
    AfterCommitLocked(
        [this, job = updated, task = *task] { options_.event_sink->OnTaskOutOfMemory(job, task); });
  }
  const std::vector<std::string> changed = {task->task_id()};
  const TaskReportOutcome outcome = DecideTaskReport(updated, *task);
  switch (outcome.kind) {
    case TaskReportOutcome::Kind::kRunning:
      if (outcome.started) {
        // The stall clock starts when the attempt runs, and counts this attempt's steps: it may
        // resume below the step the last one reached. A job's own program may report no steps
        // at all (it need not use the module): its clock starts with its first report.
        entry->last_step_change =
            updated.spec().has_program() ? absl::InfinitePast() : clock_.Now();
        entry->last_step_seen = -1;
      }
      return TransitionLocked(*entry, std::move(updated), v1::RUNNING, outcome.reason, changed);
    case TaskReportOutcome::Kind::kSucceeded:
      return TransitionLocked(*entry, std::move(updated), v1::SUCCEEDED, outcome.reason, changed);
    case TaskReportOutcome::Kind::kEndAttempt: {
      AttemptEnd end;
      end.reason = outcome.restart_reason;
      end.message = outcome.reason;
      end.failed = clock_.Now();
      end.user_error = outcome.user_error;
      end.last_step = status.last_step();
      return EndAttemptLocked(*entry, std::move(updated), std::move(end), changed);
    }
    case TaskReportOutcome::Kind::kRestartingTaskEnded: {
      if (outcome.relabel) {
        v1::Restart* last = updated.mutable_restarts(updated.restarts_size() - 1);
        last->set_reason(outcome.restart_reason);
        last->set_message(outcome.reason);
      }
      absl::Status s = CommitLocked(*entry, std::move(updated), {}, changed);
      if (s.ok()) MaybeFinishRestartLocked(*entry);
      return s;
    }
    case TaskReportOutcome::Kind::kRecordOnly:
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
                                                               int64_t generation,
                                                               bool cancelled_ok) {
  JobEntry* entry = FindLocked(job_id);
  if (entry == nullptr) {
    // A finished job may be in the store only: its late callers hear what it is, as before it
    // left memory.
    absl::StatusOr<StoredJobRecord> stored = store_->LoadJob(job_id);
    if (stored.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", job_id, " is ", JobStateName(stored->job.job.state())));
    }
    return absl::NotFoundError(absl::StrCat("job '", job_id, "' not found"));
  }
  if (generation < entry->job.generation()) {
    return absl::FailedPreconditionError(
        absl::StrCat("stale generation ", generation, ", current ", entry->job.generation()));
  }
  if (generation > entry->job.generation()) {
    return absl::FailedPreconditionError(
        absl::StrCat("unknown generation ", generation, ", current ", entry->job.generation()));
  }
  // Only a placed attempt reports: a PENDING job has none (generation 0 is no attempt).
  const bool cancelled_attempt =
      cancelled_ok && entry->job.state() == v1::CANCELLED && generation > 0;
  if ((IsFinalJobState(entry->job.state()) && !cancelled_attempt) ||
      entry->job.state() == v1::PENDING) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, " is ", JobStateName(entry->job.state())));
  }
  return entry;
}

}  // namespace trainyard
