#include "worker/agent/reconciler.h"

#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/byte_size.h"
#include "common/exit_codes.h"
#include "common/log.h"
#include "common/rpc/credentials.h"
#include "common/rpc/ps_tls.h"
#include "common/storage/uri.h"
#include "worker/agent/rank_record.h"

namespace trainyard {
namespace {

namespace fs = std::filesystem;

std::string ReadSmallFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

bool WriteFile(const std::string& path, const std::string& data) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return false;
    out << data;
    if (!out.flush()) return false;
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  return !ec;
}

// True when `pid` is a process (not a thread of one) that runs the trainer of the task whose file
// is `task_file` (given as --task_file, an absolute path: the work folder is made absolute). A
// pid file left over from an earlier run of the agent names a process that may have ended long
// ago, its pid since taken by another process: even by another agent's trainer on this machine
// (several agents share one, as with `trainyard up`), or by a thread of one, whose id kill()
// takes for its whole process.
bool IsTrainerOf(int64_t pid, const std::string& task_file) {
  const std::string root = absl::StrCat("/proc/", pid);
  bool process = false;
  for (absl::string_view line : absl::StrSplit(ReadSmallFile(root + "/status"), '\n')) {
    if (absl::ConsumePrefix(&line, "Tgid:")) {
      process = absl::StripAsciiWhitespace(line) == absl::StrCat(pid);
      break;
    }
  }
  if (!process) return false;
  for (absl::string_view arg : absl::StrSplit(ReadSmallFile(root + "/cmdline"), '\0')) {
    if (!absl::ConsumePrefix(&arg, "--task_file=")) continue;
    std::error_code ec;  // the same file, however the work folder was spelt
    return fs::equivalent(std::string(arg), task_file, ec);
  }
  return false;
}

std::string Utc(absl::Time t) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", t, absl::UTCTimeZone());
}

}  // namespace

std::string TailLines(const std::string& path, int lines) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return "";
  const std::streamoff size = in.tellg();
  const std::streamoff start = size > 65536 ? size - 65536 : 0;
  in.seekg(start);
  std::string data(static_cast<size_t>(size - start), '\0');
  in.read(data.data(), static_cast<std::streamsize>(data.size()));
  while (!data.empty() && (data.back() == '\n' || data.back() == '\r')) data.pop_back();
  if (data.empty()) return "";
  std::vector<absl::string_view> all = absl::StrSplit(data, '\n');
  const size_t first = all.size() > static_cast<size_t>(lines) ? all.size() - lines : 0;
  return absl::StrJoin(all.begin() + first, all.end(), "\n");
}

Reconciler::Reconciler(ReconcilerOptions options, ProcessLauncher& launcher, const Clock& clock)
    : options_(std::move(options)), launcher_(launcher), clock_(clock) {
  absl::MutexLock lock(&mu_);
  gpu_used_.assign(std::max(0, options_.gpus), false);
}

std::string Reconciler::TaskDir(const std::string& task_id) const {
  return absl::StrCat(options_.work_dir, "/tasks/", task_id);
}

std::string Reconciler::LogPath(const std::string& task_id) const {
  return absl::StrCat(TaskDir(task_id), "/", kTaskOutputFile);
}

int Reconciler::CleanUpLeftovers() {
  int killed = 0;
  std::error_code ec;
  const fs::path tasks_dir = fs::path(options_.work_dir) / "tasks";
  if (!fs::is_directory(tasks_dir, ec)) return 0;
  absl::MutexLock lock(&mu_);
  for (const fs::directory_entry& entry : fs::directory_iterator(tasks_dir, ec)) {
    if (!entry.is_directory(ec)) continue;
    const std::string task_id = entry.path().filename().string();
    forgotten_.emplace_back(clock_.Now(), task_id);  // removed in time unless asked for again
    forgotten_at_[task_id] = clock_.Now();
    const std::string pid_text = ReadSmallFile((entry.path() / "pid").string());
    int64_t pid = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(pid_text), &pid) || pid <= 0) continue;
    from_disk_.insert(task_id);
    if (!IsTrainerOf(pid, TaskDir(task_id) + "/task.pb")) continue;
    LogWarning("killing trainer of task ", task_id, " (pid ", pid,
               ") left over from an earlier run of the agent");
    kill(-static_cast<pid_t>(pid), SIGKILL);
    kill(static_cast<pid_t>(pid), SIGKILL);
    ++killed;
  }
  return killed;
}

