#include "common/formats/shard_index.h"

#include <memory>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/parallel.h"
#include "common/storage/object_cache.h"

namespace trainyard {
namespace {

std::string AsUri(const std::string& pattern) {
  return absl::StartsWith(pattern, "/") ? "file://" + pattern : pattern;
}

constexpr int kIndexThreads = 16;

// One shard's size and header: HEAD, then the header length, then the header.
absl::StatusOr<ShardInfo> IndexShard(ObjectStore& store, const std::string& uri) {
  ShardInfo shard;
  shard.uri = uri;
  absl::StatusOr<ObjectInfo> info = store.Head(uri);
  if (!info.ok()) return info.status();
  shard.size_bytes = info->size_bytes;
  shard.etag = info->etag;
  auto named = [&uri](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat(uri, ": ", s.message()));
  };
  absl::StatusOr<std::string> prefix =
      store.GetRange(uri, 0, std::min<int64_t>(8, shard.size_bytes));
  if (!prefix.ok()) return named(prefix.status());
  absl::StatusOr<uint64_t> header_size = SafetensorsHeaderSize(*prefix);
  if (!header_size.ok()) return named(header_size.status());
  if (static_cast<int64_t>(8 + *header_size) > shard.size_bytes) {
    return named(absl::DataLossError(absl::StrCat("safetensors: header of ", *header_size,
                                                  " bytes does not fit in a file of ",
                                                  shard.size_bytes, " bytes (truncated?)")));
  }
  if (*header_size > 0) {
    absl::StatusOr<std::string> rest = store.GetRange(uri, 8, static_cast<int64_t>(*header_size));
    if (!rest.ok()) return named(rest.status());
    prefix->append(*rest);
  }
  absl::StatusOr<SafetensorsHeader> header =
      DecodeSafetensorsHeader(*prefix, static_cast<uint64_t>(shard.size_bytes));
  if (!header.ok()) return named(header.status());
  shard.header = *std::move(header);
  shard.samples = -1;
  for (const SafetensorsSlot& t : shard.header.tensors) {
    const int64_t first = t.shape.empty() ? -1 : t.shape[0];
    if (shard.samples == -1 && &t == &shard.header.tensors.front()) shard.samples = first;
    if (first != shard.samples) {
      shard.samples = -1;
      break;
    }
  }
  return shard;
}

}  // namespace

absl::StatusOr<ShardIndex> IndexShards(ObjectStore& store, const std::string& pattern) {
  absl::StatusOr<std::vector<std::string>> uris = ExpandObjectGlob(store, AsUri(pattern));
  if (!uris.ok()) return uris.status();
  // Three small requests a shard, which for remote shards are round trips: many shards at once.
  std::vector<absl::StatusOr<ShardInfo>> shards(uris->size(), absl::UnknownError("not read"));
  absl::Status status =
      ParallelFor(static_cast<int64_t>(uris->size()), kIndexThreads, [&](int64_t i) {
        shards[static_cast<size_t>(i)] = IndexShard(store, (*uris)[static_cast<size_t>(i)]);
        return shards[static_cast<size_t>(i)].status();
      });
  if (!status.ok()) {
    // The first shard in order that failed, whichever thread saw an error first.
    for (const absl::StatusOr<ShardInfo>& shard : shards) {
      if (!shard.ok() && shard.status().code() != absl::StatusCode::kUnknown) return shard.status();
    }
    return status;
  }
  ShardIndex index;
  for (absl::StatusOr<ShardInfo>& shard : shards) {
    index.header_bytes_read += static_cast<int64_t>(shard->header.data_start);
    if (shard->samples > 0) index.samples += shard->samples;
    index.bytes += shard->size_bytes;
    index.shards.push_back(*std::move(shard));
  }
  return index;
}

absl::StatusOr<ShardIndex> IndexShards(const ObjectStoreResolver& stores,
                                       const std::string& pattern) {
  absl::StatusOr<std::shared_ptr<ObjectStore>> store = stores.Open(AsUri(pattern));
  if (!store.ok()) return store.status();
  return IndexShards(**store, pattern);
}

}  // namespace trainyard
