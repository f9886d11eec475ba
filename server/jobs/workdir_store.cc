#include "server/jobs/workdir_store.h"

#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/byte_size.h"
#include "common/sha256.h"
#include "common/spec/job_paths.h"
#include "common/storage/uri.h"

namespace trainyard {
namespace {

bool IsSha256(const std::string& hex) {
  if (hex.size() != 64) return false;
  for (char c : hex) {
    if (!absl::ascii_isdigit(c) && !(c >= 'a' && c <= 'f')) return false;
  }
  return true;
}

// A temporary file removed on destruction.
class TempFile {
 public:
  TempFile() {
    const char* dir = std::getenv("TMPDIR");
    path_ = absl::StrCat(dir != nullptr && *dir != '\0' ? dir : "/tmp", "/workdir-XXXXXX");
    const int fd = ::mkstemp(path_.data());
    if (fd >= 0) ::close(fd);
    ok_ = fd >= 0;
  }
  ~TempFile() { std::remove(path_.c_str()); }
  bool ok() const { return ok_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  bool ok_ = false;
};

}  // namespace

std::string WorkdirStore::UriOf(const std::string& owner, const std::string& sha256) const {
  const std::string folder =
      owner.empty() ? checkpoint_root_ : JoinUri(checkpoint_root_, OwnerFolder(owner));
  return JoinUri(folder, absl::StrCat("programs/sha256-", sha256, ".tar"));
}

absl::StatusOr<WorkdirStore::Stored> WorkdirStore::Keep(
    const std::string& owner, const std::string& sha256, int64_t size_bytes,
    const std::function<bool(std::string* chunk)>& next) const {
  if (!IsSha256(sha256)) {
    return absl::InvalidArgumentError("sha256: 64 lower-case hex digits in the first message");
  }
  if (size_bytes < 0) return absl::InvalidArgumentError("size_bytes: must be >= 0");
  if (size_bytes > max_bytes_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "program.workdir: its archive of ", HumanBytes(size_bytes),
        " is over this coordinator's limit of ", HumanBytes(max_bytes_), " (--max_workdir_size)"));
  }
  Stored stored;
  stored.uri = UriOf(owner, sha256);
  absl::StatusOr<std::shared_ptr<ObjectStore>> store = stores_->Open(stored.uri);
  if (!store.ok()) return store.status();
  if (absl::StatusOr<ObjectInfo> head = (*store)->Head(stored.uri);
      head.ok() && head->size_bytes == size_bytes) {
    stored.already_stored = true;
    return stored;
  }
  TempFile file;
  if (!file.ok()) return absl::UnavailableError("cannot make a temporary file");
  std::ofstream out(file.path(), std::ios::binary | std::ios::trunc);
  Sha256 hash;
  int64_t received = 0;
  std::string chunk;
  while (next(&chunk)) {
    received += static_cast<int64_t>(chunk.size());
    if (received > size_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("data: more than the ", size_bytes, " bytes the first message said"));
    }
    hash.Update(chunk);
    out.write(chunk.data(), static_cast<std::streamsize>(chunk.size()));
  }
  out.close();
  if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", file.path()));
  if (received != size_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("data: ", received, " bytes where the first ", "message said ", size_bytes));
  }
  if (hash.HexDigest() != sha256) {
    return absl::InvalidArgumentError(
        "data: the bytes do not have the SHA-256 the first "
        "message said");
  }
  if (absl::Status s = (*store)->PutFile(stored.uri, file.path()); !s.ok()) return s;
  return stored;
}

}  // namespace trainyard
