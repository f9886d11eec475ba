// The device's fast paths of a run (run.h): its DeviceModes, and the update through the step's
// CUDA graph.

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "worker/trainer/loop/errors.h"
#include "worker/trainer/loop/run.h"
#include "worker/trainer/loop/step_graph.h"
#include "worker/trainer/model/device_modes.h"
#include "worker/trainer/model/optimizer.h"

namespace trainyard::trainer::internal {

absl::Status Run::SetUpDeviceModes() {
  DeviceFacts facts;
  facts.cuda = device_.is_cuda();
  facts.convolutional = HasConvolutions(*model_);
  // This rank's share of the global batch (DataOrder::RankBatch's slice), cut into micro-batches.
  const int64_t b = plan_.global_batch_size;
  const int64_t w = std::max(1, strategy_->data_world());
  const int64_t r = strategy_->data_rank();
  const int64_t share = (r + 1) * b / w - r * b / w;
  facts.static_shapes = pipeline_ != nullptr || share % std::max(1, spec_.accumulate_steps()) == 0;
  absl::StatusOr<DeviceModes> modes = ChooseDeviceModes(spec_, facts);
  if (!modes.ok()) return modes.status();
  modes_ = *modes;
  ApplyDeviceModes(modes_);
  if (absl::Status format = ApplyMemoryFormat(*model_, modes_.channels_last); !format.ok()) {
    return format;
  }
  if (device_.is_cuda()) {
    LogInfo("device modes: channels_last=", modes_.channels_last,
            " cudnn_benchmark=", modes_.cudnn_benchmark, " tf32=", modes_.tf32,
            " cuda_graph=", modes_.cuda_graph);
  }
  return absl::OkStatus();
}

absl::Status Run::SetUpStepGraph() {
  MultiTensorUpdate* update = AsMultiTensorUpdate(*optimizer_);
  if (update != nullptr) {
    LogInfo("optimizer: ", spec_.optimizer().name(), " with ", update->kernels(), " kernels",
            update->device_scalars() ? ", its learning rate and step counts on the device" : "");
  }
  if (!modes_.cuda_graph) return absl::OkStatus();
  // Refused at submission already; a task made by hand is refused here.
  if (spec_.strategy() != trainyard::v1::SINGLE || scaler_.has_value()) {
    return absl::InvalidArgumentError(
        "cuda_graph: only with strategy single, and not with precision fp16");
  }
  if (update == nullptr) return absl::InternalError("cuda_graph: not a multi-tensor optimizer");
  absl::StatusOr<std::unique_ptr<StepGraph>> graph = MakeStepGraph(device_, *update);
  if (!graph.ok()) return graph.status();
  graph_ = *std::move(graph);
  return absl::OkStatus();
}

absl::Status Run::UpdateInGraph(const Batch& batch, int64_t step, int accumulate) {
  // A replay is the whole step: the flight record shows it as forward, then optimizer.
  Phase(RankPhase::kForward);
  absl::StatusOr<torch::Tensor> loss;
  try {
    loss = graph_->Run(batch, [&](const Batch& inputs) -> absl::StatusOr<torch::Tensor> {
      torch::Tensor update_loss;
      absl::Status status = EagerUpdate(inputs, step, accumulate, &update_loss);
      if (!status.ok()) return status;
      return update_loss;
    });
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("model: training step ", step + 1, " failed: ", DescribeTorchError(e)));
  }
  if (!loss.ok()) return loss.status();
  if (graph_->captured()) ++graph_replays_;
  Phase(RankPhase::kOptimizer);
  // A replay runs none of the step's host code: the strategy (single) would otherwise keep the
  // loss and stop flag it saw when the step was captured.
  strategy_->BeforeBackward(/*last_micro_batch=*/true, *loss, StopRequested());
  return absl::OkStatus();
}

}  // namespace trainyard::trainer::internal
