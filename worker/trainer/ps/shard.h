#ifndef TRAINYARD_WORKER_TRAINER_PS_SHARD_H_
#define TRAINYARD_WORKER_TRAINER_PS_SHARD_H_

// The state and update rule of one parameter-server shard, without any transport: the pieces of
// the parameters it holds (ps/partition.h), the job's optimizer over them, and the version
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
// Embedding tables are held by rows, not pieces: row r of a table lives on shard r % shards (at
// local row r / shards), and workers pull and push only the rows their batches touch. The
// shard updates a table lazily, as torch's sparse optimizers do: a row's optimizer state
// (momentum, Adam's moments) and its weight decay advance only in updates whose batches touched
// it, so an update costs what its rows cost, whatever the table's size. Adam's bias correction
// counts every update of the table. With every row touched in every update this is the dense
// update exactly.
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
#include "worker/trainer/model/model.h"

namespace trainyard::trainer {

struct ShardConfig {
  int64_t generation = 0;
  int shard = 0;  // this shard's index, of `shards`: which table rows it holds
  int shards = 1;
  int workers = 1;
  bool synchronous = true;
  int max_staleness = 0;  // asynchronous mode
  trainyard::v1::OptimizerSpec optimizer;
  int64_t total_steps = 0;    // for the learning-rate schedule
  int64_t start_version = 0;  // the step the attempt resumed from
};

// How many of a `rows`-row table's rows shard `shard` of `shards` holds (rows r with
// r % shards == shard).
inline int64_t RowsOnShard(int64_t rows, int shard, int shards) {
  return rows > shard ? (rows - shard + shards - 1) / shards : 0;
}

// A worker's gradient of some rows of one embedding table: `ids` (int64 [k], the table's row
// numbers, each held by the shard) and `grads` ([k, dim], of the table's dtype). Repeated ids are
// summed. Empty (undefined or k = 0) when the worker touched none of the shard's rows.
struct RowGradients {
  torch::Tensor ids;
  torch::Tensor grads;
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
  // fresh). `tables` are the shard's rows of each embedding table ([RowsOnShard(rows), dim]
  // each, CPU floating point; `table_rows` the tables' whole row counts), with their state named
  // "t{table}.{field}" (momentum_buffer, exp_avg, exp_avg_sq shaped like the rows; step one
  // int64). INVALID_ARGUMENT for a bad config (workers < 1, max_staleness < 0 in asynchronous
  // mode, shard outside [0, shards)), pieces or tables that are not CPU floating point, or state
  // that does not fit them; the optimizer's errors (optimizer.name) otherwise.
  static absl::StatusOr<std::unique_ptr<ParameterShard>> Create(
      ShardConfig config, std::vector<torch::Tensor> pieces,
      const std::map<std::string, torch::Tensor>& optimizer_state = {},
      std::vector<torch::Tensor> tables = {}, const std::vector<int64_t>& table_rows = {});

  struct PushResult {
    int64_t version = 0;    // the shard's version after the push
    int64_t staleness = 0;  // asynchronous mode: the version it was applied at minus its base
    bool applied = true;    // false: too stale (asynchronous mode); pull and compute again
  };
  // Worker `rank`'s gradients for the update from version `base_version`, one tensor per piece in
  // piece order, of the pieces' shapes; read during the call only. `loss` and `stop` are the
  // rank's update loss and stop request, which the synchronous update combines. `rows` holds the
  // gradients of the table rows the rank touched, one entry per table (or none at all).
  // FAILED_PRECONDITION for another generation, or (synchronous) a base that is not the current
  // version or a second push by one rank for it; INVALID_ARGUMENT for a rank out of range,
  // gradients that do not match the pieces, or row ids the shard does not hold. Never blocks on
  // other workers.
  absl::StatusOr<PushResult> Push(int64_t generation, int rank, int64_t base_version,
                                  const std::vector<torch::Tensor>& gradients, double loss = 0,
                                  bool stop = false, const std::vector<RowGradients>& rows = {});

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

  // As Pull, but the copy of a version is made once and shared by every caller that pulls that
  // version (never written again; a new version gets new tensors): for a transport that sends
  // from them after the call, as PushPull does.
  absl::StatusOr<PullResult> PullShared(int64_t generation, int64_t min_version,
                                        absl::Time deadline, std::vector<torch::Tensor>* out);

  // As PullWith, for rows of the tables: `ids[t]` (int64 [k], rows of table t this shard holds;
  // undefined or empty for none) are checked, and once the version is reached `read(t, values,
  // local)` is called under the lock for each table with ids, `values` being the shard's rows of
  // table t and `local` the positions of the ids in it. INVALID_ARGUMENT for ids the shard does
  // not hold or more entries than tables.
  using RowReader =
      std::function<void(int table, const torch::Tensor& values, const torch::Tensor& local)>;
  absl::StatusOr<PullResult> PullRowsWith(int64_t generation, int64_t min_version,
                                          absl::Time deadline,
                                          const std::vector<torch::Tensor>& ids,
                                          const RowReader& read);
  // PullRowsWith copying the rows out: `out[t]` is [k, dim].
  absl::StatusOr<PullResult> PullRows(int64_t generation, int64_t min_version,
                                      const std::vector<torch::Tensor>& ids,
                                      std::vector<torch::Tensor>* out, absl::Time deadline);

