#ifndef TRAINYARD_SERVER_LOG_STORE_H_
#define TRAINYARD_SERVER_LOG_STORE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace trainyard {

// Task logs as plain files: {dir}/{job_id}/{task_id}.log. Agents ship them in pieces at byte
// offsets; shipping is idempotent. Thread-safe; calls block on file I/O.
//
// A task's log keeps at most `max_task_bytes` of output. Past that, a line says so and later
// output is acknowledged but not kept; the count of bytes dropped is kept in
// {task_id}.log.dropped ("kept_bytes shipped_end sealed") and written to the log by Seal.
class LogStore {
 public:
  // `dir` is created on the first append.
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

  std::string PathFor(absl::string_view job_id, absl::string_view task_id) const;

 private:
  // The log's size on disk; the first time, also its Capped record if it has one.
  absl::StatusOr<int64_t> SizeLocked(const std::string& path) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t VersionLocked(absl::string_view job_id) const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  // A log past the limit: bytes kept of the task's output, and the end of what was shipped.
  struct Capped {
    int64_t kept = 0;
    int64_t shipped_end = 0;
    bool sealed = false;
  };
  absl::Status WriteCappedLocked(const std::string& path, const Capped& capped)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string dir_;
  const int64_t max_task_bytes_;
  mutable absl::Mutex mu_;
  mutable absl::CondVar appended_;
  std::map<std::string, uint64_t, std::less<>> versions_ ABSL_GUARDED_BY(mu_);  // by job id
  std::map<std::string, int64_t> sizes_ ABSL_GUARDED_BY(mu_);  // path -> bytes on disk
  std::map<std::string, Capped> capped_ ABSL_GUARDED_BY(mu_);  // by path
};

// True for ids usable as one path component: [A-Za-z0-9._-], not empty, not "." or "..".
bool IsSafeFileName(absl::string_view name);

}  // namespace trainyard

#endif  // TRAINYARD_SERVER_LOG_STORE_H_
