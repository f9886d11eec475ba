#ifndef TRAINYARD_SERVER_JOBS_WORKDIR_STORE_H_
#define TRAINYARD_SERVER_JOBS_WORKDIR_STORE_H_

// Programs' workdirs, as the CLI packs them (common/formats/workdir_archive.h): kept once per
// content under the owner's folder of the checkpoint root, at
// {checkpoint_root}/{OwnerFolder(owner)}/programs/sha256-{hex}.tar, where only the owner's jobs
// may read them (JobManager::CheckJobSpaces). No gRPC here: JobServiceImpl::UploadWorkdir feeds
// it the stream.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/storage/object_store.h"

namespace trainyard {

class WorkdirStore {
 public:
  // `stores` is not owned and must outlive this object.
  WorkdirStore(const ObjectStoreResolver* stores, std::string checkpoint_root, int64_t max_bytes)
      : stores_(stores), checkpoint_root_(std::move(checkpoint_root)), max_bytes_(max_bytes) {}

  struct Stored {
    std::string uri;
    bool already_stored = false;
  };
  // Keeps the archive of `size_bytes` bytes with SHA-256 `sha256` for `owner`: reads its bytes
  // with `next` (false at the end of the stream; `next` is not called when the archive is already
  // kept). INVALID_ARGUMENT for a malformed hash or a stream whose bytes are not what its first
  // message said, FAILED_PRECONDITION over the limit (naming the size, the limit and the flag),
  // UNAVAILABLE from the store. Thread-safe; blocks.
  absl::StatusOr<Stored> Keep(const std::string& owner, const std::string& sha256,
                              int64_t size_bytes,
                              const std::function<bool(std::string* chunk)>& next) const;

  // Where an owner's archive of `sha256` is kept.
  std::string UriOf(const std::string& owner, const std::string& sha256) const;

 private:
  const ObjectStoreResolver* const stores_;
  const std::string checkpoint_root_;
  const int64_t max_bytes_;
};

}  // namespace trainyard

#endif  // TRAINYARD_SERVER_JOBS_WORKDIR_STORE_H_
