#ifndef TRAINYARD_WORKER_AGENT_LOG_SHIPPER_H_
#define TRAINYARD_WORKER_AGENT_LOG_SHIPPER_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace trainyard {

// Where task logs go (the coordinator's ShipLogs). Implementations need not be thread-safe:
// LogShipper calls them one at a time.
class LogSink {
 public:
  virtual ~LogSink() = default;
  // Sends `data`, found at byte `offset` of the task's log. Returns the offset the receiver
  // wants next (offset + data.size() when it took everything). Errors: UNAVAILABLE and the like
  // when it could not be delivered; the shipper retries later.
  virtual absl::StatusOr<int64_t> Ship(const std::string& task_id, int64_t offset,
                                       absl::string_view data) = 0;
};

// Sends the new bytes of each task's log file to a LogSink, in chunks of at most
// kMaxChunkBytes, and follows the receiver's idea of the offset (after a coordinator restart it
// may ask for everything again, or say it already has more). Thread-safe. Shipping calls
// (ShipAll, Flush, Finish) run one at a time and block while the sink is called; Track, Untrack
// and Offset never wait for the sink.
//
// The trainer writes its log itself, and the task may own the folder it is in: a log that is not
// a regular file of its own (a symbolic link, a FIFO, a hard link) is not read.
//
// A log may hold at most `max_file_bytes` on disk. Past that, each shipping call frees the oldest
// part of the file (a hole punched in it, so offsets stay as they are and the trainer's appends
// go on) down to half the bound: the newest output stays on disk and keeps being shipped. Bytes
// freed before they were shipped reach the sink as one line saying how many were dropped.
class LogShipper {
 public:
  static constexpr int64_t kMaxChunkBytes = 256 * 1024;
  static constexpr int64_t kDefaultMaxFileBytes = int64_t{1} << 30;

  explicit LogShipper(LogSink& sink, int64_t max_chunk_bytes = kMaxChunkBytes,
                      int64_t max_file_bytes = kDefaultMaxFileBytes);

  // Starts following `path` for `task_id` from offset 0. Tracking a tracked task is a no-op.
  void Track(const std::string& task_id, const std::string& path);
  // Stops following a task.
  void Untrack(const std::string& task_id);

  // Ships what is new in every tracked log, one pass. Returns the first error met (other tasks
  // are still tried).
  absl::Status ShipAll();
  // Ships the task's log until the receiver has every byte the file holds now. NOT_FOUND for an
  // untracked task; the sink's error if it fails; ABORTED if the receiver makes no progress.
  absl::Status Flush(const std::string& task_id);
  // For a task that ended: Flush, then stop following it. If the flush fails, the rest is left to
  // later ShipAll passes, which stop following the task once its whole log is shipped.
  absl::Status Finish(const std::string& task_id);

  // The offset in the file of the next byte to ship; -1 for an untracked task.
  int64_t Offset(const std::string& task_id) const;

 private:
  struct Tracked {
    std::string path;
    int64_t offset = 0;       // in the file
    bool ended = false;       // untrack once everything is shipped
    int64_t dropped_end = 0;  // bytes before this were freed on disk
    // The file's offset minus the sink's: the bytes freed unshipped, less the line saying so.
    int64_t skew = 0;
    bool trim_failed = false;  // warned once
  };
  // Ships at most one chunk from `tracked` (a copy) and advances its offset. Sets *done when there
  // was nothing (more) to send.
  absl::Status ShipOnce(const std::string& task_id, Tracked& tracked, bool* done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ship_mu_);
  // Frees the oldest part of the open log `fd` of `size` bytes if it is over max_file_bytes_.
  void Trim(const std::string& task_id, int fd, int64_t size, Tracked& tracked) const;
  // Stores what shipping changed (offset, skew, what was freed) back, if the task is still
  // followed.
  void StoreOffset(const std::string& task_id, const Tracked& tracked);
  absl::Status FlushLocked(const std::string& task_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ship_mu_);

  LogSink& sink_;
  const int64_t max_chunk_bytes_;
  const int64_t max_file_bytes_;

  // Serialises shipping, so that offsets advance in order; never held with mu_ across a sink call.
  absl::Mutex ship_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::Mutex mu_;
  std::map<std::string, Tracked> tasks_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trainyard

#endif  // TRAINYARD_WORKER_AGENT_LOG_SHIPPER_H_
