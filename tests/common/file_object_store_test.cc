#include "common/storage/file_object_store.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/sha256.h"
#include "common/storage/object_store.h"
#include "common/storage/s3_object_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainyard {
namespace {

namespace fs = std::filesystem;

class FileObjectStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/file_object_store_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Uri(const std::string& relative) const {
    return absl::StrCat("file://", dir_, "/", relative);
  }

  std::vector<std::string> Uris(const std::vector<ObjectInfo>& infos) const {
    std::vector<std::string> out;
    for (const ObjectInfo& info : infos) out.push_back(info.uri);
    return out;
  }

  // Every file under the directory, including hidden ones.
  std::vector<std::string> AllFiles() const {
    std::vector<std::string> out;
    for (const auto& entry : fs::recursive_directory_iterator(dir_)) {
      if (entry.is_regular_file()) out.push_back(entry.path().filename().string());
    }
    return out;
  }

  std::string dir_;
  FileObjectStore store_;
};

TEST_F(FileObjectStoreTest, PutGetCreatesParentsAndLeavesNoTempFiles) {
  ASSERT_TRUE(store_.Put(Uri("a/b/c.bin"), std::string("hello\0world", 11)).ok());
  absl::StatusOr<std::string> data = store_.Get(Uri("a/b/c.bin"));
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(*data, std::string("hello\0world", 11));
  EXPECT_EQ(AllFiles(), std::vector<std::string>{"c.bin"});
  EXPECT_TRUE(fs::is_regular_file(dir_ + "/a/b/c.bin"));
}

