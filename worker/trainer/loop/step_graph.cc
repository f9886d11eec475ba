#include "worker/trainer/loop/step_graph.h"

#include <memory>

namespace trainyard::trainer {

#if TRAINYARD_WITH_CUDA_GRAPH
// step_graph_cuda.cc
std::unique_ptr<StepGraph> MakeCudaStepGraph(const torch::Device& device,
                                             MultiTensorUpdate& optimizer, int warmup_steps);
#endif

absl::StatusOr<std::unique_ptr<StepGraph>> MakeStepGraph(const torch::Device& device,
                                                         MultiTensorUpdate& optimizer,
                                                         int warmup_steps) {
  if (!device.is_cuda()) {
    return absl::InvalidArgumentError("cuda_graph: the rank trains on " + device.str() +
                                      ", not a GPU");
  }
  if (!optimizer.device_scalars()) {
    return absl::InvalidArgumentError(
        "cuda_graph: the optimizer keeps its learning rate and step counts on the host, where "
        "a replay would not see them change");
  }
#if TRAINYARD_WITH_CUDA_GRAPH
  return MakeCudaStepGraph(device, optimizer, warmup_steps);
#else
  return absl::UnimplementedError(
      "cuda_graph: this trainer was built against a LibTorch without CUDA (no libc10_cuda at "
      "build time)");
#endif
}

}  // namespace trainyard::trainer
