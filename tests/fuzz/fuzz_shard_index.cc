// The index of a sharded data set, built from the shards' headers alone as trainers build it
// before they stream: up to four shards, the input's parts between "|SHARD|" separators, each
// indexed through the ranged reads IndexShards makes (the header's length, then the header).

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/formats/shard_index.h"
#include "tests/common/test_stores.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  const std::vector<absl::string_view> shards = absl::StrSplit(input, "|SHARD|");
  trainyard::MemoryStore store;
  for (size_t i = 0; i < shards.size() && i < 4; ++i) {
    store.Put(absl::StrCat("s3://bkt/train-", i, ".safetensors"), shards[i]).IgnoreError();
  }
  absl::StatusOr<trainyard::ShardIndex> index =
      trainyard::IndexShards(store, "s3://bkt/train-*.safetensors");
  if (index.ok()) {
    // What the index promises the reader: every tensor's bytes inside its shard.
    for (const trainyard::ShardInfo& shard : index->shards) {
      for (const auto& tensor : shard.header.tensors) {
        if (shard.header.data_start + tensor.end > shard.size_bytes) __builtin_trap();
      }
    }
  }
  return 0;
}
