// The data thread: builds each step's batch ahead of the training loop, holding and prefetching
// the shards its windows need.

#include <algorithm>
#include <exception>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "worker/trainer/data/data.h"
#include "worker/trainer/model/model.h"

namespace trainyard::trainer {

BatchPrefetcher::BatchPrefetcher(TrainingData& data, const StepPlan& plan, const Order& order,
                                 int rank, int world_size, int64_t first_step, int64_t end_step,
                                 int depth)
    : BatchPrefetcher(nullptr, &data, plan, order, rank, world_size, first_step, end_step, depth) {}

BatchPrefetcher::BatchPrefetcher(Dataset data, const StepPlan& plan, int64_t seed, bool shuffle,
                                 int rank, int world_size, int64_t first_step, int64_t end_step,
                                 int depth)
    : BatchPrefetcher(InMemoryData(std::move(data)), nullptr, plan, Order{seed, shuffle, 0, 0},
                      rank, world_size, first_step, end_step, depth) {}

BatchPrefetcher::BatchPrefetcher(std::unique_ptr<TrainingData> owned, TrainingData* data,
                                 const StepPlan& plan, const Order& order, int rank, int world_size,
                                 int64_t first_step, int64_t end_step, int depth)
    : owned_(std::move(owned)),
      data_(owned_ != nullptr ? *owned_ : *data),
      order_(plan, order.seed, order.shuffle, data_.shard_train_samples(), order.window),
      prefetch_shards_(order.prefetch_shards),
      rank_(rank),
      world_size_(world_size),
      first_step_(first_step),
      end_step_(end_step),
      depth_(static_cast<size_t>(std::max(1, depth))) {
  thread_ = std::thread([this] { Loop(); });
}

BatchPrefetcher::~BatchPrefetcher() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void BatchPrefetcher::Loop() {
  absl::Status status;
  try {
    status = BuildBatches();
  } catch (const std::exception& e) {
    status = absl::InternalError(absl::StrCat("the data thread failed: ", DescribeTorchError(e)));
  }
  if (!status.ok()) LogError(status.message());
  absl::MutexLock lock(&mu_);
  status_ = status;
  done_ = true;
}

absl::Status BatchPrefetcher::BuildBatches() {
  torch::NoGradGuard no_grad;
  std::vector<int> in_flight;
  for (int64_t step = first_step_; step < end_step_; ++step) {
    // Windows hold their shards and read the next ones ahead. A permutation of everything over
    // local shards maps them as batches first need them and keeps them (reading them all ahead
    // would pull the whole data set through the page cache at start); remote ones, which must
    // all fit the cache then, are all fetched ahead.
    if (order_.windowed() || data_.remote()) {
      std::vector<int> shards = order_.ShardsInFlight(step);
      if (shards != in_flight) {
        in_flight = shards;
        std::vector<int> ahead = order_.ShardsAfter(step, prefetch_shards_);
        shards.insert(shards.end(), ahead.begin(), ahead.end());
        data_.Hold(shards);
      }
    }
    absl::StatusOr<Batch> batch = data_.Gather(order_.RankBatch(step, rank_, world_size_));
    if (!batch.ok()) return batch.status();
    batch->step = step;
    absl::MutexLock lock(&mu_);
    auto room = [this]()
                    ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || queue_.size() < depth_; };
    mu_.Await(absl::Condition(&room));
    if (stop_) return absl::OkStatus();
    queue_.push_back(*std::move(batch));
  }
  return absl::OkStatus();
}

std::optional<Batch> BatchPrefetcher::Next() {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_ || !queue_.empty(); };
  mu_.Await(absl::Condition(&ready));
  if (queue_.empty()) return std::nullopt;
  Batch batch = std::move(queue_.front());
  queue_.pop_front();
  return batch;
}

absl::Status BatchPrefetcher::status() {
  absl::MutexLock lock(&mu_);
  return status_;
}

}  // namespace trainyard::trainer
