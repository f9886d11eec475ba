#include "worker/trainer/schedule.h"

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

std::vector<int64_t> EpochOrder(int64_t n, int64_t seed, int64_t epoch, bool shuffle) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[i] = i;
  if (!shuffle || n < 2) return order;
  std::mt19937_64 rng(static_cast<uint64_t>(seed) * 1000003ULL + static_cast<uint64_t>(epoch));
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

DataOrder::DataOrder(const StepPlan& plan, int64_t seed, bool shuffle)
    : plan_(plan), seed_(seed), shuffle_(shuffle) {}

std::vector<int64_t> DataOrder::GlobalBatch(int64_t step) {
  const int64_t epoch = step / plan_.steps_per_epoch;
  const int64_t position = (step % plan_.steps_per_epoch) * plan_.global_batch_size;
  if (epoch != cached_epoch_) {
    order_ = EpochOrder(plan_.train_samples, seed_, epoch, shuffle_);
    cached_epoch_ = epoch;
  }
  return std::vector<int64_t>(order_.begin() + position,
                              order_.begin() + position + plan_.global_batch_size);
}

std::vector<int64_t> DataOrder::RankBatch(int64_t step, int rank, int world_size) {
  std::vector<int64_t> global = GlobalBatch(step);
  const int64_t b = static_cast<int64_t>(global.size());
  const int64_t begin = rank * b / world_size;
  const int64_t end = (rank + 1) * b / world_size;
  return std::vector<int64_t>(global.begin() + begin, global.begin() + end);
}

}  // namespace trainyard::trainer
