#ifndef TRAINYARD_SERVER_STORE_LOG_STORE_H_
#define TRAINYARD_SERVER_STORE_LOG_STORE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace trainyard {

// A log that went past its limit: bytes kept of the task's output, the end of what was shipped,
// and whether the line counting what was dropped has been written.
struct LogCap {
  int64_t kept = 0;
  int64_t shipped_end = 0;
  bool sealed = false;
};

// Where task logs are kept: what LogStore needs of its storage. Thread-safe; calls block on I/O.
// Errors: UNAVAILABLE for what may pass.
class LogBackend {
 public:
  virtual ~LogBackend() = default;
  // What is kept of the task's log: its size (0 when there is none) and its cap, if it has one.
  struct Record {
    int64_t size = 0;
    std::optional<LogCap> cap;
  };
  virtual absl::StatusOr<Record> Load(absl::string_view job_id, absl::string_view task_id) = 0;
  // Adds `data` at byte `at`, the log's size as Load (or the appends since) left it.
  virtual absl::Status Append(absl::string_view job_id, absl::string_view task_id, int64_t at,
                              absl::string_view data) = 0;
  // Replaces the log's cap record, whole.
  virtual absl::Status WriteCap(absl::string_view job_id, absl::string_view task_id,
                                const LogCap& cap) = 0;
  // Up to `n` bytes from `offset` (both within the size kept).
  virtual absl::StatusOr<std::string> Read(absl::string_view job_id, absl::string_view task_id,
                                           int64_t offset, int64_t n) = 0;
  // Every log of the job; OK when there are none.
  virtual absl::Status RemoveJob(absl::string_view job_id) = 0;
};

// Plain files: {dir}/{job_id}/{task_id}.log, and {task_id}.log.dropped holding the cap
// ("kept_bytes shipped_end sealed"). `dir` is created on the first append.
std::unique_ptr<LogBackend> NewFileLogBackend(std::string dir);

// Task logs, shipped by agents in pieces at byte offsets; shipping is idempotent. Thread-safe;
// calls block on the backend's I/O.
//
// A task's log keeps at most `max_task_bytes` of output. Past that, a line says so and later
// output is acknowledged but not kept; the count of bytes dropped is kept in the log's cap and
// written to the log by Seal.
class LogStore {
 public:
  LogStore(std::unique_ptr<LogBackend> backend, int64_t max_task_bytes = int64_t{64} << 20);
  // Files under `dir` (NewFileLogBackend).
  explicit LogStore(std::string dir, int64_t max_task_bytes = int64_t{64} << 20);

  // Writes `data`, which starts at byte `offset` of the task's log, and returns the log's size
  // afterwards: the offset the agent should send next. Bytes the store already has are skipped;
  // for a gap (offset beyond the size) nothing is written and the current size is returned so
  // that the agent resends from there. Past the limit, the offset after `data` (or after what
  // was shipped before, if more) is returned. INVALID_ARGUMENT for ids that are not plain file
  // names or a negative offset, UNAVAILABLE for I/O errors.
  absl::StatusOr<int64_t> Append(absl::string_view job_id, absl::string_view task_id,
                                 int64_t offset, absl::string_view data);

  // Up to `max_bytes` from `offset`; empty at the end or when there is no log yet.
  absl::StatusOr<std::string> Read(absl::string_view job_id, absl::string_view task_id,
                                   int64_t offset, int64_t max_bytes);

  // Counts appends to the job's logs that added data; never decreases.
  uint64_t version(absl::string_view job_id) const;

  // Blocks until version(job_id) differs from `known` or `timeout` passes; returns
  // version(job_id). Appends to other jobs' logs do not end the wait.
  uint64_t WaitForAppend(absl::string_view job_id, uint64_t known, absl::Duration timeout) const;

  // The task has ended: if its log went past the limit, a last line says how many bytes were
  // not kept. Later appends are dropped.
  absl::Status Seal(absl::string_view job_id, absl::string_view task_id);

  // Removes every log of the job. OK when there are none.
  absl::Status RemoveJob(absl::string_view job_id);

 private:
  // "{job_id}/{task_id}": the key of the caches.
  static std::string Key(absl::string_view job_id, absl::string_view task_id);
  // The log's size; the first time, also its cap if it has one.
  absl::StatusOr<int64_t> SizeLocked(absl::string_view job_id, absl::string_view task_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Appends `data` at the log's cached `size`, updating the cache.
  absl::Status AppendLocked(absl::string_view job_id, absl::string_view task_id, int64_t size,
                            absl::string_view data) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t VersionLocked(absl::string_view job_id) const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const std::unique_ptr<LogBackend> backend_;
  const int64_t max_task_bytes_;
  mutable absl::Mutex mu_;
  mutable absl::CondVar appended_;
  std::map<std::string, uint64_t, std::less<>> versions_ ABSL_GUARDED_BY(mu_);  // by job id
  std::map<std::string, int64_t> sizes_ ABSL_GUARDED_BY(mu_);  // by Key: bytes kept
  std::map<std::string, LogCap> capped_ ABSL_GUARDED_BY(mu_);  // by Key
};

// True for ids usable as one path component: [A-Za-z0-9._-], not empty, not "." or "..".
bool IsSafeFileName(absl::string_view name);

}  // namespace trainyard

#endif  // TRAINYARD_SERVER_STORE_LOG_STORE_H_
