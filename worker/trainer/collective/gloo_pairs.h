#ifndef TRAINYARD_WORKER_TRAINER_COLLECTIVE_GLOO_PAIRS_H_
#define TRAINYARD_WORKER_TRAINER_COLLECTIVE_GLOO_PAIRS_H_

// What the Gloo communicator does with the TCP pairs between ranks, below the collectives: their
// sockets, the watchdog that ends a stalled collective, SIGPIPE kept away from a write, and how
// one tensor is cut into frames and written on a thread of its own. Internal to
// gloo_communicator.cc and gloo_point_to_point.cc (built with their include paths).

#include <gloo/transport/buffer.h>
#include <gloo/transport/pair.h>
#include <gloo/transport/tcp/pair.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/log.h"

namespace trainyard::trainer::gloo_pairs {

// The socket of a connected TCP pair, which Gloo keeps to itself: a pointer to the member, taken
// through a class derived from the pair, reads it without changing Gloo. -1 for other transports.
struct PairSocket : gloo::transport::tcp::Pair {
  static int Of(gloo::transport::Pair& pair) {
    auto* tcp = dynamic_cast<gloo::transport::tcp::Pair*>(&pair);
    return tcp == nullptr ? -1 : tcp->*(&PairSocket::fd_);
  }
};

// Ends a collective in which no bytes have moved for the collective timeout. A socket's own
// timeout bounds one blocked read or write, but the kernel lets a write go on for as long as a few
// bytes get through now and then (a frozen peer's receive window opening a little), and a read
// waits only once the write before it is done, so a peer that stops in the middle of a large
// all-reduce took two or three timeouts to be noticed. The collective's thread arms the watchdog
// when it starts and again at every frame or message that completes (Arm is an atomic store, so a
// small all-reduce pays no thread hand-off); the watchdog checks the deadline a few times per
// timeout and, once it has passed, shuts the group's sockets down: every blocked read and write
// fails at once, and the group is broken from then on.
//
// It holds its own descriptors of the sockets (dup), so that a socket Gloo closes after an error
// stays this one until the watchdog is gone, never a later socket that reused the number; since
// they keep the connections open, a failed collective shuts them down too (ShutDown), so that the
// peers see the break at once.
class Watchdog {
 public:
  // Takes ownership of `sockets` (-1 entries are skipped).
  Watchdog(std::vector<int> sockets, absl::Duration timeout)
      : sockets_(std::move(sockets)),
        timeout_ns_(absl::ToInt64Nanoseconds(timeout)),
        poll_(std::clamp(timeout / 20, absl::Milliseconds(10), absl::Milliseconds(250))),
        thread_([this] { Loop(); }) {}
  ~Watchdog() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
    for (int fd : sockets_) {
      if (fd >= 0) ::close(fd);
    }
  }

  // Shuts every socket down: blocked reads and writes fail, and the peers see the connections end.
  void ShutDown() {
    for (int fd : sockets_) {
      if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
    }
  }

  // The collective has made progress (or starts): it fails if it makes none for the timeout.
  void Arm() { deadline_ns_.store(NowNs() + timeout_ns_, std::memory_order_relaxed); }
  void Disarm() { deadline_ns_.store(kDisarmed, std::memory_order_relaxed); }
  // Whether a deadline passed (the sockets are shut down).
  bool fired() const { return fired_.load(std::memory_order_acquire); }

 private:
  static constexpr int64_t kDisarmed = std::numeric_limits<int64_t>::max();
  static int64_t NowNs() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(MonotonicNow().time_since_epoch())
        .count();
  }

  void Loop() {
    absl::MutexLock lock(&mu_);
    auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; };
    while (!mu_.AwaitWithTimeout(absl::Condition(&stopping), poll_)) {
      if (NowNs() < deadline_ns_.load(std::memory_order_relaxed)) continue;
      fired_.store(true, std::memory_order_release);
      ShutDown();
      return;
    }
  }

  const std::vector<int> sockets_;
  const int64_t timeout_ns_;
  const absl::Duration poll_;
  std::atomic<int64_t> deadline_ns_{kDisarmed};
  std::atomic<bool> fired_{false};
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// Arms `watchdog` for the life of one collective.
class ArmedFor {
 public:
  explicit ArmedFor(Watchdog& watchdog) : watchdog_(watchdog) { watchdog_.Arm(); }
  ~ArmedFor() { watchdog_.Disarm(); }
  ArmedFor(const ArmedFor&) = delete;
  ArmedFor& operator=(const ArmedFor&) = delete;

 private:
  Watchdog& watchdog_;
};

