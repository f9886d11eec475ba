#ifndef TRAINYARD_WORKER_TRAINER_PS_STRATEGY_H_
#define TRAINYARD_WORKER_TRAINER_PS_STRATEGY_H_

// Part ps/ of the trainer (worker/trainer/PARTS): parameter servers: partition, shard state, wire
// format, server, client, the strategy. It may call coordinator/, data/, model/, strategy/.
//
// The worker side of a parameter_server job: the model's trainable parameters are split over the
// shards (ps/partition.h); the shards run the optimizer, so the trainer does not
// (updates_parameters()).
//
// Synchronous: each update every rank pushes its gradients' pieces to their shards, and pulls
// the parameters the shards made from the mean of all ranks' gradients straight into the
// model's storage; the ranks agree on the update's loss and on stopping through the shards.
//
// Embedding tables (Model::EmbeddingTables) are not cut into pieces: row r lives on shard
// r % shards, and each micro-batch pulls only the rows it touches (BeforeForward) into a small
// tensor the model looks them up in, whose gradient is pushed with the dense ones; so what a
// step moves follows the rows it touches, not the table's size. The tables in the model itself
// are brought up to date only where needed: the rows a validation set touches before it is
// evaluated, and the whole tables on rank 0 before a checkpoint and before the export.
//
// With dense: allreduce (the hybrid large recommendation models use) the shards hold only the
// tables, and the other parameters stay with the ranks, all-reduced as in data_parallel.
//
// Asynchronous: each rank pushes when its update is ready and pulls whatever each shard holds
// then, never waiting for the other ranks; a push too stale to apply is dropped by the shard
// (the rank goes on with fresh parameters). Each rank stops on its own stop request. Rank 0's
// checkpoints hold a snapshot of the shards (their parameters and optimizer state, each shard
// at one version); the final one of a run or of a stop is taken once every other rank has
// finished, so it holds every rank's last update.

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "worker/trainer/ps/client.h"
#include "worker/trainer/ps/partition.h"
#include "worker/trainer/strategy/strategy.h"

namespace trainyard::trainer {

// The rendezvous key under which shard `shard` of a parameter_server attempt publishes its
// host:port.
std::string ParameterServerKey(int shard);

class ParameterServerStrategy final : public Strategy {
 public:
  // `shards[i]` talks to shard i of this attempt. With `dense` (parameter_servers.dense:
  // allreduce), the shards hold only the embedding tables and `dense` combines the other
  // parameters' gradients among the ranks (a DataParallelStrategy; a SingleStrategy for one
  // rank), whose updates the trainer's optimizer then makes.
  ParameterServerStrategy(int rank, int world, std::vector<std::unique_ptr<PsClient>> shards,
                          bool synchronous = true, std::unique_ptr<Strategy> dense = nullptr);

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  bool updates_parameters() const override { return dense_ == nullptr; }
  // With dense: allreduce, through the ranks' all-reduce; the workers of a job whose every
  // parameter lives on the shards have no channel among themselves.
  bool sums_over_ranks() const override { return dense_ != nullptr && dense_->sums_over_ranks(); }
  absl::StatusOr<std::vector<double>> SumOverRanks(std::vector<double> values) override {
    if (dense_ == nullptr) return Strategy::SumOverRanks(std::move(values));
    return dense_->SumOverRanks(std::move(values));
  }
  // For the shards' learning-rate schedule: rank 0 gives it to them in SyncState.
  void SetTotalSteps(int64_t total_steps, int64_t end_step) override {
    total_steps_ = total_steps;
    end_step_ = end_step;
  }
  void SetOptimizer(torch::optim::Optimizer* optimizer, const NamedTensors& params) override;
  // Fetches every shard's optimizer state of version `step` and lays it out over the whole
  // parameters in the trainer's optimizer. Asynchronous: a snapshot of each shard's parameters
  // (into the model) and optimizer state, after the other ranks finished when `step` ends the
  // run or a stop.
  absl::Status GatherOptimizerState(int64_t step) override;
  // Partitions the trainable parameters (float32 or float64, contiguous, CPU) over the shards.
  // INVALID_ARGUMENT for parameters it cannot hold.
  absl::Status Setup(Model& model) override;
  // Rank 0 initialises the shards with its parameters at `start_step`; every rank then pulls
  // them, and ABORTED when the shards are at another step than the rank resumed at (behind it,
  // in asynchronous mode, where other ranks may have pushed already).
  absl::Status SyncState(Model& model, int64_t start_step) override;
  // Pulls the rows of every table the micro-batch touches from their shards.
  absl::Status BeforeForward(const torch::Tensor& categorical) override;
  // Pulls the rows these ids touch into the model's tables.
  absl::Status BeforeEvaluate(const torch::Tensor& categorical) override;
  void BeforeBackward(bool last_micro_batch, const torch::Tensor& update_loss,
                      bool stop_requested) override;
  // Asynchronous mode: the furthest version pulled from a shard (every push, by any rank, that a
  // shard applied).
  std::optional<int64_t> UpdatesApplied() const override;
  // Pushes this rank's gradients and pulls the next version (synchronous) or the shards'
  // current one (asynchronous) into the parameters.
  absl::Status AfterBackward(Model& model) override;
  // Asynchronous mode: pushes the shards did not apply, too stale.
  int64_t stale_pushes() const { return stale_pushes_; }
  absl::StatusOr<StepAgreement> EndStep() override;
  // Fetches the whole tables into the model unless the last checkpoint did.
  absl::Status GatherModel(int64_t step) override;
  // Tells every shard this rank is done.
  absl::Status Finish() override;
  double TakeCommunicationSeconds() override;
  // {"shards", "mode", "dense", "partition": the dense pieces (PartitionToJson), "tables": each
  // table's parameter, rows and dim, row r on shard r % shards}.
  std::string Layout() const override;

