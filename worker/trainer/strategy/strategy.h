#ifndef TRAINYARD_WORKER_TRAINER_STRATEGY_STRATEGY_H_
#define TRAINYARD_WORKER_TRAINER_STRATEGY_STRATEGY_H_

// Part strategy/ of the trainer (worker/trainer/PARTS): what a rank does around each update: the
// interface, single, data-parallel. It may call collective/, model/.
//
// What a rank does around each update. A Strategy decides how ranks combine their work
// (data-parallel: broadcast the initial state, all-reduce gradients; parameter-server: push
// gradients and pull parameters); a Communicator (collective/communicator.h) moves the tensors.

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "trainyard/v1/agent_service.pb.h"
#include "worker/trainer/collective/communicator.h"
#include "worker/trainer/model/model.h"

namespace trainyard::trainer {

struct StepAgreement {
  // The update's loss averaged over ranks: a 0-dim float64 tensor on the training device. Reading
  // it (.item) waits for the step to finish on a GPU, so the trainer reads it only where it
  // prints or reports it.
  torch::Tensor loss;
  bool stop = false;  // some rank was asked to stop: all stop after this update
};

// Called from the training thread only (autograd hooks included, which LibTorch runs there for
// CPU tensors; a strategy guards what its hooks touch regardless).
class Strategy {
 public:
  virtual ~Strategy() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Which share of each global batch this rank reads, of how many: its rank of world_size where
  // every rank trains the whole model; a pipeline's replica of its replicas, since every stage of
  // a replica reads the same samples.
  virtual int data_rank() const { return rank(); }
  virtual int data_world() const { return world_size(); }
  // Once, after the model is built and before any checkpoint is restored.
  virtual absl::Status Setup(Model& model) = 0;
  // The run's total updates (the learning-rate schedule's length) and the step this job stops at
  // (stop_at_step), once the data is known; before SyncState.
  virtual void SetTotalSteps(int64_t total_steps, int64_t end_step) {}
  // The trainer's optimizer over its trainable parameters (by name), before SyncState, which
  // finds it restored from the checkpoint resumed from. A strategy that updates the parameters
  // itself keeps the optimizer's state elsewhere and carries it through this one: into its own
  // in SyncState, and back before every checkpoint (GatherOptimizerState). Not owned.
  virtual void SetOptimizer(torch::optim::Optimizer* optimizer, const NamedTensors& params) {}
  // Rank 0, before a checkpoint of `step`: makes the trainer's optimizer hold the state the
  // checkpoint records. The strategy's errors (a shard that cannot be reached) otherwise.
  virtual absl::Status GatherOptimizerState(int64_t step) { return absl::OkStatus(); }
  // Rank 0, at the end of a finished run, before the model is exported: makes the model hold
  // every trained parameter (a strategy that keeps some elsewhere fetches them). OK by default.
  virtual absl::Status GatherModel(int64_t step) { return absl::OkStatus(); }
  // At the end of the run on every rank, finished or stopped (after the checkpoint of the stop):
  // the strategy may let go of what it shares with the other ranks (the parameter servers end
  // once every rank is done). OK by default.
  virtual absl::Status Finish() { return absl::OkStatus(); }
  // Whether the strategy applies the optimizer itself (the parameter servers do): then the
  // trainer does not step its own after AfterBackward.
  virtual bool updates_parameters() const { return false; }
  // After a checkpoint was restored (or none was): every rank takes rank 0's parameters and
  // buffers, and all must have resumed at the same step (ABORTED otherwise).
  virtual absl::Status SyncState(Model& model, int64_t start_step) = 0;
  // Before each micro-batch's forward, with its categorical ids ([n, fields] int64; undefined
  // when the data has none): a strategy that keeps the model's embedding tables elsewhere
  // fetches the rows the micro-batch touches. OK by default.
  virtual absl::Status BeforeForward(const torch::Tensor& categorical) { return absl::OkStatus(); }
  // Before the model is evaluated on samples with these categorical ids (outside training
  // steps): such a strategy brings those rows of the tables in the model up to date.
  virtual absl::Status BeforeEvaluate(const torch::Tensor& categorical) { return absl::OkStatus(); }
  // Before each micro-batch's backward(): whether this backward completes the update, so that
  // gradients are combined as they become ready. For the last one, also this rank's loss of the
  // whole update (a 0-dim float64 tensor on the training device) and whether it was asked to stop
  // (ignored otherwise), which EndStep combines over ranks; a strategy may send them along with
  // the gradients.
  virtual void BeforeBackward(bool last_micro_batch, const torch::Tensor& update_loss,
                              bool stop_requested) = 0;
  // After the update's last backward(), before the optimizer step: gradients hold the mean over
  // ranks when it returns OK.
  virtual absl::Status AfterBackward(Model& model) = 0;
  // After the optimizer step: the update's loss averaged over ranks and whether any rank was
  // asked to stop, from what the ranks gave the update's last BeforeBackward.
  virtual absl::StatusOr<StepAgreement> EndStep() = 0;
  // Where ranks do not update together (asynchronous parameter servers): the updates applied so
  // far by all ranks together, as this rank last saw them, each of one rank's share of the global
  // batch. nullopt where every update is all ranks' at once (an update: the global batch).
  virtual std::optional<int64_t> UpdatesApplied() const { return std::nullopt; }
  // Seconds spent blocked on communication since the last call, and resets the count.
  virtual double TakeCommunicationSeconds() = 0;
  // Whether SumOverRanks works: then every rank measures its share of the validation split.
  virtual bool sums_over_ranks() const { return false; }
  // Outside a step, on every rank at once: the element-wise sum of `values` over the ranks.
  // UNIMPLEMENTED where sums_over_ranks() is false; the communicator's errors otherwise.
  virtual absl::StatusOr<std::vector<double>> SumOverRanks(std::vector<double> values) {
    return absl::UnimplementedError("this strategy does not sum over ranks");
  }
  // What a checkpoint records of how the strategy lays the parameters out (a JSON object; empty
  // for strategies where every rank holds the whole model).
  virtual std::string Layout() const { return ""; }
};

// One process, nothing to exchange.
class SingleStrategy final : public Strategy {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  absl::Status Setup(Model&) override { return absl::OkStatus(); }
  absl::Status SyncState(Model&, int64_t) override { return absl::OkStatus(); }
  void BeforeBackward(bool last_micro_batch, const torch::Tensor& update_loss,
                      bool stop_requested) override {
    if (last_micro_batch) local_ = StepAgreement{update_loss, stop_requested};
  }
  absl::Status AfterBackward(Model&) override { return absl::OkStatus(); }
  absl::StatusOr<StepAgreement> EndStep() override { return local_; }
  double TakeCommunicationSeconds() override { return 0; }
  bool sums_over_ranks() const override { return true; }
  absl::StatusOr<std::vector<double>> SumOverRanks(std::vector<double> values) override {
    return values;
  }