  // Copies of the shard's rows of each table once the version is `version` (as OptimizerState).
  absl::StatusOr<std::vector<torch::Tensor>> Tables(int64_t generation, int64_t version) const;

  // A copy of the optimizer's state, named as Create takes it, once the version is `version`.
  // FAILED_PRECONDITION for another generation or when the shard is at another version.
  absl::StatusOr<NamedTensors> OptimizerState(int64_t generation, int64_t version) const;

  // The pieces (copies) and the optimizer's state taken at one version, for an asynchronous
  // shard's checkpoint. FAILED_PRECONDITION for another generation.
  struct Snapshot {
    int64_t version = 0;
    std::vector<torch::Tensor> pieces;
    std::vector<torch::Tensor> tables;
    NamedTensors optimizer_state;
  };
  absl::StatusOr<Snapshot> TakeSnapshot(int64_t generation) const;

  int64_t version() const;
  const ShardConfig& config() const { return config_; }
  using PieceShape = std::pair<std::vector<int64_t>, c10::ScalarType>;
  // The pieces' shapes and dtypes, in piece order; fixed.
  const std::vector<PieceShape>& shapes() const { return shapes_; }
  // Each table's whole row count and row width, in table order; fixed.
  struct TableShape {
    int64_t rows = 0;
    int64_t dim = 0;
    c10::ScalarType dtype = torch::kFloat32;
  };
  const std::vector<TableShape>& table_shapes() const { return table_shapes_; }
  // Pushes not applied because they were too stale (asynchronous mode).
  int64_t stale_pushes() const;

 private:
  // One table's rows on this shard and their lazy optimizer state (allocated on first use).
  struct Table {
    torch::Tensor values;  // [local rows, dim]
    torch::Tensor momentum_buffer, exp_avg, exp_avg_sq;
    int64_t step = 0;  // updates applied to the table
  };
  ParameterShard(ShardConfig config, std::vector<torch::Tensor> pieces,
                 std::unique_ptr<torch::optim::Optimizer> optimizer, std::vector<Table> tables,
                 std::vector<TableShape> table_shapes);
  absl::Status CheckGradients(const std::vector<torch::Tensor>& gradients) const;
  // The positions in table `table`'s local rows of `ids`; INVALID_ARGUMENT naming the first id
  // this shard does not hold.
  absl::StatusOr<torch::Tensor> LocalRows(int table, const torch::Tensor& ids) const;
  absl::Status CheckRows(const std::vector<RowGradients>& rows) const;
  // Adds `rows` (one entry per table, or none), scaled by `scale`, into each table lazily at the
  // learning rate of `step`; every table counts the update.
  void ApplyRowsLocked(const std::vector<RowGradients>& rows, double scale, int64_t step)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  NamedTensors TableStateLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits until the version is at least `min_version`: how long it waited, or DEADLINE_EXCEEDED.
  absl::StatusOr<absl::Duration> AwaitVersionLocked(int64_t min_version, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
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
  const std::vector<TableShape> table_shapes_;

  mutable absl::Mutex mu_;
  std::vector<torch::Tensor> pieces_ ABSL_GUARDED_BY(mu_);
  NamedTensors named_pieces_ ABSL_GUARDED_BY(mu_);  // the same tensors, named "p{index}"
  std::unique_ptr<torch::optim::Optimizer> optimizer_ ABSL_GUARDED_BY(mu_);
  std::vector<Table> tables_ ABSL_GUARDED_BY(mu_);
  int64_t version_ ABSL_GUARDED_BY(mu_);
  int64_t stale_pushes_ ABSL_GUARDED_BY(mu_) = 0;
  // Synchronous mode: `sum_` holds the gradients of ranks [0, summed_) of the current version,
  // added in rank order (buffers kept from one version to the next); `pending_` the pushes of
  // later ranks that came early, by rank (empty: not pushed, or summed).
  std::vector<torch::Tensor> sum_ ABSL_GUARDED_BY(mu_);
  int summed_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<bool> pushed_ ABSL_GUARDED_BY(mu_);
  std::vector<std::vector<torch::Tensor>> pending_ ABSL_GUARDED_BY(mu_);
  // The table rows each rank pushed for the current version (copies), by rank.
  std::vector<std::vector<RowGradients>> pending_rows_ ABSL_GUARDED_BY(mu_);
  std::vector<double> pending_loss_ ABSL_GUARDED_BY(mu_);
  int pending_count_ ABSL_GUARDED_BY(mu_) = 0;
  bool pending_stop_ ABSL_GUARDED_BY(mu_) = false;
  ShardAgreement agreement_ ABSL_GUARDED_BY(mu_);
  // PullShared's copy of the pieces, of version shared_version_ (-1: none yet).
  std::vector<torch::Tensor> shared_ ABSL_GUARDED_BY(mu_);
  int64_t shared_version_ ABSL_GUARDED_BY(mu_) = -1;
};

}  // namespace trainyard::trainer

#endif  // TRAINYARD_WORKER_TRAINER_PS_SHARD_H_
