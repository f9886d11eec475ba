#include "worker/trainer/collective/gloo_point_to_point.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <deque>
#include <exception>
#include <functional>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "worker/trainer/collective/gloo_pairs.h"

namespace trainyard::trainer::gloo_internal {

using gloo_pairs::PairSocket;
using gloo_pairs::ScopedSigpipeBlock;

// A gloo failure as a status naming the collective: timeouts (a stuck peer) apart from broken
// connections (a dead one).
absl::Status FromGloo(const std::string& what, absl::string_view op, absl::Duration timeout) {
  if (absl::StrContains(what, "timeout") || absl::StrContains(what, "Timeout") ||
      absl::StrContains(what, "timed out") || absl::StrContains(what, "Timed out")) {
    return absl::DeadlineExceededError(
        absl::StrCat(op, ": a peer did not respond within the collective timeout of ",
                     absl::FormatDuration(timeout), " (collective_timeout): ", what));
  }
  return absl::UnavailableError(absl::StrCat(op, ": lost a peer: ", what));
}

// Point-to-point sends to one peer, in order, on a thread of their own: a write that waits for
// the peer to read never holds up the caller or the sends to other peers.
class SendQueue {
 public:
  SendQueue() : thread_([this] { Loop(); }) {}
  ~SendQueue() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
  }
  void Push(std::function<void()> fn) {
    absl::MutexLock lock(&mu_);
    queue_.push_back(std::move(fn));
  }

 private:
  void Loop() {
    while (true) {
      std::function<void()> fn;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(
            +[](SendQueue* q)
                 ABSL_EXCLUSIVE_LOCKS_REQUIRED(q->mu_) { return q->stop_ || !q->queue_.empty(); },
            this));
        if (queue_.empty()) return;
        fn = std::move(queue_.front());
        queue_.pop_front();
      }
      fn();
    }
  }

  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

template <typename Body>
absl::Status PointToPoint::Run(absl::string_view op, Body body) {
  {
    absl::MutexLock lock(&mu_);
    if (!broken_.ok()) return broken_;
  }
  ScopedSigpipeBlock sigpipe;
  try {
    body();
    return absl::OkStatus();
  } catch (const std::exception& e) {
    absl::Status status = FromGloo(e.what(), op, timeout_);
    absl::MutexLock lock(&mu_);
    if (broken_.ok()) {
      broken_ = status;
      for (int fd : sockets_) {
        if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
      }
    }
    return broken_;
  }
}

PointToPoint::PointToPoint(std::shared_ptr<gloo::Context> up, std::shared_ptr<gloo::Context> down,
                           absl::Duration timeout)
    : up_(std::move(up)), down_(std::move(down)), timeout_(timeout) {
  for (const auto& context : {up_, down_}) {
    for (int peer = 0; peer < context->size; ++peer) {
      if (peer == context->rank) continue;
      const int fd = PairSocket::Of(*context->getPair(peer));
      sockets_.push_back(fd < 0 ? -1 : fcntl(fd, F_DUPFD_CLOEXEC, 0));
    }
  }
}

PointToPoint::~PointToPoint() {
  senders_.clear();  // drains and joins the send threads before the sockets go
  for (int fd : sockets_) {
    if (fd >= 0) ::close(fd);
  }
}

std::unique_ptr<Work> PointToPoint::SendAsync(torch::Tensor tensor, int peer) {
  if (absl::Status s = Check(tensor, peer, "send"); !s.ok()) {
    return std::make_unique<DoneWork>(s);
  }
  auto state = std::make_shared<WorkState>();
  std::unique_ptr<SendQueue>& queue = senders_[peer];
  if (queue == nullptr) queue = std::make_unique<SendQueue>();
  queue->Push([this, tensor = std::move(tensor), peer, state] {
    state->Finish(Run("send", [&] {
      const size_t bytes = tensor.nbytes();
      if (bytes == 0) return;
      std::unique_ptr<gloo::transport::Buffer> out =
          To(peer).createSendBuffer(kPointSlot, tensor.data_ptr(), bytes);
      out->send(0, bytes, 0);
      out->waitSend();
    }));
  });
  return std::make_unique<GlooWork>(std::move(state));
}

absl::Status PointToPoint::Recv(torch::Tensor tensor, int peer) {
  if (absl::Status s = Check(tensor, peer, "receive"); !s.ok()) return s;
  return Run("receive", [&] {
    const size_t bytes = tensor.nbytes();
    if (bytes == 0) return;
    From(peer).createRecvBuffer(kPointSlot, tensor.data_ptr(), bytes)->waitRecv();
  });
}

absl::Status PointToPoint::Check(const torch::Tensor& tensor, int peer, absl::string_view op) {
  if (peer < 0 || peer >= up_->size || peer == rank()) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": no peer rank ", peer));
  }
  if (!tensor.device().is_cpu() || !tensor.is_contiguous()) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": Gloo moves contiguous CPU tensors"));
  }
  absl::MutexLock lock(&mu_);
  return broken_;
}

}  // namespace trainyard::trainer::gloo_internal
