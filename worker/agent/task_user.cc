#include "worker/agent/task_user.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace trainyard {
namespace {

constexpr const char* kPassedNames[] = {
    "PATH",           "HOME",       "USER",        "LOGNAME",    "LANG",
    "LANGUAGE",       "TZ",         "TERM",        "HOSTNAME",   "LD_LIBRARY_PATH",
    "GLIBC_TUNABLES", "PYTHONPATH", "PYTHONHOME",  "HTTP_PROXY", "HTTPS_PROXY",
    "NO_PROXY",       "http_proxy", "https_proxy", "no_proxy",   "SSL_CERT_FILE",
    "SSL_CERT_DIR"};
constexpr const char* kPassedPrefixes[] = {
    "LC_", "OMP_", "OPENBLAS_", "GOTO", "MKL_", "KMP_", "CUDA_", "NCCL_", "GLOO_", "TORCH_",
    "NVIDIA_", "CUBLAS", "CUDNN_", "PYTORCH_", "AWS_",
    // The tests' hold of a trainer at a step (worker/trainer/main.cc); inert elsewhere.
    "TRAINYARD_TEST_"};

// FNV-1a: the same on every machine and build, unlike std::hash.
uint64_t Fnv1a(absl::string_view text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace

bool PassesToTrainers(absl::string_view name, const std::vector<std::string>& extra) {
  for (const char* passed : kPassedNames) {
    if (name == passed) return true;
  }
  for (const char* prefix : kPassedPrefixes) {
    if (absl::StartsWith(name, prefix)) return true;
  }
  for (const std::string& passed : extra) {
    if (name == passed) return true;
  }
  return false;
}

absl::StatusOr<TaskUidRange> ParseTaskUidRange(absl::string_view text) {
  text = absl::StripAsciiWhitespace(text);
  if (text.empty()) return TaskUidRange{};
  const std::vector<absl::string_view> parts = absl::StrSplit(text, '-');
  TaskUidRange range;
  constexpr int kLowest = 1000;  // below: the system's own users
  constexpr int kHighest = 2147483646;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &range.first) ||
      !absl::SimpleAtoi(parts[1], &range.last) || range.first < kLowest || range.last > kHighest ||
      range.last < range.first) {
    return absl::InvalidArgumentError(
        absl::StrCat("--task_uid_range: '", text, "' is not FIRST-LAST, two user ids in [", kLowest,
                     ", ", kHighest, "] with FIRST <= LAST"));
  }
  return range;
}

int TaskUid(const TaskUidRange& range, absl::string_view job_id, const std::set<int>& taken) {
  const int64_t size = int64_t{range.last} - range.first + 1;
  const int64_t start = static_cast<int64_t>(Fnv1a(job_id) % static_cast<uint64_t>(size));
  for (int64_t i = 0; i < size; ++i) {
    const int uid = static_cast<int>(range.first + (start + i) % size);
    if (taken.count(uid) == 0) return uid;
  }
  return static_cast<int>(range.first + start);
}

absl::Status GiveTo(const std::string& path, int uid, int mode) {
  const int fd = open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0 || fchown(fd, uid, uid) != 0 || fchmod(fd, static_cast<mode_t>(mode)) != 0) {
    const int err = errno;
    if (fd >= 0) close(fd);
    return absl::InternalError(
        absl::StrCat("cannot give ", path, " to user ", uid, ": ", std::strerror(err)));
  }
  close(fd);
  return absl::OkStatus();
}

}  // namespace trainyard
