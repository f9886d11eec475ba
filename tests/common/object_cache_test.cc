// The ETag-keyed cache of remote objects, over s3rver and over the file store.

#include "common/storage/object_cache.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/storage/file_object_store.h"
#include "common/storage/s3_object_store.h"
#include "gtest/gtest.h"
#include "tests/common/s3rver.h"

namespace trainyard {
namespace {

namespace fs = std::filesystem;

std::string ReadWhole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string TempDir() {
  char dir[] = "/tmp/object-cache-test-XXXXXX";
  EXPECT_NE(mkdtemp(dir), nullptr);
  return dir;
}

TEST(ObjectCacheTest, DownloadsOncePerEtagAndSurvivesARestart) {
  if (testing::S3rver::BinaryPath().empty()) GTEST_SKIP() << "s3rver is not installed";
  absl::StatusOr<std::unique_ptr<testing::S3rver>> server = testing::S3rver::Start({"bkt"});
  ASSERT_TRUE(server.ok()) << server.status();
  S3ObjectStore store(std::make_unique<S3Client>((*server)->ClientOptions()));
  const std::string dir = TempDir();
  ASSERT_TRUE(store.Put("s3://bkt/models/net.pt", "version one").ok());

  ObjectCache cache(dir + "/cache");
  absl::StatusOr<std::string> path = cache.Fetch(store, "s3://bkt/models/net.pt");
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(ReadWhole(*path), "version one");
  EXPECT_EQ(cache.downloads(), 1);

  // A new process (a new cache object on the same folder) does not download again.
  ObjectCache restarted(dir + "/cache");
  absl::StatusOr<std::string> again = restarted.Fetch(store, "s3://bkt/models/net.pt");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, *path);
  EXPECT_EQ(restarted.downloads(), 0);

  // A new version (new ETag) is fetched and replaces the old file.
  ASSERT_TRUE(store.Put("s3://bkt/models/net.pt", "version two!").ok());
  absl::StatusOr<std::string> updated = restarted.Fetch(store, "s3://bkt/models/net.pt");
  ASSERT_TRUE(updated.ok()) << updated.status();
  EXPECT_NE(*updated, *path);
  EXPECT_EQ(ReadWhole(*updated), "version two!");
  EXPECT_EQ(restarted.downloads(), 1);
  EXPECT_FALSE(fs::exists(*path));

  EXPECT_EQ(cache.Fetch(store, "s3://bkt/models/missing.pt").status().code(),
            absl::StatusCode::kNotFound);

  // Globs list the prefix and match keys without crossing '/'.
  for (const char* key : {"data/train-0.safetensors", "data/train-1.safetensors",
                          "data/test-0.safetensors", "data/sub/train-2.safetensors"}) {
    ASSERT_TRUE(store.Put(absl::StrCat("s3://bkt/", key), "t").ok());
  }
  absl::StatusOr<std::vector<std::string>> matched =
      ExpandObjectGlob(store, "s3://bkt/data/train-*.safetensors");
  ASSERT_TRUE(matched.ok()) << matched.status();
  EXPECT_EQ(*matched, (std::vector<std::string>{"s3://bkt/data/train-0.safetensors",
                                                "s3://bkt/data/train-1.safetensors"}));
  EXPECT_EQ(ExpandObjectGlob(store, "s3://bkt/data/none-*").status().code(),
            absl::StatusCode::kNotFound);

  // With the endpoint gone, the cached copy still serves.
  server->reset();
  S3ClientOptions down;
  down.endpoint = "http://127.0.0.1:1";
  down.credentials = {"a", "b", "", ""};
  down.retry.max_attempts = 1;
  S3ObjectStore down_store(std::make_unique<S3Client>(down));
  absl::StatusOr<std::string> offline = restarted.Fetch(down_store, "s3://bkt/models/net.pt");
  ASSERT_TRUE(offline.ok()) << offline.status();
  EXPECT_EQ(ReadWhole(*offline), "version two!");
  fs::remove_all(dir);
}

TEST(ObjectCacheTest, FileStoreEtagsChangeWithContent) {
  const std::string dir = TempDir();
  FileObjectStore store;
  ASSERT_TRUE(store.Put("file://" + dir + "/obj", "one").ok());
  absl::StatusOr<ObjectInfo> first = store.Head("file://" + dir + "/obj");
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(store.Put("file://" + dir + "/obj", "two").ok());
  absl::StatusOr<ObjectInfo> second = store.Head("file://" + dir + "/obj");
  ASSERT_TRUE(second.ok());
  EXPECT_NE(first->etag, second->etag);

  // PutFile and GetToFile stream through files.
  std::ofstream(dir + "/src") << std::string(3 << 20, 'z');
  ASSERT_TRUE(store.PutFile("file://" + dir + "/copy", dir + "/src").ok());
  absl::StatusOr<ObjectInfo> got = store.GetToFile("file://" + dir + "/copy", dir + "/dst");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->size_bytes, 3 << 20);
  EXPECT_EQ(ReadWhole(dir + "/dst"), std::string(3 << 20, 'z'));
  EXPECT_EQ(store.PutFile("file://" + dir + "/x", dir + "/nope").code(),
            absl::StatusCode::kNotFound);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace trainyard
