#include "worker/trainer/model/device_modes.h"

#include <ATen/Context.h>
#include <torch/torch.h>

#include "absl/strings/str_cat.h"

namespace trainyard::trainer {

absl::StatusOr<DeviceModes> ChooseDeviceModes(const trainyard::v1::JobSpec& spec,
                                              const DeviceFacts& facts) {
  DeviceModes modes;
  const std::string& format = spec.model().memory_format();
  if (format == "channels_last") {
    if (!facts.convolutional) {
      return absl::InvalidArgumentError(
          "model.memory_format: channels_last, but the model has no 4-D weights (no "
          "convolution)");
    }
    modes.channels_last = true;
  } else if (format.empty() || format == "auto") {
    modes.channels_last = facts.cuda && facts.convolutional;
  } else if (format != "contiguous") {
    return absl::InvalidArgumentError(
        absl::StrCat("model.memory_format: unknown memory format '", format, "'"));
  }
  modes.cudnn_benchmark = facts.cuda && facts.convolutional && facts.static_shapes;
  modes.tf32 = facts.cuda && spec.precision() == trainyard::v1::TF32;
  if (spec.cuda_graph()) {
    if (!facts.cuda) {
      return absl::InvalidArgumentError(
          "cuda_graph: this rank trains on the CPU (a trainer whose LibTorch has no CUDA, or no "
          "GPU visible); CUDA graphs need a GPU");
    }
    if (!facts.static_shapes) {
      return absl::InvalidArgumentError(
          "cuda_graph: the micro-batches of an update differ in size (accumulate_steps does not "
          "divide this rank's share of batch_size); a graph takes one shape");
    }
    modes.cuda_graph = true;
  }
  return modes;
}

void ApplyDeviceModes(const DeviceModes& modes) {
  at::Context& context = at::globalContext();
  context.setAllowTF32CuBLAS(modes.tf32);
  if (modes.tf32) context.setAllowTF32CuDNN(true);
  context.setBenchmarkCuDNN(modes.cudnn_benchmark);
}

bool HasConvolutions(Model& model) {
  for (const auto& [name, p] : model.NamedParameters()) {
    if (p.dim() == 4) return true;
  }
  return false;
}

absl::Status ApplyMemoryFormat(Model& model, bool channels_last) {
  if (!channels_last) return absl::OkStatus();
  int converted = 0;
  torch::NoGradGuard no_grad;
  for (auto& [name, p] : model.NamedParameters()) {
    if (p.dim() != 4) continue;
    p.set_data(p.contiguous(torch::MemoryFormat::ChannelsLast));
    ++converted;
  }
  if (converted == 0) {
    return absl::InvalidArgumentError(
        "model.memory_format: channels_last, but the model has no 4-D weights (no convolution)");
  }
  model.SetChannelsLastInput(true);
  return absl::OkStatus();
}

}  // namespace trainyard::trainer
