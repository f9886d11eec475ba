#include "worker/trainer/model/precision.h"

#include <ATen/autocast_mode.h>

#include <cmath>

#include "absl/strings/str_cat.h"

namespace trainyard::trainer {
namespace {

// LibTorch 2.4 names the device type in one set of calls; 1.13 had one pair per device (kept,
// deprecated, until later releases).
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
bool AutocastEnabled(bool cuda) {
  return at::autocast::is_autocast_enabled(cuda ? at::kCUDA : at::kCPU);
}
void SetAutocastEnabled(bool cuda, bool on) {
  at::autocast::set_autocast_enabled(cuda ? at::kCUDA : at::kCPU, on);
}
torch::ScalarType AutocastDtype(bool cuda) {
  return at::autocast::get_autocast_dtype(cuda ? at::kCUDA : at::kCPU);
}
void SetAutocastDtype(bool cuda, torch::ScalarType dtype) {
  at::autocast::set_autocast_dtype(cuda ? at::kCUDA : at::kCPU, dtype);
}
#else
bool AutocastEnabled(bool cuda) {
  return cuda ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled();
}
void SetAutocastEnabled(bool cuda, bool on) {
  cuda ? at::autocast::set_enabled(on) : at::autocast::set_cpu_enabled(on);
}
torch::ScalarType AutocastDtype(bool cuda) {
  return cuda ? at::autocast::get_autocast_gpu_dtype() : at::autocast::get_autocast_cpu_dtype();
}
void SetAutocastDtype(bool cuda, torch::ScalarType dtype) {
  cuda ? at::autocast::set_autocast_gpu_dtype(dtype) : at::autocast::set_autocast_cpu_dtype(dtype);
}
#endif

}  // namespace

absl::StatusOr<std::optional<torch::ScalarType>> AutocastType(trainyard::v1::Precision precision,
                                                              const torch::Device& device) {
  switch (precision) {
    case trainyard::v1::PRECISION_UNSPECIFIED:
    case trainyard::v1::FP32:
    case trainyard::v1::TF32:  // float32 arithmetic; TF32 is a math mode (device_modes.h)
      return std::optional<torch::ScalarType>();
    case trainyard::v1::BF16:
      return std::optional<torch::ScalarType>(torch::kBFloat16);
    case trainyard::v1::FP16:
      if (!device.is_cuda()) {
        return absl::InvalidArgumentError(
            "precision: fp16 needs a GPU, and this rank trains on the CPU (a trainer whose "
            "LibTorch has no CUDA, or no GPU visible); use bf16 on CPUs");
      }
      return std::optional<torch::ScalarType>(torch::kHalf);
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("precision: unknown value ", static_cast<int>(precision)));
  }
}

AutocastGuard::AutocastGuard(const torch::Device& device, std::optional<torch::ScalarType> dtype)
    : active_(dtype.has_value()), cuda_(device.is_cuda()) {
  if (!active_) return;
  was_enabled_ = AutocastEnabled(cuda_);
  previous_dtype_ = AutocastDtype(cuda_);
  SetAutocastEnabled(cuda_, true);
  SetAutocastDtype(cuda_, *dtype);
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  if (!active_) return;
  // torch.autocast's __exit__: the cast weights are cached for the region, dropped after it.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  SetAutocastEnabled(cuda_, was_enabled_);
  SetAutocastDtype(cuda_, previous_dtype_);
}

LossScaler::LossScaler(Options options)
    : options_(options), scale_(static_cast<float>(options.init_scale)) {}

torch::Tensor LossScaler::Scale(const torch::Tensor& loss) const {
  // A power of two times the float32 loss: exact, as GradScaler's tensor product is.
  return loss * static_cast<double>(scale_);
}

bool LossScaler::Unscale(const NamedTensors& parameters) {
  // GradScaler: inv_scale = scale.double().reciprocal().float().
  const float inv_scale = static_cast<float>(1.0 / static_cast<double>(scale_));
  torch::NoGradGuard no_grad;
  torch::Tensor found;
  for (const auto& [name, p] : parameters) {
    const torch::Tensor& g = p.grad();
    if (!g.defined()) continue;
    // Checked before the division, as the fused kernel does: inf * inv_scale is still inf.
    torch::Tensor bad = torch::logical_not(torch::isfinite(g)).any();
    found = found.defined() ? torch::logical_or(found, bad) : bad;
    g.mul_(inv_scale);
  }
  return found.defined() && found.item<bool>();
}

void LossScaler::Update(bool found_inf) {
  // torch._amp_update_scale_, in float32 like the scale tensor it updates.
  if (found_inf) {
    scale_ = scale_ * static_cast<float>(options_.backoff_factor);
    growth_tracker_ = 0;
    return;
  }
  const int64_t successful = growth_tracker_ + 1;
  if (successful == options_.growth_interval) {
    const float grown = scale_ * static_cast<float>(options_.growth_factor);
    if (std::isfinite(grown)) scale_ = grown;
    growth_tracker_ = 0;
  } else {
    growth_tracker_ = successful;
  }
}

absl::Status LossScaler::Restore(double scale, int64_t growth_tracker) {
  if (!(scale > 0) || !std::isfinite(scale) || growth_tracker < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "loss_scaler: scale ", scale, " and growth_tracker ", growth_tracker, " are not valid"));
  }
  scale_ = static_cast<float>(scale);
  growth_tracker_ = growth_tracker;
  return absl::OkStatus();
}

}  // namespace trainyard::trainer