 private:
  StepAgreement local_;
};

// Data parallelism: every rank holds the whole model. Gradients live in buckets of about
// `bucket_bytes` in reverse parameter order (the order backward produces them): from Setup on,
// each trainable parameter's .grad is its slice of a bucket, so that autograd accumulates into
// the bucket, the all-reduce averages it in place and the optimizer reads the mean there. With
// `overlap`, autograd hooks start a bucket's all-reduce as soon as all its gradients have been
// accumulated, so that communication runs during the rest of backward. Buckets start strictly
// in order on every rank. Zero gradients in place (Optimizer::zero_grad); a gradient that was
// reset or replaced is copied into its bucket and the parameter gets its slice back after the
// all-reduce. Assumes every parameter gets a gradient in every update; one that does not is
// reduced from its accumulated (or zero) gradient after backward. The update's loss and stop flag
// travel at the end of the bucket that is reduced last, when its dtype is float32 or float64
// (the loss is then averaged in that precision); otherwise EndStep reduces them on their own.
// The loss stays on the device; the stop flag is read on the host after the all-reduce, which
// the host waits for anyway (the communicator enforces its timeout there).
class DataParallelStrategy final : public Strategy {
 public:
  DataParallelStrategy(std::unique_ptr<Communicator> communicator, int64_t bucket_bytes,
                       bool overlap);
  ~DataParallelStrategy() override;

