#ifndef TRAINYARD_WORKER_AGENT_PROCESS_LAUNCHER_H_
#define TRAINYARD_WORKER_AGENT_PROCESS_LAUNCHER_H_

#include <cstdint>
#include <memory>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/agent/subprocess.h"

namespace trainyard {

// Starts, signals and reaps the processes the agent runs. The seam between the reconciler's
// logic and fork/exec; tests use a fake. Implementations are thread-safe.
class ProcessLauncher {
 public:
  virtual ~ProcessLauncher() = default;

  // Starts a process and returns its pid once it runs. Errors as StartSubprocess: NOT_FOUND /
  // PERMISSION_DENIED / INTERNAL when the program cannot be run. Forks from the calling thread.
  virtual absl::StatusOr<int64_t> Launch(const SubprocessOptions& options) = 0;
  // Sends `signal` to the process and everything in its process group. Gone is not an error.
  virtual absl::Status Signal(int64_t pid, int signal) = 0;
  // Non-blocking. How the process ended (reaping it), or nullopt while it runs.
  // FAILED_PRECONDITION for a pid this launcher does not own or already reported.
  virtual absl::StatusOr<std::optional<ExitInfo>> PollExit(int64_t pid) = 0;
};

// fork/exec with new_process_group and die_with_parent.
std::unique_ptr<ProcessLauncher> NewRealProcessLauncher();

}  // namespace trainyard

#endif  // TRAINYARD_WORKER_AGENT_PROCESS_LAUNCHER_H_
