#include "worker/agent/log_shipper.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace trainyard {
namespace {

// The log at `path` for reading, or -1 (missing, or refused). The task may own the folder the
// log is in, so it could put there a link to a file only the agent may read (whose bytes would be
// shipped to the task's owner) or a FIFO (on which a plain open blocks the agent): the last
// component is not followed, the open does not wait, and only a regular file with no other name
// is read.
int OpenLog(const std::string& path, struct stat* st) {
  constexpr int kFlags = O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY;
  // Writable to free its oldest part (Trim); readable at least.
  int fd = open(path.c_str(), O_RDWR | kFlags);
  if (fd < 0 && (errno == EACCES || errno == EPERM)) fd = open(path.c_str(), O_RDONLY | kFlags);
  if (fd < 0) return -1;
  if (fstat(fd, st) != 0 || !S_ISREG(st->st_mode) || st->st_nlink != 1) {
    close(fd);
    return -1;
  }
  return fd;
}

// Up to `max` bytes of `fd` from `offset`; empty at (or past) the end or if unreadable.
std::string ReadAt(int fd, int64_t offset, int64_t max) {
  std::string data(static_cast<size_t>(max), '\0');
  size_t got = 0;
  while (got < data.size()) {
    const ssize_t n = pread(fd, data.data() + got, data.size() - got,
                            static_cast<off_t>(offset + static_cast<int64_t>(got)));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  data.resize(got);
  return data;
}

}  // namespace

LogShipper::LogShipper(LogSink& sink, int64_t max_chunk_bytes, int64_t max_file_bytes)
    : sink_(sink), max_chunk_bytes_(max_chunk_bytes), max_file_bytes_(max_file_bytes) {}

void LogShipper::Track(const std::string& task_id, const std::string& path) {
  absl::MutexLock lock(&mu_);
  tasks_.emplace(task_id, Tracked{path, 0});
}

void LogShipper::Untrack(const std::string& task_id) {
  absl::MutexLock lock(&mu_);
  tasks_.erase(task_id);
}

int64_t LogShipper::Offset(const std::string& task_id) const {
  absl::MutexLock lock(&mu_);
  auto it = tasks_.find(task_id);
  return it == tasks_.end() ? -1 : it->second.offset;
}

void LogShipper::Trim(const std::string& task_id, int fd, int64_t size, Tracked& tracked) const {
  if (size - tracked.dropped_end <= max_file_bytes_) return;
  // Down to half the bound, so that this happens once per half of it, on a block boundary.
  const int64_t cut = (size - max_file_bytes_ / 2) & ~int64_t{4095};
  if (cut <= tracked.dropped_end) return;
  if (fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, tracked.dropped_end,
                cut - tracked.dropped_end) != 0) {
    if (tracked.trim_failed) return;
    tracked.trim_failed = true;
    LogWarning("cannot free the oldest output of task ", task_id, " (its log is over ",
               max_file_bytes_, " bytes): ", std::strerror(errno));
    return;
  }
  tracked.dropped_end = cut;
}

absl::Status LogShipper::ShipOnce(const std::string& task_id, Tracked& tracked, bool* done) {
  struct stat st;
  const int fd = OpenLog(tracked.path, &st);
  if (fd < 0) {
    *done = true;
    return absl::OkStatus();
  }
  Trim(task_id, fd, st.st_size, tracked);
  const int64_t sink_offset = tracked.offset - tracked.skew;
  std::string data;
  if (tracked.offset < tracked.dropped_end) {
    data = absl::StrCat("[trainyard: ", tracked.dropped_end - tracked.offset,
                        " bytes of output were dropped on the worker: the task's log went past "
                        "its bound of ",
                        max_file_bytes_, " bytes there]\n");
  } else {
    data = ReadAt(fd, tracked.offset, max_chunk_bytes_);
  }
  close(fd);
  if (data.empty()) {
    *done = true;
    return absl::OkStatus();
  }
  absl::StatusOr<int64_t> next = sink_.Ship(task_id, sink_offset, data);
  if (!next.ok()) {
    StoreOffset(task_id, tracked);  // what Trim freed
    return next.status();
  }
  const int64_t expected = sink_offset + static_cast<int64_t>(data.size());
  if (tracked.offset < tracked.dropped_end) {
    // The line stands for the bytes freed: the file's next byte is the sink's `expected`.
    tracked.skew = tracked.dropped_end - expected;
    *done = false;
  } else {
    *done = *next == expected && static_cast<int64_t>(data.size()) < max_chunk_bytes_;
  }
  tracked.offset = (*next < 0 ? 0 : *next) + tracked.skew;
  StoreOffset(task_id, tracked);
  return absl::OkStatus();
}

void LogShipper::StoreOffset(const std::string& task_id, const Tracked& tracked) {
  absl::MutexLock lock(&mu_);
  auto it = tasks_.find(task_id);
  if (it == tasks_.end()) return;
  it->second.offset = tracked.offset;
  it->second.dropped_end = tracked.dropped_end;
  it->second.skew = tracked.skew;
  it->second.trim_failed = tracked.trim_failed;
}

absl::Status LogShipper::ShipAll() {
  absl::MutexLock ship_lock(&ship_mu_);
  std::map<std::string, Tracked> snapshot;
  {
    absl::MutexLock lock(&mu_);
    snapshot = tasks_;
  }
  absl::Status first_error;
  for (auto& [task_id, tracked] : snapshot) {
    // Bounded passes per task so one busy log cannot starve the others.
    for (int i = 0; i < 8; ++i) {
      bool done = false;
      absl::Status status = ShipOnce(task_id, tracked, &done);
      if (!status.ok()) {
        if (first_error.ok()) first_error = status;
        break;
      }
      if (done) {
        if (tracked.ended) Untrack(task_id);
        break;
      }
    }
  }
  return first_error;
}

absl::Status LogShipper::FlushLocked(const std::string& task_id) {
  Tracked tracked;
  {
    absl::MutexLock lock(&mu_);
    auto it = tasks_.find(task_id);
    if (it == tasks_.end()) return absl::NotFoundError(absl::StrCat("no log for task ", task_id));
    tracked = it->second;
  }
  int stalled = 0;
  while (true) {
    const int64_t before = tracked.offset;
    bool done = false;
    absl::Status status = ShipOnce(task_id, tracked, &done);
    if (!status.ok()) return status;
    if (done) return absl::OkStatus();
    stalled = tracked.offset > before ? 0 : stalled + 1;
    if (stalled >= 3) {
      return absl::AbortedError(absl::StrCat("the receiver keeps asking for offset ",
                                             tracked.offset, " of task ", task_id));
    }
  }
}

absl::Status LogShipper::Flush(const std::string& task_id) {
  absl::MutexLock ship_lock(&ship_mu_);
  return FlushLocked(task_id);
}

absl::Status LogShipper::Finish(const std::string& task_id) {
  absl::MutexLock ship_lock(&ship_mu_);
  absl::Status status = FlushLocked(task_id);
  absl::MutexLock lock(&mu_);
  auto it = tasks_.find(task_id);
  if (it == tasks_.end()) return status;
  // A receiver that keeps refusing (ABORTED) will not take the rest later either.
  if (status.ok() || absl::IsAborted(status)) {
    tasks_.erase(it);
  } else {
    it->second.ended = true;
  }
  return status;
}

}  // namespace trainyard
