#ifndef TRAINYARD_WORKER_TRAINER_SCHEDULE_H_
#define TRAINYARD_WORKER_TRAINER_SCHEDULE_H_

// Step arithmetic, learning-rate schedules and data order: pure functions of the job spec, the
// seed and the step, so that a resumed run sees exactly what an uninterrupted run would have.
// Nothing here touches LibTorch or its random generator.

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "trainyard/v1/job.pb.h"

namespace trainyard::trainer {

struct StepPlan {
  int64_t train_samples = 0;      // samples in the training split
  int64_t global_batch_size = 0;  // samples per update over all ranks
  int64_t steps_per_epoch = 0;    // floor(train_samples / global_batch_size): drop-last
  int64_t total_steps = 0;
};

// total_steps = max_steps if > 0, else epochs * steps_per_epoch; the smaller when both are set.
// INVALID_ARGUMENT naming the field when batch_size is < 1 or larger than the training split,
// when neither max_steps nor epochs is set, or when batch_size does not split over world_size.
absl::StatusOr<StepPlan> PlanSteps(const trainyard::v1::JobSpec& spec, int64_t train_samples,
                                   int world_size);

// The learning rate for the update with 0-based index `step` (the update that brings the step
// count from `step` to `step + 1`). "constant" (or empty): optimizer.lr. "cosine": linear warm-up
// lr * (step + 1) / warmup_steps for step < warmup_steps, then a half cosine from lr down to
// schedule.min_lr reached at step == total_steps.
double LearningRateAt(const trainyard::v1::OptimizerSpec& optimizer, int64_t step,
                      int64_t total_steps);

// The order of the `n` samples in epoch `epoch`: 0..n-1 when !shuffle, otherwise a Fisher-Yates
// permutation drawn from std::mt19937_64 seeded with seed * 1000003 + epoch.
std::vector<int64_t> EpochOrder(int64_t n, int64_t seed, int64_t epoch, bool shuffle);

// The seed of LibTorch's random generator for the update with 0-based index `step` on `rank`: a
// function of (seed, step, rank) alone, so that what an update draws (dropout masks) does not
// depend on how many steps this process has run, and ranks draw independent streams.
uint64_t StepSeed(int64_t seed, int64_t step, int rank);

// Which samples each update uses. Step s (0-based) is in epoch s / steps_per_epoch and takes the
// global batch at position (s % steps_per_epoch) * global_batch_size of that epoch's order. Rank
// r of w takes the contiguous slice [r * b / w, (r + 1) * b / w) of the global batch.
// Not thread-safe (it caches the current epoch's order); use one per thread.
class DataOrder {
 public:
  DataOrder(const StepPlan& plan, int64_t seed, bool shuffle);

  std::vector<int64_t> GlobalBatch(int64_t step);
  std::vector<int64_t> RankBatch(int64_t step, int rank, int world_size);

  // Global samples consumed before update `step`: step * global_batch_size.
  int64_t CursorAt(int64_t step) const { return step * plan_.global_batch_size; }

 private:
  const StepPlan plan_;
  const int64_t seed_;
  const bool shuffle_;
  int64_t cached_epoch_ = -1;
  std::vector<int64_t> order_;
};

}  // namespace trainyard::trainer

#endif  // TRAINYARD_WORKER_TRAINER_SCHEDULE_H_
