#ifndef TRAINYARD_COMMON_FORMATS_SHARD_INDEX_H_
#define TRAINYARD_COMMON_FORMATS_SHARD_INDEX_H_

// The index of a sharded safetensors data set, read from the shards' headers alone: which
// shards, how many samples each, which tensors with which dtypes, shapes and byte ranges. Two
// ranged reads per shard (the header length, then the header), never the data.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/formats/safetensors.h"
#include "common/storage/object_store.h"

namespace trainyard {

struct ShardInfo {
  std::string uri;
  int64_t size_bytes = 0;
  std::string etag;  // what the store said when the header was read (ObjectInfo::etag)
  // Samples: the first dimension, which every tensor of a data shard shares; -1 when they do
  // not (then it is no data shard).
  int64_t samples = 0;
  SafetensorsHeader header;  // tensor byte ranges are from header.data_start
};

struct ShardIndex {
  std::vector<ShardInfo> shards;  // sorted by URI
  int64_t samples = 0;            // of all shards
  int64_t bytes = 0;              // of all shards, whole files
  int64_t header_bytes_read = 0;  // what building the index read
};

// The shards `pattern` matches: a local path or file:// URI, or s3://bucket/key, with wildcards
// (* ? [) in its file names. NOT_FOUND when nothing matches; the store's error when a shard
// cannot be read; the header's error (INVALID_ARGUMENT, DATA_LOSS) naming the shard when one is
// not safetensors.
absl::StatusOr<ShardIndex> IndexShards(ObjectStore& store, const std::string& pattern);

// Opens the store of `pattern` through `stores` (plain paths are file://) and indexes it.
absl::StatusOr<ShardIndex> IndexShards(const ObjectStoreResolver& stores,
                                       const std::string& pattern);

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_FORMATS_SHARD_INDEX_H_
