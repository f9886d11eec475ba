#ifndef TRAINYARD_WORKER_TRAINER_PS_SHARD_H_
#define TRAINYARD_WORKER_TRAINER_PS_SHARD_H_

// The state and update rule of one parameter-server shard, without any transport: the pieces of
// the parameters it holds (ps_partition.h), the job's optimizer over them, and the version
// (updates applied). A transport calls Push and Pull from any number of threads.
//
// Synchronous mode: version v is the model after v updates. Every worker pushes its gradients of
// update v once; the last of the `workers` pushes averages them (summed in rank order, so the
// result does not depend on arrival order), applies the optimizer at the learning rate of step
// v, and makes version v + 1, which the workers then pull. This is the data-parallel update
// split over shards, so a synchronous job trains like the same data_parallel one.
//
// Asynchronous mode: each push is applied when it arrives, scaled by 1 / workers (the mean
// gradient's weight, so the learning rate means what it means in synchronous mode), and makes a
// new version; the learning-rate schedule advances one step per `workers` pushes. A push
// computed from version b reaching a shard at version v has staleness v - b; one staler than
// max_staleness is not applied (it is counted): its worker pulls fresh parameters and goes on
// with its next batch, so no update is made from parameters older than that and a slow worker
// never holds up the others.
//
// Every call carries the attempt's generation; another one is refused with FAILED_PRECONDITION
// (fencing: a worker of an old attempt cannot change a new attempt's shard).

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "trainyard/v1/job.pb.h"
#include "worker/trainer/model.h"

namespace trainyard::trainer {

struct ShardConfig {
  int64_t generation = 0;
  int workers = 1;
  bool synchronous = true;
  int max_staleness = 0;  // asynchronous mode
  trainyard::v1::OptimizerSpec optimizer;
  int64_t total_steps = 0;    // for the learning-rate schedule
  int64_t start_version = 0;  // the step the attempt resumed from
};

// What a synchronous update agreed on: the workers' losses averaged, and whether any of them was
// asked to stop (they all stop after this update).
struct ShardAgreement {
  double loss = 0;
  bool stop = false;
};

class ParameterShard {
 public:
  // `pieces` are this shard's parameter pieces (float32 or float64, CPU, contiguous), taken as
  // the initial values; the shard owns them from now on. `optimizer_state` is the optimizer's
  // state over them, named "p{piece index}.{field}" as OptimizerStateTensors names it (empty:
  // fresh). INVALID_ARGUMENT for a bad config (workers < 1, max_staleness < 0 in asynchronous
  // mode), pieces that are not CPU floating point, or state that does not fit them; the
  // optimizer's errors (optimizer.name) otherwise.
  static absl::StatusOr<std::unique_ptr<ParameterShard>> Create(
      ShardConfig config, std::vector<torch::Tensor> pieces,
      const std::map<std::string, torch::Tensor>& optimizer_state = {});

  struct PushResult {
    int64_t version = 0;    // the shard's version after the push
    int64_t staleness = 0;  // asynchronous mode: the version it was applied at minus its base
    bool applied = true;    // false: too stale (asynchronous mode); pull and compute again
  };
  // Worker `rank`'s gradients for the update from version `base_version`, one tensor per piece in
  // piece order, of the pieces' shapes; read during the call only. `loss` and `stop` are the
  // rank's update loss and stop request, which the synchronous update combines.
  // FAILED_PRECONDITION for another generation, or (synchronous) a base that is not the current
  // version or a second push by one rank for it; INVALID_ARGUMENT for a rank out of range or
  // gradients that do not match the pieces. Never blocks on other workers.
  absl::StatusOr<PushResult> Push(int64_t generation, int rank, int64_t base_version,
                                  const std::vector<torch::Tensor>& gradients, double loss = 0,
                                  bool stop = false);

