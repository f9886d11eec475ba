#include "worker/trainer/gloo_communicator.h"

#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/log.h"

namespace trainyard::trainer {
namespace {

std::chrono::milliseconds ToChrono(absl::Duration d) {
  return std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
}

// Gloo's rendezvous store over ours. Gloo expects failures as exceptions; the status behind the
// last one is kept so that the caller can report its real code.
class StoreAdapter final : public gloo::rendezvous::Store {
 public:
  StoreAdapter(RendezvousClient& client, absl::Duration timeout)
      : client_(client), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    Check(client_.Set(key, std::string(data.begin(), data.end())));
  }

  std::vector<char> get(const std::string& key) override {
    absl::StatusOr<std::string> value = client_.Get(key, timeout_);
    Check(value.status());
    return std::vector<char>(value->begin(), value->end());
  }

  void wait(const std::vector<std::string>& keys) override { wait(keys, ToChrono(timeout_)); }

  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    const absl::Time deadline = absl::Now() + absl::FromChrono(timeout);
    for (const std::string& key : keys) {
      Check(client_.Get(key, std::max(deadline - absl::Now(), absl::ZeroDuration())).status());
    }
  }

  const absl::Status& last_error() const { return last_error_; }

 private:
  void Check(const absl::Status& status) {
    if (status.ok()) return;
    last_error_ = status;
    throw gloo::IoException(std::string(status.message()));
  }

  RendezvousClient& client_;
  const absl::Duration timeout_;
  absl::Status last_error_;
};

// Elementwise reductions for Gloo's ring. `c` may equal `a`; that is safe for an elementwise loop,
// so the vectorizer may ignore the apparent dependence. Built with -O3 (see CMakeLists.txt): this
// loop is where large all-reduces spend their CPU time.
template <typename T>
void SumInto(void* c_, const void* a_, const void* b_, size_t n) {
  T* c = static_cast<T*>(c_);
  const T* a = static_cast<const T*>(a_);
  const T* b = static_cast<const T*>(b_);
#pragma GCC ivdep
  for (size_t i = 0; i < n; ++i) c[i] = a[i] + b[i];
}

template <typename T>
void MaxInto(void* c_, const void* a_, const void* b_, size_t n) {
  T* c = static_cast<T*>(c_);
  const T* a = static_cast<const T*>(a_);
  const T* b = static_cast<const T*>(b_);
#pragma GCC ivdep
  for (size_t i = 0; i < n; ++i) c[i] = a[i] > b[i] ? a[i] : b[i];
}

