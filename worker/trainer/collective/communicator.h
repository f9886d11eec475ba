#ifndef TRAINYARD_WORKER_TRAINER_COLLECTIVE_COMMUNICATOR_H_
#define TRAINYARD_WORKER_TRAINER_COLLECTIVE_COMMUNICATOR_H_

// Part collective/ of the trainer (worker/trainer/PARTS): collectives among an attempt's ranks:
// Gloo on CPUs, NCCL on GPUs. It may call coordinator/.
//
// Collective operations among the ranks of one attempt: Gloo for CPU tensors, NCCL for CUDA
// tensors. Both meet their peers through a RendezvousClient.

#include <torch/torch.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace trainyard::trainer {

enum class ReduceOp { kSum, kMean, kMax };

// A collective in flight.
class Work {
 public:
  virtual ~Work() = default;
  // Blocks until the collective has completed on this rank. Idempotent: later calls return the
  // same status. Safe to call from any one thread.
  virtual absl::Status Wait() = 0;
};

// A Work that is already done, with `status`.
class DoneWork final : public Work {
 public:
  explicit DoneWork(absl::Status status) : status_(std::move(status)) {}
  absl::Status Wait() override { return status_; }

 private:
  const absl::Status status_;
};

// Every rank must issue the same collectives in the same order. Each collective completes or
// fails within the communicator's timeout: a dead peer turns into UNAVAILABLE, a stuck one into
// DEADLINE_EXCEEDED, whose messages name the collective; never a hang. After the first failure
// every later call fails the same way (the group is broken; the attempt must restart).
//
// Calls are made from one thread (the training thread, including autograd hooks it runs);
// collectives run in the order issued on the communicator's own thread or stream.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual std::string backend() const = 0;  // "gloo", "nccl"

  // Starts reducing each tensor elementwise over all ranks, in place. The tensors (float32 or
  // float64; CPU for Gloo, CUDA for NCCL) must stay alive and untouched until Wait() returns.
  // INVALID_ARGUMENT (from Wait) for other dtypes or devices.
  virtual std::unique_ptr<Work> AllReduceAsync(std::vector<torch::Tensor> tensors, ReduceOp op) = 0;
  // The same, blocking until it completes.
  virtual absl::Status AllReduce(std::vector<torch::Tensor> tensors, ReduceOp op) {
    return AllReduceAsync(std::move(tensors), op)->Wait();
  }

  // Replaces each tensor (any dtype, contiguous) with root's. Blocks.
  virtual absl::Status Broadcast(std::vector<torch::Tensor> tensors, int root) = 0;

  // Returns once every rank has entered it. Blocks.
  virtual absl::Status Barrier() = 0;

  // Point to point, for pipelines, on connections of their own (collectives never wait behind
  // them). SendAsync starts sending `tensor` (contiguous; CPU for Gloo) to `peer` on a thread
  // of the communicator's that writes to that peer alone, so that a send never waits for the
  // caller's receives or for sends to other peers; messages to one peer arrive in the order sent.
  // The tensor must stay untouched until Wait() returns (the Work holds a reference). Recv
  // receives the next message from `peer` into `tensor`, whose size must be the message's;
  // it blocks up to the communicator's timeout (DEADLINE_EXCEEDED), UNAVAILABLE when the peer is
  // gone. UNIMPLEMENTED where the communicator was made without point-to-point connections.
  virtual std::unique_ptr<Work> SendAsync(torch::Tensor tensor, int peer) {
    return std::make_unique<DoneWork>(
        absl::UnimplementedError("this communicator has no point-to-point connections"));
  }
  virtual absl::Status Recv(torch::Tensor tensor, int peer) {
    return absl::UnimplementedError("this communicator has no point-to-point connections");
  }
};

}  // namespace trainyard::trainer

#endif  // TRAINYARD_WORKER_TRAINER_COLLECTIVE_COMMUNICATOR_H_