  struct PullResult {
    int64_t version = 0;
    ShardAgreement agreement;  // synchronous mode: of the update that made `version`
    absl::Duration waited;     // for `min_version`
  };
  // Waits until the version is at least `min_version`, then copies the pieces into `out`
  // (resized to one tensor per piece; tensors of the right shape and dtype are reused).
  // DEADLINE_EXCEEDED naming the version waited for when it is not reached by `deadline`;
  // FAILED_PRECONDITION for another generation. Thread-safe; blocks.
  absl::StatusOr<PullResult> Pull(int64_t generation, int64_t min_version,
                                  std::vector<torch::Tensor>* out, absl::Time deadline);

  // As Pull, but hands the pieces themselves to `read`, under the shard's lock (no update runs
  // meanwhile), instead of copying them out: for a transport that writes them out directly.
  absl::StatusOr<PullResult> PullWith(
      int64_t generation, int64_t min_version, absl::Time deadline,
      const std::function<void(const std::vector<torch::Tensor>&)>& read);

  // A copy of the optimizer's state, named as Create takes it, once the version is `version`.
  // FAILED_PRECONDITION for another generation or when the shard is at another version.
  absl::StatusOr<NamedTensors> OptimizerState(int64_t generation, int64_t version) const;

  // The pieces (copies) and the optimizer's state taken at one version, for an asynchronous
  // shard's checkpoint. FAILED_PRECONDITION for another generation.
  struct Snapshot {
    int64_t version = 0;
    std::vector<torch::Tensor> pieces;
    NamedTensors optimizer_state;
  };
  absl::StatusOr<Snapshot> TakeSnapshot(int64_t generation) const;

  int64_t version() const;
  const ShardConfig& config() const { return config_; }
  using PieceShape = std::pair<std::vector<int64_t>, c10::ScalarType>;
  // The pieces' shapes and dtypes, in piece order; fixed.
  const std::vector<PieceShape>& shapes() const { return shapes_; }
  // Pushes not applied because they were too stale (asynchronous mode).
  int64_t stale_pushes() const;

 private:
  ParameterShard(ShardConfig config, std::vector<torch::Tensor> pieces,
                 std::unique_ptr<torch::optim::Optimizer> optimizer);
  absl::Status CheckGradients(const std::vector<torch::Tensor>& gradients) const;
  // Adds rank summed_'s gradients to sum_ (copies them when it is the first) and moves on.
  void AddToSumLocked(const std::vector<torch::Tensor>& gradients)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sets each piece's gradient to `scale` times `sum` (scaling `sum` itself when
  // `scale_in_place`) and steps the optimizer at the learning rate of `step`.
  void ApplyLocked(std::vector<torch::Tensor>& sum, bool scale_in_place, double scale, int64_t step)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ShardConfig config_;
  // The pieces' shapes and dtypes, which pushes must match; fixed.
  const std::vector<PieceShape> shapes_;

  mutable absl::Mutex mu_;
  std::vector<torch::Tensor> pieces_ ABSL_GUARDED_BY(mu_);
  NamedTensors named_pieces_ ABSL_GUARDED_BY(mu_);  // the same tensors, named "p{index}"
  std::unique_ptr<torch::optim::Optimizer> optimizer_ ABSL_GUARDED_BY(mu_);
  int64_t version_ ABSL_GUARDED_BY(mu_);
  int64_t stale_pushes_ ABSL_GUARDED_BY(mu_) = 0;
  // Synchronous mode: `sum_` holds the gradients of ranks [0, summed_) of the current version,
  // added in rank order (buffers kept from one version to the next); `pending_` the pushes of
  // later ranks that came early, by rank (empty: not pushed, or summed).
  std::vector<torch::Tensor> sum_ ABSL_GUARDED_BY(mu_);
  int summed_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<bool> pushed_ ABSL_GUARDED_BY(mu_);
  std::vector<std::vector<torch::Tensor>> pending_ ABSL_GUARDED_BY(mu_);
  std::vector<double> pending_loss_ ABSL_GUARDED_BY(mu_);
  int pending_count_ ABSL_GUARDED_BY(mu_) = 0;
  bool pending_stop_ ABSL_GUARDED_BY(mu_) = false;
  ShardAgreement agreement_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trainyard::trainer

#endif  // TRAINYARD_WORKER_TRAINER_PS_SHARD_H_
