#ifndef TRAINYARD_WORKER_TRAINER_MODEL_OPTIMIZER_H_
#define TRAINYARD_WORKER_TRAINER_MODEL_OPTIMIZER_H_

// The optimizers a job spec names, and their per-parameter state as named tensors (what
// checkpoints and the parameter servers carry).
//
// They are torch::optim's SGD, Adam and AdamW (the same options, defaults, state and checkpoint
// names) with an update over all parameters at once instead of a loop of small operations per
// parameter: LibTorch's multi-tensor _foreach_ operations in torch::optim's own order of
// arithmetic, or its fused kernels (at::_fused_sgd_, _fused_adam_, _fused_adamw_, from LibTorch
// 2.4, on CPUs and GPUs), one pass over each parameter. A CUDA graph of the whole training step
// captures their update too: the learning rate and Adam's step counts then live in tensors on the
// device (torch::optim computes Adam's bias correction from a host integer, which a captured
// graph would replay unchanged).

#include <torch/torch.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "trainyard/v1/job.pb.h"
#include "worker/trainer/model/tensors.h"

namespace trainyard::trainer {

// How BuildOptimizer's optimizers compute an update; every choice is torch::optim's update.
struct OptimizerOptions {
  enum class Kernels {
    kAuto,     // kFused where this LibTorch has the fused kernels, else kForEach
    kForEach,  // _foreach_ operations: torch::optim's arithmetic in its order, so on the CPU its
               // result bit for bit
    kFused,    // the fused kernels (kForEach where this LibTorch lacks them, or for parameters
               // they do not take: mixed dtypes or layouts); the same formulas in one pass, whose
               // roundings may differ from torch::optim's in the last place
  };
  Kernels kernels = Kernels::kAuto;
  // The learning rate and Adam's step counts as tensors on the parameters' device, advanced and
  // read by kernels (nullopt: yes for parameters on a GPU, no on the CPU). What a CUDA graph of
  // the step needs; on the CPU its result equals the host scalars' (tests compare the two).
  std::optional<bool> device_scalars;
};

// sgd (momentum, nesterov, weight_decay), adam and adamw (beta1, beta2, eps, weight_decay), with
// beta1/beta2/eps of 0 meaning the usual defaults (0.9, 0.999, 1e-8).
// INVALID_ARGUMENT "optimizer.name: ..." for anything else. The result is also a
// MultiTensorUpdate (AsMultiTensorUpdate).
absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>> BuildOptimizer(
    const trainyard::v1::OptimizerSpec& spec, const std::vector<torch::Tensor>& parameters,
    const OptimizerOptions& options = {});

// What a CUDA graph of the whole training step asks of BuildOptimizer's optimizers. Not
// thread-safe: the training thread's.
class MultiTensorUpdate {
 public:
  virtual ~MultiTensorUpdate() = default;
  // "fused" or "foreach": what the last step() used ("fused" where any parameter took the fused
  // kernels), or what the first will use.
  virtual std::string kernels() const = 0;
  virtual bool device_scalars() const = 0;
  // While capturing, step() only queues device work: it neither writes the learning rate into
  // its tensor nor moves the host step counts (a capture runs nothing), and throws where it would
  // have to make state (take a step before capturing). Needs device_scalars.
  virtual void set_capturing(bool capturing) = 0;
  // Before each replay of a graph that captured step(): each group's learning rate (from its
  // options, as SetLearningRate left it) into its device tensor, a fill queued on the current
  // stream, and the host step count of every parameter the capture stepped advanced by one, as
  // the replay advances the device counts (the host counts are what checkpoints hold).
  virtual void BeforeReplay() = 0;
};

// `optimizer` as a MultiTensorUpdate; null for an optimizer BuildOptimizer did not make.
MultiTensorUpdate* AsMultiTensorUpdate(torch::optim::Optimizer& optimizer);

void SetLearningRate(torch::optim::Optimizer& optimizer, double lr);

// Per-parameter optimizer state as "<param>.momentum_buffer", "<param>.exp_avg",
// "<param>.exp_avg_sq", "<param>.max_exp_avg_sq" and "<param>.step" (I64, shape [1]). CPU copies
// of the state, whatever the parameters' device; parameters without state are absent. With
// `share`, state already on the CPU is returned as it is, not copied (ToHost).
NamedTensors OptimizerStateTensors(const torch::optim::Optimizer& optimizer,
                                   const NamedTensors& parameters, bool share = false);

// Checks that `state` fits `optimizer` over `parameters` (names, shapes, the kind of state)
// without changing anything. INVALID_ARGUMENT naming the offending entry.
absl::Status CheckOptimizerState(const torch::optim::Optimizer& optimizer,
                                 const NamedTensors& parameters,
                                 const std::map<std::string, torch::Tensor>& state);
// Replaces the optimizer's state with copies of `state` (which CheckOptimizerState accepted) on
// each parameter's device.
void LoadOptimizerState(torch::optim::Optimizer& optimizer, const NamedTensors& parameters,
                        const std::map<std::string, torch::Tensor>& state);

}  // namespace trainyard::trainer

#endif  // TRAINYARD_WORKER_TRAINER_MODEL_OPTIMIZER_H_
