#include "server/log_store.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <system_error>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

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

LogStore::LogStore(std::string dir) : dir_(std::move(dir)) {}

std::string LogStore::PathFor(absl::string_view job_id, absl::string_view task_id) const {
  return absl::StrCat(dir_, "/", job_id, "/", task_id, ".log");
}

absl::StatusOr<int64_t> LogStore::SizeLocked(const std::string& path) {
  auto it = sizes_.find(path);
  if (it != sizes_.end()) return it->second;
  std::error_code ec;
  auto size = std::filesystem::file_size(path, ec);
  int64_t result = 0;
  if (!ec) {
    result = static_cast<int64_t>(size);
  } else if (ec != std::errc::no_such_file_or_directory) {
    return absl::UnavailableError(absl::StrCat("stat ", path, ": ", ec.message()));
  }
  sizes_[path] = result;
  return result;
}

absl::StatusOr<int64_t> LogStore::Append(absl::string_view job_id, absl::string_view task_id,
                                         int64_t offset, absl::string_view data) {
  if (!IsSafeFileName(job_id) || !IsSafeFileName(task_id)) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad log name job '", job_id, "' task '", task_id, "'"));
  }
  if (offset < 0) return absl::InvalidArgumentError(absl::StrCat("offset: ", offset, " < 0"));
  const std::string path = PathFor(job_id, task_id);
  absl::MutexLock lock(&mu_);
  absl::StatusOr<int64_t> size = SizeLocked(path);
  if (!size.ok()) return size.status();
  if (offset > *size) return *size;  // a gap: resend from what is here
  const int64_t end = offset + static_cast<int64_t>(data.size());
  if (end <= *size) return *size;
  absl::string_view fresh = data.substr(static_cast<size_t>(*size - offset));
  std::error_code ec;
  std::filesystem::create_directories(absl::StrCat(dir_, "/", job_id), ec);
  if (ec) return absl::UnavailableError(absl::StrCat("mkdir for ", path, ": ", ec.message()));
  std::ofstream out(path, std::ios::binary | std::ios::app);
  out.write(fresh.data(), static_cast<std::streamsize>(fresh.size()));
  out.flush();
  if (!out) {
    sizes_.erase(path);  // re-read from disk next time
    return absl::UnavailableError(absl::StrCat("write ", path, ": ", std::strerror(errno)));
  }
  sizes_[path] = end;
  ++versions_[std::string(job_id)];
  appended_.SignalAll();
  return end;
}

absl::StatusOr<std::string> LogStore::Read(absl::string_view job_id, absl::string_view task_id,
                                           int64_t offset, int64_t max_bytes) {
  if (!IsSafeFileName(job_id) || !IsSafeFileName(task_id)) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad log name job '", job_id, "' task '", task_id, "'"));
  }
  const std::string path = PathFor(job_id, task_id);
  int64_t size = 0;
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<int64_t> s = SizeLocked(path);
    if (!s.ok()) return s.status();
    size = *s;
  }
  if (offset >= size || max_bytes <= 0) return std::string();
  const int64_t n = std::min(max_bytes, size - offset);
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::UnavailableError(absl::StrCat("open ", path, ": ", std::strerror(errno)));
  in.seekg(offset);
  std::string out(static_cast<size_t>(n), '\0');
  in.read(out.data(), n);
  out.resize(static_cast<size_t>(in.gcount()));
  return out;
}

absl::Status LogStore::RemoveJob(absl::string_view job_id) {
  if (!IsSafeFileName(job_id)) {
    return absl::InvalidArgumentError(absl::StrCat("bad log name job '", job_id, "'"));
  }
  const std::string dir = absl::StrCat(dir_, "/", job_id);
  absl::MutexLock lock(&mu_);
  const std::string prefix = dir + "/";
  for (auto it = sizes_.lower_bound(prefix);
       it != sizes_.end() && absl::StartsWith(it->first, prefix);) {
    it = sizes_.erase(it);
  }
  if (auto it = versions_.find(job_id); it != versions_.end()) versions_.erase(it);
  appended_.SignalAll();  // a follower of the job sees it gone
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (ec) return absl::UnavailableError(absl::StrCat("remove ", dir, ": ", ec.message()));
  return absl::OkStatus();
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
  const absl::Time deadline = absl::Now() + timeout;
  while (VersionLocked(job_id) == known) {
    if (appended_.WaitWithDeadline(&mu_, deadline)) break;
  }
  return VersionLocked(job_id);
}

}  // namespace trainyard
