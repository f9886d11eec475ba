#include "server/store/log_store.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <system_error>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/clock.h"

namespace trainyard {

bool IsSafeFileName(absl::string_view name) {
  if (name.empty() || name == "." || name == "..") return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') {
      return false;
    }
  }
  return true;
}

namespace {

std::string Size(int64_t bytes) {
  if (bytes >= (1 << 20))
    return absl::StrFormat("%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  if (bytes >= (1 << 10))
    return absl::StrFormat("%.1f KiB", static_cast<double>(bytes) / (1 << 10));
  return absl::StrCat(bytes, " bytes");
}

absl::Status CheckNames(absl::string_view job_id, absl::string_view task_id) {
  if (!IsSafeFileName(job_id) || !IsSafeFileName(task_id)) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad log name job '", job_id, "' task '", task_id, "'"));
  }
  return absl::OkStatus();
}

class FileLogBackend final : public LogBackend {
 public:
  explicit FileLogBackend(std::string dir) : dir_(std::move(dir)) {}

  absl::StatusOr<Record> Load(absl::string_view job_id, absl::string_view task_id) override {
    const std::string path = PathFor(job_id, task_id);
    std::error_code ec;
    auto size = std::filesystem::file_size(path, ec);
    Record record;
    if (!ec) {
      record.size = static_cast<int64_t>(size);
    } else if (ec != std::errc::no_such_file_or_directory) {
      return absl::UnavailableError(absl::StrCat("stat ", path, ": ", ec.message()));
    }
    std::ifstream capped(CapPath(path));
    LogCap c;
    if (capped >> c.kept >> c.shipped_end) {
      int sealed = 0;
      if (capped >> sealed) c.sealed = sealed != 0;
      record.cap = c;
    }
    return record;
  }

  absl::Status Append(absl::string_view job_id, absl::string_view task_id, int64_t,
                      absl::string_view data) override {
    const std::string path = PathFor(job_id, task_id);
    std::error_code ec;
    std::filesystem::create_directories(absl::StrCat(dir_, "/", job_id), ec);
    if (ec) return absl::UnavailableError(absl::StrCat("mkdir for ", path, ": ", ec.message()));
    std::ofstream out(path, std::ios::binary | std::ios::app);
    out.write(data.data(), static_cast<std::streamsize>(data.size()));
    out.flush();
    if (!out) {
      return absl::UnavailableError(absl::StrCat("write ", path, ": ", std::strerror(errno)));
    }
    return absl::OkStatus();
  }

