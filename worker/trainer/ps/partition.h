#ifndef TRAINYARD_WORKER_TRAINER_PS_PARTITION_H_
#define TRAINYARD_WORKER_TRAINER_PS_PARTITION_H_

// How a parameter_server job splits its dense parameters over the shards: each parameter is cut
// into pieces of at most `chunk_bytes` (a few MiB, so that one large tensor does not land whole
// on one shard), and the pieces go to the shards balanced by bytes. The result depends only on
// the parameters (in model order), the shard count and the chunk size, so every worker and
// every shard of every attempt computes the same partition, and a checkpoint records it to be
// read back on another shard count. Free of LibTorch types.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace trainyard::trainer {

// One parameter as the partition sees it: a flat run of `numel` elements.
struct ParameterShape {
  std::string name;
  int64_t numel = 0;
  int64_t element_size = 4;  // bytes
};

// A contiguous run of one parameter's elements, held by one shard.
struct Piece {
  int parameter = 0;   // index into the parameters partitioned
  int64_t offset = 0;  // first element
  int64_t length = 0;  // elements
  int shard = 0;
  friend bool operator==(const Piece& a, const Piece& b) {
    return a.parameter == b.parameter && a.offset == b.offset && a.length == b.length &&
           a.shard == b.shard;
  }
};

struct Partition {
  int shards = 0;
  int64_t chunk_bytes = 0;
  // Every element of every parameter in exactly one piece; ordered by parameter, then offset.
  std::vector<Piece> pieces;
  std::vector<int64_t> shard_bytes;  // bytes each shard holds

  // The pieces of `shard`, in the order above.
  std::vector<Piece> PiecesOf(int shard) const;
};

// The default piece size: big enough that a piece's per-message cost is small against its
// transfer, small enough that the shards' loads differ by at most one piece.
inline constexpr int64_t kDefaultChunkBytes = int64_t{4} << 20;

// Splits `parameters` over `shards`. The pieces are assigned largest first (ties in model
// order), each to the shard holding the fewest bytes so far (ties to the lowest index), so the
// shards' loads differ by at most the largest piece. INVALID_ARGUMENT for shards < 1,
// chunk_bytes smaller than an element, or a parameter with a negative size or element size
// below 1. A parameter of zero elements has no piece.
absl::StatusOr<Partition> PartitionParameters(const std::vector<ParameterShape>& parameters,
                                              int shards, int64_t chunk_bytes = kDefaultChunkBytes);

// The partition as JSON (what a checkpoint records), and back. ParsePartitionJson checks that
// the pieces cover each parameter of `parameters` exactly once, in order, on shards that exist:
// DATA_LOSS naming the first problem otherwise.
std::string PartitionToJson(const Partition& partition,
                            const std::vector<ParameterShape>& parameters);
absl::StatusOr<Partition> ParsePartitionJson(const std::string& json,
                                             const std::vector<ParameterShape>& parameters);

}  // namespace trainyard::trainer

#endif  // TRAINYARD_WORKER_TRAINER_PS_PARTITION_H_
