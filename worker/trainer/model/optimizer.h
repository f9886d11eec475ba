#ifndef TRAINYARD_WORKER_TRAINER_MODEL_OPTIMIZER_H_
#define TRAINYARD_WORKER_TRAINER_MODEL_OPTIMIZER_H_

// The optimizers a job spec names, and their per-parameter state as named tensors (what
// checkpoints and the parameter servers carry).

#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "trainyard/v1/job.pb.h"
#include "worker/trainer/model/tensors.h"

namespace trainyard::trainer {

// sgd (momentum, nesterov, weight_decay), adam and adamw (beta1, beta2, eps, weight_decay), with
// beta1/beta2/eps of 0 meaning the usual defaults (0.9, 0.999, 1e-8).
// INVALID_ARGUMENT "optimizer.name: ..." for anything else.
absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>> BuildOptimizer(
    const trainyard::v1::OptimizerSpec& spec, const std::vector<torch::Tensor>& parameters);

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
