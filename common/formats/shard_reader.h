#ifndef TRAINYARD_COMMON_FORMATS_SHARD_READER_H_
#define TRAINYARD_COMMON_FORMATS_SHARD_READER_H_

// Reads some tensors of a sharded safetensors data set without loading it. Local shards are
// memory-mapped: nothing is copied, and only the pages a batch touches are read. Remote shards
// are fetched, the named tensors' bytes only, with parallel ranged GETs into a bounded cache
// folder on this machine (shared by the processes that use it: one fetches, the others wait for
// it), then mapped like local ones. The reader holds the shards it is told to (those in flight
// and those ahead) and reads each into memory in file order once it is mapped, so that batches,
// which take rows at random, do not fault pages in from disk one at a time; the mapping of any
// other shard ends when the last batch built from it does. Resident memory is therefore about
// the held shards' tensors.

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/formats/shard_index.h"
#include "common/storage/object_store.h"

namespace trainyard {

struct ShardReaderOptions {
  // Remote shards: the cache folder (created on first use) and the bound on the disk space its
  // shard files take (LRU; files a process has mapped are never removed). Required > 0 for
  // remote shards.
  std::string cache_dir;
  int64_t cache_bytes = 0;
  // Parallel ranged GETs per shard, and their size.
  int fetch_threads = 4;
  int64_t part_bytes = int64_t{8} << 20;
};

// One shard's tensors, mapped. Unmapped (and, for a cached shard, released to eviction) when
// the last reference goes. Thread-safe to read.
class MappedShard {
 public:
  MappedShard(int fd, void* base, size_t length, std::vector<absl::string_view> columns);
  ~MappedShard();
  MappedShard(const MappedShard&) = delete;
  MappedShard& operator=(const MappedShard&) = delete;

  // The bytes of the reader's column `column` in this shard.
  absl::string_view column(size_t column) const { return columns_[column]; }

 private:
  const int fd_;
  void* const base_;
  const size_t length_;
  const std::vector<absl::string_view> columns_;
};

class ShardReader {
 public:
  // `index` is what IndexShards read from `store`; `columns` the tensors to read, each of which
  // every shard must hold (INVALID_ARGUMENT naming the first shard without otherwise).
  // INVALID_ARGUMENT when a shard is remote and options.cache_bytes < 1.
  static absl::StatusOr<std::unique_ptr<ShardReader>> Open(std::shared_ptr<ObjectStore> store,
                                                           ShardIndex index,
                                                           std::vector<std::string> columns,
                                                           ShardReaderOptions options);
  ~ShardReader();  // stops after the fetch in progress; batches may keep their shards

  // The shard's columns, local and mapped; blocks until they are (fetching the shard first if
  // no one asked for it). Errors: the store's (NOT_FOUND, UNAVAILABLE, ...) naming the shard,
  // DATA_LOSS when the shard is not what was indexed (its size changed, a short read),
  // UNAVAILABLE for local I/O. A failed shard fails again on every call. Thread-safe.
  absl::StatusOr<std::shared_ptr<const MappedShard>> Get(int shard);

  // Makes `shards` (in the order they will be read) the ones the reader holds: the ones not yet
  // held are fetched (remote) or read ahead (local) in that order on a background thread, every
  // other shard is let go. Does not block. Thread-safe.
  void Hold(const std::vector<int>& shards);

  bool remote() const { return remote_; }
  // The bytes of the columns in shard `shard`: what fetching it downloads.
  int64_t ColumnBytes(int shard) const;
  // Bytes downloaded by this reader.
  int64_t bytes_fetched() const;

 private:
  enum class State { kIdle, kQueued, kLoading, kReady, kFailed };
  struct Shard {
    State state = State::kIdle;
    std::shared_ptr<const MappedShard> mapped;
    absl::Status error;
  };
  struct Range {
    int64_t offset = 0;  // in the file
    int64_t length = 0;
  };

  ShardReader(std::shared_ptr<ObjectStore> store, ShardIndex index,
              std::vector<std::vector<Range>> ranges, ShardReaderOptions options, bool remote);
  void Loop();
  // Makes shard `i` local and maps it; no lock held.
  absl::StatusOr<std::shared_ptr<const MappedShard>> Load(int i);
  absl::StatusOr<std::shared_ptr<const MappedShard>> MapLocal(int i);
  absl::StatusOr<std::shared_ptr<const MappedShard>> MapCached(int i);
  absl::Status Download(int i, const std::string& path);
  // Removes least recently used shard files not mapped by anyone until `need` more bytes fit.
  void Evict(int64_t need);
  std::shared_ptr<const MappedShard> Map(int i, int fd) const;
  // Reads a loaded shard's columns into memory in file order; stops early when the reader does.
  void Populate(const MappedShard& shard);

  // Fixed at construction.
  const std::shared_ptr<ObjectStore> store_;
  const ShardIndex index_;
  const std::vector<std::vector<Range>> ranges_;  // per shard, per column
  const ShardReaderOptions options_;
  const bool remote_;
  std::string columns_key_;  // which columns a cached file holds

  mutable absl::Mutex mu_;
  std::vector<Shard> shards_ ABSL_GUARDED_BY(mu_);
  std::deque<int> queue_ ABSL_GUARDED_BY(mu_);
  std::vector<int> held_ ABSL_GUARDED_BY(mu_);
  int64_t bytes_fetched_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_FORMATS_SHARD_READER_H_