std::vector<v1::TaskStatus> Reconciler::Apply(const std::vector<v1::Task>& desired,
                                              const std::set<std::string>& kill) {
  std::vector<v1::TaskStatus> changes;
  absl::MutexLock lock(&mu_);
  if (stopping_all_) return changes;
  std::set<std::string> desired_ids;
  for (const v1::Task& task : desired) desired_ids.insert(task.task_id());

  const absl::Time now = clock_.Now();
  for (auto it = records_.begin(); it != records_.end();) {
    Record& record = it->second;
    if (desired_ids.count(it->first) == 0) {
      if (record.running && !record.killed && kill.count(it->first) > 0) {
        record.undesired = true;
        // Dead already and not yet reaped (a peer's failure is often this task's own death,
        // seen first by the peer): its end is its own, and SIGKILL now would pass it off as the
        // stop. The next Tick reports it.
        absl::StatusOr<std::optional<ExitInfo>> dead =
            record.reaped ? absl::StatusOr<std::optional<ExitInfo>>(std::nullopt)
                          : launcher_.PollExit(record.status.pid());
        if (dead.ok() && dead->has_value()) {
          record.exited = **dead;
        } else {
          if (record.stop_cause == StopCause::kNone) record.stop_cause = StopCause::kUndesired;
          record.killed = true;
          record.kill_at = now;
          LogInfo("killing task ", it->first, " (pid ", record.status.pid(),
                  "): its attempt ended for a failure");
          KeepRecordAtStop(record);
          absl::Status status = launcher_.Signal(record.status.pid(), SIGKILL);
          if (!status.ok()) LogWarning("cannot kill task ", it->first, ": ", status.message());
        }
      } else if (record.running && !record.undesired) {
        record.undesired = true;
        if (record.stop_cause == StopCause::kNone) {
          Terminate(record, StopCause::kUndesired, now + options_.stop_grace_period);
        } else {
          // Saving for a deadline: the coordinator giving up on the task is no reason to cut the
          // save short, nor to let it run past the grace period either.
          record.kill_at = std::max(record.kill_at, now + options_.stop_grace_period);
        }
      }
      if (!record.running && record.sent) {
        forgotten_.emplace_back(now, it->first);
        forgotten_at_[it->first] = now;
        it = records_.erase(it);
        continue;
      }
    }
    ++it;
  }

  for (const v1::Task& task : desired) {
    const std::string& id = task.task_id();
    const absl::Time deadline = task.stop_deadline_unix_ms() > 0
                                    ? absl::FromUnixMillis(task.stop_deadline_unix_ms())
                                    : absl::InfiniteFuture();
    if (seen_.count(id) > 0) {
      auto it = records_.find(id);
      if (it != records_.end() && deadline != absl::InfiniteFuture()) {
        ApplyStopDeadline(it->second, deadline);
      }
      continue;
    }
    seen_.insert(id);
    if (from_disk_.count(id) > 0) {
      Record& record = records_[id];
      record.task = task;
      v1::TaskStatus& status = record.status;
      status.set_task_id(id);
      status.set_job_id(task.job_id());
      status.set_generation(task.generation());
      status.set_rank(task.rank());
      status.set_role(task.role());
      status.set_shard(task.shard());
      // Killed with the agent that ran it: the machine's doing, not the job's (STOPPED counts
      // against the job's infrastructure budget, not its failures).
      status.set_state(v1::TASK_STOPPED);
      status.set_signal(SIGKILL);
      status.set_exit_code(128 + SIGKILL);
      status.set_message("lost: the worker agent restarted while it ran");
      changes.push_back(status);
      continue;
    }
    changes.push_back(Start(task));
    if (deadline != absl::InfiniteFuture()) ApplyStopDeadline(records_[id], deadline);
  }
  return changes;
}

