// The GPU side of device_feed.h, built only against a LibTorch with CUDA (libc10_cuda).

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "worker/trainer/data/device_feed.h"

namespace trainyard::trainer {
namespace {

void Check(cudaError_t result, const char* what) {
  if (result != cudaSuccess) {
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(result));
  }
}

// One batch ahead: Prefetch() takes the next batch from the source and queues its copies on the
// copy stream, then records an event there; Next() makes the current stream wait for that event
// and hands the batch over. The copies come from pinned memory, so they are asynchronous, and
// LibTorch's pinned allocator keeps each host block until its copy has finished.
class CopyStreamFeed final : public DeviceFeed {
 public:
  CopyStreamFeed(BatchPrefetcher& source, const torch::Device& device)
      : source_(source),
        index_(device.has_index() ? device.index() : c10::cuda::current_device()),
        device_(torch::kCUDA, index_),
        stream_(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, index_)) {
    c10::cuda::CUDAGuard guard(index_);
    Check(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "cudaEventCreate");
  }
  ~CopyStreamFeed() override {
    if (ready_ != nullptr) cudaEventDestroy(ready_);
  }

  void Prefetch() override {
    if (fetched_) return;
    fetched_ = true;
    ahead_ = source_.Next();
    if (!ahead_.has_value()) return;
    c10::cuda::CUDAStreamGuard guard(stream_);
    for (torch::Tensor* t : Tensors(*ahead_)) {
      *t = t->to(device_, /*non_blocking=*/true);
    }
    Check(cudaEventRecord(ready_, stream_.stream()), "cudaEventRecord");
  }

  std::optional<Batch> Next() override {
    Prefetch();
    fetched_ = false;
    if (!ahead_.has_value()) return std::nullopt;
    const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(index_);
    Check(cudaStreamWaitEvent(current.stream(), ready_, 0), "cudaStreamWaitEvent");
    // Allocated on the copy stream, used on the current one: the caching allocator must not
    // hand the memory out again before the current stream is done with it.
    for (torch::Tensor* t : Tensors(*ahead_)) {
      c10::cuda::CUDACachingAllocator::recordStream(t->storage().data_ptr(), current);
    }
    return std::exchange(ahead_, std::nullopt);
  }

 private:
  static std::vector<torch::Tensor*> Tensors(Batch& batch) {
    std::vector<torch::Tensor*> out = {&batch.features, &batch.labels};
    if (batch.categorical.defined()) out.push_back(&batch.categorical);
    return out;
  }

  BatchPrefetcher& source_;
  const c10::DeviceIndex index_;
  const torch::Device device_;
  const c10::cuda::CUDAStream stream_;
  cudaEvent_t ready_ = nullptr;
  std::optional<Batch> ahead_;  // copied, or being copied, on stream_
  bool fetched_ = false;        // Prefetch() ran since the last Next()
};

}  // namespace

std::unique_ptr<DeviceFeed> MakeCopyStreamFeed(BatchPrefetcher& source,
                                               const torch::Device& device) {
  return std::make_unique<CopyStreamFeed>(source, device);
}

}  // namespace trainyard::trainer
