#ifndef TRAINYARD_WORKER_TRAINER_MODEL_MULTI_TENSOR_H_
#define TRAINYARD_WORKER_TRAINER_MODEL_MULTI_TENSOR_H_

// Internal to model/: torch::optim's SGD, Adam and AdamW with their step() over all parameters
// at once (optimizer.h says what they promise). They are torch::optim's own classes underneath,
// so their options, param groups and per-parameter state (SGDParamState, AdamParamState,
// AdamWParamState) are the ones the checkpoint functions of optimizer.cc read and write.

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "worker/trainer/model/optimizer.h"

namespace trainyard::trainer {

// The key of parameter `p` in Optimizer::state(): LibTorch 2 keys the map by the parameter's
// TensorImpl address, LibTorch 1 by that address as text (c10::guts::to_string, which LibTorch 2
// removed).
#if TORCH_VERSION_MAJOR >= 2
inline void* StateKey(const torch::Tensor& p) { return p.unsafeGetTensorImpl(); }
#else
inline std::string StateKey(const torch::Tensor& p) {
  return c10::guts::to_string(p.unsafeGetTensorImpl());
}
#endif

// Whether this LibTorch has the fused kernels on the CPU and on CUDA, with a tensor learning rate
// (at::_fused_sgd_, _fused_adam_, _fused_adamw_: all three since 2.4).
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
inline constexpr bool kHasFusedOptimizers = true;
#else
inline constexpr bool kHasFusedOptimizers = false;
#endif

// `options.kernels` and `device_scalars` decided (BuildOptimizer resolves device_scalars from
// the parameters' device).
std::unique_ptr<torch::optim::Optimizer> MakeMultiTensorSgd(std::vector<torch::Tensor> parameters,
                                                            torch::optim::SGDOptions options,
                                                            OptimizerOptions::Kernels kernels,
                                                            bool device_scalars);
std::unique_ptr<torch::optim::Optimizer> MakeMultiTensorAdam(std::vector<torch::Tensor> parameters,
                                                             torch::optim::AdamOptions options,
                                                             OptimizerOptions::Kernels kernels,
                                                             bool device_scalars);
std::unique_ptr<torch::optim::Optimizer> MakeMultiTensorAdamW(std::vector<torch::Tensor> parameters,
                                                              torch::optim::AdamWOptions options,
                                                              OptimizerOptions::Kernels kernels,
                                                              bool device_scalars);

}  // namespace trainyard::trainer

#endif  // TRAINYARD_WORKER_TRAINER_MODEL_MULTI_TENSOR_H_
