#ifndef TRAINYARD_WORKER_TRAINER_COLLECTIVE_RECORDING_COMMUNICATOR_H_
#define TRAINYARD_WORKER_TRAINER_COLLECTIVE_RECORDING_COMMUNICATOR_H_

// Part collective/ of the trainer (worker/trainer/PARTS).
//
// A communicator that keeps a rank's flight record (common/flight_record.h) of what it is asked to
// do: each collective and message is begun in the record when it is issued, and ended when its
// Work's Wait returns (or the blocking call returns), failed if that failed. It adds nothing to
// what the communicator it wraps does and changes no order: a hung rank's record names the
// collective, or the message, it is stuck in.

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/flight_record.h"
#include "worker/trainer/collective/communicator.h"

namespace trainyard::trainer {

struct RecordingOptions {
  // Called on the caller's thread before the send-th SendAsync (1, 2, ...: every peer counted),
  // before it is recorded or issued, with its peer. It may block (a test holding a rank before
  // a send, main.cc). Null: none.
  std::function<void(int peer, int64_t send)> before_send;
};

class RecordingCommunicator final : public Communicator {
 public:
  // `recorder` is not owned; it must outlive this communicator and every Work it returns.
  RecordingCommunicator(std::unique_ptr<Communicator> inner, FlightRecorder& recorder,
                        RecordingOptions options = {});

  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  std::string backend() const override { return inner_->backend(); }

  // Each recorded with its tensors' bytes (all of them summed), collectives with no peer,
  // messages with theirs. The returned Works end their entries in their first Wait.
  std::unique_ptr<Work> AllReduceAsync(std::vector<torch::Tensor> tensors, ReduceOp op) override;
  absl::Status AllReduce(std::vector<torch::Tensor> tensors, ReduceOp op) override;
  absl::Status Broadcast(std::vector<torch::Tensor> tensors, int root) override;
  absl::Status Barrier() override;
  std::unique_ptr<Work> SendAsync(torch::Tensor tensor, int peer) override;
  absl::Status Recv(torch::Tensor tensor, int peer) override;

 private:
  const std::unique_ptr<Communicator> inner_;
  FlightRecorder& recorder_;
  const RecordingOptions options_;
  int64_t sends_ = 0;  // SendAsync calls so far (calls come from one thread: communicator.h)
};

// `inner` in a RecordingCommunicator when `recorder` is not null; `inner` itself otherwise (null
// stays null).
std::unique_ptr<Communicator> WithRecorder(std::unique_ptr<Communicator> inner,
                                           FlightRecorder* recorder, RecordingOptions options = {});

}  // namespace trainyard::trainer

#endif  // TRAINYARD_WORKER_TRAINER_COLLECTIVE_RECORDING_COMMUNICATOR_H_
