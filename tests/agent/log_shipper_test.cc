#include "worker/agent/log_shipper.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainyard {
namespace {

// Keeps what it receives like the coordinator does: appends data at its current size, and
// answers with the offset it wants next.
class FakeSink final : public LogSink {
 public:
  struct Call {
    std::string task_id;
    int64_t offset;
    size_t size;
  };
  absl::StatusOr<int64_t> Ship(const std::string& task_id, int64_t offset,
                               absl::string_view data) override {
    calls.push_back({task_id, offset, data.size()});
    if (!fail.ok()) return fail;
    std::string& have = received[task_id];
    if (offset == static_cast<int64_t>(have.size())) have.append(data.data(), data.size());
    return static_cast<int64_t>(have.size());
  }
  std::map<std::string, std::string> received;
  std::vector<Call> calls;
  absl::Status fail;
};

class LogShipperTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/shipper-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void Append(const std::string& path, const std::string& data) {
    std::ofstream(path, std::ios::app) << data;
  }

  std::string dir_;
  FakeSink sink_;
};

TEST_F(LogShipperTest, ShipsOnlyNewBytes) {
  LogShipper shipper(sink_);
  const std::string log = dir_ + "/output.log";
  shipper.Track("t1", log);
  ASSERT_TRUE(shipper.ShipAll().ok());  // no file yet: nothing to send
  EXPECT_TRUE(sink_.calls.empty());
  Append(log, "hello\n");
  ASSERT_TRUE(shipper.ShipAll().ok());
  Append(log, "world\n");
  ASSERT_TRUE(shipper.ShipAll().ok());
  ASSERT_TRUE(shipper.ShipAll().ok());  // nothing new: no call
  ASSERT_EQ(sink_.calls.size(), 2u);
  EXPECT_EQ(sink_.calls[0].offset, 0);
  EXPECT_EQ(sink_.calls[1].offset, 6);
  EXPECT_EQ(sink_.received["t1"], "hello\nworld\n");
  EXPECT_EQ(shipper.Offset("t1"), 12);
}

TEST_F(LogShipperTest, SplitsIntoChunksOfAtMostTheLimit) {
  LogShipper shipper(sink_, /*max_chunk_bytes=*/4);
  const std::string log = dir_ + "/output.log";
  shipper.Track("t1", log);
  Append(log, "0123456789");
  ASSERT_TRUE(shipper.Flush("t1").ok());
  EXPECT_EQ(sink_.received["t1"], "0123456789");
  for (const FakeSink::Call& call : sink_.calls) EXPECT_LE(call.size, 4u);
  EXPECT_EQ(sink_.calls.size(), 3u);
}

TEST_F(LogShipperTest, ResumesFromTheOffsetTheReceiverAsksFor) {
  LogShipper shipper(sink_);
  const std::string log = dir_ + "/output.log";
  shipper.Track("t1", log);
  Append(log, "abc");
  ASSERT_TRUE(shipper.ShipAll().ok());
  // The receiver lost everything (a coordinator restart without the log): it asks for 0.
  sink_.received["t1"].clear();
  Append(log, "def");
  ASSERT_TRUE(shipper.Flush("t1").ok());
  EXPECT_EQ(sink_.received["t1"], "abcdef");
  EXPECT_EQ(sink_.calls[1].offset, 3);  // tried the new bytes first
  EXPECT_EQ(sink_.calls[2].offset, 0);  // then resent from what it asked for

  // The receiver already has more than this side shipped: skip ahead.
  sink_.received["t2"] = "xyz";
  const std::string log2 = dir_ + "/output2.log";
  Append(log2, "xyz123");
  shipper.Track("t2", log2);
  ASSERT_TRUE(shipper.Flush("t2").ok());
  EXPECT_EQ(sink_.received["t2"], "xyz123");
  EXPECT_EQ(shipper.Offset("t2"), 6);
}

