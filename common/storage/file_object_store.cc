#include "common/storage/file_object_store.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/sha256.h"
#include "common/storage/uri.h"

namespace trainyard {
namespace {

namespace fs = std::filesystem;

constexpr char kTempPrefix[] = ".trainyard-tmp-";

absl::Status ErrnoStatus(int err, absl::string_view what, absl::string_view uri) {
  const std::string message = absl::StrCat(what, " ", uri, ": ", std::strerror(err));
  switch (err) {
    case ENOENT:
      return absl::NotFoundError(message);
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::PermissionDeniedError(message);
    case EISDIR:
    case ENOTDIR:
    case EEXIST:
    case ENOTEMPTY:
      return absl::FailedPreconditionError(message);
    case ENAMETOOLONG:
      return absl::InvalidArgumentError(message);
    default:
      return absl::UnavailableError(message);
  }
}

// The local path of an object URI; the URI must name a file, not a folder.
absl::StatusOr<std::string> ObjectPath(absl::string_view uri) {
  absl::StatusOr<std::string> path = LocalPath(uri);
  if (!path.ok()) return path.status();
  if (absl::EndsWith(*path, "/")) {
    return absl::InvalidArgumentError(absl::StrCat("'", uri, "' names a folder, not an object"));
  }
  return path;
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  int get() const { return fd_; }
  // Closes now, reporting the error that close() can carry for some file systems.
  int Close() {
    int rc = close(fd_);
    fd_ = -1;
    return rc;
  }

 private:
  int fd_;
};

absl::Status WriteAll(int fd, absl::string_view data, absl::string_view uri) {
  while (!data.empty()) {
    ssize_t n = write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "writing", uri);
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

// Opens an existing regular file for reading.
absl::StatusOr<int> OpenForRead(const std::string& path, absl::string_view uri, struct stat* st) {
  int fd;
  do {
    fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    if (errno == ENOTDIR) return absl::NotFoundError(absl::StrCat("no object ", uri));
    return ErrnoStatus(errno, "opening", uri);
  }
  if (fstat(fd, st) != 0) {
    int err = errno;
    close(fd);
    return ErrnoStatus(err, "stat of", uri);
  }
  if (!S_ISREG(st->st_mode)) {
    close(fd);
    return absl::NotFoundError(absl::StrCat("no object ", uri, " (not a regular file)"));
  }
  return fd;
}

absl::StatusOr<std::string> ReadAt(int fd, int64_t offset, int64_t length, absl::string_view uri) {
  std::string out(static_cast<size_t>(length), '\0');
  size_t done = 0;
  while (done < out.size()) {
    ssize_t n = pread(fd, out.data() + done, out.size() - done, offset + done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "reading", uri);
    }
    if (n == 0) break;  // the file shrank under us: return what is there
    done += static_cast<size_t>(n);
  }
  out.resize(done);
  return out;
}

std::string FileUri(const std::string& path) { return absl::StrCat("file://", path); }

std::string FileEtag(const struct stat& st) {
  return absl::StrCat(absl::Hex(st.st_size), "-",
                      absl::Hex(static_cast<uint64_t>(st.st_mtim.tv_sec) * 1000000000ull +
                                static_cast<uint64_t>(st.st_mtim.tv_nsec)),
                      "-", absl::Hex(st.st_ino));
}

// Copies what is left of `in` to `out`.
absl::Status CopyFd(int in, int out, absl::string_view from, absl::string_view to) {
  std::string buffer(1 << 20, '\0');
  while (true) {
    ssize_t n = read(in, buffer.data(), buffer.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "reading", from);
    }
    if (n == 0) return absl::OkStatus();
    absl::Status status = WriteAll(out, absl::string_view(buffer.data(), n), to);
    if (!status.ok()) return status;
  }
}

}  // namespace

absl::StatusOr<std::string> RealPathOfExisting(const std::string& path) {
  std::string head = path;
  std::string tail;
  while (!head.empty()) {
    char resolved[PATH_MAX];
    if (realpath(head.c_str(), resolved) != nullptr) {
      std::string real = resolved;
      if (!tail.empty()) real = JoinUri(real, tail);
      return real;
    }
    const size_t slash = head.rfind('/');
    if (slash == std::string::npos) break;
    const std::string last = head.substr(slash + 1);
    tail = tail.empty() ? last : absl::StrCat(last, "/", tail);
    head = slash == 0 ? (head == "/" ? "" : "/") : head.substr(0, slash);
  }
  return absl::NotFoundError(absl::StrCat("no part of '", path, "' exists"));
}

FileObjectStore::FileObjectStore(const std::vector<std::string>& roots) : rooted_(true) {
  for (const std::string& root : roots) {
    absl::StatusOr<std::string> path = LocalPath(root);
    if (!path.ok()) continue;  // names no folder: nothing is under it
    absl::StatusOr<std::string> real = RealPathOfExisting(*path);
    if (real.ok()) roots_.push_back(*real);
  }
}

