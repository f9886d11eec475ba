#ifndef TRAINYARD_WORKER_TRAINER_DATA_H_
#define TRAINYARD_WORKER_TRAINER_DATA_H_

// Training data held in memory as tensors, and the background batch builder.

#include <torch/torch.h>

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "trainyard/v1/job.pb.h"
#include "worker/trainer/schedule.h"

namespace trainyard::trainer {

struct Dataset {
  torch::Tensor features;  // [N, ...] float32, contiguous
  torch::Tensor labels;    // [N] int64 class ids, or [N, ...] float32 targets for mse
  // [N, fields] int64 ids (data.categorical, data.synthetic.vocab); undefined without.
  torch::Tensor categorical;
  int64_t size() const { return features.defined() ? features.size(0) : 0; }
  // Features per sample: the product of the dimensions after the first.
  int64_t FeatureWidth() const;
  // Outputs the model needs: max label + 1 for class ids, the target width for float targets.
  int64_t OutputWidth() const;
};

// Samples around one centre per class: centres ~ N(0, 1) per feature, sample i has class
// i % classes and features centre + noise * N(0, 1). With vocab, also categorical ids: field f of
// a sample is, with probability 1/2, its class's id for that field (an id fixed per class and
// field), else uniform in [0, vocab[f]). Draws from std::mt19937_64 seeded by `seed`
// with our own Box-Muller, so the same seed gives identical bytes on every machine.
// INVALID_ARGUMENT "data.synthetic.<field>: ..." for sizes < 1 (classes < 2).
absl::StatusOr<Dataset> MakeSyntheticDataset(const trainyard::v1::SyntheticData& spec,
                                             int64_t seed);

// The files `pattern` (a glob of absolute paths or file:// URIs) matches, sorted.
// NOT_FOUND "data.train: no files match '...'"; INVALID_ARGUMENT for other URI schemes.
absl::StatusOr<std::vector<std::string>> ExpandDataGlob(const std::string& pattern);

// Reads data.train (every matching safetensors file, concatenated along dim 0 in sorted order;
// with data.categorical also that tensor of integer ids, as int64 [N, fields]) or data.synthetic.
// `classification` asks for integer labels as int64 class ids; otherwise labels become float32.
// Errors name the field: NOT_FOUND for missing files, INVALID_ARGUMENT for a missing tensor
// ("data.features: tensor 'x' not in /p/f.safetensors"), a bad file, a dtype or shape mismatch,
// negative class ids.
absl::StatusOr<Dataset> LoadDataset(const trainyard::v1::DataSpec& spec, int64_t seed,
                                    bool classification);

struct SplitDataset {
  Dataset train;
  Dataset validation;  // empty (size() == 0) without a validation split
};
// Holds out the last round(fraction * N) samples (in file order, before any shuffling).
// INVALID_ARGUMENT "data.validation_split: ..." when the fraction is outside [0, 1) or leaves no
// training sample.
absl::StatusOr<SplitDataset> SplitValidation(const Dataset& data, double fraction);

struct Batch {
  int64_t step = 0;  // 0-based index of the update this batch is for
  torch::Tensor features;
  torch::Tensor labels;
  torch::Tensor categorical;  // undefined when the data has none
};

// Builds the batches of updates [first_step, end_step) in order on a background thread, at most
// `depth` ahead of the consumer. The batch of a step depends only on the data, plan, seed, shuffle
// and rank (see DataOrder), never on timing. Next() is for one consumer thread.
class BatchPrefetcher {
 public:
  BatchPrefetcher(Dataset data, const StepPlan& plan, int64_t seed, bool shuffle, int rank,
                  int world_size, int64_t first_step, int64_t end_step, int depth = 3);
  ~BatchPrefetcher();  // stops the thread; batches not taken are dropped

  // Blocks until the next batch is built; nullopt after the batch of end_step - 1.
  std::optional<Batch> Next();

 private:
  void Loop();
  void BuildBatches();

  const Dataset data_;
  DataOrder order_;  // used by the background thread only
  const int rank_;
  const int world_size_;
  const int64_t first_step_;
  const int64_t end_step_;
  const size_t depth_;

  absl::Mutex mu_;
  std::deque<Batch> queue_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;  // the thread built its last batch
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace trainyard::trainer

#endif  // TRAINYARD_WORKER_TRAINER_DATA_H_