  absl::Status WriteCap(absl::string_view job_id, absl::string_view task_id,
                        const LogCap& cap) override {
    // Replaced whole (temp file and rename): a crash leaves the old count or the new one.
    const std::string target = CapPath(PathFor(job_id, task_id));
    const std::string temp = target + ".tmp";
    {
      std::ofstream out(temp, std::ios::binary | std::ios::trunc);
      out << cap.kept << " " << cap.shipped_end << " " << (cap.sealed ? 1 : 0) << "\n";
      out.flush();
      if (!out) {
        return absl::UnavailableError(absl::StrCat("write ", temp, ": ", std::strerror(errno)));
      }
    }
    std::error_code ec;
    std::filesystem::rename(temp, target, ec);
    if (ec) return absl::UnavailableError(absl::StrCat("rename ", temp, ": ", ec.message()));
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> Read(absl::string_view job_id, absl::string_view task_id,
                                   int64_t offset, int64_t n) override {
    const std::string path = PathFor(job_id, task_id);
    std::ifstream in(path, std::ios::binary);
    if (!in) return absl::UnavailableError(absl::StrCat("open ", path, ": ", std::strerror(errno)));
    in.seekg(offset);
    std::string out(static_cast<size_t>(n), '\0');
    in.read(out.data(), n);
    out.resize(static_cast<size_t>(in.gcount()));
    return out;
  }

  absl::Status RemoveJob(absl::string_view job_id) override {
    const std::string dir = absl::StrCat(dir_, "/", job_id);
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
    if (ec) return absl::UnavailableError(absl::StrCat("remove ", dir, ": ", ec.message()));
    return absl::OkStatus();
  }

 private:
  std::string PathFor(absl::string_view job_id, absl::string_view task_id) const {
    return absl::StrCat(dir_, "/", job_id, "/", task_id, ".log");
  }
  static std::string CapPath(const std::string& log_path) { return log_path + ".dropped"; }

  const std::string dir_;
};

}  // namespace

std::unique_ptr<LogBackend> NewFileLogBackend(std::string dir) {
  return std::make_unique<FileLogBackend>(std::move(dir));
}

LogStore::LogStore(std::unique_ptr<LogBackend> backend, int64_t max_task_bytes)
    : backend_(std::move(backend)), max_task_bytes_(std::max<int64_t>(max_task_bytes, 0)) {}

LogStore::LogStore(std::string dir, int64_t max_task_bytes)
    : LogStore(NewFileLogBackend(std::move(dir)), max_task_bytes) {}

std::string LogStore::Key(absl::string_view job_id, absl::string_view task_id) {
  return absl::StrCat(job_id, "/", task_id);
}

absl::StatusOr<int64_t> LogStore::SizeLocked(absl::string_view job_id, absl::string_view task_id) {
  const std::string key = Key(job_id, task_id);
  auto it = sizes_.find(key);
  if (it != sizes_.end()) return it->second;
  absl::StatusOr<LogBackend::Record> record = backend_->Load(job_id, task_id);
  if (!record.ok()) return record.status();
  sizes_[key] = record->size;
  if (record->cap.has_value()) capped_[key] = *record->cap;
  return record->size;
}

absl::Status LogStore::AppendLocked(absl::string_view job_id, absl::string_view task_id,
                                    int64_t size, absl::string_view data) {
  const std::string key = Key(job_id, task_id);
  if (absl::Status s = backend_->Append(job_id, task_id, size, data); !s.ok()) {
    sizes_.erase(key);  // read from the backend again next time
    return s;
  }
  sizes_[key] = size + static_cast<int64_t>(data.size());
  ++versions_[std::string(job_id)];
  appended_.SignalAll();
  return absl::OkStatus();
}

absl::StatusOr<int64_t> LogStore::Append(absl::string_view job_id, absl::string_view task_id,
                                         int64_t offset, absl::string_view data) {
  if (absl::Status s = CheckNames(job_id, task_id); !s.ok()) return s;
  if (offset < 0) return absl::InvalidArgumentError(absl::StrCat("offset: ", offset, " < 0"));
  const std::string key = Key(job_id, task_id);
  absl::MutexLock lock(&mu_);
  absl::StatusOr<int64_t> size = SizeLocked(job_id, task_id);
  if (!size.ok()) return size.status();
  const int64_t end = offset + static_cast<int64_t>(data.size());
  if (auto capped = capped_.find(key); capped != capped_.end()) {
    // Past the limit: acknowledged and counted, not kept.
    LogCap& c = capped->second;
    if (end <= c.shipped_end || c.sealed) return std::max(end, c.shipped_end);
    LogCap updated = c;
    updated.shipped_end = end;
    if (absl::Status s = backend_->WriteCap(job_id, task_id, updated); !s.ok()) return s;
    c = updated;
    return end;
  }
  if (offset > *size) return *size;  // a gap: resend from what is here
  if (end <= *size) return *size;
  absl::string_view fresh = data.substr(static_cast<size_t>(*size - offset));
  std::string write(fresh);
  std::optional<LogCap> capped;
  if (*size + static_cast<int64_t>(fresh.size()) > max_task_bytes_) {
    // The log may already be at or past the limit without a record of it (written before the
    // limit was lowered): it keeps what it has.
    const int64_t kept = std::max(*size, max_task_bytes_);
    capped = LogCap{kept, end, false};
    write.resize(static_cast<size_t>(kept - *size));
    absl::StrAppend(&write, write.empty() || write.back() != '\n' ? "\n" : "",
                    "[trainyard: this task's log reached its limit of ", Size(max_task_bytes_),
                    " (--max_task_log_bytes); later output is not kept]\n");
  }
  // The data first, then the record of the limit: a crash between them leaves a log whose size
  // says it reached the limit, which the next append records again.
  if (absl::Status s = AppendLocked(job_id, task_id, *size, write); !s.ok()) return s;
  if (capped.has_value()) {
    capped_[key] = *capped;
    if (absl::Status s = backend_->WriteCap(job_id, task_id, *capped); !s.ok()) {
      return s;  // resent: counted
    }
  }
  return end;
}

absl::Status LogStore::Seal(absl::string_view job_id, absl::string_view task_id) {
  if (absl::Status s = CheckNames(job_id, task_id); !s.ok()) return s;
  const std::string key = Key(job_id, task_id);
  absl::MutexLock lock(&mu_);
  absl::StatusOr<int64_t> size = SizeLocked(job_id, task_id);
  if (!size.ok()) return size.status();
  auto capped = capped_.find(key);
  if (capped == capped_.end() || capped->second.sealed) return absl::OkStatus();
  const LogCap& c = capped->second;
  const std::string line = absl::StrCat("[trainyard: ", c.shipped_end - c.kept,
                                        " bytes of later output were not kept]\n");
  if (absl::Status s = AppendLocked(job_id, task_id, *size, line); !s.ok()) return s;
  capped->second.sealed = true;
  return backend_->WriteCap(job_id, task_id, capped->second);
}

absl::StatusOr<std::string> LogStore::Read(absl::string_view job_id, absl::string_view task_id,
                                           int64_t offset, int64_t max_bytes) {
  if (absl::Status s = CheckNames(job_id, task_id); !s.ok()) return s;
  int64_t size = 0;
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<int64_t> s = SizeLocked(job_id, task_id);
    if (!s.ok()) return s.status();
    size = *s;
  }
  if (offset >= size || max_bytes <= 0) return std::string();
  return backend_->Read(job_id, task_id, offset, std::min(max_bytes, size - offset));
}

