#ifndef TRAINYARD_WORKER_TRAINER_LOOP_STEP_GRAPH_H_
#define TRAINYARD_WORKER_TRAINER_LOOP_STEP_GRAPH_H_

// The whole training step as one CUDA graph (JobSpec.cuda_graph): a few eager steps on a side
// stream, then one captured (zeroing the gradients, forward, loss, backward, the optimizer's
// update), then that graph replayed for every later step, each batch first copied into the
// graph's input tensors. A replay launches the step's hundreds of kernels at once, so the host's
// per-kernel cost is gone. The optimizer must keep its learning rate and step counts on the
// device (MultiTensorUpdate): a replay reads them there, as BeforeReplay left them.
//
// Built with a LibTorch that has CUDA (step_graph_cuda.cc); without, MakeStepGraph says so.

#include <torch/torch.h>

#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/trainer/data/data.h"
#include "worker/trainer/model/optimizer.h"

namespace trainyard::trainer {

// Used by the training thread alone.
class StepGraph {
 public:
  // The step a graph captures: the update on `inputs` (the graph's input tensors), queuing only
  // device work (no host synchronisation, no decision on a value the device computes); returns
  // the update's loss, a tensor on the device.
  using Step = std::function<absl::StatusOr<torch::Tensor>(const Batch& inputs)>;

  virtual ~StepGraph() = default;
  // One update on `batch` (on the graph's device, ready on the current stream): eagerly for the
  // first warm-up updates, captured and replayed on the next, replayed after. `step` must do the
  // same work every time. Returns a copy of the update's loss that later replays leave alone.
  // INVALID_ARGUMENT naming cuda_graph when the batch's shapes or dtypes differ from the first
  // batch's, or when capturing the step fails (an operation that waits for the GPU or that
  // graphs cannot hold); `step`'s own error as it is.
  virtual absl::StatusOr<torch::Tensor> Run(const Batch& batch, const Step& step) = 0;
  // Whether the step has been captured (every later Run replays it).
  virtual bool captured() const = 0;
};

inline constexpr int kStepGraphWarmupSteps = 3;

// The graph of a rank training on `device` (a GPU) with `optimizer`, which must keep device
// scalars; `warmup_steps` eager updates precede the capture. UNIMPLEMENTED naming cuda_graph when
// this trainer was built against a LibTorch without CUDA; INVALID_ARGUMENT when `device` is not
// a GPU or the optimizer keeps host scalars.
absl::StatusOr<std::unique_ptr<StepGraph>> MakeStepGraph(const torch::Device& device,
                                                         MultiTensorUpdate& optimizer,
                                                         int warmup_steps = kStepGraphWarmupSteps);

}  // namespace trainyard::trainer

#endif  // TRAINYARD_WORKER_TRAINER_LOOP_STEP_GRAPH_H_
