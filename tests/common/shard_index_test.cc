#include "common/formats/shard_index.h"

#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/formats/safetensors.h"
#include "common/storage/file_object_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/test_stores.h"

namespace trainyard {
namespace {

using ::testing::HasSubstr;

class ShardIndexTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "shard_index.XXXXXX";
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // A shard of `n` samples: features uint8 [n, 4] and labels int64 [n].
  std::string WriteShard(const std::string& name, int64_t n) {
    std::string features(n * 4, '\x07');
    std::string labels(n * 8, '\0');
    auto file =
        EncodeSafetensors({{"features", "U8", {n, 4}, features}, {"labels", "I64", {n}, labels}},
                          {{"source", "test"}});
    EXPECT_TRUE(file.ok()) << file.status();
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << *file;
    return path;
  }

  std::string dir_;
};

TEST_F(ShardIndexTest, TheIndexComesFromTheHeadersAlone) {
  WriteShard("train-0.safetensors", 1000);
  WriteShard("train-1.safetensors", 24);
  WriteShard("other.safetensors", 5);
  auto index = IndexShards(EnvironmentStores(), dir_ + "/train-*.safetensors");
  ASSERT_TRUE(index.ok()) << index.status();
  ASSERT_EQ(index->shards.size(), 2u);
  EXPECT_EQ(index->samples, 1024);
  EXPECT_EQ(index->shards[0].uri, "file://" + dir_ + "/train-0.safetensors");
  EXPECT_EQ(index->shards[1].samples, 24);
  const SafetensorsHeader& header = index->shards[0].header;
  ASSERT_EQ(header.tensors.size(), 2u);
  EXPECT_EQ(header.tensors[0].name, "features");
  EXPECT_EQ(header.tensors[0].dtype, "U8");
  EXPECT_EQ(header.tensors[0].shape, (std::vector<int64_t>{1000, 4}));
  EXPECT_EQ(header.metadata.at("source"), "test");
  // The byte ranges point at the data: the features read from there are the ones written.
  std::ifstream in(dir_ + "/train-0.safetensors", std::ios::binary);
  in.seekg(static_cast<std::streamoff>(header.data_start + header.tensors[0].begin));
  char byte = 0;
  in.read(&byte, 1);
  EXPECT_EQ(byte, '\x07');
  // Only the headers were read: a few hundred bytes of a 13 KB data set.
  EXPECT_EQ(index->bytes, index->shards[0].size_bytes + index->shards[1].size_bytes);
  EXPECT_EQ(index->header_bytes_read, static_cast<int64_t>(index->shards[0].header.data_start +
                                                           index->shards[1].header.data_start));
  EXPECT_LT(index->header_bytes_read, 1000);
}

TEST_F(ShardIndexTest, ABadShardIsNamedAndNothingMatchingIsNotFound) {
  WriteShard("train-0.safetensors", 10);
  std::ofstream(dir_ + "/train-1.safetensors") << "not a safetensors file";
  auto index = IndexShards(EnvironmentStores(), "file://" + dir_ + "/train-*.safetensors");
  EXPECT_EQ(index.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(index.status().message()), HasSubstr("train-1.safetensors"));
  // Truncated after its header: the header says more data than the file has.
  std::filesystem::resize_file(WriteShard("train-1.safetensors", 10), 100);
  index = IndexShards(EnvironmentStores(), dir_ + "/train-*.safetensors");
  EXPECT_EQ(index.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(IndexShards(EnvironmentStores(), dir_ + "/none-*.safetensors").status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(ShardIndexTest, TensorsThatDisagreeOnTheSampleCountAreNoDataShard) {
  std::string a(8, '\0'), b(3, '\0');
  auto file = EncodeSafetensors({{"x", "U8", {8}, a}, {"y", "U8", {3}, b}}, {});
  ASSERT_TRUE(file.ok());
  std::ofstream(dir_ + "/mixed.safetensors", std::ios::binary) << *file;
  auto index = IndexShards(EnvironmentStores(), dir_ + "/mixed.safetensors");
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ(index->shards[0].samples, -1);
  EXPECT_EQ(index->samples, 0);
}

}  // namespace
}  // namespace trainyard