 private:
  // `whole` (optimizer state by parameter, as OptimizerStateTensors names it) cut into the
  // pieces of `shard`, named "p{piece}.{field}" as the shard takes it.
  NamedTensors ShardState(const NamedTensors& whole, int shard) const;
  // Runs `call(shard)` for every shard at once (one thread per shard beyond the first); the
  // first error in shard order.
  absl::Status ForEachShard(const std::function<absl::Status(int)>& call);

  // Asynchronous: merges each shard's optimizer state into the trainer's optimizer.
  absl::Status LoadShardStates(std::vector<std::map<std::string, torch::Tensor>>& states);
  absl::Status AfterBackwardAsync();
  // dense: allreduce: pushes the rows' gradients, then all-reduces the rest.
  absl::Status AfterBackwardHybrid(Model& model);
  // The rows of shard `s` in table `t` ([RowsOnShard, dim] strided view of the model's table).
  torch::Tensor TableSlice(int t, int s) const;
  // New contiguous tensors shaped like shard `s`'s rows of each table.
  std::vector<torch::Tensor> TableBuffers(int s) const;
  // `ids` (sorted, distinct) split by shard: for each shard its ids and their positions in `ids`.
  struct ShardRows {
    torch::Tensor ids;
    torch::Tensor positions;
  };
  std::vector<ShardRows> SplitByShard(const torch::Tensor& ids) const;
  // Pulls the rows `ids` (sorted, distinct, per table; undefined for none) from their shards at
  // `min_version`: [k, dim] per table. `versions` (per shard), when given, gets the version of
  // each shard pulled from.
  absl::StatusOr<std::vector<torch::Tensor>> PullTableRows(
      const std::vector<torch::Tensor>& ids, int64_t min_version,
      std::vector<int64_t>* versions = nullptr);
  // The row gradients of this update, split by shard (per shard, per table).
  std::vector<std::vector<RowGradients>> TakeRowGradients();
  // The rows of table `t` looked up by `ids` in the current micro-batch's pulled rows.
  torch::Tensor LookUp(int t, const torch::Tensor& ids);

  const int rank_;
  const int world_;
  const bool synchronous_;
  const std::unique_ptr<Strategy> dense_;
  int64_t total_steps_ = 0;
  int64_t end_step_ = 0;
  std::vector<std::unique_ptr<PsClient>> shards_;
  // Fixed by Setup and SetOptimizer.
  std::vector<torch::Tensor> params_;
  std::vector<std::string> names_;  // of params_
  torch::optim::Optimizer* optimizer_ = nullptr;
  NamedTensors optimizer_params_;
  Partition partition_;
  std::vector<ParameterShape> shapes_;      // of params_, partitioned
  std::vector<std::vector<Piece>> pieces_;  // per shard
  struct Table {
    torch::Tensor param;  // the model's [rows, dim] parameter
    std::string name;
    int field = 0;  // its column of the categorical ids
  };
  std::vector<Table> tables_;
  // Each micro-batch of the current update: per table, the distinct ids it touches (sorted),
  // where each of its samples' ids is among them, and their rows (a leaf that collects their
  // gradient).
  struct MicroRows {
    torch::Tensor ids;
    torch::Tensor inverse;
    torch::Tensor rows;
  };
  std::vector<std::vector<MicroRows>> micro_;
  int64_t tables_version_ = -1;  // the version the model's whole tables hold (rank 0)

  // Training thread only.
  int64_t version_ = 0;                  // synchronous: the version every shard is at
  std::vector<int64_t> shard_versions_;  // asynchronous: the version pulled from each shard
  int64_t stale_pushes_ = 0;
  // The loss on the host: it travels to the shards (whose tensors are on the CPU anyway).
  ShardAgreement local_;
  ShardAgreement agreed_;
  double communication_seconds_ = 0;
};

}  // namespace trainyard::trainer

#endif  // TRAINYARD_WORKER_TRAINER_PS_STRATEGY_H_
