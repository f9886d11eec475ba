#ifndef TRAINYARD_WORKER_TRAINER_DATA_SCHEDULE_H_
#define TRAINYARD_WORKER_TRAINER_DATA_SCHEDULE_H_

// Step arithmetic, learning-rate schedules and data order: pure functions of the job spec, the
// seed and the step, so that a resumed run sees exactly what an uninterrupted run would have.
// Nothing here touches LibTorch or its random generator.

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "trainyard/v1/job.pb.h"

namespace trainyard::trainer {

struct StepPlan {
  int64_t train_samples = 0;      // samples in the training split
  int64_t global_batch_size = 0;  // samples per update over all ranks
  int64_t steps_per_epoch = 0;    // floor(train_samples / global_batch_size): drop-last
  int64_t total_steps = 0;
  // Where this job stops: stop_at_step when set (a search's rung), else total_steps. The
  // learning-rate schedule and the data order run to total_steps all the same.
  int64_t end_step = 0;
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

// A Fisher-Yates permutation of 0..n-1 drawn from std::mt19937_64 seeded with `rng_seed`.
std::vector<int64_t> Permutation(int64_t n, uint64_t rng_seed);

// The seed of LibTorch's random generator for the update with 0-based index `step` on `rank`: a
// function of (seed, step, rank) alone, so that what an update draws (dropout masks) does not
// depend on how many steps this process has run, and ranks draw independent streams.
uint64_t StepSeed(int64_t seed, int64_t step, int rank);

// Which samples each update uses. Step s (0-based) is in epoch s / steps_per_epoch and takes the
// global batch at position (s % steps_per_epoch) * global_batch_size of that epoch's order. Rank
// r of w takes the contiguous slice [r * b / w, (r + 1) * b / w) of the global batch. Samples are
// numbered in file order (shard after shard); the order never depends on the number of ranks, so
// a run resumed on another number of ranks continues the same sequence.
//
// Without shards or a window (and with shuffle), each epoch is one permutation of all samples
// (EpochOrder): the best mixing, but a batch may come from anywhere in the data set. With
// `shard_samples` (training samples per shard, in file order) and a `window` > 0, each epoch
// first permutes the shards, lays their samples end to end in that order, and permutes the
// samples within consecutive windows of `window` of them: a batch comes from the few shards a
// window spans (ShardsInFlight), so data larger than memory is read shard by shard. Without
// shuffle the order is the file order either way.
// Not thread-safe (it caches the current epoch's order); use one per thread.
class DataOrder {
 public:
  DataOrder(const StepPlan& plan, int64_t seed, bool shuffle,
            std::vector<int64_t> shard_samples = {}, int64_t window = 0);

  std::vector<int64_t> GlobalBatch(int64_t step);
  std::vector<int64_t> RankBatch(int64_t step, int rank, int world_size);

  // Global samples consumed before update `step`: step * global_batch_size.
  int64_t CursorAt(int64_t step) const { return step * plan_.global_batch_size; }

  // The shards (indices into shard_samples) that the windows of update `step`'s global batch
  // draw from, in the order the epoch reads them: every shard with samples for a full
  // permutation. Empty without shards.
  std::vector<int> ShardsInFlight(int64_t step);
  // Up to `count` shards read after those in flight, continuing into the next epoch's order
  // while it is within the plan's total_steps: the ones to fetch ahead.
  std::vector<int> ShardsAfter(int64_t step, int count);
  // Whether batches are drawn from windows of shards (else one permutation of everything).
  bool windowed() const { return window_ > 0; }

 private:
  struct Epoch {
    int64_t index = -1;
    std::vector<int> shards;       // shards with samples, in this epoch's order
    std::vector<int64_t> offsets;  // offsets[k]: samples of shards[0..k) (size shards + 1)
  };
  Epoch BuildEpoch(int64_t epoch) const;
  const Epoch& EpochAt(int64_t epoch);
  // Indices into the epoch's shards of the first and last shard that step's windows span.
  std::pair<size_t, size_t> InFlightRange(int64_t step);
  std::vector<int> AllShards() const;
  // The position in the epoch's stream (shard after shard in Epoch::shards order) of the sample
  // at `position` of the epoch's order.
  int64_t StreamPosition(int64_t epoch, int64_t position);
  // Index into Epoch::shards of the shard holding stream position `q`.
  static size_t ShardAt(const Epoch& e, int64_t q);

  const StepPlan plan_;
  const int64_t seed_;
  const bool shuffle_;
  const std::vector<int64_t> shard_samples_;
  std::vector<int64_t> shard_first_;  // global index of each shard's first sample
  // Samples per window; 0: a full permutation per epoch. Without shuffle, a global batch.
  int64_t window_ = 0;
  int64_t cached_epoch_ = -1;
  std::vector<int64_t> order_;  // full permutation of the cached epoch
  Epoch epoch_;
  Epoch next_epoch_;  // ShardsAfter's look into the following epoch
  int64_t chunk_epoch_ = -1;
  int64_t chunk_ = -1;
  std::vector<int64_t> chunk_order_;  // permutation within the cached window
};

}  // namespace trainyard::trainer

#endif  // TRAINYARD_WORKER_TRAINER_DATA_SCHEDULE_H_
