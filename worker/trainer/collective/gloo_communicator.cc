#include "worker/trainer/collective/gloo_communicator.h"

#include <fcntl.h>
#include <gloo/allreduce.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/buffer.h>
#include <gloo/transport/pair.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/tcp/pair.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <limits>
#include <map>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/log.h"
#include "worker/trainer/collective/gloo_pairs.h"
#include "worker/trainer/collective/gloo_point_to_point.h"

namespace trainyard::trainer {

using gloo_internal::FromGloo;
using gloo_internal::GlooWork;
using gloo_internal::PointToPoint;
using gloo_internal::WorkState;
using gloo_pairs::ArmedFor;
using gloo_pairs::Frames;
using gloo_pairs::FrameSender;
using gloo_pairs::kFrameBytes;
using gloo_pairs::kOneRoundBytes;
using gloo_pairs::kScratchBytes;
using gloo_pairs::PairSocket;
using gloo_pairs::ScopedSigpipeBlock;
using gloo_pairs::Watchdog;

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

  // Gloo passes the context's timeout, which is the (shorter) collective timeout by the time it
  // meets the peers; waiting for the slowest rank to start gets the connect timeout instead.
  void wait(const std::vector<std::string>& keys) override {
    const absl::Time deadline = RealClock::Get().Now() + timeout_;
    for (const std::string& key : keys) {
      Check(client_.Get(key, std::max(deadline - RealClock::Get().Now(), absl::ZeroDuration()))
                .status());
    }
  }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& /*timeout*/) override {
    wait(keys);
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

// Elementwise reductions, c = a op b. `c` may equal `a` or `b`; that is safe for an elementwise
// loop, so the vectorizer may ignore the apparent dependence. Built with -O3 (see
// CMakeLists.txt): this loop is where large all-reduces spend their CPU time outside the kernel.
using ReduceFn = void (*)(void* c, const void* a, const void* b, size_t n);

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

// Messages go over Gloo's TCP pairs in synchronous mode: the thread running a collective writes
// to the sockets and reads from them itself, and the kernel wakes it when a peer's data arrives.
// Gloo's own collectives (gloo::allreduce and the like) hand every message to the device's
// event-loop thread instead, which wakes the caller through a condition variable: several thread
// hand-offs per message, each a wait for a core on a busy machine.
//
// Every two ranks share two connections, one per direction (the lower rank writes on `up`, the
// higher on `down`), so that a rank may write to a peer and read from it at the same time
// without the two waiting on each other.
//
// A message names its destination by slot: the receiver registers a buffer under that slot and
// the bytes land in it at the sender's chosen offset. Reads happen only inside a collective and
// in the order the peer wrote, so every collective reuses the same slots once the previous one's
// buffers are gone.
constexpr int kScratchSlot = 0x7a000001;  // a piece to reduce, into the scratch buffer
constexpr int kDataSlot = 0x7a000002;     // final values, straight into the tensor
// (kPointSlot, a point-to-point message into the receiver's tensor: gloo_point_to_point.h)

// The ring's segments. Each rank writes a segment to its right neighbour before it reads one from
// its left neighbour, so all of them may be writing at once with nobody reading: a segment must
// fit in the socket's send buffer, which Gloo sizes to the message, up to net.core.wmem_max
// (208 KiB where not raised). Fixed, since both ends of a connection must cut alike.
constexpr size_t kRingSegmentBytes = 128 << 10;

// Three ranks or more reduce tensors from this size with Gloo's own ring (ReduceBulk).
constexpr size_t kBulkBytes = 2 << 20;

// Byte ranges of `count` elements of `size` bytes split into `parts` near-equal chunks.
struct Range {
  size_t offset;
  size_t bytes;
};
Range Chunk(size_t count, size_t size, int parts, int index) {
  const size_t base = count / parts;
  const size_t extra = count % parts;
  const size_t i = static_cast<size_t>(index);
  const size_t start = i * base + std::min(i, extra);
  return {start * size, (base + (i < extra ? 1 : 0)) * size};
}

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(std::shared_ptr<gloo::Context> up, std::shared_ptr<gloo::Context> down,
                   std::shared_ptr<gloo::Context> bulk, std::unique_ptr<PointToPoint> p2p,
                   absl::Duration timeout)
      : p2p_(std::move(p2p)),
        up_(std::move(up)),
        down_(std::move(down)),
        bulk_(std::move(bulk)),
        rank_(up_->rank),
        size_(up_->size),
        timeout_(timeout),
        scratch_(new double[kScratchBytes / sizeof(double)]),
        watchdog_(Sockets(), timeout) {
    if (size_ > 1) {
      scratch_in_ = From(LeftRank()).createRecvBuffer(kScratchSlot, scratch_.get(), kScratchBytes);
    }
    if (size_ == 2) sender_ = std::make_unique<FrameSender>();
    thread_ = std::thread([this] { Loop(); });
  }

  ~GlooCommunicator() override {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
  }

  int rank() const override { return rank_; }
  int world_size() const override { return size_; }
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

  std::unique_ptr<Work> SendAsync(torch::Tensor tensor, int peer) override {
    if (p2p_ == nullptr) return Communicator::SendAsync(std::move(tensor), peer);
    return p2p_->SendAsync(std::move(tensor), peer);
  }

  absl::Status Recv(torch::Tensor tensor, int peer) override {
    if (p2p_ == nullptr) return Communicator::Recv(std::move(tensor), peer);
    return p2p_->Recv(std::move(tensor), peer);
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

  // The ring's neighbours: this rank receives from the left and sends to the right (the same
  // peer when there are two ranks).
  int LeftRank() const { return (rank_ + size_ - 1) % size_; }
  int RightRank() const { return (rank_ + 1) % size_; }
  // The connection this rank writes to `peer` on, and the one it reads from `peer` on.
  gloo::transport::Pair& To(int peer) { return *(rank_ < peer ? up_ : down_)->getPair(peer); }
  gloo::transport::Pair& From(int peer) { return *(peer < rank_ ? up_ : down_)->getPair(peer); }

  // On whichever thread runs collectives. After the first failure the group is broken: every
  // later collective fails at once with the same status instead of waiting out its timeout again.
  absl::Status RunAllReduce(std::vector<torch::Tensor>& tensors, ReduceOp op) {
    if (!broken_.ok()) return broken_;
    for (const torch::Tensor& t : tensors) {
      if (!t.device().is_cpu() ||
          (t.scalar_type() != torch::kFloat && t.scalar_type() != torch::kDouble)) {
        return absl::InvalidArgumentError("all-reduce: Gloo reduces float32/float64 CPU tensors");
      }
    }
    ScopedSigpipeBlock sigpipe;
    ArmedFor armed(watchdog_);
    for (torch::Tensor& t : tensors) {
      torch::Tensor buffer = t.is_contiguous() ? t : t.contiguous();
      const bool is_float = t.scalar_type() == torch::kFloat;
      ReduceFn fn;
      if (op == ReduceOp::kMax) {
        fn = is_float ? &MaxInto<float> : &MaxInto<double>;
      } else {
        fn = is_float ? &SumInto<float> : &SumInto<double>;
      }
      watchdog_.Arm();  // Gloo's own ring (ReduceBulk) gets the timeout per tensor
      absl::Status status = Guard("all-reduce", [&] {
        Reduce(buffer.data_ptr(), static_cast<size_t>(buffer.numel()), buffer.element_size(), fn);
      });
      if (!status.ok()) return status;
      if (op == ReduceOp::kMean) buffer.div_(static_cast<double>(size_));
      if (!buffer.is_same(t)) t.copy_(buffer);
    }
    return absl::OkStatus();
  }

  // Runs `body` (Gloo calls, which throw), turning a failure into the broken state.
  // A collective that ran past its deadline fails with DEADLINE_EXCEEDED, even if its last
  // bytes arrived as the watchdog shut the sockets down.
  template <typename Body>
  absl::Status Guard(absl::string_view op, Body body) {
    try {
      body();
    } catch (const std::exception& e) {
      broken_ = watchdog_.fired() ? Expired(op) : FromGloo(e.what(), op, timeout_);
      watchdog_.ShutDown();
      return broken_;
    }
    if (watchdog_.fired()) {
      broken_ = Expired(op);
      return broken_;
    }
    return absl::OkStatus();
  }

  absl::Status Expired(absl::string_view op) const {
    return absl::DeadlineExceededError(absl::StrCat(
        op, ": no progress within the collective timeout of ", absl::FormatDuration(timeout_),
        " (collective_timeout): a peer stopped sending or receiving"));
  }

  // Copies of the sockets of every connection of the group, for the watchdog.
  std::vector<int> Sockets() const {
    std::vector<int> sockets;
    for (const auto& context : {up_, down_, bulk_}) {
      for (int peer = 0; context != nullptr && peer < size_; ++peer) {
        if (peer == rank_) continue;
        const int fd = PairSocket::Of(*context->getPair(peer));
        sockets.push_back(fd < 0 ? -1 : fcntl(fd, F_DUPFD_CLOEXEC, 0));
      }
    }
    return sockets;
  }

  void Reduce(void* data, size_t count, size_t size, ReduceFn fn) {
    if (count == 0 || size_ == 1) return;
    const size_t bytes = count * size;
    if (size_ == 2) {
      ReduceWithPeer(static_cast<char*>(data), bytes, size, fn);
    } else if (bytes >= kBulkBytes) {
      ReduceBulk(data, count, size, fn);
    } else {
      ReduceRing(static_cast<char*>(data), count, size, fn);
    }
  }

  // Gloo's own ring, through its event loop: for large tensors over three ranks or more, where
  // that loop reading while this thread writes and reduces is worth its hand-offs.
  void ReduceBulk(void* data, size_t count, size_t size, ReduceFn fn) {
    gloo::AllreduceOptions opts(bulk_);
    if (size == sizeof(float)) {
      opts.setOutput(static_cast<float*>(data), count);
    } else {
      opts.setOutput(static_cast<double*>(data), count);
    }
    opts.setReduceFunction(fn);
    opts.setTag(next_tag_++);
    opts.setTimeout(ToChrono(timeout_));
    gloo::allreduce(opts);
  }

  // c = op(rank 0's, rank 1's) on both ranks, so that they end with identical bits.
  void ReduceSegment(ReduceFn fn, char* mine, size_t bytes, size_t size) {
    const char* theirs = reinterpret_cast<const char*>(scratch_.get());
    const bool first = rank_ == 0;
    fn(mine, first ? mine : theirs, first ? theirs : mine, bytes / size);
  }

  // Two ranks: each sends all of its tensor and reduces all of the peer's into it, in one round
  // rather than the ring's two (reduce-scatter, then all-gather) for the same bytes on the wire.
  // The sender's thread writes while this one reads and reduces, so that both directions flow
  // all the time, for one hand-off per call.
  void ReduceWithPeer(char* data, size_t bytes, size_t size, ReduceFn fn) {
    std::unique_ptr<gloo::transport::Buffer> out =
        To(RightRank()).createSendBuffer(kScratchSlot, data, bytes);
    const Frames frames(bytes);
    sender_->Start(out.get(), frames);
    try {
      for (size_t i = 0; i < frames.count; ++i) {
        scratch_in_->waitRecv();
        watchdog_.Arm();
        if (i == 0) sender_->PeerJoined();
        // A frame is reduced in place only once it has gone out.
        if (!sender_->WaitSent(i + 1)) break;
        watchdog_.Arm();
        ReduceSegment(fn, data + frames.offset(i), frames.length(i), size);
      }
    } catch (...) {
      sender_->Finish(/*abort=*/true);
      throw;
    }
    const std::string error = sender_->Finish(/*abort=*/false);
    if (!error.empty()) throw gloo::IoException(error);
  }

  // Three ranks or more: the ring. Reduce-scatter: in step s this rank passes chunk rank - s to
  // the right and reduces chunk rank - s - 1 from the left into its own, ending with chunk
  // rank + 1 complete. All-gather: the complete chunks travel once around the ring, straight
  // into the tensors. Each chunk is reduced on one rank only, so all ranks end with its bits.
  void ReduceRing(char* data, size_t count, size_t size, ReduceFn fn) {
    const int n = size_;
    const int r = rank_;
    const size_t bytes = count * size;
    const size_t segment = kRingSegmentBytes;
    auto mod = [n](int i) { return ((i % n) + n) % n; };
    auto segments = [segment](size_t b) { return (b + segment - 1) / segment; };
    gloo::transport::Pair& right = To(RightRank());
    std::unique_ptr<gloo::transport::Buffer> to_scratch =
        right.createSendBuffer(kScratchSlot, data, bytes);
    std::unique_ptr<gloo::transport::Buffer> to_data =
        right.createSendBuffer(kDataSlot, data, bytes);
    std::unique_ptr<gloo::transport::Buffer> in_data =
        From(LeftRank()).createRecvBuffer(kDataSlot, data, bytes);
    const char* scratch = reinterpret_cast<const char*>(scratch_.get());

    for (int s = 0; s < n - 1; ++s) {
      const Range send = Chunk(count, size, n, mod(r - s));
      const Range recv = Chunk(count, size, n, mod(r - s - 1));
      const size_t sends = segments(send.bytes);
      const size_t recvs = segments(recv.bytes);
      auto send_segment = [&](size_t i) {
        const size_t at = i * segment;
        to_scratch->send(send.offset + at, std::min(send.bytes - at, segment), 0);
        to_scratch->waitSend();
        watchdog_.Arm();
      };
      if (sends > 0) send_segment(0);
      for (size_t i = 0; i < std::max(sends, recvs); ++i) {
        if (i < recvs) {
          scratch_in_->waitRecv();
          watchdog_.Arm();
        }
        if (i + 1 < sends) send_segment(i + 1);
        if (i < recvs) {
          const size_t at = i * segment;
          char* mine = data + recv.offset + at;
          fn(mine, scratch, mine, std::min(recv.bytes - at, segment) / size);
        }
      }
    }

    for (int s = 0; s < n - 1; ++s) {
      const Range send = Chunk(count, size, n, mod(r + 1 - s));
      const Range recv = Chunk(count, size, n, mod(r - s));
      const size_t sends = segments(send.bytes);
      const size_t recvs = segments(recv.bytes);
      auto send_segment = [&](size_t i) {
        const size_t at = send.offset + i * segment;
        to_data->send(at, std::min(send.offset + send.bytes - at, segment), at);
        to_data->waitSend();
        watchdog_.Arm();
      };
      if (sends > 0) send_segment(0);
      for (size_t i = 0; i < std::max(sends, recvs); ++i) {
        if (i < recvs) {
          in_data->waitRecv();
          watchdog_.Arm();
        }
        if (i + 1 < sends) send_segment(i + 1);
      }
    }
  }

  absl::Status RunBroadcast(std::vector<torch::Tensor>& tensors, int root) {
    if (!broken_.ok()) return broken_;
    if (root < 0 || root >= size_) {
      return absl::InvalidArgumentError(absl::StrCat("broadcast: no rank ", root));
    }
    for (const torch::Tensor& t : tensors) {
      if (!t.device().is_cpu() || !t.is_contiguous()) {
        return absl::InvalidArgumentError("broadcast: Gloo sends contiguous CPU tensors");
      }
    }
    if (size_ == 1) return absl::OkStatus();
    ScopedSigpipeBlock sigpipe;
    ArmedFor armed(watchdog_);
    for (torch::Tensor& t : tensors) {
      const size_t bytes = t.nbytes();
      if (bytes == 0) continue;
      auto* data = static_cast<char*>(t.data_ptr());
      watchdog_.Arm();  // each tensor gets the timeout, and each peer's copy of it
      absl::Status status = Guard("broadcast", [&] {
        // One message per tensor and peer: only the root writes, so nothing waits on a write.
        if (rank_ == root) {
          for (int peer = 0; peer < size_; ++peer) {
            if (peer == root) continue;
            std::unique_ptr<gloo::transport::Buffer> out =
                To(peer).createSendBuffer(kDataSlot, data, bytes);
            out->send(0, bytes, 0);
            out->waitSend();
            watchdog_.Arm();
          }
        } else {
          From(root).createRecvBuffer(kDataSlot, data, bytes)->waitRecv();
        }
      });
      if (!status.ok()) return status;
    }
    return absl::OkStatus();
  }

  // An all-reduce of one value: no rank can finish it before every rank has contributed.
  absl::Status RunBarrier() {
    if (!broken_.ok()) return broken_;
    if (size_ == 1) return absl::OkStatus();
    ScopedSigpipeBlock sigpipe;
    ArmedFor armed(watchdog_);
    float token = 0;
    return Guard("barrier", [&] { Reduce(&token, 1, sizeof(token), &SumInto<float>); });
  }

  // Fixed at construction. The point-to-point connections go last (declared first).
  const std::unique_ptr<PointToPoint> p2p_;
  const std::shared_ptr<gloo::Context> up_;
  const std::shared_ptr<gloo::Context> down_;
  const std::shared_ptr<gloo::Context> bulk_;
  const int rank_;
  const int size_;
  const absl::Duration timeout_;
  const std::unique_ptr<double[]> scratch_;  // one segment from the left neighbour
  std::unique_ptr<gloo::transport::Buffer> scratch_in_;
  std::unique_ptr<FrameSender> sender_;  // two ranks only
  Watchdog watchdog_;

  // Used by whichever thread runs collectives: the communicator's, or the caller's while
  // nothing is outstanding (WaitIdle), never both at once.
  absl::Status broken_;
  uint32_t next_tag_ = 0;

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
  std::unique_ptr<gloo::rendezvous::PrefixStore> group;
  gloo::rendezvous::Store* keys = &store;
  if (!options.key_prefix.empty()) {
    group = std::make_unique<gloo::rendezvous::PrefixStore>(options.key_prefix, store);
    keys = group.get();
  }
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.hostname;
    std::shared_ptr<gloo::transport::Device> device = gloo::transport::tcp::CreateDevice(attr);
    // A pair's timeout bounds each blocking read and write on its socket (SO_RCVTIMEO,
    // SO_SNDTIMEO): the collective timeout, behind the communicator's watchdog, which bounds the
    // time without progress. Waiting for the slowest rank to start is the store's, with the
    // connect timeout; connecting once every rank has published its address is quick.
    auto connect = [&](const char* prefix, bool sync) {
      auto context = std::make_shared<gloo::rendezvous::Context>(rank, world_size);
      context->setTimeout(ToChrono(options.timeout));
      gloo::rendezvous::PrefixStore prefixed(prefix, *keys);
      context->connectFullMesh(prefixed, device);
      for (int peer = 0; peer < world_size && sync; ++peer) {
        if (peer != rank) context->getPair(peer)->setSync(/*sync=*/true, /*busyPoll=*/false);
      }
      return context;
    };
    auto up = connect("up", true);
    auto down = connect("down", true);
    // Gloo's own ring, through the device's event loop, for large tensors over three ranks or
    // more.
    std::shared_ptr<gloo::Context> bulk;
    if (world_size > 2) bulk = connect("bulk", false);
    std::unique_ptr<PointToPoint> p2p;
    if (options.point_to_point && world_size > 1) {
      p2p = std::make_unique<PointToPoint>(connect("p2p-up", true), connect("p2p-down", true),
                                           options.timeout);
    }
    LogInfo("gloo: rank ", rank, " of ", world_size, options.key_prefix.empty() ? "" : " in ",
            options.key_prefix, " connected on ", options.hostname);
    return std::unique_ptr<Communicator>(std::make_unique<GlooCommunicator>(
        std::move(up), std::move(down), std::move(bulk), std::move(p2p), options.timeout));
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
