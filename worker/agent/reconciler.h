#ifndef TRAINYARD_WORKER_AGENT_RECONCILER_H_
#define TRAINYARD_WORKER_AGENT_RECONCILER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/exit_codes.h"
#include "trainyard/v1/agent_service.pb.h"
#include "worker/agent/process_launcher.h"
#include "worker/agent/s3_gateway.h"
#include "worker/agent/task_isolation.h"
#include "worker/agent/task_user.h"

namespace trainyard {

// The stop-deadline file (kStopDeadlineFile) is written into a task's folder before the trainer
// is sent SIGTERM to save and exit by a deadline: one line, decimal unix milliseconds, the time by
// which the trainer must have exited.
// The agent sends SIGKILL at that time (later only if the task has also left the desired state
// and the grace period ends later), never before. Replaced atomically (rename), and only ever
// rewritten with an earlier time. Without the file, SIGTERM is a plain stop and SIGKILL follows
// after the agent's --stop_grace_period.

struct ReconcilerOptions {
  std::string work_dir;      // absolute; tasks live in {work_dir}/tasks/{task_id}/
  std::string trainer_path;  // the trainyard-trainer executable
  std::string coordinator;   // passed to trainers as --coordinator
  int gpus = 0;              // local GPUs 0..gpus-1 handed out through CUDA_VISIBLE_DEVICES
  absl::Duration stop_grace_period = absl::Seconds(10);  // SIGTERM, then SIGKILL after this
  // Called (without locks held, from the thread calling Tick) for a task that has ended, before
  // its final status becomes visible through Tick or Statuses: the agent ships the rest of the
  // task's log here, so a reported exit always comes with its whole log.
  std::function<void(const std::string& task_id)> before_exit_reported;
  // Folders of tasks that ended and were forgotten (and those an earlier run of the agent left)
  // are removed this long after: RemoveExpiredTaskDirs.
  absl::Duration task_retention = absl::Hours(24);
  // Added to every trainer's environment (how to reach the coordinator: TRAINYARD_CA_FILE, ...).
  std::map<std::string, std::string> trainer_env;
  // Confines each task to its memory and CPU limits (Task.memory_limit_bytes, cpu_limit) and
  // says how its memory ended; null: no limits (what tasks report of memory stays unset).
  TaskIsolation* isolation = nullptr;
  // More of the agent's variables that trainers inherit than PassesToTrainers admits.
  std::vector<std::string> trainer_env_pass;
  // Non-empty (the agent runs as root): each job's trainers run as their own user from it
  // (TaskUid); the task folder, the job's cache and its local checkpoint folder are given to it.
  TaskUidRange task_uids;
  // Non-null: trainers reach object storage only through this gateway, each with a key of its
  // own for its task's scope (TaskObjectScope), which ends with the task; none of the agent's
  // AWS_* variables passes to them.
  S3Gateway* s3_gateway = nullptr;
  // Whether local GPU `gpu` is in service (GpuHealth): a task is given only GPUs in service.
  // Called with the reconciler's lock held: it must not call back into it. Unset: all are.
  std::function<bool(int gpu)> gpu_in_service;
};

// The worker's task table: makes the set of running trainers match the coordinator's desired
// tasks and tracks how each one ends.
//
// Task folder {work_dir}/tasks/{task_id}/ (the trainer's working directory) holds task.pb (binary
// trainyard.v1.Task with the task's credential, mode 0600), output.log (the trainer's stdout and
// stderr, mode 0600), pid, the trainer's termination-message if it wrote one, and stop-deadline
// when the trainer is asked to save and exit by a deadline (see kStopDeadlineFile). A task id is
// started at most once in the life of a work_dir: one that ran before (even in an earlier run of
// the agent) is never started again, as long as its folder is kept (the coordinator never asks
// again for a task it has seen end).
//
// Thread-safe. Apply forks from the calling thread, which must live as long as the agent (the
// trainers die with that thread).
class Reconciler {
 public:
  Reconciler(ReconcilerOptions options, ProcessLauncher& launcher, const Clock& clock);
  Reconciler(const Reconciler&) = delete;
  Reconciler& operator=(const Reconciler&) = delete;

  // Looks for task folders of an earlier run of the agent: kills any trainer still running from
  // one (its pid file names a live process whose command line is a trainyard-trainer) and
  // remembers the task ids so they are never started again. Call once, before Apply. Returns the
  // number of processes killed.
  int CleanUpLeftovers();

