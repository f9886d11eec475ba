#include "worker/agent/log_shipper.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

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

}  // namespace
}  // namespace trainyard
