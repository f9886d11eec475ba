#include "common/formats/shard_reader.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/formats/safetensors.h"
#include "common/formats/shard_index.h"
#include "common/storage/file_object_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/test_stores.h"

namespace trainyard {
namespace {

using ::testing::HasSubstr;

// Shard `i` of `n` samples: "x" uint8 [n, 4] (bytes i*16 + row % 16), "y" int64 [n] (row),
// and "unused" float32 [n, 64], which no test asks for.
std::string Shard(int i, int64_t n) {
  std::string x(static_cast<size_t>(n * 4), '\0');
  std::string y(static_cast<size_t>(n * 8), '\0');
  std::string unused(static_cast<size_t>(n * 256), '\x55');
  for (int64_t r = 0; r < n; ++r) {
    for (int c = 0; c < 4; ++c)
      x[static_cast<size_t>(r * 4 + c)] = static_cast<char>(i * 16 + r % 16);
    const int64_t label = r;
    std::memcpy(&y[static_cast<size_t>(r * 8)], &label, 8);
  }
  auto file = EncodeSafetensors(
      {{"x", "U8", {n, 4}, x}, {"unused", "F32", {n, 64}, unused}, {"y", "I64", {n}, y}}, {});
  EXPECT_TRUE(file.ok()) << file.status();
  return *file;
}

int64_t DiskUse(const std::string& dir) {
  int64_t total = 0;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    struct stat st;
    if (stat(it->path().c_str(), &st) == 0) total += static_cast<int64_t>(st.st_blocks) * 512;
  }
  return total;
}

class ShardReaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "shard_reader.XXXXXX";
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::unique_ptr<ShardReader> OpenRemote(std::shared_ptr<MemoryStore> store,
                                          ShardReaderOptions options) {
    auto index = IndexShards(*store, "mem://ds/train-*.safetensors");
    EXPECT_TRUE(index.ok()) << index.status();
    auto reader = ShardReader::Open(store, *std::move(index), {"x", "y"}, options);
    EXPECT_TRUE(reader.ok()) << reader.status();
    return *std::move(reader);
  }

  std::string dir_;
};

TEST_F(ShardReaderTest, LocalShardsAreMappedAndReadInPlace) {
  for (int i = 0; i < 2; ++i) {
    std::ofstream(absl::StrCat(dir_, "/train-", i, ".safetensors"), std::ios::binary)
        << Shard(i, 100 + i);
  }
  auto index = IndexShards(EnvironmentStores(), dir_ + "/train-*.safetensors");
  ASSERT_TRUE(index.ok()) << index.status();
  auto reader = ShardReader::Open(std::make_unique<FileObjectStore>(), *index, {"y", "x"}, {});
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_FALSE((*reader)->remote());
  auto shard = (*reader)->Get(1);
  ASSERT_TRUE(shard.ok()) << shard.status();
  ASSERT_EQ((*shard)->column(0).size(), 101u * 8);
  ASSERT_EQ((*shard)->column(1).size(), 101u * 4);
  int64_t label;
  std::memcpy(&label, (*shard)->column(0).data() + 7 * 8, 8);
  EXPECT_EQ(label, 7);
  EXPECT_EQ((*shard)->column(1)[4 * 17], static_cast<char>(16 + 1));
  EXPECT_EQ((*reader)->bytes_fetched(), 0);

  // A shard that changed since it was indexed is refused, not misread.
  std::filesystem::resize_file(dir_ + "/train-0.safetensors", 10);
  EXPECT_EQ((*reader)->Get(0).status().code(), absl::StatusCode::kDataLoss);
  // A missing column is named with the shard.
  auto missing = ShardReader::Open(std::make_unique<FileObjectStore>(), *index, {"z"}, {});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(missing.status().message()),
              HasSubstr("tensor 'z' not in " + dir_ + "/train-0.safetensors"));
}