  // Starts each task of `desired` not seen before and asks each running task that is not in
  // `desired` to stop (SIGTERM now, SIGKILL from Tick after the grace period). A desired task
  // with a stop deadline (stop_deadline_unix_ms > 0) is asked to save and exit: the deadline is
  // written to its stop-deadline file, then it gets SIGTERM (once), and SIGKILL from Tick at the
  // deadline; if it then leaves `desired`, it is killed at the later of the deadline and the
  // grace period. Tasks that ended and were included in a StatusesForSync() call are forgotten
  // once no longer desired. Returns the statuses that changed (TASK_RUNNING,
  // TASK_FAILED_TO_START, or TASK_EXITED for a desired task lost in an earlier run of the agent).
  // Does nothing after StopAll or StopAllBy.
  // A running task in `kill` (and not in `desired`) gets SIGKILL at once instead: the
  // coordinator ended its attempt for a failure, and nothing it could save would be used.
  std::vector<v1::TaskStatus> Apply(const std::vector<v1::Task>& desired,
                                    const std::set<std::string>& kill = {});

  // Reaps trainers that ended and sends SIGKILL to those past their kill time or, under the
  // isolation's watch, over their memory limit (reported out_of_memory). Returns the final
  // statuses of the tasks that ended, each with the last step its trainer wrote to its
  // kLastStepFile (-1 without one): TASK_STOPPED for a task stopped because it left the
  // desired state (first), TASK_EXITED with the trainer's own exit code or signal otherwise,
  // including tasks asked to save by a stop deadline, StopAll or StopAllBy (a trainer that saved
  // after SIGTERM exits with 143). Non-blocking apart from the before_exit_reported hook. Calls
  // may overlap: each end is reported by exactly one of them.
  std::vector<v1::TaskStatus> Tick();

  // Stops every running task because the agent itself is going away (SIGTERM, SIGKILL after the
  // grace period; tasks already being stopped keep their kill time) and refuses new ones.
  void StopAll();

  // Stops every running task because this machine is being preempted and refuses new ones:
  // `kill_at` is written to each one's stop-deadline file, then it gets SIGTERM (tasks already
  // sent SIGTERM get no second one), and SIGKILL from Tick at `kill_at`, or at its own earlier
  // kill time. Calling it again only ever brings kill times forward.
  void StopAllBy(absl::Time kill_at);

  // Kills every running trainer at once (SIGKILL: nothing it could save would be committed)
  // because this agent has had no lease from the coordinator for `without_lease`: the
  // coordinator has presumably given its work to others (self-fencing). Each end is reported
  // TASK_STOPPED, saying why. Returns how many it killed. New tasks are still accepted.
  int FenceAll(absl::Duration without_lease);

  // The status of every task tracked: running ones and ended ones not yet forgotten.
  std::vector<v1::TaskStatus> Statuses() const;
  // The same, and marks ended tasks as sent to the coordinator (see Apply).
  std::vector<v1::TaskStatus> StatusesForSync();

  // Removes the folders of tasks forgotten (see Apply) or left by an earlier run of the agent
  // more than task_retention ago, unless the coordinator asked for them again meanwhile. Returns
  // how many it removed. Cheap when there is nothing to remove: call it often.
  int RemoveExpiredTaskDirs();

  // Kills every running task that uses local GPU `gpu` at once (SIGKILL: a broken GPU saves
  // nothing worth having) because the GPU failed for `reason`. Each end is reported TASK_STOPPED
  // with gpu_fault set to `reason` and a message naming the GPU: the machine's doing, and the job
  // restarts elsewhere as for a lost worker. Returns how many it killed.
  int StopForGpuFault(int gpu, const std::string& reason);
  // From the before_exit_reported hook: task `task_id`, which has ended, used local GPU `gpu`,
  // now found failing for `reason`. An end that was not clean and that no stop of ours explains
  // is then reported as StopForGpuFault's are (the GPU failed under it); a clean exit stays one.
  void AttributeEndToGpuFault(const std::string& task_id, int gpu, const std::string& reason);

  // Running trainers (including ones being stopped).
  int RunningCount() const;
  // Local GPUs in service (gpu_in_service) and not assigned to a running task.
  int FreeGpus() const;
  // Local GPUs assigned to running tasks.
  int GpusInUse() const;
  // The local GPUs of task `task_id` while it runs (until its end is reported); empty otherwise.
  std::vector<int> TaskGpus(const std::string& task_id) const;
  // The process of `task_id` while it runs; 0 when it does not (unknown here, or ended).
  int64_t RunningPid(const std::string& task_id) const;
  // The running task each assigned GPU (by local index) is handed to.
  std::map<int, v1::TaskStatus> GpuTasks() const;

  std::string TaskDir(const std::string& task_id) const;
  std::string LogPath(const std::string& task_id) const;