TEST_F(LogShipperTest, KeepsTheOffsetWhenTheSinkFails) {
  LogShipper shipper(sink_);
  const std::string log = dir_ + "/output.log";
  shipper.Track("t1", log);
  Append(log, "abc");
  sink_.fail = absl::UnavailableError("down");
  EXPECT_EQ(shipper.ShipAll().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(shipper.Flush("t1").code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(shipper.Offset("t1"), 0);
  sink_.fail = absl::OkStatus();
  ASSERT_TRUE(shipper.ShipAll().ok());
  EXPECT_EQ(sink_.received["t1"], "abc");
}

TEST_F(LogShipperTest, AnEndedTaskWhoseFlushFailsIsShippedByLaterPasses) {
  LogShipper shipper(sink_);
  const std::string log = dir_ + "/output.log";
  shipper.Track("t1", log);
  Append(log, "last words\n");
  sink_.fail = absl::UnavailableError("down");
  EXPECT_EQ(shipper.Finish("t1").code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(shipper.Offset("t1"), 0);  // still followed: nothing is lost
  sink_.fail = absl::OkStatus();
  ASSERT_TRUE(shipper.ShipAll().ok());
  EXPECT_EQ(sink_.received["t1"], "last words\n");
  EXPECT_EQ(shipper.Offset("t1"), -1);  // done: no longer followed

  // A flush that works stops following the task at once.
  shipper.Track("t2", log);
  ASSERT_TRUE(shipper.Finish("t2").ok());
  EXPECT_EQ(shipper.Offset("t2"), -1);
  EXPECT_EQ(sink_.received["t2"], "last words\n");
}

TEST_F(LogShipperTest, FlushOfAnUntrackedTaskIsNotFound) {
  LogShipper shipper(sink_);
  EXPECT_EQ(shipper.Flush("nope").code(), absl::StatusCode::kNotFound);
  shipper.Track("t1", dir_ + "/x");
  shipper.Untrack("t1");
  EXPECT_EQ(shipper.Offset("t1"), -1);
}

TEST_F(LogShipperTest, ReceiverThatMakesNoProgressAbortsTheFlush) {
  class StuckSink final : public LogSink {
   public:
    absl::StatusOr<int64_t> Ship(const std::string&, int64_t, absl::string_view) override {
      return 0;
    }
  } stuck;
  LogShipper shipper(stuck);
  const std::string log = dir_ + "/output.log";
  Append(log, "abc");
  shipper.Track("t1", log);
  EXPECT_EQ(shipper.Flush("t1").code(), absl::StatusCode::kAborted);
}

TEST_F(LogShipperTest, ALinkInPlaceOfTheLogIsNotFollowed) {
  // The task may own its folder: it could put there a link to what only the agent may read, or
  // a FIFO that would block the agent's open.
  const std::string secret = dir_ + "/agent-secret";
  Append(secret, "the agent's credential\n");
  const std::string log = dir_ + "/output.log";
  ASSERT_EQ(symlink(secret.c_str(), log.c_str()), 0);
  const std::string other_secret = dir_ + "/agent-key";
  Append(other_secret, "the agent's key\n");
  const std::string hard = dir_ + "/output2.log";
  ASSERT_EQ(link(other_secret.c_str(), hard.c_str()), 0);
  const std::string fifo = dir_ + "/output3.log";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  LogShipper shipper(sink_);
  shipper.Track("t1", log);
  shipper.Track("t2", hard);
  shipper.Track("t3", fifo);
  EXPECT_TRUE(shipper.ShipAll().ok());
  EXPECT_TRUE(shipper.Flush("t1").ok());
  EXPECT_TRUE(shipper.Flush("t2").ok());
  EXPECT_TRUE(shipper.Flush("t3").ok());
  EXPECT_TRUE(sink_.calls.empty());
  EXPECT_EQ(shipper.Offset("t1"), 0);

  // A regular file in its place is shipped.
  ASSERT_EQ(unlink(log.c_str()), 0);
  Append(log, "mine\n");
  ASSERT_TRUE(shipper.Flush("t1").ok());
  EXPECT_EQ(sink_.received["t1"], "mine\n");
}

// Bytes of `path` that take space on disk.
int64_t DiskBytes(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_blocks) * 512 : -1;
}

// Whether the file system under `dir` frees the blocks of a punched hole.
bool CanPunchHoles(const std::string& dir) {
  const std::string probe = dir + "/probe";
  std::ofstream(probe) << std::string(64 << 10, 'p');
  const int fd = open(probe.c_str(), O_RDWR);
  const bool punched =
      fd >= 0 && fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 64 << 10) == 0;
  if (fd >= 0) close(fd);
  const bool freed = punched && DiskBytes(probe) < (64 << 10);
  unlink(probe.c_str());
  return freed;
}

TEST_F(LogShipperTest, ALogOverItsBoundKeepsTheNewestOutputOnDiskAndShipsIt) {
  if (!CanPunchHoles(dir_)) GTEST_SKIP() << "this file system cannot punch holes";
  constexpr int64_t kBound = 64 << 10;
  LogShipper shipper(sink_, LogShipper::kMaxChunkBytes, kBound);
  const std::string log = dir_ + "/output.log";
  shipper.Track("t1", log);
  // Under the bound, shipped as it comes.
  const std::string early(40 << 10, 'a');
  Append(log, early);
  ASSERT_TRUE(shipper.Flush("t1").ok());
  ASSERT_EQ(sink_.received["t1"], early);

  // Then 100 KiB more while the receiver is down: the file goes past the bound, and the oldest
  // of it is freed, shipped or not, down to half the bound.
  std::string late;
  for (int i = 0; late.size() < (100 << 10); ++i) late += absl::StrCat("line ", i, "\n");
  Append(log, late);
  sink_.fail = absl::UnavailableError("down");
  EXPECT_FALSE(shipper.ShipAll().ok());
  sink_.fail = absl::OkStatus();
  const int64_t size = static_cast<int64_t>(early.size() + late.size());
  EXPECT_EQ(static_cast<int64_t>(std::filesystem::file_size(log)), size);  // offsets stay
  EXPECT_LE(DiskBytes(log), kBound);

  // The receiver gets one line for what it missed, then the newest output, to the last byte.
  ASSERT_TRUE(shipper.Flush("t1").ok());
  const std::string& got = sink_.received["t1"];
  ASSERT_TRUE(absl::StartsWith(got, early + "[trainyard: ")) << got.substr(early.size(), 200);
  EXPECT_THAT(got, ::testing::HasSubstr("bytes of output were dropped on the worker"));
  const int64_t kept_from = (size - kBound / 2) & ~int64_t{4095};
  EXPECT_TRUE(absl::EndsWith(got, late.substr(static_cast<size_t>(kept_from) - early.size())));
  EXPECT_EQ(shipper.Offset("t1"), size);

  // And later output follows.
  Append(log, "after\n");
  ASSERT_TRUE(shipper.Flush("t1").ok());
  EXPECT_TRUE(absl::EndsWith(sink_.received["t1"], late.substr(late.size() - 10) + "after\n"));
}

}  // namespace
}  // namespace trainyard
