#ifndef TRAINYARD_WORKER_AGENT_SUBPROCESS_H_
#define TRAINYARD_WORKER_AGENT_SUBPROCESS_H_

// Child processes over fork/exec, shared by the worker agent (trainers) and `trainyard up`
// (coordinator and workers). Plain functions over pids; no state of their own.

#include <sys/types.h>

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace trainyard {

struct SubprocessOptions {
  // argv[0] is the program: a path (with a '/'), or a name looked up on PATH.
  std::vector<std::string> argv;
  // Empty: the caller's working directory.
  std::string working_dir;
  // Set on top of the caller's environment (an existing variable is replaced).
  std::vector<std::pair<std::string, std::string>> env;
  // Set: only the caller's variables whose names it admits pass to the child (`env` still
  // does); unset: all of them.
  std::function<bool(absl::string_view name)> inherit;
  // Non-empty: stdout and stderr are both appended to this file (created with `output_mode` if
  // missing), and stdin is /dev/null. Empty: the child shares the caller's stdin, stdout and
  // stderr.
  std::string output_file;
  int output_mode = 0644;
  // Non-negative: the child runs the program as this user, its group the same number and no
  // supplementary groups (set last, after the output file is opened and the cgroups joined).
  // Needs the privilege to switch users (root); a failure is reported as an exec failure.
  int uid = -1;
  // The child leads a new process group, so that signals can reach everything it starts and a
  // Ctrl-C at the terminal does not reach it directly. It stays in this process's session (not
  // setsid): where the kernel groups each session's processes for the scheduler (autogroup, on
  // by default), a session per task made every rank a group of its own, and the ranks of a job on
  // one machine were switched out about once a step more than in one group (docs/benchmarks.md).
  bool new_process_group = true;
  // The child gets SIGKILL when the thread that started it exits. Call from a thread that lives
  // as long as the process that should own the child (the main thread, typically).
  bool die_with_parent = true;
  // cgroup.procs files the child joins (by writing "0" to each) before it runs the program, so
  // that everything it allocates is charged to those cgroups from the start.
  std::vector<std::string> join_cgroups;
};

// How a process ended.
struct ExitInfo {
  int exit_code = 0;  // meaningful when signal == 0
  int signal = 0;     // the signal that ended it, 0 if it exited
};

// Starts a child and blocks until it has exec'd (or failed to). Returns its pid. If exec fails,
// the child is reaped and the error is NOT_FOUND (ENOENT), PERMISSION_DENIED (EACCES) or
// INTERNAL, with the program and strerror in the message; INTERNAL as well for fork/pipe or
// output-file failures (output-file and working-dir errors are reported the same way as exec
// errors since they happen in the child). Thread-safe.
absl::StatusOr<pid_t> StartSubprocess(const SubprocessOptions& options);

// Non-blocking: reaps `pid` if it has ended. nullopt while it runs. FAILED_PRECONDITION if `pid`
// is not a child of this process (or was already reaped).
absl::StatusOr<std::optional<ExitInfo>> TryWaitSubprocess(pid_t pid);

// Blocks until `pid` ends and reaps it. FAILED_PRECONDITION as above.
absl::StatusOr<ExitInfo> WaitSubprocess(pid_t pid);

// Sends `sig` to `pid`, or to its whole process group when `group` is set (the child must have
// been started with new_process_group). A process that is already gone is not an error.
absl::Status SignalSubprocess(pid_t pid, int sig, bool group);

// "exited with code 3", "killed by signal 9 (SIGKILL)".
std::string DescribeExit(const ExitInfo& exit);

// The number of /dev/nvidia[0-9]* device files: the GPUs this machine has.
int DetectGpuCount(const std::string& dev = "/dev");

// The folder holding the running executable (from /proc/self/exe); empty if unknown.
std::string SelfExecutableDir();

}  // namespace trainyard

#endif  // TRAINYARD_WORKER_AGENT_SUBPROCESS_H_
