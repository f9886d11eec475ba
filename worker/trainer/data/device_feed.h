#ifndef TRAINYARD_WORKER_TRAINER_DATA_DEVICE_FEED_H_
#define TRAINYARD_WORKER_TRAINER_DATA_DEVICE_FEED_H_

// Brings the batches a BatchPrefetcher builds (in pinned host memory when the trainer is on a
// GPU) to the training device. On a GPU, the batch of the next update is copied on a CUDA stream
// of its own while the current update runs, and the update's stream waits for that copy on the
// GPU, never on the host: the step queues its work without waiting for the data. On the CPU the
// batches pass through unchanged.

#include <torch/torch.h>

#include <memory>
#include <optional>

#include "worker/trainer/data/data.h"

namespace trainyard::trainer {

// Used by the training thread alone.
class DeviceFeed {
 public:
  virtual ~DeviceFeed() = default;
  // The batch of the next update, on the device and safe to use on the current stream; nullopt
  // after the last one or when building one failed (the source's status() says why). Blocks
  // only when the source has not built it yet.
  virtual std::optional<Batch> Next() = 0;
  // Starts bringing the batch after the one Next() returned, so that its copy overlaps the work
  // already queued. Call after the update's work has been queued; Next() does it itself when
  // nobody did.
  virtual void Prefetch() {}
};

// The feed for `device`. `source` must outlive it.
std::unique_ptr<DeviceFeed> MakeDeviceFeed(BatchPrefetcher& source, const torch::Device& device);

}  // namespace trainyard::trainer

#endif  // TRAINYARD_WORKER_TRAINER_DATA_DEVICE_FEED_H_