TEST_F(ShardReaderTest, RemoteShardsFetchOnlyTheNamedTensorsInParallelParts) {
  auto store = std::make_shared<MemoryStore>();
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(
        store->Put(absl::StrCat("mem://ds/train-", i, ".safetensors"), Shard(i, 5000)).ok());
  }
  ShardReaderOptions options;
  options.cache_dir = dir_ + "/cache";
  options.cache_bytes = 1 << 30;
  options.part_bytes = 1 << 16;  // the smallest part: several per tensor
  options.fetch_threads = 3;
  std::unique_ptr<ShardReader> reader = OpenRemote(store, options);
  ASSERT_TRUE(reader->remote());
  const size_t header_reads = store->reads().size();
  auto shard = reader->Get(2);
  ASSERT_TRUE(shard.ok()) << shard.status();
  EXPECT_EQ((*shard)->column(0)[4 * 3], static_cast<char>(2 * 16 + 3));
  int64_t label;
  std::memcpy(&label, (*shard)->column(1).data() + 4999 * 8, 8);
  EXPECT_EQ(label, 4999);
  // x and y only (20 KB + 40 KB), in parts of at most 64 KiB; the 1.28 MB "unused" never.
  EXPECT_EQ(reader->bytes_fetched(), 5000 * 4 + 5000 * 8);
  const std::vector<MemoryStore::Read> reads = store->reads();
  for (size_t r = header_reads; r < reads.size(); ++r) {
    EXPECT_EQ(reads[r].uri, "mem://ds/train-2.safetensors");
    EXPECT_LE(reads[r].length, 1 << 16);
  }
  EXPECT_EQ(reads.size() - header_reads, 2u);  // 20000 and 40000 bytes: one part each
  // The cached file is sparse: about the tensors read, not the 1.3 MB shard.
  EXPECT_LT(DiskUse(dir_ + "/cache"), 200 * 1024);

  // Another process sharing the folder finds it cached and downloads nothing.
  std::unique_ptr<ShardReader> second = OpenRemote(store, options);
  ASSERT_TRUE(second->Get(2).ok());
  EXPECT_EQ(second->bytes_fetched(), 0);

  // A store error names the shard and fails that shard only.
  store->Fail("mem://ds/train-1.safetensors");
  auto failed = second->Get(1);
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(failed.status().message()), HasSubstr("train-1.safetensors"));
  EXPECT_TRUE(second->Get(0).ok());
}

TEST_F(ShardReaderTest, TheCacheStaysWithinItsBoundAndKeepsShardsInUse) {
  auto store = std::make_shared<MemoryStore>();
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(
        store->Put(absl::StrCat("mem://ds/train-", i, ".safetensors"), Shard(i, 4096)).ok());
  }
  ShardReaderOptions options;
  options.cache_dir = dir_ + "/cache";
  // Room for three shards' tensors (48 KiB each, up to 56 KiB on disk) but not four.
  options.cache_bytes = 200 * 1024;
  std::unique_ptr<ShardReader> reader = OpenRemote(store, options);
  std::shared_ptr<const MappedShard> pinned = *reader->Get(0);  // a batch still using shard 0
  for (int i = 1; i < 8; ++i) {
    reader->Hold({i, (i + 1) % 8});
    auto shard = reader->Get(i);
    ASSERT_TRUE(shard.ok()) << shard.status();
    EXPECT_EQ((*shard)->column(0)[0], static_cast<char>(i * 16));
    EXPECT_LE(DiskUse(options.cache_dir), options.cache_bytes) << "after shard " << i;
  }
  // Shard 0 was in use throughout: still there, and still readable.
  EXPECT_EQ(pinned->column(0)[4], static_cast<char>(1));
  EXPECT_EQ(reader->bytes_fetched(), 8 * 4096 * 12);
  // Evicted shards are fetched again when needed.
  reader->Hold({});
  ASSERT_TRUE(reader->Get(1).ok());
  EXPECT_GT(reader->bytes_fetched(), 8 * 4096 * 12);
}

}  // namespace
}  // namespace trainyard
