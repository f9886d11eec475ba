#ifndef TRAINYARD_WORKER_TRAINER_STRATEGY_H_
#define TRAINYARD_WORKER_TRAINER_STRATEGY_H_

// The seams along which distributed training plugs into the training loop. A Communicator moves
// tensors between ranks (Gloo on CPU, NCCL on GPU, met through the coordinator's rendezvous
// store); a Strategy decides what a rank does around each update with it (data-parallel:
// broadcast the initial parameters, all-reduce gradients; parameter-server: push gradients and
// pull parameters). Only the single-process strategy exists so far.

#include <torch/torch.h>

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "trainyard/v1/agent_service.pb.h"
#include "worker/trainer/model.h"

namespace trainyard::trainer {

// Collective operations among the ranks of one attempt. Calls block until every rank has made
// the matching call; a peer that disappears turns into UNAVAILABLE or DEADLINE_EXCEEDED, never a
// hang. Not thread-safe: one training thread uses it.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Replaces each tensor with the elementwise mean over all ranks.
  virtual absl::Status AllReduceMean(std::vector<torch::Tensor>& tensors) = 0;
  // Replaces each tensor with root's.
  virtual absl::Status Broadcast(std::vector<torch::Tensor>& tensors, int root) = 0;
};

// What a rank does around each update. Called from the training thread only.
class Strategy {
 public:
  virtual ~Strategy() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // After the model is built or restored and before the first update.
  virtual absl::Status Setup(Model& model) = 0;
  // After backward(), before the optimizer step: combine gradients across ranks.
  virtual absl::Status AfterBackward(Model& model) = 0;
  // The loss to report, combined across ranks.
  virtual absl::StatusOr<double> ReduceLoss(double local_loss) = 0;
};

// One process, nothing to exchange.
class SingleStrategy final : public Strategy {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  absl::Status Setup(Model&) override { return absl::OkStatus(); }
  absl::Status AfterBackward(Model&) override { return absl::OkStatus(); }
  absl::StatusOr<double> ReduceLoss(double local_loss) override { return local_loss; }
};

// The strategy of `task.spec.strategy`. UNIMPLEMENTED "strategy: ..." for data_parallel and
// parameter_server, which this trainer does not run yet.
absl::StatusOr<std::unique_ptr<Strategy>> MakeStrategy(const trainyard::v1::Task& task);

}  // namespace trainyard::trainer

#endif  // TRAINYARD_WORKER_TRAINER_STRATEGY_H_
