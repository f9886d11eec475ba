#include "worker/agent/process_launcher.h"

namespace trainyard {
namespace {

class RealProcessLauncher final : public ProcessLauncher {
 public:
  absl::StatusOr<int64_t> Launch(const SubprocessOptions& options) override {
    SubprocessOptions copy = options;
    copy.new_process_group = true;
    copy.die_with_parent = true;
    absl::StatusOr<pid_t> pid = StartSubprocess(copy);
    if (!pid.ok()) return pid.status();
    return static_cast<int64_t>(*pid);
  }
  absl::Status Signal(int64_t pid, int signal) override {
    return SignalSubprocess(static_cast<pid_t>(pid), signal, /*group=*/true);
  }
  absl::StatusOr<std::optional<ExitInfo>> PollExit(int64_t pid) override {
    return TryWaitSubprocess(static_cast<pid_t>(pid));
  }
};

}  // namespace

std::unique_ptr<ProcessLauncher> NewRealProcessLauncher() {
  return std::make_unique<RealProcessLauncher>();
}

}  // namespace trainyard
