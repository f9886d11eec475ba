#ifndef TRAINYARD_COMMON_STORAGE_OBJECT_STORE_H_
#define TRAINYARD_COMMON_STORAGE_OBJECT_STORE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/storage/s3_auth.h"  // EnvLookup

namespace trainyard {

struct ObjectInfo {
  std::string uri;  // full URI of the object
  int64_t size_bytes = 0;
  // Changes whenever the content may have changed: the S3 ETag, or for files a tag of size,
  // modification time and inode. Empty when the store cannot tell (List may leave it empty).
  std::string etag;
};

// A flat store of immutable objects named by URI (file:///abs/path, s3://bucket/key).
// Errors: NOT_FOUND for a missing object, INVALID_ARGUMENT for a URI the store does not serve,
// UNAVAILABLE for I/O failures that may succeed on retry, and the URI in every message.
// Implementations are thread-safe. Calls block until done.
class ObjectStore {
 public:
  virtual ~ObjectStore() = default;

  // Writes the whole object atomically: a reader sees the old object, or none, or all of `data`.
  virtual absl::Status Put(absl::string_view uri, absl::string_view data) = 0;
  // Writes the object made of `pieces` one after the other, atomically as Put, without first
  // joining them into one buffer (they are read where they are and must stay valid until the
  // call returns). Returns the lower-case hex SHA-256 of the object, computed in the pass over
  // the bytes that the write makes anyway where the store can: the S3 store signs requests with
  // it, the file store hashes each piece as it writes it. The default joins the pieces, calls
  // Put and hashes.
  virtual absl::StatusOr<std::string> PutPieces(absl::string_view uri,
                                                absl::Span<const absl::string_view> pieces);
  // Reads the whole object.
  virtual absl::StatusOr<std::string> Get(absl::string_view uri) = 0;
  // Reads `length` bytes from `offset` (fewer at the end of the object).
  virtual absl::StatusOr<std::string> GetRange(absl::string_view uri, int64_t offset,
                                               int64_t length) = 0;
  virtual absl::StatusOr<ObjectInfo> Head(absl::string_view uri) = 0;
  // Every object whose URI starts with `prefix`, sorted by URI.
  virtual absl::StatusOr<std::vector<ObjectInfo>> List(absl::string_view prefix) = 0;
  // Deleting a missing object is not an error.
  virtual absl::Status Delete(absl::string_view uri) = 0;

  // Streaming forms for objects too large to hold in memory twice. PutFile writes the object
  // from the local file `local_path` (atomically, as Put); GetToFile writes the object to
  // `local_path` (created or replaced; incomplete on error, the caller removes it) and returns
  // what Head says about it. NOT_FOUND also for a missing local file. The defaults go through
  // memory; stores override them to stream.
  virtual absl::Status PutFile(absl::string_view uri, const std::string& local_path);
  virtual absl::StatusOr<ObjectInfo> GetToFile(absl::string_view uri,
                                               const std::string& local_path);
};

// Opens the store that serves a URI's scheme. A program builds one at start
// (NewObjectStoreResolver, its S3 settings read once) and hands it to whatever reads or writes
// objects; tests hand one that serves from memory. Thread-safe.
class ObjectStoreResolver {
 public:
  virtual ~ObjectStoreResolver() = default;
  // The store for `uri` (file:///abs/path, a plain absolute path, s3://bucket/key), shared: the
  // same one may serve every URI of its scheme. INVALID_ARGUMENT for a URI no store serves;
  // for s3:// URIs, the error of incomplete S3 settings (NOT_FOUND / INVALID_ARGUMENT for missing
  // or bad credentials), the URI in the message.
  virtual absl::StatusOr<std::shared_ptr<ObjectStore>> Open(absl::string_view uri) const = 0;
};

// file:// and s3://, the S3 settings (S3ClientOptionsFromEnv: endpoint, region, credentials)
// read from `env` here, once; one file store and one S3 store (with its pool of connections)
// serve every URI of their scheme. With `local_roots`, the file store serves only what resolves
// below those folders (FileObjectStore's roots); without, any local path.
std::unique_ptr<ObjectStoreResolver> NewObjectStoreResolver(
    const EnvLookup& env,
    const std::optional<std::vector<std::string>>& local_roots = std::nullopt);

// A fresh store for `uri` with the S3 settings of the process environment: for tests and
// benchmarks. Programs hand down one ObjectStoreResolver instead.
absl::StatusOr<std::shared_ptr<ObjectStore>> OpenObjectStore(absl::string_view uri);

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_STORAGE_OBJECT_STORE_H_