v1::TaskStatus Reconciler::Start(const v1::Task& task) {
  const std::string& id = task.task_id();
  Record& record = records_[id];
  record.task = task;
  v1::TaskStatus& status = record.status;
  status.set_task_id(id);
  status.set_job_id(task.job_id());
  status.set_generation(task.generation());
  status.set_rank(task.rank());
  status.set_role(task.role());
  status.set_shard(task.shard());
  auto fail = [&](const std::string& message) {
    LogError("task ", id, " failed to start: ", message);
    if (options_.s3_gateway != nullptr) options_.s3_gateway->Revoke(id);
    status.set_state(v1::TASK_FAILED_TO_START);
    status.set_exit_code(127);
    status.set_message(message);
    return status;
  };

  // The id names a folder: nothing that could climb out of the work dir.
  if (id.empty() || id.size() > 255 || id.find('/') != std::string::npos || id == "." ||
      id == ".." || id.find('\0') != std::string::npos) {
    return fail(absl::StrCat("task id '", id, "' is not a safe folder name"));
  }
  const std::string dir = TaskDir(id);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return fail(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  const std::string task_file = dir + "/task.pb";
  // It holds the task's credential: for the trainer's user only.
  if (!WriteSecretFile(task_file, task.SerializeAsString()).ok()) {
    return fail(absl::StrCat("cannot write ", task_file));
  }

  std::vector<int> gpus;
  for (size_t i = 0; i < gpu_used_.size() && static_cast<int>(gpus.size()) < task.gpus(); ++i) {
    if (!gpu_used_[i] && GpuInService(static_cast<int>(i))) gpus.push_back(static_cast<int>(i));
  }
  if (static_cast<int>(gpus.size()) < task.gpus()) return fail(NoGpusMessage(task.gpus()));

  absl::StatusOr<SubprocessOptions> prepared = TaskLaunch(task, dir, gpus);
  if (!prepared.ok()) return fail(std::string(prepared.status().message()));
  SubprocessOptions& launch = *prepared;
  absl::StatusOr<int> uid = PrepareTaskUser(task, dir, launch);
  if (!uid.ok()) return fail(std::string(uid.status().message()));
  if (options_.isolation != nullptr) {
    TaskLimits limits;
    limits.memory_bytes = std::max<int64_t>(task.memory_limit_bytes(), 0);
    limits.cpus = std::max(task.cpu_limit(), 0.0);
    absl::StatusOr<std::vector<std::string>> join = options_.isolation->Prepare(id, limits);
    if (!join.ok()) return fail(absl::StrCat("cannot confine it: ", join.status().message()));
    launch.join_cgroups = *std::move(join);
  }
  absl::StatusOr<int64_t> pid = launcher_.Launch(launch);
  if (!pid.ok()) {
    if (options_.isolation != nullptr) options_.isolation->Finish(id, 127, 0);
    return fail(std::string(pid.status().message()));
  }
  if (options_.isolation != nullptr) options_.isolation->Started(id, static_cast<pid_t>(*pid));

  for (int gpu : gpus) gpu_used_[gpu] = true;
  record.gpus = gpus;
  record.uid = *uid;
  record.running = true;
  status.set_state(v1::TASK_RUNNING);
  status.set_pid(*pid);
  if (!WriteFile(dir + "/pid", absl::StrCat(*pid, "\n"))) {
    LogWarning("cannot write the pid file of task ", id);
  }
  LogInfo("starting task ", id, " (pid ", *pid, ")",
          gpus.empty() ? "" : absl::StrCat(" on GPUs ", absl::StrJoin(gpus, ",")));
  return status;
}

void Reconciler::KeepRecordAtStop(Record& record) {
  if (record.record_at_stop.has_value()) return;
  record.record_at_stop =
      ReadRankRecord(TaskDir(record.task.task_id()), record.status.pid(), clock_);
}

void Reconciler::Terminate(Record& record, StopCause cause, absl::Time kill_at) {
  KeepRecordAtStop(record);
  record.stop_cause = cause;
  record.kill_at = kill_at;
  LogInfo("stopping task ", record.task.task_id(), " (pid ", record.status.pid(), ")",
          record.stop_deadline == absl::InfiniteFuture()
              ? ""
              : absl::StrCat(" to save and exit by ", Utc(record.stop_deadline)));
  absl::Status status = launcher_.Signal(record.status.pid(), SIGTERM);
  if (!status.ok()) {
    LogWarning("cannot signal task ", record.task.task_id(), ": ", status.message());
  }
}

void Reconciler::WriteStopDeadline(Record& record, absl::Time deadline) {
  record.stop_deadline = deadline;
  const std::string path = absl::StrCat(TaskDir(record.task.task_id()), "/", kStopDeadlineFile);
  // Without the file the trainer still saves on SIGTERM; it only cannot plan for the deadline.
  if (!WriteFile(path, absl::StrCat(absl::ToUnixMillis(deadline), "\n"))) {
    LogWarning("cannot write ", path);
  }
}

void Reconciler::ApplyStopDeadline(Record& record, absl::Time deadline) {
  if (!record.running) return;
  if (record.stop_cause == StopCause::kNone) {
    WriteStopDeadline(record, deadline);
    Terminate(record, StopCause::kSaveDeadline, deadline);
  } else if (record.stop_cause == StopCause::kSaveDeadline && deadline < record.stop_deadline) {
    // Moved forward by the coordinator: no second SIGTERM, the trainer re-reads the file.
    WriteStopDeadline(record, deadline);
    record.kill_at = record.undesired ? std::max(deadline, record.kill_at) : deadline;
  }
}

std::string Reconciler::ExitMessage(const std::string& task_id, const ExitInfo& exit,
                                    const Record& record) const {
  std::string detail = std::string(absl::StripAsciiWhitespace(
      ReadSmallFile(absl::StrCat(TaskDir(task_id), "/", kTerminationMessageFile))));
  const bool stopped = ReportedStopped(record.stop_cause);
  const bool clean_exit = exit.signal == 0 && exit.exit_code == 0;
  if (detail.empty() && !stopped && !clean_exit) detail = TailLines(LogPath(task_id), 3);
  // Why the task ended, not how: the exit code and signal travel in their own fields, and the
  // coordinator's reason ("rank 1 exited with code 143: ...") and `describe` show them.
  std::string message;
  switch (record.stop_cause) {
    case StopCause::kNone:
      break;
    case StopCause::kUndesired:
      message = "stopped on request";
      break;
    case StopCause::kSaveDeadline:
      message = absl::StrCat("asked to save and exit by ", Utc(record.stop_deadline));
      break;
    case StopCause::kAgentShutdown:
      message = "stopped because the worker agent is shutting down";
      break;
    case StopCause::kPreemption:
      message = "stopped because the worker is being preempted";
      break;
    case StopCause::kFenced:
      message = absl::StrCat("stopped by its agent, which had no lease from the coordinator for ",
                             absl::FormatDuration(record.fenced_after), " (self-fencing)");
      break;
    case StopCause::kGpuFault:
      message = absl::StrCat("stopped by its agent: GPU ", record.fault_gpu,
                             " failed: ", record.gpu_fault);
      break;
  }
  if (!detail.empty()) message = message.empty() ? detail : absl::StrCat(message, ": ", detail);
  // It travels in every Sync and becomes the job's reason: keep it short.
  constexpr size_t kMaxMessageBytes = 4096;
  if (message.size() > kMaxMessageBytes) {
    message.resize(kMaxMessageBytes - 3);
    message += "...";
  }
  return message;
}

int Reconciler::RemoveExpiredTaskDirs() {
  std::vector<std::string> expired;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time cutoff = clock_.Now() - options_.task_retention;
    while (!forgotten_.empty() && forgotten_.front().first <= cutoff) {
      const absl::Time when = forgotten_.front().first;
      std::string id = std::move(forgotten_.front().second);
      forgotten_.pop_front();
      if (records_.count(id) > 0) continue;  // asked for again: forgotten again later
      auto at = forgotten_at_.find(id);
      if (at == forgotten_at_.end() || at->second != when) continue;  // a later entry counts
      forgotten_at_.erase(at);
      seen_.erase(id);
      from_disk_.erase(id);
      expired.push_back(std::move(id));
    }
  }
  int removed = 0;
  for (const std::string& id : expired) {
    std::error_code ec;
    fs::remove_all(TaskDir(id), ec);
    if (ec) {
      LogWarning("cannot remove the folder of task ", id, ": ", ec.message());
    } else {
      ++removed;
    }
  }
  return removed;
}