// A write to a socket whose peer has gone raises SIGPIPE, which would end the process; blocked
// on this thread while it writes, the write fails with EPIPE instead, which becomes UNAVAILABLE.
// A SIGPIPE raised meanwhile is consumed before the mask is restored.
class ScopedSigpipeBlock {
 public:
  ScopedSigpipeBlock() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~ScopedSigpipeBlock() {
    if (sigismember(&old_, SIGPIPE)) return;
    sigset_t pending;
    sigemptyset(&pending);
    if (sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE)) {
      const timespec zero = {0, 0};
      sigtimedwait(&pipe_, nullptr, &zero);
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  ScopedSigpipeBlock(const ScopedSigpipeBlock&) = delete;
  ScopedSigpipeBlock& operator=(const ScopedSigpipeBlock&) = delete;

 private:
  sigset_t pipe_;
  sigset_t old_;
};

// How two ranks cut a tensor of `bytes` into messages (frames). Every frame but the last is
// kFrameBytes long; a tensor of up to kOneRoundBytes goes in at most two frames, larger ones in
// frames of kFrameBytes, which the scratch buffer and the reduction after each keep in the core's
// cache. The first frame is short enough to sit in the socket's buffers even if the peer never
// reads it (see FrameSender).
constexpr size_t kFrameBytes = 256 << 10;
constexpr size_t kOneRoundBytes = 1 << 20;
constexpr size_t kScratchBytes = kOneRoundBytes - kFrameBytes;  // the longest frame

struct Frames {
  explicit Frames(size_t bytes)
      : bytes(bytes),
        count(bytes <= kFrameBytes      ? 1
              : bytes <= kOneRoundBytes ? 2
                                        : (bytes + kFrameBytes - 1) / kFrameBytes) {}
  size_t offset(size_t i) const { return i * kFrameBytes; }
  size_t length(size_t i) const { return i + 1 < count ? kFrameBytes : bytes - offset(i); }
  size_t bytes;
  size_t count;
};

// Writes the frames of one tensor to the peer on its own thread, while the collective's thread
// reads the peer's, so that both directions flow at once. Used by one collective at a time.
//
// After the first frame it waits for the collective's thread to have received the peer's first
// frame: a peer that never joins the collective then costs one frame, which fits in the socket's
// buffers, instead of a write that blocks until the socket's timeout, which Gloo restarts
// whenever a few bytes get through.
class FrameSender {
 public:
  FrameSender() : thread_([this] { Loop(); }) {}
  ~FrameSender() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
  }

  // Starts writing `out`, each frame to offset 0 at the receiver. `out` must outlive Finish(),
  // which must come before the next Start().
  void Start(gloo::transport::Buffer* out, Frames frames) {
    absl::MutexLock lock(&mu_);
    out_ = out;
    frames_ = frames;
    sent_ = 0;
    peer_joined_ = false;
    abort_ = false;
    error_.clear();
    busy_ = true;
  }

  // The peer's first frame has arrived.
  void PeerJoined() {
    absl::MutexLock lock(&mu_);
    peer_joined_ = true;
  }

  // Blocks until `count` frames are written (true) or the writes failed (false).
  bool WaitSent(size_t count) {
    absl::MutexLock lock(&mu_);
    auto ready = [this, count]()
                     ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return sent_ >= count || !busy_; };
    mu_.Await(absl::Condition(&ready));
    return sent_ >= count;
  }

  // Stops after the frame being written, if any, and blocks until then (abort), or blocks until
  // every frame is written. Returns the writes' error, if any ("" when none).
  std::string Finish(bool abort) {
    absl::MutexLock lock(&mu_);
    abort_ = abort;
    mu_.Await(absl::Condition(
        +[](FrameSender* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) { return !s->busy_; }, this));
    return error_;
  }

 private:
  void Loop() {
    ScopedSigpipeBlock sigpipe;
    absl::MutexLock lock(&mu_);
    while (true) {
      mu_.Await(absl::Condition(
          +[](FrameSender* s)
               ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) { return s->stop_ || s->busy_; },
          this));
      if (stop_) return;
      gloo::transport::Buffer* out = out_;
      const Frames frames = frames_;
      std::string error;
      for (size_t i = 0; i < frames.count && error.empty(); ++i) {
        if (i == 1) {
          mu_.Await(absl::Condition(
              +[](FrameSender* s)
                   ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) { return s->peer_joined_ || s->abort_; },
              this));
        }
        if (abort_) break;
        mu_.Unlock();
        try {
          out->send(frames.offset(i), frames.length(i), 0);
          out->waitSend();
        } catch (const std::exception& e) {
          error = e.what();
        }
        mu_.Lock();
        if (error.empty()) ++sent_;
      }
      error_ = error;
      busy_ = false;
    }
  }

  absl::Mutex mu_;
  gloo::transport::Buffer* out_ ABSL_GUARDED_BY(mu_) = nullptr;
  Frames frames_ ABSL_GUARDED_BY(mu_){0};
  size_t sent_ ABSL_GUARDED_BY(mu_) = 0;
  bool peer_joined_ ABSL_GUARDED_BY(mu_) = false;
  bool abort_ ABSL_GUARDED_BY(mu_) = false;
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::string error_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace trainyard::trainer::gloo_pairs

#endif  // TRAINYARD_WORKER_TRAINER_COLLECTIVE_GLOO_PAIRS_H_
