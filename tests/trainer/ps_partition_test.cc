// The parameter-server partition: every element on exactly one shard, shards balanced by bytes,
// large tensors cut into pieces, the same result every time, and the layout a checkpoint records.

#include <algorithm>
#include <map>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/trainer/ps/partition.h"

namespace trainyard::trainer {
namespace {

using ::testing::HasSubstr;

// The scaling MLP's parameters (32 -> 256 -> 256 -> 4) and a 1M x 16 table.
std::vector<ParameterShape> Mixed() {
  return {{"0.weight", 256 * 32, 4},    {"0.bias", 256, 4},       {"2.weight", 256 * 256, 4},
          {"2.bias", 256, 4},           {"4.weight", 4 * 256, 4}, {"4.bias", 4, 4},
          {"table", 1'000'000 * 16, 4}, {"scale", 10, 8}};
}

// Checks that the pieces tile each parameter in order and add up to the shard totals.
void ExpectTiles(const Partition& partition, const std::vector<ParameterShape>& parameters) {
  std::vector<int64_t> covered(parameters.size(), 0);
  std::vector<int64_t> bytes(partition.shards, 0);
  int last = -1;
  for (const Piece& piece : partition.pieces) {
    ASSERT_GE(piece.parameter, last);
    last = piece.parameter;
    EXPECT_EQ(piece.offset, covered[piece.parameter]) << parameters[piece.parameter].name;
    EXPECT_GT(piece.length, 0);
    EXPECT_LE(piece.length * parameters[piece.parameter].element_size, partition.chunk_bytes);
    ASSERT_GE(piece.shard, 0);
    ASSERT_LT(piece.shard, partition.shards);
    covered[piece.parameter] += piece.length;
    bytes[piece.shard] += piece.length * parameters[piece.parameter].element_size;
  }
  for (size_t i = 0; i < parameters.size(); ++i) {
    EXPECT_EQ(covered[i], parameters[i].numel) << parameters[i].name;
  }
  EXPECT_EQ(bytes, partition.shard_bytes);
}

TEST(PsPartitionTest, EveryElementOnceAndShardsWithinOnePieceOfEachOther) {
  const std::vector<ParameterShape> parameters = Mixed();
  for (int shards : {1, 2, 3, 5, 16}) {
    absl::StatusOr<Partition> partition = PartitionParameters(parameters, shards, 1 << 20);
    ASSERT_TRUE(partition.ok()) << partition.status();
    ExpectTiles(*partition, parameters);
    const auto [lightest, heaviest] =
        std::minmax_element(partition->shard_bytes.begin(), partition->shard_bytes.end());
    EXPECT_LE(*heaviest - *lightest, int64_t{1} << 20) << shards << " shards";
    EXPECT_GT(*lightest, 0) << shards << " shards";
  }
}

TEST(PsPartitionTest, ALargeTensorIsCutIntoChunksSpreadOverTheShards) {
  const std::vector<ParameterShape> parameters = {{"table", 1'000'000 * 16, 4}};
  absl::StatusOr<Partition> partition = PartitionParameters(parameters, 4);
  ASSERT_TRUE(partition.ok()) << partition.status();
  // 64 MB in 4 MiB pieces: 16 pieces, 4 on each shard, the last one shorter.
  ASSERT_EQ(partition->pieces.size(), 16u);
  EXPECT_EQ(partition->pieces[0].length, (int64_t{4} << 20) / 4);
  EXPECT_EQ(partition->pieces.back().length, 16'000'000 - 15 * ((int64_t{4} << 20) / 4));
  for (int shard = 0; shard < 4; ++shard) EXPECT_EQ(partition->PiecesOf(shard).size(), 4u);
}

TEST(PsPartitionTest, SmallModelOnMoreShardsThanPiecesLeavesSomeEmpty) {
  const std::vector<ParameterShape> parameters = {{"w", 10, 4}, {"b", 2, 4}, {"empty", 0, 4}};
  absl::StatusOr<Partition> partition = PartitionParameters(parameters, 4);
  ASSERT_TRUE(partition.ok()) << partition.status();
  ExpectTiles(*partition, parameters);
  ASSERT_EQ(partition->pieces.size(), 2u);   // the empty parameter has none
  EXPECT_EQ(partition->pieces[0].shard, 0);  // the larger piece first, to shard 0
  EXPECT_EQ(partition->pieces[1].shard, 1);
  EXPECT_EQ(partition->shard_bytes, (std::vector<int64_t>{40, 8, 0, 0}));
}

TEST(PsPartitionTest, TheSameInputsGiveTheSamePartition) {
  // Parameters of random sizes: two computations agree piece for piece.
  std::mt19937 random(3);
  std::vector<ParameterShape> parameters;
  for (int i = 0; i < 200; ++i) {
    parameters.push_back(
        {"p" + std::to_string(i), static_cast<int64_t>(random() % 3'000'000), i % 3 == 0 ? 8 : 4});
  }
  absl::StatusOr<Partition> a = PartitionParameters(parameters, 7);
  absl::StatusOr<Partition> b = PartitionParameters(parameters, 7);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->pieces, b->pieces);
  ExpectTiles(*a, parameters);
}

TEST(PsPartitionTest, BadArgumentsAreRefused) {
  EXPECT_EQ(PartitionParameters(Mixed(), 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PartitionParameters(Mixed(), 2, 4).status().code(),  // "scale" has 8-byte elements
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PartitionParameters({{"w", -1, 4}}, 2).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(PsPartitionTest, LayoutRoundTripsThroughJsonAndABadOneIsRefused) {
  const std::vector<ParameterShape> parameters = Mixed();
  absl::StatusOr<Partition> partition = PartitionParameters(parameters, 3, 1 << 20);
  ASSERT_TRUE(partition.ok()) << partition.status();
  const std::string json = PartitionToJson(*partition, parameters);
  absl::StatusOr<Partition> back = ParsePartitionJson(json, parameters);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->shards, 3);
  EXPECT_EQ(back->chunk_bytes, 1 << 20);
  EXPECT_EQ(back->pieces, partition->pieces);
  EXPECT_EQ(back->shard_bytes, partition->shard_bytes);

  // Another model.
  std::vector<ParameterShape> other = parameters;
  other[2].numel += 1;
  absl::StatusOr<Partition> mismatch = ParsePartitionJson(json, other);
  EXPECT_EQ(mismatch.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(mismatch.status().message()), HasSubstr("2.weight"));
  // A piece lost, a piece on a shard that does not exist, and not JSON at all.
  Partition broken = *partition;
  broken.pieces.erase(broken.pieces.begin() + 3);
  EXPECT_EQ(ParsePartitionJson(PartitionToJson(broken, parameters), parameters).status().code(),
            absl::StatusCode::kDataLoss);
  broken = *partition;
  broken.pieces[0].shard = 3;
  EXPECT_EQ(ParsePartitionJson(PartitionToJson(broken, parameters), parameters).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(ParsePartitionJson("{not json", parameters).status().code(),
            absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace trainyard::trainer