const char* Reconciler::StopCauseText(StopCause cause) {
  switch (cause) {
    case Reconciler::StopCause::kNone:
      return "";
    case Reconciler::StopCause::kUndesired:
      return " (stopped on request)";
    case Reconciler::StopCause::kSaveDeadline:
      return " (asked to save by a deadline)";
    case Reconciler::StopCause::kAgentShutdown:
      return " (stopped for the agent's shutdown)";
    case Reconciler::StopCause::kPreemption:
      return " (stopped for the preemption)";
    case Reconciler::StopCause::kFenced:
      return " (self-fenced)";
    case Reconciler::StopCause::kGpuFault:
      return " (its GPU failed)";
  }
  return "";
}

std::vector<Reconciler::Ended> Reconciler::ReapLocked(const std::vector<std::string>& over_limit) {
  std::vector<Ended> ended;
  const absl::Time now = clock_.Now();
  for (const std::string& id : over_limit) {
    auto it = records_.find(id);
    if (it == records_.end() || !it->second.running || it->second.reaped) continue;
    // Its end is its own (the isolation reports it out of memory), not a stop of ours.
    LogWarning("task ", id, " is over its memory limit of ",
               HumanBytes(it->second.task.memory_limit_bytes()), "; sending SIGKILL");
    absl::Status status = launcher_.Signal(it->second.status.pid(), SIGKILL);
    if (!status.ok()) LogWarning("cannot kill task ", id, ": ", status.message());
  }
  for (auto& [id, record] : records_) {
    // Reaped by a Tick still busy with the hook: it reports the end.
    if (!record.running || record.reaped) continue;
    if (record.exited.has_value()) {  // reaped by Apply
      record.reaped = true;
      ended.push_back({id, *record.exited});
      continue;
    }
    absl::StatusOr<std::optional<ExitInfo>> exit = launcher_.PollExit(record.status.pid());
    if (!exit.ok()) {
      LogError("cannot wait for task ", id, ": ", exit.status().message());
      record.reaped = true;
      ended.push_back({id, ExitInfo{-1, 0}});
      continue;
    }
    if (exit->has_value()) {
      record.reaped = true;
      ended.push_back({id, **exit});
      continue;
    }
    if (!record.killed && now >= record.kill_at) {
      LogWarning("task ", id, " did not exit in time; sending SIGKILL");
      record.killed = true;
      absl::Status status = launcher_.Signal(record.status.pid(), SIGKILL);
      if (!status.ok()) LogWarning("cannot kill task ", id, ": ", status.message());
    }
  }
  return ended;
}

