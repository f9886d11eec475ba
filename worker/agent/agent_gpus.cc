// The agent's side of its GPUs' health: the tasks on a GPU that failed, and the checks of GPUs a
// task freed.

#include <string>
#include <vector>

#include "common/log.h"
#include "worker/agent/agent.h"

namespace trainyard {

void Agent::OnGpuFault(int gpu, const std::string& reason) {
  const int killed = reconciler_.StopForGpuFault(gpu, reason);
  if (killed > 0) LogWarning("killed ", killed, " tasks on GPU ", gpu, "; their jobs run again");
  absl::MutexLock lock(&mu_);
  Wake();
}

void Agent::CheckGpusAfterTask(const std::string& task_id) {
  {
    // A stop's deadline is the trainers' and the agent's: no time for checks of GPUs that take
    // no more work here.
    absl::MutexLock lock(&mu_);
    if (stop_requested_ || preemption_.has_value()) return;
  }
  const std::vector<int> gpus = reconciler_.TaskGpus(task_id);
  if (gpus.empty()) return;
  std::optional<FailedGpu> failed = gpu_guard_.CheckFreed(gpus);
  if (failed.has_value()) reconciler_.AttributeEndToGpuFault(task_id, failed->gpu, failed->reason);
}

}  // namespace trainyard
