#ifndef TRAINYARD_WORKER_TRAINER_DATA_DATA_H_
#define TRAINYARD_WORKER_TRAINER_DATA_DATA_H_

// Part data/ of the trainer (worker/trainer/PARTS): datasets and shards, which samples each step
// takes, batches prepared ahead and brought to the device. It may call model/.
//
// Training data held in memory as tensors, and the background batch builder.

#include <torch/torch.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/storage/object_store.h"
#include "trainyard/v1/job.pb.h"
#include "worker/trainer/data/schedule.h"

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

struct DataOptions;

// Reads all of data.train (every matching safetensors file, concatenated along dim 0 in sorted
// order; with data.categorical also that tensor of integer ids, as int64 [N, fields]) or
// data.synthetic into memory, ignoring data.validation_split. For small data and tests; the
// trainer reads through OpenTrainingData.
// `classification` asks for integer labels as int64 class ids; otherwise labels become float32.
// Errors name the field: NOT_FOUND for missing files, INVALID_ARGUMENT for a missing tensor
// ("data.features: tensor 'x' not in /p/f.safetensors"), a bad file, a dtype or shape mismatch,
// negative class ids.
absl::StatusOr<Dataset> LoadDataset(const trainyard::v1::DataSpec& spec, int64_t seed,
                                    bool classification, const DataOptions& options);

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

// Where the trainer's data lives that the spec does not say.
struct DataOptions {
  // Remote shards: the worker's cache folder (empty: {ObjectCache::DefaultDir()}/shards, which
  // follows the agent's TRAINYARD_CACHE_DIR) and its bound (TRAINYARD_DATA_CACHE_BYTES, set by
  // the agent; FromEnvironment).
  std::string cache_dir;
  int64_t cache_bytes = int64_t{10} << 30;
  // Batches in page-locked memory, for fast copies to a GPU.
  bool pin_memory = false;
  // Where data.train's shards are opened; not owned. Required for data.train (FAILED_PRECONDITION
  // without); synthetic data needs none. FromEnvironment leaves it to the caller.
  const ObjectStoreResolver* stores = nullptr;
  // data.tokens: the model's context (model.args.context); a sample is a window of this many
  // tokens plus the one that follows. Required > 0 for token data.
  int64_t token_context = 0;
  static DataOptions FromEnvironment();
};

// What a run trains and validates on: samples numbered in file order, the training split
// first, then the validation split (the last samples). Synthetic data is held in memory; files
// are indexed from their headers and read per batch, only the named tensors, local shards
// memory-mapped and remote ones streamed through the worker's cache
// (common/formats/shard_reader.h). Compact dtypes stay compact until a batch is built: features
// become float32 per batch (times data.feature_scale plus data.feature_offset), labels int64 class
// ids (float32 targets for mse), categorical ids int64.
class TrainingData {
 public:
  virtual ~TrainingData() = default;

  int64_t train_size() const { return train_; }
  int64_t validation_size() const { return validation_; }
  // Features per sample: the product of sample_shape.
  int64_t FeatureWidth() const;
  const std::vector<int64_t>& sample_shape() const { return sample_shape_; }
  // Outputs the model needs: max class id + 1, or the target width for mse.
  int64_t outputs() const { return outputs_; }
  // Whether samples are windows of tokens (data.tokens), with a label per position.
  bool tokens() const { return tokens_; }
  // Per categorical field, the largest id (empty without categorical ids).
  const std::vector<int64_t>& max_ids() const { return max_ids_; }
  // Training samples of each shard in file order; empty for data held in memory.
  const std::vector<int64_t>& shard_train_samples() const { return shard_train_samples_; }
  // Bytes of the named tensors of each shard (what reading a whole shard reads).
  virtual int64_t ShardBytes(int shard) const { return 0; }

