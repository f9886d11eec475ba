#include "worker/trainer/data/device_feed.h"

#include <memory>
#include <optional>
#include <utility>

namespace trainyard::trainer {

#if TRAINYARD_WITH_CUDA_FEED
// device_feed_cuda.cc
std::unique_ptr<DeviceFeed> MakeCopyStreamFeed(BatchPrefetcher& source,
                                               const torch::Device& device);
#endif

namespace {

// The batches as built, moved to the device (if any) on the current stream when taken.
class DirectFeed final : public DeviceFeed {
 public:
  DirectFeed(BatchPrefetcher& source, const torch::Device& device)
      : source_(source), device_(device) {}

  std::optional<Batch> Next() override {
    std::optional<Batch> batch = source_.Next();
    if (!batch.has_value() || device_.is_cpu()) return batch;
    // Pinned memory makes the copy asynchronous.
    auto to_device = [&](const torch::Tensor& t) {
      return t.defined() ? t.to(device_, /*non_blocking=*/t.is_pinned()) : t;
    };
    batch->features = to_device(batch->features);
    batch->labels = to_device(batch->labels);
    batch->categorical = to_device(batch->categorical);
    return batch;
  }

 private:
  BatchPrefetcher& source_;
  const torch::Device device_;
};

}  // namespace

std::unique_ptr<DeviceFeed> MakeDeviceFeed(BatchPrefetcher& source, const torch::Device& device) {
#if TRAINYARD_WITH_CUDA_FEED
  if (device.is_cuda()) return MakeCopyStreamFeed(source, device);
#endif
  return std::make_unique<DirectFeed>(source, device);
}

}  // namespace trainyard::trainer
