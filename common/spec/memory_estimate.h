#ifndef TRAINYARD_COMMON_SPEC_MEMORY_ESTIMATE_H_
#define TRAINYARD_COMMON_SPEC_MEMORY_ESTIMATE_H_

// How much memory one rank (and one parameter-server shard) of a job needs, worked out from its
// spec without LibTorch: the coordinator refuses at submission a job that its own
// resources.memory, or every worker, is too small for.
//
// Parameters are counted exactly for the built-in models (from their arguments and, where the
// arguments leave them out, the synthetic data's features and classes) and from the tensors of a
// TorchScript archive. The rest follows from the strategy and the optimizer: a rank holds its
// parameters, their gradients and its optimizer's state (Adam and AdamW two values per
// parameter, SGD with momentum one), except that a parameter-server rank leaves the optimizer to
// the shards, and holds only the dense layers when the shards keep the tables; a pipeline stage
// holds its share of the layers; a shard its share of what the shards hold, with the optimizer's
// state and a gradient being summed. Activations are those one batch keeps for its backward pass
// (a rank's share of the global batch; a pipeline stage's micro-batches in flight), in float32.
// On top, the trainer's own LibTorch runtime.

#include <cstdint>
#include <string>
#include <vector>

#include "trainyard/v1/job.pb.h"

namespace trainyard {

// What a trainer holds before any model: measured 62 MiB (cgroup peak, page cache included) for
// a small MLP; rounded up.
inline constexpr int64_t kTrainerRuntimeBytes = int64_t{80} << 20;

// The share of what the model leaves of a rank's memory limit that its data path (the shards the
// order holds at once, and those fetched ahead) may take: the rest is room for the page cache's
// churn, the batches being built and what the estimate misses.
inline constexpr double kDataShareOfMemory = 0.5;

struct TaskMemory {
  int64_t parameters = 0;
  int64_t gradients = 0;
  int64_t optimizer = 0;  // optimizer state
  int64_t teacher = 0;    // a distillation teacher's tensors
  int64_t activations = 0;
  int64_t runtime = kTrainerRuntimeBytes;
  // Something could not be known at submission (a data file's width, a TorchScript file this
  // machine cannot read): the total is a lower bound.
  bool lower_bound = false;
  std::string optimizer_name;  // "adamw", for the detail

  int64_t Total() const;
  // "parameters 400.0 MiB, gradients 400.0 MiB, adamw state 800.0 MiB, activations 12.0 MiB,
  // runtime 80.0 MiB".
  std::string Detail() const;
  trainyard::v1::TaskMemoryEstimate ToProto() const;
};

struct JobMemory {
  TaskMemory rank;  // a pipeline's: its largest stage's
  bool has_shard = false;
  TaskMemory shard;
  std::vector<TaskMemory> stages;  // a pipeline's, one per stage
};

// The estimate for a valid `spec` (ValidateJobSpec passed). `needs` may carry the tensor bytes of
// its TorchScript models (nullptr or unread: a lower bound without them).
JobMemory EstimateJobMemory(const trainyard::v1::JobSpec& spec,
                            const trainyard::v1::ModelNeeds* needs);

// "1.9 GiB (parameters ..., ...)" or "at least 1.9 GiB (...)".
std::string DescribeEstimate(const trainyard::v1::TaskMemoryEstimate& estimate);

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_SPEC_MEMORY_ESTIMATE_H_
