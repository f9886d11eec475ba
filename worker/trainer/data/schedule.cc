#include "worker/trainer/data/schedule.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace trainyard::trainer {

absl::StatusOr<StepPlan> PlanSteps(const trainyard::v1::JobSpec& spec, int64_t train_samples,
                                   int world_size) {
  StepPlan plan;
  plan.train_samples = train_samples;
  plan.global_batch_size = spec.batch_size();
  if (plan.global_batch_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch_size: must be >= 1, got ", spec.batch_size()));
  }
  if (world_size < 1) world_size = 1;
  if (plan.global_batch_size % world_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch_size: ", plan.global_batch_size, " does not split over ", world_size, " workers"));
  }
  if (plan.global_batch_size > train_samples) {
    return absl::InvalidArgumentError(absl::StrCat("batch_size: ", plan.global_batch_size,
                                                   " is larger than the ", train_samples,
                                                   " training samples"));
  }
  plan.steps_per_epoch = train_samples / plan.global_batch_size;
  const int64_t from_epochs =
      spec.epochs() > 0 ? static_cast<int64_t>(spec.epochs()) * plan.steps_per_epoch : 0;
  if (spec.max_steps() > 0 && from_epochs > 0) {
    plan.total_steps = std::min<int64_t>(spec.max_steps(), from_epochs);
  } else if (spec.max_steps() > 0) {
    plan.total_steps = spec.max_steps();
  } else if (from_epochs > 0) {
    plan.total_steps = from_epochs;
  } else {
    return absl::InvalidArgumentError("max_steps: set max_steps or epochs");
  }
  plan.end_step =
      spec.stop_at_step() > 0 ? std::min(spec.stop_at_step(), plan.total_steps) : plan.total_steps;
  return plan;
}

double LearningRateAt(const trainyard::v1::OptimizerSpec& optimizer, int64_t step,
                      int64_t total_steps) {
  const double lr = optimizer.lr();
  const auto& schedule = optimizer.schedule();
  if (schedule.name() != "cosine") return lr;
  const int64_t warmup = std::max<int64_t>(0, schedule.warmup_steps());
  if (step < warmup) {
    return lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
  }
  const int64_t span = std::max<int64_t>(1, total_steps - warmup);
  const double progress =
      std::clamp(static_cast<double>(step - warmup) / static_cast<double>(span), 0.0, 1.0);
  const double min_lr = schedule.min_lr();
  return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(M_PI * progress));
}

std::vector<int64_t> Permutation(int64_t n, uint64_t rng_seed) {
  std::vector<int64_t> order(static_cast<size_t>(std::max<int64_t>(n, 0)));
  for (int64_t i = 0; i < n; ++i) order[i] = i;
  if (n < 2) return order;
  std::mt19937_64 rng(rng_seed);
  // Fisher-Yates with our own bounded draw: std::uniform_int_distribution is not specified
  // bit for bit across standard libraries.
  for (int64_t i = n - 1; i > 0; --i) {
    const uint64_t bound = static_cast<uint64_t>(i) + 1;
    const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
    uint64_t draw;
    do {
      draw = rng();
    } while (draw >= limit);
    std::swap(order[i], order[draw % bound]);
  }
  return order;
}

std::vector<int64_t> EpochOrder(int64_t n, int64_t seed, int64_t epoch, bool shuffle) {
  if (!shuffle) {
    std::vector<int64_t> order(static_cast<size_t>(std::max<int64_t>(n, 0)));
    for (int64_t i = 0; i < n; ++i) order[i] = i;
    return order;
  }
  return Permutation(n, static_cast<uint64_t>(seed) * 1000003ULL + static_cast<uint64_t>(epoch));
}

namespace {

// SplitMix64's finaliser: a bijection that spreads every input bit over the output.
uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

}  // namespace

uint64_t StepSeed(int64_t seed, int64_t step, int rank) {
  return Mix(Mix(Mix(static_cast<uint64_t>(seed)) ^ static_cast<uint64_t>(step)) ^
             static_cast<uint64_t>(rank));
}

DataOrder::DataOrder(const StepPlan& plan, int64_t seed, bool shuffle,
                     std::vector<int64_t> shard_samples, int64_t window)
    : plan_(plan), seed_(seed), shuffle_(shuffle), shard_samples_(std::move(shard_samples)) {
  int64_t first = 0;
  for (int64_t n : shard_samples_) {
    shard_first_.push_back(first);
    first += n;
  }
  if (!shard_samples_.empty()) {
    // Without shuffle a window is one global batch: the file order read shard by shard.
    window_ = shuffle_ ? std::max<int64_t>(window, 0) : plan_.global_batch_size;
  }
}

DataOrder::Epoch DataOrder::BuildEpoch(int64_t epoch) const {
  Epoch e;
  e.index = epoch;
  for (size_t i = 0; i < shard_samples_.size(); ++i) {
    if (shard_samples_[i] > 0) e.shards.push_back(static_cast<int>(i));
  }
  if (shuffle_) {
    const std::vector<int64_t> perm = Permutation(
        static_cast<int64_t>(e.shards.size()),
        Mix(Mix(static_cast<uint64_t>(seed_) ^ 0x5348415244ULL) ^ static_cast<uint64_t>(epoch)));
    std::vector<int> shuffled;
    for (int64_t k : perm) shuffled.push_back(e.shards[static_cast<size_t>(k)]);
    e.shards = std::move(shuffled);
  }
  e.offsets.push_back(0);
  for (int shard : e.shards) e.offsets.push_back(e.offsets.back() + shard_samples_[shard]);
  return e;
}