 private:
  // Why a trainer was sent SIGTERM, first: decides how its end is reported.
  enum class StopCause {
    kNone,
    kUndesired,      // it left the desired state: TASK_STOPPED
    kSaveDeadline,   // the coordinator set a stop deadline: TASK_EXITED
    kAgentShutdown,  // StopAll: TASK_EXITED
    kPreemption,     // StopAllBy: TASK_EXITED
    kFenced,         // FenceAll: TASK_STOPPED
    kGpuFault,       // StopForGpuFault, AttributeEndToGpuFault: TASK_STOPPED with gpu_fault
  };
  // Only a stop the coordinator asked for without a deadline, self-fencing and a GPU that failed
  // end a task TASK_STOPPED; an exit after a request to save goes to the coordinator with the
  // trainer's own code to classify.
  static bool ReportedStopped(StopCause cause) {
    return cause == StopCause::kUndesired || cause == StopCause::kFenced ||
           cause == StopCause::kGpuFault;
  }

  struct Record {
    v1::Task task;
    v1::TaskStatus status;
    std::vector<int> gpus;
    bool running = false;
    int uid = -1;         // the user it runs as; -1: the agent's
    bool reaped = false;  // its exit is known; running until reported by the Tick that reaped it
    StopCause stop_cause = StopCause::kNone;
    bool undesired = false;  // has left the desired state
    bool killed = false;
    std::optional<ExitInfo> exited;  // reaped outside Tick (found dead when about to be killed)
    absl::Time kill_at = absl::InfiniteFuture();        // SIGKILL from Tick from then on
    absl::Time stop_deadline = absl::InfiniteFuture();  // in the stop-deadline file, if written
    absl::Duration fenced_after;  // FenceAll: how long the agent had been without a lease
    bool sent = false;            // ended, and included in a StatusesForSync result
    // Its flight record as it was when the agent first stopped it, before any signal.
    std::optional<v1::RankRecord> record_at_stop;
    int fault_gpu = -1;  // kGpuFault: the local GPU that failed, and why
    std::string gpu_fault;
    // AttributeEndToGpuFault's GPU and reason, applied when the end is recorded (if not clean).
    std::optional<std::pair<int, std::string>> fault_after_exit;
  };

  // Tick's steps: the tasks found ended (those over their memory limit killed, those past their
  // kill time too), and the end of one of them recorded in its status.
  struct Ended {
    std::string task_id;
    ExitInfo exit;
  };
  std::vector<Ended> ReapLocked(const std::vector<std::string>& over_limit)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EndLocked(const Ended& e, Record& record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Why a stop of ours ended a task, for its log line.
  static const char* StopCauseText(StopCause cause);
  v1::TaskStatus Start(const v1::Task& task) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The trainer's command, environment (the gateway's key granted here) and output of `task`,
  // whose folder is `dir` and GPUs `gpus`. Errors name what could not be prepared.
  absl::StatusOr<SubprocessOptions> TaskLaunch(const v1::Task& task, const std::string& dir,
                                               const std::vector<int>& gpus);
  // With task_uids: the user `task` runs as, the files it needs given to it, `launch` told.
  // INTERNAL naming the file that cannot be given.
  absl::StatusOr<int> PrepareTaskUser(const v1::Task& task, const std::string& dir,
                                      SubprocessOptions& launch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool GpuInService(int gpu) const {
    return !options_.gpu_in_service || options_.gpu_in_service(gpu);
  }
  // Why a task that needs `needed` GPUs cannot have them.
  std::string NoGpusMessage(int needed) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // An AttributeEndToGpuFault of `record`, applied to its end `e` when that was not clean.
  static void ApplyFaultAfterExit(const Ended& e, Record& record);
  void Terminate(Record& record, StopCause cause, absl::Time kill_at)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reads the rank's flight record into record_at_stop, once, before the first signal of a stop
  // (a hang's diagnosis needs the record as the hang left it).
  void KeepRecordAtStop(Record& record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WriteStopDeadline(Record& record, absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyStopDeadline(Record& record, absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string ExitMessage(const std::string& task_id, const ExitInfo& exit,
                          const Record& record) const;

  // Fixed at construction.
  const ReconcilerOptions options_;
  ProcessLauncher& launcher_;
  const Clock& clock_;

  mutable absl::Mutex mu_;
  std::map<std::string, Record> records_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> seen_ ABSL_GUARDED_BY(mu_);       // every task id ever started
  std::set<std::string> from_disk_ ABSL_GUARDED_BY(mu_);  // ran in an earlier agent run
  // (when forgotten, task id) in that order: folders RemoveExpiredTaskDirs removes.
  std::deque<std::pair<absl::Time, std::string>> forgotten_ ABSL_GUARDED_BY(mu_);
  // The latest time each of them was forgotten: an older entry of a task asked for again and
  // forgotten since does not count.
  std::map<std::string, absl::Time> forgotten_at_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> gpu_used_ ABSL_GUARDED_BY(mu_);
  bool stopping_all_ ABSL_GUARDED_BY(mu_) = false;
};

// The last `lines` lines of the file at `path` (reading at most its last 64 KiB), without the
// final newline; empty if it cannot be read.
std::string TailLines(const std::string& path, int lines);

}  // namespace trainyard

#endif  // TRAINYARD_WORKER_AGENT_RECONCILER_H_