  // The samples at `indices` (global, in [0, train_size + validation_size)), in that order.
  // Errors from the shards (UNAVAILABLE, NOT_FOUND, DATA_LOSS) naming the shard. Thread-safe.
  virtual absl::StatusOr<Batch> Gather(const std::vector<int64_t>& indices) = 0;
  // The shards to keep at hand, in the order they will be read (DataOrder::ShardsInFlight and
  // ShardsAfter); the others are let go. No-op for data in memory. Does not block.
  virtual void Hold(const std::vector<int>& shards) {}
  // Remote bytes fetched so far.
  virtual int64_t bytes_fetched() const { return 0; }
  // Whether the shards come from object storage through the worker's cache.
  virtual bool remote() const { return false; }

 protected:
  int64_t train_ = 0;
  int64_t validation_ = 0;
  std::vector<int64_t> sample_shape_;
  int64_t outputs_ = 0;
  std::vector<int64_t> max_ids_;
  std::vector<int64_t> shard_train_samples_;
  bool tokens_ = false;
};

// data.synthetic, data.train or data.tokens, split by data.validation_split. Token shards
// give windows of options.token_context + 1 tokens, one every token_context tokens within each
// shard: features the first token_context ids, labels the last (each position's next token),
// both int64 [N, token_context]; outputs() is the largest id + 1. `classification` asks for
// integer labels as class ids. Reads headers (and the labels and categorical columns when the
// shards do not record their extremes, see `trainyard data pack`), never the features.
// Errors name the field: NOT_FOUND "data.train: no files match '...'", INVALID_ARGUMENT for a
// missing tensor ("data.features: tensor 'x' not in /p/f.safetensors"), a bad file, a dtype or
// shape mismatch between shards, negative class ids, a split that leaves nothing to train on,
// and remote shards whose windows (data.shuffle_window, data.prefetch_shards) do not fit the
// worker's cache.
absl::StatusOr<std::unique_ptr<TrainingData>> OpenTrainingData(const trainyard::v1::DataSpec& spec,
                                                               int64_t seed, bool classification,
                                                               const DataOptions& options);

// Data already in memory (tests): `validation` follows `train`.
std::unique_ptr<TrainingData> InMemoryData(Dataset train, Dataset validation = {});

// Builds the batches of updates [first_step, end_step) in order on a background thread, at most
// `depth` ahead of the consumer, telling the data which shards to hold (those the current
// windows span and `prefetch_shards` after them). The batch of a step depends only on the data,
// plan, seed, shuffle, window and rank (see DataOrder), never on timing. Next() is for one
// consumer thread.
class BatchPrefetcher {
 public:
  struct Order {
    int64_t seed = 0;
    bool shuffle = true;
    int64_t window = 0;  // data.shuffle_window
    int prefetch_shards = 2;
  };
  BatchPrefetcher(TrainingData& data, const StepPlan& plan, const Order& order, int rank,
                  int world_size, int64_t first_step, int64_t end_step, int depth = 3);
  // In memory, no window (tests).
  BatchPrefetcher(Dataset data, const StepPlan& plan, int64_t seed, bool shuffle, int rank,
                  int world_size, int64_t first_step, int64_t end_step, int depth = 3);
  ~BatchPrefetcher();  // stops the thread; batches not taken are dropped

  // Blocks until the next batch is built; nullopt after the batch of end_step - 1, or when
  // building one failed (status() says why).
  std::optional<Batch> Next();
  // Why the batches ended early; OK otherwise.
  absl::Status status();

 private:
  // Reads `owned` when set, else `data`.
  BatchPrefetcher(std::unique_ptr<TrainingData> owned, TrainingData* data, const StepPlan& plan,
                  const Order& order, int rank, int world_size, int64_t first_step,
                  int64_t end_step, int depth);
  void Loop();
  absl::Status BuildBatches();

  std::unique_ptr<TrainingData> owned_;  // the in-memory form's
  TrainingData& data_;
  DataOrder order_;  // used by the background thread only
  const int prefetch_shards_;
  const int rank_;
  const int world_size_;
  const int64_t first_step_;
  const int64_t end_step_;
  const size_t depth_;

  absl::Mutex mu_;
  std::deque<Batch> queue_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;  // the thread built its last batch
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace trainyard::trainer

#endif  // TRAINYARD_WORKER_TRAINER_DATA_DATA_H_