absl::StatusOr<std::string> FileObjectStore::Resolve(absl::string_view uri, bool object) const {
  absl::StatusOr<std::string> path = object ? ObjectPath(uri) : LocalPath(uri);
  if (!path.ok() || !rooted_) return path;
  absl::StatusOr<std::string> real = RealPathOfExisting(*path);
  if (!real.ok()) return real.status();
  const Uri where{"file", "", *real};
  for (const std::string& root : roots_) {
    if (IsWithin(where, Uri{"file", "", root})) return path;
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "'", uri, "' resolves to '", *real, "', outside the folders this job may use (",
      roots_.empty() ? "none: object storage only" : absl::StrJoin(roots_, ", "), ")"));
}

absl::Status FileObjectStore::Put(absl::string_view uri, absl::string_view data) {
  return WriteObject(uri, [&](int fd) { return WriteAll(fd, data, uri); });
}

absl::StatusOr<std::string> FileObjectStore::PutPieces(absl::string_view uri,
                                                       absl::Span<const absl::string_view> pieces) {
  constexpr size_t kChunk = 1 << 20;
  Sha256 hash;
  absl::Status status = WriteObject(uri, [&](int fd) {
    for (absl::string_view piece : pieces) {
      for (size_t at = 0; at < piece.size(); at += kChunk) {
        const absl::string_view chunk = piece.substr(at, kChunk);
        hash.Update(chunk);
        absl::Status written = WriteAll(fd, chunk, uri);
        if (!written.ok()) return written;
      }
    }
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  return hash.HexDigest();
}

absl::Status FileObjectStore::PutFile(absl::string_view uri, const std::string& local_path) {
  int raw_fd;
  do {
    raw_fd = open(local_path.c_str(), O_RDONLY | O_CLOEXEC);
  } while (raw_fd < 0 && errno == EINTR);
  if (raw_fd < 0) return ErrnoStatus(errno, "opening", local_path);
  Fd source(raw_fd);
  return WriteObject(uri, [&](int fd) { return CopyFd(source.get(), fd, "the source file", uri); });
}

absl::StatusOr<ObjectInfo> FileObjectStore::GetToFile(absl::string_view uri,
                                                      const std::string& local_path) {
  absl::StatusOr<std::string> path = Resolve(uri, /*object=*/true);
  if (!path.ok()) return path.status();
  struct stat st;
  absl::StatusOr<int> raw_fd = OpenForRead(*path, uri, &st);
  if (!raw_fd.ok()) return raw_fd.status();
  Fd in(*raw_fd);
  int out_fd;
  do {
    out_fd = open(local_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  } while (out_fd < 0 && errno == EINTR);
  if (out_fd < 0) return ErrnoStatus(errno, "creating", local_path);
  Fd out(out_fd);
  absl::Status status = CopyFd(in.get(), out.get(), uri, local_path);
  if (status.ok() && out.Close() != 0) status = ErrnoStatus(errno, "closing", local_path);
  if (!status.ok()) return status;
  return ObjectInfo{FileUri(*path), static_cast<int64_t>(st.st_size), FileEtag(st)};
}

absl::Status FileObjectStore::WriteObject(absl::string_view uri,
                                          const std::function<absl::Status(int fd)>& fill) {
  absl::StatusOr<std::string> path = Resolve(uri, /*object=*/true);
  if (!path.ok()) return path.status();
  const fs::path target(*path);
  const fs::path dir = target.parent_path();
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return ErrnoStatus(ec.value(), "creating the folder of", uri);

  const std::string temp = (dir / absl::StrCat(kTempPrefix, target.filename().string(), "-",
                                               getpid(), "-", temp_counter_.fetch_add(1)))
                               .string();
  int raw_fd;
  for (int attempt = 0;; ++attempt) {
    raw_fd = open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (raw_fd >= 0 || errno == EINTR) {
      if (raw_fd >= 0) break;
      continue;
    }
    // A Delete of the folder's last object removed it since it was made: make it again.
    if (errno != ENOENT || attempt >= 3) break;
    fs::create_directories(dir, ec);
  }
  if (raw_fd < 0) return ErrnoStatus(errno, "creating a temporary file for", uri);
  Fd fd(raw_fd);
  absl::Status status = fill(fd.get());
  if (status.ok() && fsync(fd.get()) != 0) status = ErrnoStatus(errno, "syncing", uri);
  if (status.ok() && fd.Close() != 0) status = ErrnoStatus(errno, "closing", uri);
  if (status.ok() && rename(temp.c_str(), path->c_str()) != 0) {
    status = ErrnoStatus(errno, "renaming into", uri);
  }
  if (!status.ok()) {
    unlink(temp.c_str());
    return status;
  }
  // Make the rename itself durable.
  int dir_fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) return ErrnoStatus(errno, "opening the folder of", uri);
  Fd dir_guard(dir_fd);
  if (fsync(dir_fd) != 0) return ErrnoStatus(errno, "syncing the folder of", uri);
  return absl::OkStatus();
}

absl::StatusOr<std::string> FileObjectStore::Get(absl::string_view uri) {
  absl::StatusOr<std::string> path = Resolve(uri, /*object=*/true);
  if (!path.ok()) return path.status();
  struct stat st;
  absl::StatusOr<int> raw_fd = OpenForRead(*path, uri, &st);
  if (!raw_fd.ok()) return raw_fd.status();
  Fd fd(*raw_fd);
  return ReadAt(fd.get(), 0, st.st_size, uri);
}

absl::StatusOr<std::string> FileObjectStore::GetRange(absl::string_view uri, int64_t offset,
                                                      int64_t length) {
  if (offset < 0 || length < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad range offset=", offset, " length=", length, " for ", uri));
  }
  absl::StatusOr<std::string> path = Resolve(uri, /*object=*/true);
  if (!path.ok()) return path.status();
  struct stat st;
  absl::StatusOr<int> raw_fd = OpenForRead(*path, uri, &st);
  if (!raw_fd.ok()) return raw_fd.status();
  Fd fd(*raw_fd);
  if (offset > st.st_size) {
    return absl::OutOfRangeError(
        absl::StrCat("offset ", offset, " is past the end of ", uri, " (", st.st_size, " bytes)"));
  }
  return ReadAt(fd.get(), offset, std::min<int64_t>(length, st.st_size - offset), uri);
}

absl::StatusOr<ObjectInfo> FileObjectStore::Head(absl::string_view uri) {
  absl::StatusOr<std::string> path = Resolve(uri, /*object=*/true);
  if (!path.ok()) return path.status();
  struct stat st;
  if (stat(path->c_str(), &st) != 0) {
    if (errno == ENOTDIR) return absl::NotFoundError(absl::StrCat("no object ", uri));
    return ErrnoStatus(errno, "stat of", uri);
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::NotFoundError(absl::StrCat("no object ", uri, " (not a regular file)"));
  }
  return ObjectInfo{FileUri(*path), static_cast<int64_t>(st.st_size), FileEtag(st)};
}

absl::StatusOr<std::vector<ObjectInfo>> FileObjectStore::List(absl::string_view prefix) {
  absl::StatusOr<std::string> local = Resolve(prefix, /*object=*/false);
  if (!local.ok()) return local.status();
  const std::string& path_prefix = *local;
  // The deepest folder that certainly contains every match.
  const std::string root = path_prefix.substr(0, path_prefix.rfind('/') + 1);

  std::vector<ObjectInfo> result;
  std::error_code ec;
  fs::recursive_directory_iterator it(root, fs::directory_options::skip_permission_denied, ec);
  if (ec) {
    if (ec == std::errc::no_such_file_or_directory || ec == std::errc::not_a_directory) {
      return result;
    }
    return ErrnoStatus(ec.value(), "listing", prefix);
  }
  for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) break;
    const fs::directory_entry& entry = *it;
    const std::string path = entry.path().string();
    std::error_code type_ec;
    const fs::file_status status = entry.symlink_status(type_ec);
    if (type_ec) continue;  // vanished while we looked
    if (fs::is_directory(status)) {
      // Descend only where a match can be: the folder is inside the prefix, or the prefix
      // continues inside the folder.
      const std::string dir = path + "/";
      if (!absl::StartsWith(dir, path_prefix) && !absl::StartsWith(path_prefix, dir)) {
        it.disable_recursion_pending();
      }
      continue;
    }
    if (!fs::is_regular_file(status)) continue;
    if (absl::StartsWith(entry.path().filename().string(), kTempPrefix)) continue;
    if (!absl::StartsWith(path, path_prefix)) continue;
    std::error_code size_ec;
    const uintmax_t size = entry.file_size(size_ec);
    if (size_ec) continue;
    result.push_back(ObjectInfo{FileUri(path), static_cast<int64_t>(size), ""});
  }
  if (ec && ec != std::errc::no_such_file_or_directory) {
    return ErrnoStatus(ec.value(), "listing", prefix);
  }
  std::sort(result.begin(), result.end(),
            [](const ObjectInfo& a, const ObjectInfo& b) { return a.uri < b.uri; });
  return result;
}

absl::Status FileObjectStore::Delete(absl::string_view uri) {
  absl::StatusOr<std::string> path = Resolve(uri, /*object=*/true);
  if (!path.ok()) return path.status();
  if (unlink(path->c_str()) != 0 && errno != ENOENT && errno != ENOTDIR) {
    return ErrnoStatus(errno, "deleting", uri);
  }
  // Fails, as it should, while anything else is in the folder (ENOTEMPTY) or it is gone.
  rmdir(fs::path(*path).parent_path().c_str());
  return absl::OkStatus();
}

}  // namespace trainyard