  int rank() const override { return communicator_->rank(); }
  int world_size() const override { return communicator_->world_size(); }
  absl::Status Setup(Model& model) override;
  absl::Status SyncState(Model& model, int64_t start_step) override;
  void BeforeBackward(bool last_micro_batch, const torch::Tensor& update_loss,
                      bool stop_requested) override;
  absl::Status AfterBackward(Model& model) override;
  absl::StatusOr<StepAgreement> EndStep() override;
  double TakeCommunicationSeconds() override;
  bool sums_over_ranks() const override { return true; }
  absl::StatusOr<std::vector<double>> SumOverRanks(std::vector<double> values) override;

  int bucket_count() const { return static_cast<int>(buckets_.size()); }
  // Before Setup: parameters (by name) this strategy leaves alone, neither reduced nor
  // broadcast: a parameter_server job's embedding tables, which live on its shards.
  void LeaveOut(std::set<std::string> names) { left_out_ = std::move(names); }

 private:
  struct Bucket {
    std::vector<int> params;  // indices into params_, in the order they are laid out
    torch::Tensor flat;       // their gradients
    int pending = 0;          // gradients not yet ready in this update
    std::unique_ptr<Work> work;
  };
  struct Slot {
    int bucket = 0;
    int64_t offset = 0;  // elements into the bucket
    bool ready = false;  // its gradient of this update is in the bucket
  };

  void OnGradientAccumulated(int index);
  void MarkReadyLocked(int index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LaunchReadyLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  torch::Tensor SliceOf(int index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::unique_ptr<Communicator> communicator_;
  const int64_t bucket_bytes_;
  const bool overlap_;
  std::set<std::string> left_out_;

  // Fixed by Setup.
  std::vector<torch::Tensor> params_;
  std::vector<torch::Tensor> grads_;    // per parameter: its slice of its bucket
  torch::Device device_ = torch::kCPU;  // the parameters'
  // Where the loss and the stop flag travel in the last bucket; -1: on their own in EndStep.
  int64_t report_offset_ = -1;
  // The parameters' gradient accumulators and the keys of the hooks on them.
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<uintptr_t> hook_keys_;

  absl::Mutex mu_;  // the hooks' state
  std::vector<Bucket> buckets_ ABSL_GUARDED_BY(mu_);
  std::vector<Slot> slots_ ABSL_GUARDED_BY(mu_);  // per parameter
  int next_launch_ ABSL_GUARDED_BY(mu_) = 0;
  bool reduce_this_backward_ ABSL_GUARDED_BY(mu_) = false;
  double communication_seconds_ = 0;
  // Training thread only.
  StepAgreement local_;                  // from the last BeforeBackward
  std::optional<StepAgreement> agreed_;  // reduced with the gradients by AfterBackward
};

// The device this rank trains on: the first GPU it sees (the agent gives each task its own
// through CUDA_VISIBLE_DEVICES) when the task has GPUs (task.gpus or
// resources.gpus_per_worker) and LibTorch was built with CUDA and finds one; the CPU otherwise.
// A rank of a multi-rank job stays on the CPU when this trainer has no NCCL communicator, since
// Gloo reduces CPU tensors.
torch::Device TrainingDevice(const trainyard::v1::Task& task);

}  // namespace trainyard::trainer

#endif  // TRAINYARD_WORKER_TRAINER_STRATEGY_STRATEGY_H_
