#ifndef TRAINYARD_WORKER_TRAINER_COLLECTIVE_GLOO_POINT_TO_POINT_H_
#define TRAINYARD_WORKER_TRAINER_COLLECTIVE_GLOO_POINT_TO_POINT_H_

// The Gloo communicator's point-to-point messages (a pipeline's activations and gradients), and
// what its collectives share with them: the completion of one operation and how a Gloo failure
// becomes a status. Internal to the Gloo communicator (built with its include paths).

#include <gloo/rendezvous/context.h>
#include <gloo/transport/pair.h>
#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/trainer/collective/communicator.h"

namespace trainyard::trainer::gloo_internal {

// The slot of a point-to-point message, into the receiver's tensor (the collectives' slots are
// in gloo_communicator.cc).
inline constexpr int kPointSlot = 0x7a000003;

// A gloo failure as a status naming the operation: timeouts (a stuck peer) DEADLINE_EXCEEDED,
// broken connections (a dead one) UNAVAILABLE.
absl::Status FromGloo(const std::string& what, absl::string_view op, absl::Duration timeout);

// Completion of one collective, shared by the caller's Work and the queued closure, so that a
// caller may drop its Work before the collective ends.
class WorkState {
 public:
  absl::Status Wait() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&done_));
    return status_;
  }
  void Finish(absl::Status status) {
    absl::MutexLock lock(&mu_);
    status_ = std::move(status);
    done_ = true;
  }

 private:
  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

class GlooWork final : public Work {
 public:
  explicit GlooWork(std::shared_ptr<WorkState> state) : state_(std::move(state)) {}
  absl::Status Wait() override { return state_->Wait(); }

 private:
  const std::shared_ptr<WorkState> state_;
};

class SendQueue;

// A pipeline's connections: one per direction between every two ranks, as for the collectives,
// in synchronous mode; each message is one tensor whole, under kPointSlot. Reads and writes are
// bounded by the pairs' socket timeouts (the collective timeout). After a failure the
// connections are shut down, so that the peers fail at once too, and every later call fails.
class PointToPoint {
 public:
  PointToPoint(std::shared_ptr<gloo::Context> up, std::shared_ptr<gloo::Context> down,
               absl::Duration timeout);
  ~PointToPoint();

  // Sends `tensor` to `peer` on that peer's send thread; the Work ends when it is written.
  std::unique_ptr<Work> SendAsync(torch::Tensor tensor, int peer);
  // Receives into `tensor` from `peer`, blocking.
  absl::Status Recv(torch::Tensor tensor, int peer);

 private:
  gloo::transport::Pair& To(int peer) { return *(rank() < peer ? up_ : down_)->getPair(peer); }
  gloo::transport::Pair& From(int peer) { return *(peer < rank() ? up_ : down_)->getPair(peer); }
  int rank() const { return up_->rank; }
  absl::Status Check(const torch::Tensor& tensor, int peer, absl::string_view op);
  template <typename Body>
  absl::Status Run(absl::string_view op, Body body);

  const std::shared_ptr<gloo::Context> up_;
  const std::shared_ptr<gloo::Context> down_;
  const absl::Duration timeout_;
  std::vector<int> sockets_;  // copies (dup) of the connections', to shut them down
  std::map<int, std::unique_ptr<SendQueue>> senders_;  // the caller's thread only
  absl::Mutex mu_;
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trainyard::trainer::gloo_internal

#endif  // TRAINYARD_WORKER_TRAINER_COLLECTIVE_GLOO_POINT_TO_POINT_H_
