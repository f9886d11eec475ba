#include "common/storage/uri.h"

#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "common/storage/checkpoint_layout.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainyard {
namespace {

TEST(ParseUriTest, FileUri) {
  absl::StatusOr<Uri> uri = ParseUri("file:///tmp/x/y.bin");
  ASSERT_TRUE(uri.ok()) << uri.status();
  EXPECT_EQ(uri->scheme, "file");
  EXPECT_EQ(uri->authority, "");
  EXPECT_EQ(uri->path, "/tmp/x/y.bin");
  EXPECT_EQ(uri->ToString(), "file:///tmp/x/y.bin");
}

TEST(ParseUriTest, FileUriWithLocalhost) {
  absl::StatusOr<Uri> uri = ParseUri("file://localhost/tmp/x");
  ASSERT_TRUE(uri.ok()) << uri.status();
  EXPECT_EQ(uri->path, "/tmp/x");
}

TEST(ParseUriTest, PlainAbsolutePathIsFile) {
  absl::StatusOr<Uri> uri = ParseUri("/data/x");
  ASSERT_TRUE(uri.ok()) << uri.status();
  EXPECT_EQ(uri->scheme, "file");
  EXPECT_EQ(uri->path, "/data/x");
  EXPECT_EQ(uri->ToString(), "file:///data/x");
}

TEST(ParseUriTest, S3Uri) {
  absl::StatusOr<Uri> uri = ParseUri("s3://bucket/a/b");
  ASSERT_TRUE(uri.ok()) << uri.status();
  EXPECT_EQ(uri->scheme, "s3");
  EXPECT_EQ(uri->authority, "bucket");
  EXPECT_EQ(uri->path, "a/b");
  EXPECT_EQ(uri->ToString(), "s3://bucket/a/b");
}

TEST(ParseUriTest, S3BucketRoot) {
  absl::StatusOr<Uri> uri = ParseUri("s3://bucket");
  ASSERT_TRUE(uri.ok()) << uri.status();
  EXPECT_EQ(uri->authority, "bucket");
  EXPECT_EQ(uri->path, "");
  EXPECT_EQ(uri->ToString(), "s3://bucket");
}

TEST(ParseUriTest, Rejects) {
  for (const char* bad : {"", "relative/path", "://x", "gs://bucket/x", "s3:///key",
                          "file://host/x", "file://", "file:relative"}) {
    absl::StatusOr<Uri> uri = ParseUri(bad);
    EXPECT_EQ(uri.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(ParseUriTest, ErrorNamesTheUri) {
  absl::StatusOr<Uri> uri = ParseUri("gs://bucket/x");
  EXPECT_NE(uri.status().message().find("gs://bucket/x"), absl::string_view::npos);
}

// Nothing written under a folder may name a place above it, however it is spelled.
TEST(ParseUriTest, RefusesPathsThatCouldLeadElsewhere) {
  for (const std::string& bad : std::vector<std::string>{
           "/a/../b", "/a/..", "/a/./b", "/a/...", "file:///a/../b", "file://localhost/a/%2e%2E/b",
           "/a/%2e/b", "/a/x://../../b", "file:///a/s3://b/c", "s3://bucket/a/../b",
           "s3://bucket/a/%2e%2e/b", "s3://bucket/a//b", "s3://bucket//a", "s3://../a", "/a\\..\\b",
           "/a/b\n", std::string("/a/b\0/../c", 10)}) {
    absl::StatusOr<Uri> uri = ParseUri(bad);
    EXPECT_EQ(uri.status().code(), absl::StatusCode::kInvalidArgument) << absl::CHexEscape(bad);
  }
  EXPECT_THAT(std::string(ParseUri("/a/../b").status().message()),
              ::testing::HasSubstr("the segment '..' is not allowed"));
  // Names with dots in them are names.
  EXPECT_TRUE(ParseUri("/a/.hidden/b..c/v1.2").ok());
  EXPECT_TRUE(ParseUri("s3://bucket/a/..x/b").ok());
}

TEST(ParseUriTest, LocalPathsHaveOneSpelling) {
  EXPECT_EQ(ParseUri("//a///b/")->path, "/a/b/");
  EXPECT_EQ(ParseUri("file:////a//b")->path, "/a/b");
  EXPECT_EQ(*LocalPath("file://localhost//a"), "/a");
}

TEST(IsWithinTest, ComparesWholeSegments) {
  auto within = [](const std::string& uri, const std::string& folder) {
    return IsWithin(*ParseUri(uri), *ParseUri(folder));
  };
  EXPECT_TRUE(within("/data/a/b", "/data/a"));
  EXPECT_TRUE(within("/data/a/b", "/data/a/"));
  EXPECT_TRUE(within("/data/a", "/data/a"));
  EXPECT_TRUE(within("/x", "/"));
  EXPECT_TRUE(within("file:///data//a/b", "/data/a"));
  EXPECT_FALSE(within("/data/ab", "/data/a"));
  EXPECT_FALSE(within("/data", "/data/a"));
  EXPECT_FALSE(within("s3://b/data/a", "/data/a"));
  EXPECT_TRUE(within("s3://b/data/a/x", "s3://b/data/a"));
  EXPECT_TRUE(within("s3://b/data/a/x", "s3://b"));
  EXPECT_FALSE(within("s3://c/data/a/x", "s3://b"));
  EXPECT_FALSE(within("s3://b/data/ab", "s3://b/data/a"));
}

TEST(JoinUriTest, ExactlyOneSlash) {
  EXPECT_EQ(JoinUri("file:///a/", "b"), "file:///a/b");
  EXPECT_EQ(JoinUri("file:///a", "b"), "file:///a/b");
  EXPECT_EQ(JoinUri("file:///a//", "/b"), "file:///a/b");
  EXPECT_EQ(JoinUri("s3://bucket", "k/step-1"), "s3://bucket/k/step-1");
  EXPECT_EQ(JoinUri("s3://bucket/", "/k"), "s3://bucket/k");
  EXPECT_EQ(JoinUri("/tmp/x", "y"), "/tmp/x/y");
  EXPECT_EQ(JoinUri("file:///", "y"), "file:///y");
  EXPECT_EQ(JoinUri("/", "y"), "/y");
  EXPECT_EQ(JoinUri("", "y"), "y");
  EXPECT_EQ(JoinUri("file:///a", ""), "file:///a");
}

TEST(LocalPathTest, FileAndPlain) {
  EXPECT_EQ(*LocalPath("file:///a/b"), "/a/b");
  EXPECT_EQ(*LocalPath("/a/b"), "/a/b");
  EXPECT_EQ(LocalPath("s3://bucket/a").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LocalPath("a/b").status().code(), absl::StatusCode::kInvalidArgument);
}

// The step folder the trainer writes is the one the coordinator accepts a commit for.
TEST(CheckpointLayoutTest, StepFoldersAreZeroPaddedUnderTheCheckpointUri) {
  EXPECT_EQ(CheckpointStepUri("s3://bucket/jobs/j-1", 42),
            "s3://bucket/jobs/j-1/step-000000000042");
  EXPECT_EQ(CheckpointStepUri("file:///ckpt/j-1/", 0), "file:///ckpt/j-1/step-000000000000");
  EXPECT_TRUE(absl::StartsWith(CheckpointStepUri("file:///c", 7),
                               JoinUri("file:///c", kCheckpointStepPrefix)));
}

TEST(UriTest, SafeRelativePathsStayWhereTheyArePut) {
  for (const char* good : {"model.pt", "shards/rank-0/part.bin", "a..b", ".hidden"}) {
    EXPECT_TRUE(IsSafeRelativePath(good)) << good;
  }
  for (const char* bad :
       {"", "/etc/passwd", "../x", "a/../../x", "a//b", "./a", "a/.", "a\\b", "a\nb"}) {
    EXPECT_FALSE(IsSafeRelativePath(bad)) << bad;
  }
}

}  // namespace
}  // namespace trainyard
