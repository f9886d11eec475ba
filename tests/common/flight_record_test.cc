#include "common/flight_record.h"

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/common/fake_clock.h"
#include "tests/common/flight_record_queries.h"
#include "tests/common/scratch_files.h"

namespace trainyard {
namespace {

int64_t UnixMs(const FakeClock& clock) { return absl::ToUnixMillis(clock.Now()); }

TEST(FlightRecorderTest, StartsInStartingAtStepZeroWithNothingRecorded) {
  FakeClock clock;
  std::unique_ptr<FlightRecorder> recorder = FlightRecorder::InMemory(clock);
  const FlightRecordSnapshot record = recorder->Snapshot();
  EXPECT_EQ(record.phase, RankPhase::kStarting);
  EXPECT_EQ(record.phase_since_unix_ms, UnixMs(clock));
  EXPECT_EQ(record.step, 0);
  EXPECT_TRUE(record.recent.empty());
  EXPECT_EQ(LastCollective(record), 0);
  EXPECT_EQ(LastSent(record, 1), 0);
  EXPECT_EQ(LastReceived(record, 1), 0);
}

TEST(FlightRecorderTest, PhasesKeepTheirStartAndTheStepItsLastValue) {
  FakeClock clock;
  std::unique_ptr<FlightRecorder> recorder = FlightRecorder::InMemory(clock);
  clock.Advance(absl::Seconds(2));
  recorder->SetPhase(RankPhase::kData);
  const int64_t data_since = UnixMs(clock);
  EXPECT_EQ(recorder->Snapshot().phase, RankPhase::kData);
  EXPECT_EQ(recorder->Snapshot().phase_since_unix_ms, data_since);

  // The same phase again: it has been in it since it entered it.
  clock.Advance(absl::Seconds(3));
  recorder->SetPhase(RankPhase::kData);
  EXPECT_EQ(recorder->Snapshot().phase_since_unix_ms, data_since);

  recorder->SetPhase(RankPhase::kForward);
  EXPECT_EQ(recorder->Snapshot().phase, RankPhase::kForward);
  EXPECT_EQ(recorder->Snapshot().phase_since_unix_ms, data_since + 3000);

  recorder->SetStep(41);
  recorder->SetStep(42);
  EXPECT_EQ(recorder->Snapshot().step, 42);
}

TEST(FlightRecorderTest, CollectivesAreNumberedAcrossKindsAndMessagesPerPeerAndDirection) {
  FakeClock clock;
  std::unique_ptr<FlightRecorder> recorder = FlightRecorder::InMemory(clock);
  recorder->Begin(CollectiveKind::kAllReduce, 100);
  recorder->Begin(CollectiveKind::kSend, 10, /*peer=*/1);
  recorder->Begin(CollectiveKind::kBroadcast, 200);
  recorder->Begin(CollectiveKind::kSend, 11, /*peer=*/1);
  recorder->Begin(CollectiveKind::kRecv, 12, /*peer=*/1);
  recorder->Begin(CollectiveKind::kSend, 13, /*peer=*/2);
  recorder->Begin(CollectiveKind::kBarrier, 0);

  const FlightRecordSnapshot record = recorder->Snapshot();
  struct Expected {
    CollectiveKind kind;
    int64_t seq;
    int peer;
    int64_t bytes;
  };
  const std::vector<Expected> expected = {
      {CollectiveKind::kAllReduce, 1, -1, 100}, {CollectiveKind::kSend, 1, 1, 10},
      {CollectiveKind::kBroadcast, 2, -1, 200}, {CollectiveKind::kSend, 2, 1, 11},
      {CollectiveKind::kRecv, 1, 1, 12},        {CollectiveKind::kSend, 1, 2, 13},
      {CollectiveKind::kBarrier, 3, -1, 0},
  };
  ASSERT_EQ(record.recent.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    const CollectiveEntry& e = record.recent[i];
    EXPECT_EQ(e.kind, expected[i].kind) << i;
    EXPECT_EQ(e.seq, expected[i].seq) << i;
    EXPECT_EQ(e.peer, expected[i].peer) << i;
    EXPECT_EQ(e.bytes, expected[i].bytes) << i;
    EXPECT_EQ(e.started_unix_ms, UnixMs(clock)) << i;
    EXPECT_EQ(e.ended_unix_ms, 0) << i;
    EXPECT_FALSE(e.failed) << i;
  }
  EXPECT_EQ(LastCollective(record), 3);
  EXPECT_EQ(LastSent(record, 1), 2);
  EXPECT_EQ(LastSent(record, 2), 1);
  EXPECT_EQ(LastReceived(record, 1), 1);
  EXPECT_EQ(LastReceived(record, 2), 0);
}

TEST(FlightRecorderTest, EndMarksTheEntryEndedOrFailedOnce) {
  FakeClock clock;
  std::unique_ptr<FlightRecorder> recorder = FlightRecorder::InMemory(clock);
  const int64_t start = UnixMs(clock);
  const uint64_t good = recorder->Begin(CollectiveKind::kAllReduce, 8);
  const uint64_t bad = recorder->Begin(CollectiveKind::kRecv, 8, /*peer=*/0);
  recorder->Begin(CollectiveKind::kBarrier, 0);  // still running
  clock.Advance(absl::Milliseconds(250));
  recorder->End(good, /*ok=*/true);
  recorder->End(bad, /*ok=*/false);
  // A second End of an ended entry changes nothing.
  clock.Advance(absl::Milliseconds(250));
  recorder->End(good, /*ok=*/false);

  const FlightRecordSnapshot record = recorder->Snapshot();
  ASSERT_EQ(record.recent.size(), 3u);
  EXPECT_EQ(record.recent[0].started_unix_ms, start);
  EXPECT_EQ(record.recent[0].ended_unix_ms, start + 250);
  EXPECT_FALSE(record.recent[0].failed);
  EXPECT_EQ(record.recent[1].ended_unix_ms, start + 250);
  EXPECT_TRUE(record.recent[1].failed);
  EXPECT_EQ(record.recent[2].ended_unix_ms, 0);
  EXPECT_FALSE(record.recent[2].failed);
}

TEST(FlightRecorderTest, TheRingKeepsTheNewestEntriesOldestFirst) {
  FakeClock clock;
  std::unique_ptr<FlightRecorder> recorder = FlightRecorder::InMemory(clock);
  const int total = kFlightRecordEntries * 2 + 5;
  std::vector<uint64_t> tokens;
  for (int i = 0; i < total; ++i) {
    tokens.push_back(recorder->Begin(CollectiveKind::kAllReduce, i));
    clock.Advance(absl::Milliseconds(1));
  }
  // The end of an entry long gone from the ring marks nothing (its slot holds a newer entry).
  recorder->End(tokens[total - kFlightRecordEntries - 1], /*ok=*/false);
  recorder->End(tokens[total - 1], /*ok=*/true);

  const FlightRecordSnapshot record = recorder->Snapshot();
  ASSERT_EQ(record.recent.size(), static_cast<size_t>(kFlightRecordEntries));
  for (int i = 0; i < kFlightRecordEntries; ++i) {
    const CollectiveEntry& e = record.recent[static_cast<size_t>(i)];
    const int64_t n = total - kFlightRecordEntries + i;  // 0-based among all begun
    EXPECT_EQ(e.seq, n + 1) << i;
    EXPECT_EQ(e.bytes, n) << i;
    EXPECT_EQ(e.ended_unix_ms != 0, i == kFlightRecordEntries - 1) << i;
    EXPECT_FALSE(e.failed) << i;
  }
  EXPECT_EQ(LastCollective(record), total);
}

TEST(FlightRecorderTest, TheFileReadsBackWhileItsWriterRunsAndAfterItIsGone) {
  testing::ScratchFolder dir;
  const std::string path = dir / kFlightRecordFile;
  FakeClock clock;
  absl::StatusOr<std::unique_ptr<FlightRecorder>> recorder = FlightRecorder::Create(path, clock);
  ASSERT_TRUE(recorder.ok()) << recorder.status();
  (*recorder)->SetStep(7);
  clock.Advance(absl::Seconds(1));
  (*recorder)->SetPhase(RankPhase::kBackward);
  const uint64_t sent = (*recorder)->Begin(CollectiveKind::kSend, 4096, /*peer=*/3);
  (*recorder)->Begin(CollectiveKind::kAllReduce, 1 << 20);
  clock.Advance(absl::Milliseconds(5));
  (*recorder)->End(sent, /*ok=*/true);

  auto check = [&](const FlightRecordSnapshot& record) {
    EXPECT_EQ(record.phase, RankPhase::kBackward);
    EXPECT_EQ(record.phase_since_unix_ms, UnixMs(clock) - 5);
    EXPECT_EQ(record.step, 7);
    ASSERT_EQ(record.recent.size(), 2u);
    EXPECT_EQ(record.recent[0].kind, CollectiveKind::kSend);
    EXPECT_EQ(record.recent[0].peer, 3);
    EXPECT_EQ(record.recent[0].seq, 1);
    EXPECT_EQ(record.recent[0].bytes, 4096);
    EXPECT_EQ(record.recent[0].ended_unix_ms, UnixMs(clock));
    EXPECT_EQ(record.recent[1].kind, CollectiveKind::kAllReduce);
    EXPECT_EQ(record.recent[1].peer, -1);
    EXPECT_EQ(record.recent[1].bytes, 1 << 20);
    EXPECT_EQ(record.recent[1].ended_unix_ms, 0);
  };
  absl::StatusOr<FlightRecordSnapshot> live = ReadFlightRecord(path);
  ASSERT_TRUE(live.ok()) << live.status();
  check(*live);
  check((*recorder)->Snapshot());

  recorder->reset();  // the writer is gone (as after kill -9): the file stays as it left it
  absl::StatusOr<FlightRecordSnapshot> after = ReadFlightRecord(path);
  ASSERT_TRUE(after.ok()) << after.status();
  check(*after);
}

// A reader meets no entry half rewritten, however fast the writer rewrites the ring as it reads,
// and no phase with another phase's start while phases change much faster than a step's few
// times (every 256 entries).
TEST(FlightRecorderTest, AReaderSeesWholeEntriesAndPhasesWhileTheWriterRuns) {
  testing::ScratchFolder dir;
  const std::string path = dir / kFlightRecordFile;
  FakeClock clock;
  absl::StatusOr<std::unique_ptr<FlightRecorder>> recorder = FlightRecorder::Create(path, clock);
  ASSERT_TRUE(recorder.ok()) << recorder.status();
  const absl::Time base = clock.Now();  // whole seconds: a multiple of 8 ms
  std::atomic<bool> done{false};
  std::thread writer([&] {
    for (int64_t i = 0; !done.load(); ++i) {
      if (i % 256 == 0) {
        // Each phase starts at a time whose milliseconds modulo 8 are the phase's number.
        const int64_t n = i / 256;
        const RankPhase phase = n % 2 == 0 ? RankPhase::kForward : RankPhase::kBackward;
        clock.AdvanceTo(base + absl::Milliseconds(8 * (n + 1) + static_cast<int>(phase)));
        (*recorder)->SetPhase(phase);
      }
      // The i-th entry (seq i + 1) carries 8 (i + 1) bytes.
      (*recorder)->End((*recorder)->Begin(CollectiveKind::kAllReduce, 8 * (i + 1)), true);
    }
  });
  int64_t entries = 0;
  for (int read = 0; read < 2000; ++read) {
    absl::StatusOr<FlightRecordSnapshot> record = ReadFlightRecord(path);
    ASSERT_TRUE(record.ok()) << record.status();
    if (record->phase != RankPhase::kStarting) {
      EXPECT_EQ(record->phase_since_unix_ms % 8, static_cast<int64_t>(record->phase));
    }
    for (const CollectiveEntry& e : record->recent) {
      ASSERT_EQ(e.bytes, 8 * e.seq);
      ++entries;
    }
  }
  done.store(true);
  writer.join();
  EXPECT_GT(entries, 0);
}

TEST(FlightRecorderTest, CreateFailsInAFolderThatIsNotThere) {
  FakeClock clock;
  absl::StatusOr<std::unique_ptr<FlightRecorder>> recorder =
      FlightRecorder::Create("/nonexistent-folder/flight-record", clock);
  EXPECT_EQ(recorder.status().code(), absl::StatusCode::kUnavailable) << recorder.status();
}

TEST(ReadFlightRecordTest, NotFoundWithoutAFile) {
  testing::ScratchFolder dir;
  EXPECT_EQ(ReadFlightRecord(dir / "none").status().code(), absl::StatusCode::kNotFound);
}

TEST(ReadFlightRecordTest, DataLossForGarbageAShortFileAndAnotherVersion) {
  testing::ScratchFolder dir;
  auto write = [&](const std::string& name, const std::string& bytes) {
    testing::WriteText(dir / name, bytes);
    return dir / name;
  };
  const std::string garbage = write("garbage", std::string(8192, 'x'));
  EXPECT_EQ(ReadFlightRecord(garbage).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ReadFlightRecord(write("empty", "")).status().code(), absl::StatusCode::kDataLoss);

  FakeClock clock;
  const std::string path = dir / kFlightRecordFile;
  ASSERT_TRUE(FlightRecorder::Create(path, clock).ok());
  const std::string whole = testing::ReadText(path);
  ASSERT_TRUE(ReadFlightRecord(path).ok());
  // Cut short: its header alone, then all but its last word.
  const std::string header = write("header", whole.substr(0, 7 * 8));
  absl::Status status = ReadFlightRecord(header).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_NE(status.message().find("not a flight record"), std::string::npos) << status;
  status = ReadFlightRecord(write("short", whole.substr(0, whole.size() - 8))).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;

  // A record of another version (word 1), or of another size of ring (word 2).
  std::string other = whole;
  other[8] = static_cast<char>(kFlightRecordVersion + 1);
  status = ReadFlightRecord(write("version", other)).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_NE(status.message().find("version"), std::string::npos) << status;
  other = whole;
  other[16] = static_cast<char>(kFlightRecordEntries + 1);
  EXPECT_EQ(ReadFlightRecord(write("entries", other)).status().code(), absl::StatusCode::kDataLoss);
}

TEST(FlightRecordNamesTest, PhasesAndKindsHaveTheirNames) {
  EXPECT_STREQ(RankPhaseName(RankPhase::kData), "data loading");
  EXPECT_STREQ(RankPhaseName(static_cast<RankPhase>(99)), "an unknown phase");
  EXPECT_STREQ(CollectiveKindName(CollectiveKind::kRecv), "receive");
  EXPECT_STREQ(CollectiveKindName(CollectiveKind::kAllReduce), "all-reduce");
}

}  // namespace
}  // namespace trainyard