const DataOrder::Epoch& DataOrder::EpochAt(int64_t epoch) {
  if (epoch_.index == epoch) return epoch_;
  if (next_epoch_.index == epoch) {
    epoch_ = next_epoch_;
  } else {
    epoch_ = BuildEpoch(epoch);
  }
  return epoch_;
}

size_t DataOrder::ShardAt(const Epoch& e, int64_t q) {
  return static_cast<size_t>(std::upper_bound(e.offsets.begin(), e.offsets.end(), q) -
                             e.offsets.begin()) -
         1;
}

int64_t DataOrder::StreamPosition(int64_t epoch, int64_t position) {
  if (!shuffle_) return position;
  const int64_t chunk = position / window_;
  const int64_t base = chunk * window_;
  if (chunk_epoch_ != epoch || chunk_ != chunk) {
    const int64_t n = EpochAt(epoch).offsets.back();
    chunk_order_ =
        Permutation(std::min(window_, n - base),
                    Mix(Mix(Mix(static_cast<uint64_t>(seed_)) ^ static_cast<uint64_t>(epoch)) ^
                        static_cast<uint64_t>(chunk)));
    chunk_epoch_ = epoch;
    chunk_ = chunk;
  }
  return base + chunk_order_[static_cast<size_t>(position - base)];
}

std::vector<int64_t> DataOrder::GlobalBatch(int64_t step) {
  const int64_t epoch = step / plan_.steps_per_epoch;
  const int64_t position = (step % plan_.steps_per_epoch) * plan_.global_batch_size;
  if (window_ == 0) {
    if (epoch != cached_epoch_) {
      order_ = EpochOrder(plan_.train_samples, seed_, epoch, shuffle_);
      cached_epoch_ = epoch;
    }
    return std::vector<int64_t>(order_.begin() + position,
                                order_.begin() + position + plan_.global_batch_size);
  }
  std::vector<int64_t> batch;
  batch.reserve(static_cast<size_t>(plan_.global_batch_size));
  for (int64_t i = 0; i < plan_.global_batch_size; ++i) {
    const int64_t q = StreamPosition(epoch, position + i);
    const Epoch& e = EpochAt(epoch);
    const size_t k = ShardAt(e, q);
    batch.push_back(shard_first_[static_cast<size_t>(e.shards[k])] + (q - e.offsets[k]));
  }
  return batch;
}

std::pair<size_t, size_t> DataOrder::InFlightRange(int64_t step) {
  const int64_t epoch = step / plan_.steps_per_epoch;
  const int64_t position = (step % plan_.steps_per_epoch) * plan_.global_batch_size;
  const Epoch& e = EpochAt(epoch);
  const int64_t n = e.offsets.back();
  const int64_t lo = position / window_ * window_;
  const int64_t hi =
      std::min(((position + plan_.global_batch_size - 1) / window_ + 1) * window_, n);
  return {ShardAt(e, lo), ShardAt(e, hi - 1)};
}

std::vector<int> DataOrder::ShardsInFlight(int64_t step) {
  if (shard_samples_.empty()) return {};
  if (window_ == 0) return AllShards();
  const auto [first, last] = InFlightRange(step);
  const Epoch& e = EpochAt(step / plan_.steps_per_epoch);
  return std::vector<int>(e.shards.begin() + static_cast<std::ptrdiff_t>(first),
                          e.shards.begin() + static_cast<std::ptrdiff_t>(last) + 1);
}

std::vector<int> DataOrder::AllShards() const {
  std::vector<int> all;
  for (size_t i = 0; i < shard_samples_.size(); ++i) {
    if (shard_samples_[i] > 0) all.push_back(static_cast<int>(i));
  }
  return all;
}

std::vector<int> DataOrder::ShardsAfter(int64_t step, int count) {
  std::vector<int> after;
  if (window_ == 0 || count <= 0) return after;
  const int64_t epoch = step / plan_.steps_per_epoch;
  // The last shard this epoch reads: the one holding the end of the window of its last batch
  // (samples past steps_per_epoch batches are dropped).
  const size_t end = InFlightRange((epoch + 1) * plan_.steps_per_epoch - 1).second;
  const size_t last = InFlightRange(step).second;
  const Epoch& e = EpochAt(epoch);
  for (size_t k = last + 1; k <= end && static_cast<int>(after.size()) < count; ++k) {
    after.push_back(e.shards[k]);
  }
  if (static_cast<int>(after.size()) < count &&
      (epoch + 1) * plan_.steps_per_epoch < plan_.total_steps) {
    if (next_epoch_.index != epoch + 1) next_epoch_ = BuildEpoch(epoch + 1);
    for (size_t k = 0; k < next_epoch_.shards.size() && static_cast<int>(after.size()) < count;
         ++k) {
      after.push_back(next_epoch_.shards[k]);
    }
  }
  return after;
}

std::vector<int64_t> DataOrder::RankBatch(int64_t step, int rank, int world_size) {
  std::vector<int64_t> global = GlobalBatch(step);
  const int64_t b = static_cast<int64_t>(global.size());
  const int64_t begin = rank * b / world_size;
  const int64_t end = (rank + 1) * b / world_size;
  return std::vector<int64_t>(global.begin() + begin, global.begin() + end);
}

}  // namespace trainyard::trainer
