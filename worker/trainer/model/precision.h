#ifndef TRAINYARD_WORKER_TRAINER_MODEL_PRECISION_H_
#define TRAINYARD_WORKER_TRAINER_MODEL_PRECISION_H_

// Mixed precision: the forward pass under LibTorch's autocast (bfloat16 or float16, on the CPU or
// a GPU) while parameters, gradients and optimizer state stay float32, and for float16 a dynamic
// loss scale that keeps small gradients from flushing to zero, as PyTorch's torch.autocast and
// GradScaler do (same rules, same constants), so that a job matches the same loop in PyTorch.

#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "trainyard/v1/job.pb.h"
#include "worker/trainer/model/model.h"

namespace trainyard::trainer {

// The autocast dtype of `precision` on `device`, or nullopt for float32 (fp32 and tf32).
// INVALID_ARGUMENT, naming `precision`, for float16 on a CPU (a job that asked for it must not
// quietly train otherwise).
absl::StatusOr<std::optional<torch::ScalarType>> AutocastType(trainyard::v1::Precision precision,
                                                              const torch::Device& device);

// Autocast to `dtype` on `device`'s type while alive (nothing for nullopt); restores what was set
// before and clears autocast's cache of cast weights when the outermost guard ends, as
// torch.autocast's __exit__ does. Not thread-safe: autocast state is per thread.
class AutocastGuard {
 public:
  AutocastGuard(const torch::Device& device, std::optional<torch::ScalarType> dtype);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  const bool active_;
  const bool cuda_;
  bool was_enabled_ = false;
  torch::ScalarType previous_dtype_ = torch::kFloat32;
};

// PyTorch's GradScaler, on any device: the loss is multiplied by the scale before backward, the
// gradients divided by it before the update; an update whose gradients hold an inf or NaN is
// skipped and the scale multiplied by `backoff_factor`; `growth_interval` updates in a row without
// one multiply it by `growth_factor`. The scale is float32, as PyTorch keeps it.
class LossScaler {
 public:
  struct Options {
    double init_scale = 65536.0;  // 2^16, GradScaler's
    double growth_factor = 2.0;
    double backoff_factor = 0.5;
    int64_t growth_interval = 2000;
  };
  LossScaler() : LossScaler(Options()) {}
  explicit LossScaler(Options options);

  torch::Tensor Scale(const torch::Tensor& loss) const;
  // Divides each defined gradient by the scale in place (multiplies by its float32 reciprocal, as
  // GradScaler.unscale_ does) and returns true when any held an inf or NaN: then the update must
  // be skipped. One host synchronisation.
  bool Unscale(const NamedTensors& parameters);
  // After each update, skipped or not.
  void Update(bool found_inf);

  double scale() const { return scale_; }
  int64_t growth_tracker() const { return growth_tracker_; }
  // From a checkpoint. INVALID_ARGUMENT for a scale that is not finite and > 0 or a negative
  // tracker.
  absl::Status Restore(double scale, int64_t growth_tracker);

 private:
  const Options options_;
  float scale_;
  int64_t growth_tracker_ = 0;
};

}  // namespace trainyard::trainer

#endif  // TRAINYARD_WORKER_TRAINER_MODEL_PRECISION_H_