void Reconciler::EndLocked(const Ended& e, Record& record) {
  record.running = false;
  if (options_.s3_gateway != nullptr) options_.s3_gateway->Revoke(e.task_id);
  // A stop explains an end by the trainer's handling of SIGTERM or by the SIGKILL sent here; a
  // death by any other signal (someone's kill -9, the kernel's OOM killer, a crash) is the task's
  // own even when a stop was asked for meanwhile, and is reported as such.
  // A GPU that failed under it explains any end (a crash on a broken GPU included).
  if (record.stop_cause != StopCause::kNone && record.stop_cause != StopCause::kGpuFault &&
      e.exit.signal != 0 && e.exit.signal != SIGTERM &&
      !(e.exit.signal == SIGKILL && record.killed)) {
    record.stop_cause = StopCause::kNone;
  }
  ApplyFaultAfterExit(e, record);
  for (int gpu : record.gpus) gpu_used_[gpu] = false;
  record.gpus.clear();
  v1::TaskStatus& status = record.status;
  status.set_state(ReportedStopped(record.stop_cause) ? v1::TASK_STOPPED : v1::TASK_EXITED);
  status.set_exit_code(e.exit.exit_code);
  status.set_signal(e.exit.signal);
  status.set_message(ExitMessage(e.task_id, e.exit, record));
  if (record.stop_cause == StopCause::kGpuFault) status.set_gpu_fault(record.gpu_fault);
  if (options_.isolation != nullptr) {
    const TaskMemoryEnd memory =
        options_.isolation->Finish(e.task_id, e.exit.exit_code, e.exit.signal);
    status.set_memory_limit_bytes(memory.limit_bytes);
    status.set_memory_peak_bytes(memory.peak_bytes);
    if (memory.out_of_memory) {
      status.set_out_of_memory(true);
      std::string what =
          memory.limit_bytes > 0
              ? absl::StrCat("out of memory: killed at its limit of ",
                             HumanBytes(memory.limit_bytes))
              : std::string("out of memory: killed with the worker's task memory full");
      if (memory.peak_bytes > 0) absl::StrAppend(&what, ", peak ", HumanBytes(memory.peak_bytes));
      absl::StrAppend(&what, " (", memory.how, ")");
      status.set_message(status.message().empty() ? what
                                                  : absl::StrCat(what, "; ", status.message()));
    }
  }
  int64_t last_step = -1;
  const std::string step_text = std::string(absl::StripAsciiWhitespace(
      ReadSmallFile(absl::StrCat(TaskDir(e.task_id), "/", kLastStepFile))));
  if (!absl::SimpleAtoi(step_text, &last_step)) last_step = -1;
  status.set_last_step(last_step);
  std::optional<v1::RankRecord> rank_record = record.record_at_stop.has_value()
                                                  ? record.record_at_stop
                                                  : ReadRankRecord(TaskDir(e.task_id), 0, clock_);
  if (rank_record.has_value()) *status.mutable_record() = *std::move(rank_record);
  LogInfo("task ", e.task_id, " ", DescribeExit(e.exit), StopCauseText(record.stop_cause));
}

