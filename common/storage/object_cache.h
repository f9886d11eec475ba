#ifndef TRAINYARD_COMMON_STORAGE_OBJECT_CACHE_H_
#define TRAINYARD_COMMON_STORAGE_OBJECT_CACHE_H_

// A local cache of remote objects (models, datasets) keyed by URI and ETag, so that a trainer
// that restarts on the same machine does not download them again. A cached file is
// "{dir}/{sha256(uri)[:32]}-{sha256(etag)[:16]}"; it appears by rename once complete, so
// concurrent processes sharing a folder see whole files only. Older versions of an object are
// removed when a newer one arrives.

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/storage/object_store.h"

namespace trainyard {

class ObjectCache {
 public:
  // `dir` is created on first use.
  explicit ObjectCache(std::string dir);

  // TRAINYARD_CACHE_DIR (set by the worker agent to {work_dir}/cache), else
  // $XDG_CACHE_HOME/trainyard, $HOME/.cache/trainyard, or /tmp/trainyard-cache.
  static std::string DefaultDir();

  // A local file holding `uri`'s current content. Asks the store for the object's ETag (HEAD)
  // and downloads only when no file for that (URI, ETag) is cached. When the store cannot be
  // reached (UNAVAILABLE) but some version is cached, that version is used with a warning.
  // Errors: the store's (NOT_FOUND, UNAVAILABLE, ...), UNAVAILABLE for local I/O; DATA_LOSS when
  // the download's size differs from what HEAD said. Blocks; thread-safe.
  absl::StatusOr<std::string> Fetch(ObjectStore& store, const std::string& uri);

  // Downloads made by this object (for tests and logs).
  int64_t downloads() const { return downloads_.load(); }

 private:
  const std::string dir_;
  std::atomic<int64_t> downloads_{0};
};

// The URIs matching `pattern` ("s3://bucket/data/train-*.safetensors"), sorted. The store is
// listed under the part of the pattern before its first wildcard (* ? [) and keys are matched
// with fnmatch, wildcards not crossing '/'. A pattern without wildcards names one object (it
// must exist). NOT_FOUND when nothing matches.
absl::StatusOr<std::vector<std::string>> ExpandObjectGlob(ObjectStore& store,
                                                          const std::string& pattern);

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_STORAGE_OBJECT_CACHE_H_