TEST_F(FileObjectStoreTest, PutPiecesWritesThemOneAfterTheOtherAndReturnsTheHash) {
  // Larger than the megabyte the store hashes and writes at a time.
  const std::string big(3 << 20 | 5, 'x');
  const std::vector<absl::string_view> pieces = {"head", "", big, "tail"};
  const std::string whole = absl::StrCat("head", big, "tail");
  absl::StatusOr<std::string> sha256 = store_.PutPieces(Uri("p/obj"), pieces);
  ASSERT_TRUE(sha256.ok()) << sha256.status();
  EXPECT_EQ(*sha256, Sha256Hex(whole));
  absl::StatusOr<std::string> data = store_.Get(Uri("p/obj"));
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_TRUE(*data == whole);
  EXPECT_EQ(AllFiles(), std::vector<std::string>{"obj"});
  // Nothing at all is an empty object.
  sha256 = store_.PutPieces(Uri("p/empty"), {});
  ASSERT_TRUE(sha256.ok()) << sha256.status();
  EXPECT_EQ(*sha256, Sha256Hex(""));
  EXPECT_EQ(store_.Get(Uri("p/empty")).value_or("?"), "");
  EXPECT_EQ(store_.PutPieces("s3://bkt/x", pieces).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(FileObjectStoreTest, DeletingTheLastObjectOfAFolderRemovesTheFolder) {
  FileObjectStore store;
  ASSERT_TRUE(store.Put(Uri("a/step-1/x"), "1").ok());
  ASSERT_TRUE(store.Put(Uri("a/step-1/y"), "2").ok());
  ASSERT_TRUE(store.Delete(Uri("a/step-1/x")).ok());
  EXPECT_TRUE(fs::is_directory(dir_ + "/a/step-1"));
  ASSERT_TRUE(store.Delete(Uri("a/step-1/y")).ok());
  EXPECT_FALSE(fs::exists(dir_ + "/a/step-1"));
  EXPECT_TRUE(fs::is_directory(dir_ + "/a"));  // only the object's own folder goes
  // A Put makes it again.
  ASSERT_TRUE(store.Put(Uri("a/step-1/x"), "3").ok());
  EXPECT_EQ(*store.Get(Uri("a/step-1/x")), "3");
}

TEST_F(FileObjectStoreTest, PlainPathsWork) {
  const std::string path = dir_ + "/plain.txt";
  ASSERT_TRUE(store_.Put(path, "x").ok());
  EXPECT_EQ(*store_.Get(path), "x");
  EXPECT_EQ(*store_.Get("file://" + path), "x");
  EXPECT_EQ(store_.Head(path)->uri, "file://" + path);
}

TEST_F(FileObjectStoreTest, OverwriteReplacesWholeObject) {
  ASSERT_TRUE(store_.Put(Uri("o"), "a long first version").ok());
  ASSERT_TRUE(store_.Put(Uri("o"), "short").ok());
  EXPECT_EQ(*store_.Get(Uri("o")), "short");
  EXPECT_EQ(store_.Head(Uri("o"))->size_bytes, 5);
  EXPECT_EQ(AllFiles(), std::vector<std::string>{"o"});
}

TEST_F(FileObjectStoreTest, EmptyObject) {
  ASSERT_TRUE(store_.Put(Uri("empty"), "").ok());
  EXPECT_EQ(*store_.Get(Uri("empty")), "");
  EXPECT_EQ(store_.Head(Uri("empty"))->size_bytes, 0);
}

TEST_F(FileObjectStoreTest, MissingObjectIsNotFound) {
  EXPECT_EQ(store_.Get(Uri("nope")).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_.GetRange(Uri("nope"), 0, 1).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_.Head(Uri("nope")).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_.Get(Uri("no/such/dir/x")).status().code(), absl::StatusCode::kNotFound);
  // A folder is not an object.
  ASSERT_TRUE(store_.Put(Uri("d/x"), "1").ok());
  EXPECT_EQ(store_.Get(Uri("d")).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_.Head(Uri("d")).status().code(), absl::StatusCode::kNotFound);
  // An object is not a folder.
  EXPECT_EQ(store_.Get(Uri("d/x/y")).status().code(), absl::StatusCode::kNotFound);
  // The message names the URI.
  absl::Status status = store_.Get(Uri("nope")).status();
  EXPECT_NE(status.message().find(Uri("nope")), absl::string_view::npos) << status;
}

TEST_F(FileObjectStoreTest, GetRange) {
  ASSERT_TRUE(store_.Put(Uri("r"), "0123456789").ok());
  EXPECT_EQ(*store_.GetRange(Uri("r"), 0, 3), "012");
  EXPECT_EQ(*store_.GetRange(Uri("r"), 4, 2), "45");
  EXPECT_EQ(*store_.GetRange(Uri("r"), 8, 100), "89");
  EXPECT_EQ(*store_.GetRange(Uri("r"), 10, 5), "");
  EXPECT_EQ(*store_.GetRange(Uri("r"), 3, 0), "");
  EXPECT_EQ(store_.GetRange(Uri("r"), 11, 1).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(store_.GetRange(Uri("r"), -1, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_.GetRange(Uri("r"), 0, -1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(FileObjectStoreTest, Head) {
  ASSERT_TRUE(store_.Put(Uri("h/x"), std::string(1234, 'z')).ok());
  absl::StatusOr<ObjectInfo> info = store_.Head(Uri("h/x"));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->uri, Uri("h/x"));
  EXPECT_EQ(info->size_bytes, 1234);
}

TEST_F(FileObjectStoreTest, ListIsRecursiveSortedAndPrefixMatched) {
  for (const char* name : {"ckpt/step-2/b", "ckpt/step-2/a", "ckpt/step-10/m", "ckpt/stepx",
                           "ckpt/other/step-1", "ckpt/step-1/deep/er/z", "top"}) {
    ASSERT_TRUE(store_.Put(Uri(name), name).ok());
  }
  absl::StatusOr<std::vector<ObjectInfo>> listed = store_.List(Uri("ckpt/step-"));
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(Uris(*listed),
            (std::vector<std::string>{Uri("ckpt/step-1/deep/er/z"), Uri("ckpt/step-10/m"),
                                      Uri("ckpt/step-2/a"), Uri("ckpt/step-2/b")}));
  EXPECT_EQ((*listed)[2].size_bytes, static_cast<int64_t>(std::string("ckpt/step-2/a").size()));

  listed = store_.List(Uri("ckpt/"));
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(listed->size(), 6u);

  // A plain path prefix lists the same objects, as file:// URIs.
  listed = store_.List(dir_ + "/ckpt/step-2/");
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(Uris(*listed), (std::vector<std::string>{Uri("ckpt/step-2/a"), Uri("ckpt/step-2/b")}));

  // Folders matching the prefix are listed entirely; siblings with the prefix too.
  listed = store_.List(Uri("ckpt/step-1"));
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(Uris(*listed),
            (std::vector<std::string>{Uri("ckpt/step-1/deep/er/z"), Uri("ckpt/step-10/m")}));
}

TEST_F(FileObjectStoreTest, ListOfMissingFolderIsEmpty) {
  absl::StatusOr<std::vector<ObjectInfo>> listed = store_.List(Uri("no/such/place/"));
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_TRUE(listed->empty());
}

TEST_F(FileObjectStoreTest, ListSkipsTemporaryFiles) {
  ASSERT_TRUE(store_.Put(Uri("x/real"), "1").ok());
  // What an interrupted Put leaves behind.
  std::ofstream(dir_ + "/x/.trainyard-tmp-real-1-0") << "partial";
  absl::StatusOr<std::vector<ObjectInfo>> listed = store_.List(Uri("x/"));
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(Uris(*listed), std::vector<std::string>{Uri("x/real")});
}

TEST_F(FileObjectStoreTest, Delete) {
  ASSERT_TRUE(store_.Put(Uri("del/x"), "1").ok());
  ASSERT_TRUE(store_.Delete(Uri("del/x")).ok());
  EXPECT_EQ(store_.Get(Uri("del/x")).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(store_.Delete(Uri("del/x")).ok());
  EXPECT_TRUE(store_.Delete(Uri("never/was/there")).ok());
  EXPECT_TRUE(store_.List(Uri("del/"))->empty());
}

TEST_F(FileObjectStoreTest, RejectsOtherSchemesAndFolders) {
  EXPECT_EQ(store_.Put("s3://bucket/x", "1").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_.Get("relative/x").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_.Put(Uri("folder/"), "1").code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(FileObjectStoreTest, PutOverAFolderFailsWithoutDamage) {
  ASSERT_TRUE(store_.Put(Uri("f/inner"), "1").ok());
  absl::Status status = store_.Put(Uri("f"), "2");
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_EQ(*store_.Get(Uri("f/inner")), "1");
  EXPECT_EQ(AllFiles(), std::vector<std::string>{"inner"});
}

TEST_F(FileObjectStoreTest, ConcurrentPutsOfOneObjectLeaveOneWholeVersion) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([this, t] {
      for (int i = 0; i < 20; ++i) {
        ASSERT_TRUE(
            store_.Put(Uri("same"), std::string(1000 + t, static_cast<char>('a' + t))).ok());
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  const std::string data = *store_.Get(Uri("same"));
  ASSERT_GE(data.size(), 1000u);
  EXPECT_EQ(data, std::string(data.size(), data[0]));
  EXPECT_EQ(data.size(), 1000u + (data[0] - 'a'));
  EXPECT_EQ(AllFiles(), std::vector<std::string>{"same"});
}

// A store held to its roots serves nothing outside them, however a link leads there: the
// trainer's guard on the worker's own disk, where the coordinator cannot see links.
TEST_F(FileObjectStoreTest, RootsHoldEveryOperationBelowThemThroughLinks) {
  fs::create_directories(dir_ + "/allowed/data");
  fs::create_directories(dir_ + "/outside");
  ASSERT_TRUE(store_.Put(Uri("outside/secret"), "s").ok());
  fs::create_directory_symlink(dir_ + "/outside", dir_ + "/allowed/link");
  fs::create_symlink(dir_ + "/outside/secret", dir_ + "/allowed/data/secret");
  fs::create_directory_symlink(dir_ + "/allowed", dir_ + "/allowed-link");
  FileObjectStore rooted(std::vector<std::string>{"file://" + dir_ + "/allowed-link"});

  // Inside: everything works, through the root's own link too.
  ASSERT_TRUE(rooted.Put(Uri("allowed/data/x"), "x").ok());
  EXPECT_EQ(*rooted.Get(Uri("allowed-link/data/x")), "x");
  EXPECT_TRUE(rooted.Head(Uri("allowed/data/x")).ok());
  EXPECT_TRUE(rooted.List(Uri("allowed/data/")).ok());
  // Out through a file link, a folder link, or a folder not made yet below a link: refused,
  // naming where it leads, and nothing written there.
  for (const std::string& out :
       {std::string("allowed/data/secret"), std::string("allowed/link/secret"),
        std::string("allowed/link/new/object"), std::string("outside/secret")}) {
    absl::StatusOr<std::string> got = rooted.Get(Uri(out));
    EXPECT_EQ(got.status().code(), absl::StatusCode::kPermissionDenied) << out;
    EXPECT_THAT(std::string(got.status().message()), ::testing::HasSubstr("/outside")) << out;
    EXPECT_EQ(rooted.Put(Uri(out), "overwritten").code(), absl::StatusCode::kPermissionDenied)
        << out;
    EXPECT_EQ(rooted.Head(Uri(out)).status().code(), absl::StatusCode::kPermissionDenied) << out;
    EXPECT_EQ(rooted.Delete(Uri(out)).code(), absl::StatusCode::kPermissionDenied) << out;
    EXPECT_EQ(rooted.GetRange(Uri(out), 0, 1).status().code(), absl::StatusCode::kPermissionDenied);
  }
  EXPECT_EQ(rooted.List(Uri("allowed/link/")).status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(*store_.Get(Uri("outside/secret")), "s");
  EXPECT_FALSE(fs::exists(dir_ + "/outside/new"));
  // No roots at all: no local path (object storage only).
  FileObjectStore none(std::vector<std::string>{});
  EXPECT_EQ(none.Get(Uri("allowed/data/x")).status().code(), absl::StatusCode::kPermissionDenied);
}

// The resolver hands the trainer a file store held to the task's folders.
TEST_F(FileObjectStoreTest, ResolverWithLocalRootsHoldsItsFileStore) {
  ASSERT_TRUE(store_.Put(Uri("in/x"), "x").ok());
  ASSERT_TRUE(store_.Put(Uri("out/x"), "x").ok());
  std::unique_ptr<ObjectStoreResolver> stores = NewObjectStoreResolver(
      [](const char*) -> const char* { return nullptr; }, std::vector<std::string>{dir_ + "/in"});
  std::shared_ptr<ObjectStore> files = *stores->Open(Uri("in/x"));
  EXPECT_EQ(*files->Get(Uri("in/x")), "x");
  EXPECT_EQ(files->Get(Uri("out/x")).status().code(), absl::StatusCode::kPermissionDenied);
}

TEST(OpenObjectStoreTest, Schemes) {
  absl::StatusOr<std::shared_ptr<ObjectStore>> store = OpenObjectStore("file:///tmp/x");
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_NE(dynamic_cast<FileObjectStore*>(store->get()), nullptr);
  EXPECT_TRUE(OpenObjectStore("/tmp/x").ok());
  setenv("AWS_ACCESS_KEY_ID", "AK", 1);
  setenv("AWS_SECRET_ACCESS_KEY", "SK", 1);
  absl::StatusOr<std::shared_ptr<ObjectStore>> s3 = OpenObjectStore("s3://bucket/x");
  unsetenv("AWS_ACCESS_KEY_ID");
  unsetenv("AWS_SECRET_ACCESS_KEY");
  ASSERT_TRUE(s3.ok()) << s3.status();
  EXPECT_NE(dynamic_cast<S3ObjectStore*>(s3->get()), nullptr);
  EXPECT_EQ(OpenObjectStore("gs://bucket/x").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(OpenObjectStore("relative").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ObjectStoreResolverTest, ReadsItsSettingsOnceAndSharesOneStorePerScheme) {
  std::map<std::string, std::string> env = {{"AWS_ACCESS_KEY_ID", "AK"},
                                            {"AWS_SECRET_ACCESS_KEY", "SK"}};
  int lookups = 0;
  std::unique_ptr<ObjectStoreResolver> stores =
      NewObjectStoreResolver([&](const char* name) -> const char* {
        ++lookups;
        auto it = env.find(name);
        return it == env.end() ? nullptr : it->second.c_str();
      });
  const int at_start = lookups;
  EXPECT_GT(at_start, 0);
  absl::StatusOr<std::shared_ptr<ObjectStore>> a = stores->Open("s3://bucket/a");
  absl::StatusOr<std::shared_ptr<ObjectStore>> b = stores->Open("s3://other/b");
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->get(), b->get());
  EXPECT_NE(dynamic_cast<S3ObjectStore*>(a->get()), nullptr);
  absl::StatusOr<std::shared_ptr<ObjectStore>> f = stores->Open("/tmp/x");
  ASSERT_TRUE(f.ok());
  EXPECT_NE(dynamic_cast<FileObjectStore*>(f->get()), nullptr);
  EXPECT_EQ(f->get(), stores->Open("file:///tmp/y")->get());
  EXPECT_EQ(lookups, at_start) << "the environment was read again after start";

  // Without credentials: files still work; every s3:// URI says what is missing, and where.
  env.clear();
  std::unique_ptr<ObjectStoreResolver> bare =
      NewObjectStoreResolver([&](const char* name) -> const char* {
        auto it = env.find(name);
        return it == env.end() ? nullptr : it->second.c_str();
      });
  EXPECT_TRUE(bare->Open("file:///tmp/x").ok());
  absl::Status missing = bare->Open("s3://bucket/key").status();
  EXPECT_FALSE(missing.ok());
  EXPECT_THAT(std::string(missing.message()), ::testing::HasSubstr("s3://bucket/key"));
  EXPECT_EQ(bare->Open("gs://bucket/x").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace trainyard
