#ifndef TRAINYARD_WORKER_AGENT_TASK_ISOLATION_H_
#define TRAINYARD_WORKER_AGENT_TASK_ISOLATION_H_

// How the worker agent confines each task's memory and CPU: a cgroup per task (cgroup v2, or
// the v1 memory and cpu controllers), or, where it cannot make cgroups, a watch of each task's
// resident memory that stops it at its limit. Never an address-space rlimit (CUDA reserves far
// more address space than it uses).

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/cgroup.h"

namespace trainyard {

// What a task may use. 0 = no limit of its own.
struct TaskLimits {
  int64_t memory_bytes = 0;
  double cpus = 0;  // CPU time per unit of wall time (0.5 = half a CPU)
};

// What is known of a task's memory once it has ended.
struct TaskMemoryEnd {
  bool out_of_memory = false;  // killed for going over its limit
  int64_t limit_bytes = 0;     // the limit it ran under (its own; 0 = none)
  int64_t peak_bytes = 0;      // the most it held; 0 = unknown
  std::string how;             // how the kill was decided, for the message
};

// Thread-safe.
class TaskIsolation {
 public:
  virtual ~TaskIsolation() = default;

  // "cgroup v2", "cgroup v2 (memory only)" (no cpu controller delegated: no CPU quotas),
  // "cgroup v1" or "watch": what the agent tells the coordinator and `workers` shows.
  virtual std::string Name() const = 0;

  // Before the task starts: makes its cgroup with `limits`. Returns the cgroup.procs files the
  // task's process must join before it runs the trainer (SubprocessOptions::join_cgroups).
  virtual absl::StatusOr<std::vector<std::string>> Prepare(const std::string& task_id,
                                                           const TaskLimits& limits) = 0;
  // The task runs as `pid` (the leader of its own process group).
  virtual void Started(const std::string& task_id, pid_t pid) = 0;
  // The tasks running over their memory limit now, to kill (the watch only; cgroups have the
  // kernel do it). Cheap to call often: it reads /proc at most every watch interval.
  virtual std::vector<std::string> OverLimit() = 0;
  // The task ended (`exit_code` / `signal` as reaped) or never started: what its memory did.
  // Removes its cgroup (retried later if processes linger in it).
  virtual TaskMemoryEnd Finish(const std::string& task_id, int exit_code, int signal) = 0;
};

struct IsolationOptions {
  // "auto" (cgroup v2, else v1, else the watch), "cgroup-v2", "cgroup-v1" or "watch".
  std::string mode = "auto";
  // Names the agent's cgroup under its own (AgentCgroupName).
  std::string name;
  // The memory of all tasks together (the parent cgroup's limit); 0 = none.
  int64_t total_memory_bytes = 0;
  // Where cgroup file systems are mounted and what this process's cgroups are (tests point
  // them at folders of their own).
  std::string mountinfo = "/proc/self/mountinfo";
  std::string self_cgroup = "/proc/self/cgroup";
  std::string proc = "/proc";
  absl::Duration watch_interval = absl::Milliseconds(250);
  CgroupFiles files() const { return {mountinfo, self_cgroup, proc}; }
};

// The name of the agent's own cgroup (the parent of its tasks'): "trainyard.{name}.{pidns}.{pid}",
// with its PID namespace's number (from options.proc) and its pid.
std::string AgentCgroupName(const IsolationOptions& options);

// The isolation `options.mode` asks for. "auto" falls back (cgroup v2, v1, then the watch) and
// says in `*notes` why each better one could not be used (or, for cgroup v2 without the cpu
// controller, that CPU quotas are not enforced); a named mode that cannot be set up is
// FAILED_PRECONDITION with the reason.
absl::StatusOr<std::unique_ptr<TaskIsolation>> NewTaskIsolation(const IsolationOptions& options,
                                                                std::string* notes);

}  // namespace trainyard

#endif  // TRAINYARD_WORKER_AGENT_TASK_ISOLATION_H_
