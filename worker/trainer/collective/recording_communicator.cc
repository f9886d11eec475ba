#include "worker/trainer/collective/recording_communicator.h"

#include <utility>

namespace trainyard::trainer {
namespace {

int64_t Bytes(const torch::Tensor& t) { return t.defined() ? static_cast<int64_t>(t.nbytes()) : 0; }

int64_t Bytes(const std::vector<torch::Tensor>& tensors) {
  int64_t bytes = 0;
  for (const torch::Tensor& t : tensors) bytes += Bytes(t);
  return bytes;
}

// A Work whose first Wait ends its entry in the record (Wait is idempotent: later ones return the
// same status and record nothing more).
class RecordedWork final : public Work {
 public:
  RecordedWork(std::unique_ptr<Work> inner, FlightRecorder& recorder, uint64_t token)
      : inner_(std::move(inner)), recorder_(recorder), token_(token) {}

  absl::Status Wait() override {
    absl::Status status = inner_->Wait();
    if (!ended_) {
      recorder_.End(token_, status.ok());
      ended_ = true;
    }
    return status;
  }

 private:
  const std::unique_ptr<Work> inner_;
  FlightRecorder& recorder_;
  const uint64_t token_;
  bool ended_ = false;  // Wait is called from one thread at a time (communicator.h)
};

}  // namespace

RecordingCommunicator::RecordingCommunicator(std::unique_ptr<Communicator> inner,
                                             FlightRecorder& recorder, RecordingOptions options)
    : inner_(std::move(inner)), recorder_(recorder), options_(std::move(options)) {}

std::unique_ptr<Work> RecordingCommunicator::AllReduceAsync(std::vector<torch::Tensor> tensors,
                                                            ReduceOp op) {
  const uint64_t token = recorder_.Begin(CollectiveKind::kAllReduce, Bytes(tensors));
  return std::make_unique<RecordedWork>(inner_->AllReduceAsync(std::move(tensors), op), recorder_,
                                        token);
}

absl::Status RecordingCommunicator::AllReduce(std::vector<torch::Tensor> tensors, ReduceOp op) {
  const uint64_t token = recorder_.Begin(CollectiveKind::kAllReduce, Bytes(tensors));
  absl::Status status = inner_->AllReduce(std::move(tensors), op);
  recorder_.End(token, status.ok());
  return status;
}

absl::Status RecordingCommunicator::Broadcast(std::vector<torch::Tensor> tensors, int root) {
  const uint64_t token = recorder_.Begin(CollectiveKind::kBroadcast, Bytes(tensors));
  absl::Status status = inner_->Broadcast(std::move(tensors), root);
  recorder_.End(token, status.ok());
  return status;
}

absl::Status RecordingCommunicator::Barrier() {
  const uint64_t token = recorder_.Begin(CollectiveKind::kBarrier, 0);
  absl::Status status = inner_->Barrier();
  recorder_.End(token, status.ok());
  return status;
}

std::unique_ptr<Work> RecordingCommunicator::SendAsync(torch::Tensor tensor, int peer) {
  ++sends_;
  if (options_.before_send) options_.before_send(peer, sends_);
  const uint64_t token = recorder_.Begin(CollectiveKind::kSend, Bytes(tensor), peer);
  return std::make_unique<RecordedWork>(inner_->SendAsync(std::move(tensor), peer), recorder_,
                                        token);
}

absl::Status RecordingCommunicator::Recv(torch::Tensor tensor, int peer) {
  const uint64_t token = recorder_.Begin(CollectiveKind::kRecv, Bytes(tensor), peer);
  absl::Status status = inner_->Recv(std::move(tensor), peer);
  recorder_.End(token, status.ok());
  return status;
}

std::unique_ptr<Communicator> WithRecorder(std::unique_ptr<Communicator> inner,
                                           FlightRecorder* recorder, RecordingOptions options) {
  if (inner == nullptr || recorder == nullptr) return inner;
  return std::make_unique<RecordingCommunicator>(std::move(inner), *recorder, std::move(options));
}

}  // namespace trainyard::trainer