// A gloo failure as a status naming the collective: timeouts (a stuck peer) apart from broken
// connections (a dead one).
absl::Status FromGloo(const std::exception& e, absl::string_view op, absl::Duration timeout) {
  const std::string what = e.what();
  if (absl::StrContains(what, "Timed out") || absl::StrContains(what, "timed out") ||
      absl::StrContains(what, "Timeout")) {
    return absl::DeadlineExceededError(
        absl::StrCat(op, ": a peer did not respond within the collective timeout of ",
                     absl::FormatDuration(timeout), " (collective_timeout): ", what));
  }
  return absl::UnavailableError(absl::StrCat(op, ": lost a peer: ", what));
}

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

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(std::shared_ptr<gloo::Context> context, absl::Duration timeout)
      : context_(std::move(context)), timeout_(timeout) {
    thread_ = std::thread([this] { Loop(); });
  }

  ~GlooCommunicator() override {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
  }

  int rank() const override { return context_->rank; }
  int world_size() const override { return context_->size; }
  std::string backend() const override { return "gloo"; }

  std::unique_ptr<Work> AllReduceAsync(std::vector<torch::Tensor> tensors, ReduceOp op) override {
    auto state = std::make_shared<WorkState>();
    Enqueue([this, tensors = std::move(tensors), op, state]() mutable {
      state->Finish(RunAllReduce(tensors, op));
    });
    return std::make_unique<GlooWork>(std::move(state));
  }

  absl::Status AllReduce(std::vector<torch::Tensor> tensors, ReduceOp op) override {
    WaitIdle();
    return RunAllReduce(tensors, op);
  }

  absl::Status Broadcast(std::vector<torch::Tensor> tensors, int root) override {
    WaitIdle();
    return RunBroadcast(tensors, root);
  }

  absl::Status Barrier() override {
    WaitIdle();
    return RunBarrier();
  }

 private:
  // Closures run in order on the communicator's thread; the destructor drains the queue first.
  void Enqueue(std::function<void()> fn) {
    absl::MutexLock lock(&mu_);
    queue_.push_back(std::move(fn));
    ++outstanding_;
  }

  // Blocking collectives run on the caller's thread, which saves two thread hand-offs per call
  // (most of the cost of a small all-reduce), once everything queued before them is done. The
  // one calling thread cannot queue more meanwhile, so the order is kept.
  void WaitIdle() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](int* outstanding) { return *outstanding == 0; }, &outstanding_));
  }

  void Loop() {
    while (true) {
      std::function<void()> fn;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(
            +[](GlooCommunicator* c)
                 ABSL_EXCLUSIVE_LOCKS_REQUIRED(c->mu_) { return c->stop_ || !c->queue_.empty(); },
            this));
        if (queue_.empty()) return;
        fn = std::move(queue_.front());
        queue_.pop_front();
      }
      fn();
      absl::MutexLock lock(&mu_);
      --outstanding_;
    }
  }

  // On the communicator's thread. After the first failure the group is broken: every later
  // collective fails at once with the same status instead of waiting out its timeout again.
  absl::Status RunAllReduce(std::vector<torch::Tensor>& tensors, ReduceOp op) {
    if (!broken_.ok()) return broken_;
    for (const torch::Tensor& t : tensors) {
      if (!t.device().is_cpu() ||
          (t.scalar_type() != torch::kFloat && t.scalar_type() != torch::kDouble)) {
        return absl::InvalidArgumentError("all-reduce: Gloo reduces float32/float64 CPU tensors");
      }
    }
    for (torch::Tensor& t : tensors) {
      torch::Tensor buffer = t.is_contiguous() ? t : t.contiguous();
      absl::Status status =
          t.scalar_type() == torch::kFloat ? Reduce<float>(buffer, op) : Reduce<double>(buffer, op);
      if (!status.ok()) return status;
      if (op == ReduceOp::kMean) buffer.div_(static_cast<double>(context_->size));
      if (!buffer.is_same(t)) t.copy_(buffer);
    }
    return absl::OkStatus();
  }

  template <typename T>
  absl::Status Reduce(torch::Tensor& buffer, ReduceOp op) {
    if (buffer.numel() == 0 || context_->size == 1) return absl::OkStatus();
    try {
      gloo::AllreduceOptions opts(context_);
      opts.setOutput(buffer.data_ptr<T>(), static_cast<size_t>(buffer.numel()));
      using Fn = void (*)(void*, const void*, const void*, size_t);
      const Fn fn = op == ReduceOp::kMax ? &MaxInto<T> : &SumInto<T>;
      opts.setReduceFunction(fn);
      opts.setTag(next_tag_++);
      opts.setTimeout(ToChrono(timeout_));
      gloo::allreduce(opts);
      return absl::OkStatus();
    } catch (const std::exception& e) {
      broken_ = FromGloo(e, "all-reduce", timeout_);
      return broken_;
    }
  }

  absl::Status RunBroadcast(std::vector<torch::Tensor>& tensors, int root) {
    if (!broken_.ok()) return broken_;
    if (root < 0 || root >= context_->size) {
      return absl::InvalidArgumentError(absl::StrCat("broadcast: no rank ", root));
    }
    for (torch::Tensor& t : tensors) {
      if (!t.device().is_cpu() || !t.is_contiguous()) {
        return absl::InvalidArgumentError("broadcast: Gloo sends contiguous CPU tensors");
      }
      if (t.numel() == 0 || context_->size == 1) continue;
      try {
        gloo::BroadcastOptions opts(context_);
        auto* bytes = static_cast<uint8_t*>(t.data_ptr());
        if (context_->rank == root) opts.setInput(bytes, t.nbytes());
        opts.setOutput(bytes, t.nbytes());
        opts.setRoot(root);
        opts.setTag(next_tag_++);
        opts.setTimeout(ToChrono(timeout_));
        gloo::broadcast(opts);
      } catch (const std::exception& e) {
        broken_ = FromGloo(e, "broadcast", timeout_);
        return broken_;
      }
    }
    return absl::OkStatus();
  }

  absl::Status RunBarrier() {
    if (!broken_.ok()) return broken_;
    if (context_->size == 1) return absl::OkStatus();
    try {
      gloo::BarrierOptions opts(context_);
      opts.setTag(next_tag_++);
      opts.setTimeout(ToChrono(timeout_));
      gloo::barrier(opts);
      return absl::OkStatus();
    } catch (const std::exception& e) {
      broken_ = FromGloo(e, "barrier", timeout_);
      return broken_;
    }
  }

  // Fixed at construction.
  const std::shared_ptr<gloo::Context> context_;
  const absl::Duration timeout_;

  // Used by whichever thread runs collectives: the communicator's, or the caller's while
  // nothing is outstanding (WaitIdle), never both at once.
  uint32_t next_tag_ = 0;
  absl::Status broken_;

  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  int outstanding_ ABSL_GUARDED_BY(mu_) = 0;  // queued or running on the thread
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> NewGlooCommunicator(int rank, int world_size,
                                                                  RendezvousClient& rendezvous,
                                                                  const GlooOptions& options) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("gloo: rank ", rank, " of world size ", world_size));
  }
  StoreAdapter store(rendezvous, options.connect_timeout);
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.hostname;
    std::shared_ptr<gloo::transport::Device> device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, world_size);
    // The mesh waits for the slowest rank to start; collectives get the shorter timeout.
    context->setTimeout(ToChrono(options.connect_timeout));
    context->connectFullMesh(store, device);
    context->setTimeout(ToChrono(options.timeout));
    LogInfo("gloo: rank ", rank, " of ", world_size, " connected on ", options.hostname);
    return std::unique_ptr<Communicator>(
        std::make_unique<GlooCommunicator>(std::move(context), options.timeout));
  } catch (const std::exception& e) {
    if (!store.last_error().ok()) {
      return absl::Status(store.last_error().code(),
                          absl::StrCat("gloo: meeting the peers: ", store.last_error().message()));
    }
    return absl::UnavailableError(
        absl::StrCat("gloo: connecting to the peers on ", options.hostname, ": ", e.what()));
  }
}

}  // namespace trainyard::trainer
