#include "worker/agent/log_shipper.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "absl/strings/str_cat.h"

namespace trainyard {
namespace {

// Up to `max` bytes of `path` from `offset`; empty at (or past) the end or if unreadable.
std::string ReadAt(const std::string& path, int64_t offset, int64_t max) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  std::string data(static_cast<size_t>(max), '\0');
  size_t got = 0;
  while (got < data.size()) {
    const ssize_t n = pread(fd, data.data() + got, data.size() - got,
                            static_cast<off_t>(offset + static_cast<int64_t>(got)));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  close(fd);
  data.resize(got);
  return data;
}

}  // namespace

LogShipper::LogShipper(LogSink& sink, int64_t max_chunk_bytes)
    : sink_(sink), max_chunk_bytes_(max_chunk_bytes) {}

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

absl::Status LogShipper::ShipOnce(const std::string& task_id, Tracked& tracked, bool* done) {
  const std::string data = ReadAt(tracked.path, tracked.offset, max_chunk_bytes_);
  if (data.empty()) {
    *done = true;
    return absl::OkStatus();
  }
  absl::StatusOr<int64_t> next = sink_.Ship(task_id, tracked.offset, data);
  if (!next.ok()) return next.status();
  const int64_t expected = tracked.offset + static_cast<int64_t>(data.size());
  *done = *next == expected && static_cast<int64_t>(data.size()) < max_chunk_bytes_;
  tracked.offset = *next < 0 ? 0 : *next;
  StoreOffset(task_id, tracked.offset);
  return absl::OkStatus();
}

void LogShipper::StoreOffset(const std::string& task_id, int64_t offset) {
  absl::MutexLock lock(&mu_);
  auto it = tasks_.find(task_id);
  if (it != tasks_.end()) it->second.offset = offset;
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
