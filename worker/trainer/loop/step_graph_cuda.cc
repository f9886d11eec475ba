// The CUDA side of step_graph.h, built only against a LibTorch with CUDA (libc10_cuda).

#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/log.h"
#include "worker/trainer/loop/step_graph.h"

namespace trainyard::trainer {
namespace {

std::string Describe(const torch::Tensor& t) {
  if (!t.defined()) return "none";
  return absl::StrCat("[", absl::StrJoin(t.sizes(), ", "), "] ", c10::toString(t.scalar_type()));
}

// `to` waits for the work queued so far on `from` (on the GPU; the host does not wait).
void Follow(const c10::cuda::CUDAStream& to, const c10::cuda::CUDAStream& from) {
  at::cuda::CUDAEvent event;
  event.record(from);
  event.block(to);
}

// As PyTorch's recipe for whole-network capture has it (torch.cuda.graphs): the warm-up and the
// capture on a side stream, which waits for the current stream first and which the current
// stream then waits for; every replay on the current stream, as the step's other work is.
class CudaStepGraph final : public StepGraph {
 public:
  CudaStepGraph(const torch::Device& device, MultiTensorUpdate& optimizer, int warmup_steps)
      : index_(device.has_index() ? device.index() : c10::cuda::current_device()),
        optimizer_(optimizer),
        warmup_steps_(warmup_steps),
        side_(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, index_)) {}

  absl::StatusOr<torch::Tensor> Run(const Batch& batch, const Step& step) override {
    c10::cuda::CUDAGuard device_guard(index_);
    if (absl::Status copied = CopyIn(batch); !copied.ok()) return copied;
    if (graph_ == nullptr && eager_steps_ < warmup_steps_) {
      ++eager_steps_;
      return OnSideStream(step);
    }
    if (graph_ == nullptr) {
      if (absl::Status captured = Capture(step); !captured.ok()) return captured;
    }
    optimizer_.BeforeReplay();
    graph_->replay();
    // The graph writes its loss tensor again on the next replay.
    return loss_.clone();
  }

  bool captured() const override { return graph_ != nullptr; }

 private:
  // The batch into the graph's inputs (made on the first call, alike the first batch), on the
  // current stream.
  absl::Status CopyIn(const Batch& batch) {
    if (!inputs_.features.defined()) {
      auto like = [](const torch::Tensor& t) {
        return t.defined() ? torch::empty_like(t, torch::MemoryFormat::Preserve) : t;
      };
      inputs_.features = like(batch.features);
      inputs_.labels = like(batch.labels);
      inputs_.categorical = like(batch.categorical);
    }
    const std::vector<std::pair<torch::Tensor*, const torch::Tensor*>> pairs = {
        {&inputs_.features, &batch.features},
        {&inputs_.labels, &batch.labels},
        {&inputs_.categorical, &batch.categorical}};
    for (const auto& [to, from] : pairs) {
      if (to->defined() != from->defined() ||
          (to->defined() &&
           (to->sizes() != from->sizes() || to->scalar_type() != from->scalar_type()))) {
        return absl::InvalidArgumentError(
            absl::StrCat("cuda_graph: a batch of ", Describe(*from), " where the graph takes ",
                         Describe(*to), " (every batch must have the first one's shape)"));
      }
    }
    for (const auto& [to, from] : pairs) {
      if (to->defined()) to->copy_(*from, /*non_blocking=*/true);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<torch::Tensor> OnSideStream(const Step& step) {
    const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(index_);
    Follow(side_, current);
    absl::StatusOr<torch::Tensor> loss;
    {
      c10::cuda::CUDAStreamGuard guard(side_);
      loss = step(inputs_);
    }
    Follow(current, side_);
    if (loss.ok() && loss->defined()) {
      // Made on the side stream, read on the current one.
      c10::cuda::CUDACachingAllocator::recordStream(loss->storage().data_ptr(), current);
    }
    return loss;
  }

  absl::Status Capture(const Step& step) {
    const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(index_);
    Follow(side_, current);
    auto graph = std::make_unique<at::cuda::CUDAGraph>();
    absl::StatusOr<torch::Tensor> loss;
    std::string failure;
    bool stepped = false;
    optimizer_.set_capturing(true);
    {
      c10::cuda::CUDAStreamGuard guard(side_);
      bool capturing = false;
      try {
        graph->capture_begin();
        capturing = true;
        loss = step(inputs_);
        stepped = true;
        capturing = false;
        graph->capture_end();
      } catch (const std::exception& e) {
        failure = e.what();
        if (capturing) {
          // Ends the stream's capture, so that the stream can run work again.
          try {
            graph->capture_end();
          } catch (const std::exception&) {
          }
        }
      }
    }
    optimizer_.set_capturing(false);
    Follow(current, side_);
    // The step's own error first: ending an invalidated capture only says that it was.
    if (stepped && !loss.ok()) {
      failure = std::string(loss.status().message());
    } else if (!stepped && failure.empty()) {
      failure = "an exception without a message";
    } else if (failure.empty() && !loss->defined()) {
      failure = "the step returned no loss";
    }
    if (!failure.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("cuda_graph: capturing the training step failed (an operation that "
                       "waits for the GPU, or one CUDA graphs cannot hold); run without "
                       "cuda_graph: ",
                       failure));
    }
    loss_ = *loss;
    graph_ = std::move(graph);
    LogInfo("cuda_graph: the training step captured after ", eager_steps_,
            " eager steps; every later step replays it");
    return absl::OkStatus();
  }

  const c10::DeviceIndex index_;
  MultiTensorUpdate& optimizer_;
  const int warmup_steps_;
  const c10::cuda::CUDAStream side_;
  int eager_steps_ = 0;
  Batch inputs_;  // the graph's inputs: every batch is copied in
  std::unique_ptr<at::cuda::CUDAGraph> graph_;
  torch::Tensor loss_;  // the graph's loss, rewritten by each replay
};

}  // namespace

std::unique_ptr<StepGraph> MakeCudaStepGraph(const torch::Device& device,
                                             MultiTensorUpdate& optimizer, int warmup_steps) {
  return std::make_unique<CudaStepGraph>(device, optimizer, warmup_steps);
}

}  // namespace trainyard::trainer