std::vector<v1::TaskStatus> Reconciler::Tick() {
  // Read outside the lock: the watch may scan /proc.
  const std::vector<std::string> over_limit =
      options_.isolation != nullptr ? options_.isolation->OverLimit() : std::vector<std::string>();
  std::vector<Ended> ended;
  {
    absl::MutexLock lock(&mu_);
    ended = ReapLocked(over_limit);
  }
  if (ended.empty()) return {};
  if (options_.before_exit_reported) {
    for (const Ended& e : ended) options_.before_exit_reported(e.task_id);
  }
  std::vector<v1::TaskStatus> changes;
  absl::MutexLock lock(&mu_);
  for (const Ended& e : ended) {
    auto it = records_.find(e.task_id);
    if (it == records_.end()) continue;
    EndLocked(e, it->second);
    changes.push_back(it->second.status);
  }
  return changes;
}

void Reconciler::StopAll() {
  absl::MutexLock lock(&mu_);
  stopping_all_ = true;
  const absl::Time now = clock_.Now();
  for (auto& [id, record] : records_) {
    if (record.running && record.stop_cause == StopCause::kNone) {
      Terminate(record, StopCause::kAgentShutdown, now + options_.stop_grace_period);
    }
  }
}

int Reconciler::FenceAll(absl::Duration without_lease) {
  absl::MutexLock lock(&mu_);
  int killed = 0;
  const absl::Time now = clock_.Now();
  for (auto& [id, record] : records_) {
    if (!record.running || record.killed) continue;
    record.stop_cause = StopCause::kFenced;
    record.fenced_after = without_lease;
    record.killed = true;
    record.kill_at = now;
    LogWarning("killing task ", id, " (pid ", record.status.pid(),
               "): no lease from the "
               "coordinator for ",
               absl::FormatDuration(without_lease));
    absl::Status status = launcher_.Signal(record.status.pid(), SIGKILL);
    if (!status.ok()) LogWarning("cannot kill task ", id, ": ", status.message());
    ++killed;
  }
  return killed;
}

void Reconciler::StopAllBy(absl::Time kill_at) {
  absl::MutexLock lock(&mu_);
  stopping_all_ = true;
  for (auto& [id, record] : records_) {
    if (!record.running) continue;
    if (record.stop_cause == StopCause::kNone) {
      WriteStopDeadline(record, kill_at);
      Terminate(record, StopCause::kPreemption, kill_at);
    } else if (kill_at < record.kill_at) {
      // Already stopping, on a later schedule than the machine allows.
      if (kill_at < record.stop_deadline) WriteStopDeadline(record, kill_at);
      record.kill_at = kill_at;
    }
  }
}

std::vector<v1::TaskStatus> Reconciler::Statuses() const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::TaskStatus> statuses;
  for (const auto& [id, record] : records_) statuses.push_back(record.status);
  return statuses;
}

std::vector<v1::TaskStatus> Reconciler::StatusesForSync() {
  absl::MutexLock lock(&mu_);
  std::vector<v1::TaskStatus> statuses;
  for (auto& [id, record] : records_) {
    if (!record.running) record.sent = true;
    statuses.push_back(record.status);
  }
  return statuses;
}

int Reconciler::RunningCount() const {
  absl::MutexLock lock(&mu_);
  int running = 0;
  for (const auto& [id, record] : records_) running += record.running;
  return running;
}

int64_t Reconciler::RunningPid(const std::string& task_id) const {
  absl::MutexLock lock(&mu_);
  auto it = records_.find(task_id);
  if (it == records_.end() || !it->second.running || it->second.reaped) return 0;
  return it->second.status.pid();
}

}  // namespace trainyard