absl::Status LogStore::RemoveJob(absl::string_view job_id) {
  if (!IsSafeFileName(job_id)) {
    return absl::InvalidArgumentError(absl::StrCat("bad log name job '", job_id, "'"));
  }
  absl::MutexLock lock(&mu_);
  const std::string prefix = absl::StrCat(job_id, "/");
  for (auto it = sizes_.lower_bound(prefix);
       it != sizes_.end() && absl::StartsWith(it->first, prefix);) {
    it = sizes_.erase(it);
  }
  for (auto it = capped_.lower_bound(prefix);
       it != capped_.end() && absl::StartsWith(it->first, prefix);) {
    it = capped_.erase(it);
  }
  if (auto it = versions_.find(job_id); it != versions_.end()) versions_.erase(it);
  appended_.SignalAll();  // a follower of the job sees it gone
  return backend_->RemoveJob(job_id);
}

uint64_t LogStore::VersionLocked(absl::string_view job_id) const {
  auto it = versions_.find(job_id);
  return it == versions_.end() ? 0 : it->second;
}

uint64_t LogStore::version(absl::string_view job_id) const {
  absl::MutexLock lock(&mu_);
  return VersionLocked(job_id);
}

uint64_t LogStore::WaitForAppend(absl::string_view job_id, uint64_t known,
                                 absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  // The deadline of a blocking wait is real time by nature; nothing in the logic reads it.
  const absl::Time deadline = RealClock::Get().Now() + timeout;
  while (VersionLocked(job_id) == known) {
    if (appended_.WaitWithDeadline(&mu_, deadline)) break;
  }
  return VersionLocked(job_id);
}

}  // namespace trainyard
