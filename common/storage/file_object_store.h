#ifndef TRAINYARD_COMMON_STORAGE_FILE_OBJECT_STORE_H_
#define TRAINYARD_COMMON_STORAGE_FILE_OBJECT_STORE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/storage/object_store.h"

namespace trainyard {

// An ObjectStore over the local file system (or a shared mount). Serves file:///abs/path URIs
// and plain absolute paths; anything else is INVALID_ARGUMENT. Thread-safe and stateless apart
// from a counter for temporary names, so several instances may share a tree.
//
// ObjectInfo::etag is "<size>-<mtime ns>-<inode>" (hex): a new Put always changes it.
//
// Put writes "<dir>/.trainyard-tmp-<name>-<pid>-<n>", fsyncs it, renames it over the target and
// fsyncs the folder, so the object appears whole or not at all and survives a crash once Put has
// returned. Parent folders are created as needed. Temporary files are never listed.
//
// As in S3, where a prefix exists only while objects are under it, Delete also removes the
// object's folder once it holds nothing more (a retired checkpoint leaves no empty step folder);
// a Put into a folder removed meanwhile creates it again.
//
// Error codes: NOT_FOUND for a missing object (also for a folder where an object is expected),
// INVALID_ARGUMENT for a URI this store does not serve or a bad range, OUT_OF_RANGE for a range
// that starts past the end of the object, PERMISSION_DENIED for EACCES/EPERM, FAILED_PRECONDITION
// when the path is taken by something that is not a file (a folder, or a file where a folder is
// needed), UNAVAILABLE for other I/O errors.
//
// A store made with `roots` serves only what lies, symbolic links followed, below one of those
// folders (their own links resolved once, when it is made): anything else is PERMISSION_DENIED
// naming where it leads. What does not exist yet is checked through its deepest existing
// folder. It is how a trainer holds a job to the coordinator's --allowed_local_paths on its own
// disk, where the coordinator cannot see links.
class FileObjectStore final : public ObjectStore {
 public:
  FileObjectStore() = default;
  explicit FileObjectStore(const std::vector<std::string>& roots);

  absl::Status Put(absl::string_view uri, absl::string_view data) override;
  // Hashes each megabyte of the pieces just before writing it, while it is in the cache.
  absl::StatusOr<std::string> PutPieces(absl::string_view uri,
                                        absl::Span<const absl::string_view> pieces) override;
  absl::StatusOr<std::string> Get(absl::string_view uri) override;
  // Bytes [offset, offset + length) clipped to the object. An offset equal to the size gives "";
  // one beyond it is OUT_OF_RANGE; negative offset or length is INVALID_ARGUMENT.
  absl::StatusOr<std::string> GetRange(absl::string_view uri, int64_t offset,
                                       int64_t length) override;
  absl::StatusOr<ObjectInfo> Head(absl::string_view uri) override;
  // Every regular file below the folder of `prefix` whose file:// URI starts with `prefix`
  // (a plain-path prefix is compared in its file:// form), sorted by URI, symlinks not followed.
  // A prefix whose folder does not exist gives an empty list.
  absl::StatusOr<std::vector<ObjectInfo>> List(absl::string_view prefix) override;
  // Removes the file; a missing one is fine. Empty folders are left in place.
  absl::Status Delete(absl::string_view uri) override;
  // Copies in 1 MiB pieces, with the same temporary-file-and-rename atomicity as Put.
  absl::Status PutFile(absl::string_view uri, const std::string& local_path) override;
  absl::StatusOr<ObjectInfo> GetToFile(absl::string_view uri,
                                       const std::string& local_path) override;

 private:
  // Writes the object atomically, its contents written by `fill` into the temporary file `fd`.
  absl::Status WriteObject(absl::string_view uri, const std::function<absl::Status(int fd)>& fill);
  // The local path of `uri` (an object when `object`, else a prefix), held to the roots.
  absl::StatusOr<std::string> Resolve(absl::string_view uri, bool object) const;

  const bool rooted_ = false;
  std::vector<std::string> roots_;  // real paths; fixed after construction
  std::atomic<uint64_t> temp_counter_{0};
};

// The real path of `path` (absolute and parsed by ParseUri, so free of "." and ".."): of the
// deepest part of it that exists, symbolic links resolved, with the rest appended as written
// (it holds no links yet). NOT_FOUND only when not even "/" resolves.
absl::StatusOr<std::string> RealPathOfExisting(const std::string& path);

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_STORAGE_FILE_OBJECT_STORE_H_
