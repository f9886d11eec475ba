// DiagnoseHang: which rank held the others up, from the ranks' flight records.

#include "server/jobs/hang_diagnosis.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace trainyard {
namespace {

constexpr int64_t kRead = 1'000'000;  // when the agents read the records (unix ms)

v1::RankRecord Record(const std::string& phase, int64_t seconds_in_phase,
                      const std::string& state = "sleeping") {
  v1::RankRecord r;
  r.set_phase(phase);
  r.set_phase_since_unix_ms(kRead - seconds_in_phase * 1000);
  r.set_read_unix_ms(kRead);
  r.set_process_state(state);
  return r;
}

void Add(v1::RankRecord& r, const std::string& kind, int64_t seq, bool ended, int peer = -1) {
  v1::CollectiveRecord* c = r.add_recent();
  c->set_kind(kind);
  c->set_seq(seq);
  c->set_peer(peer);
  c->set_started_unix_ms(kRead - 5000);
  c->set_ended_unix_ms(ended ? kRead - 4000 : 0);
}

std::vector<RankView> Views(const std::vector<v1::RankRecord>& records) {
  std::vector<RankView> views;
  for (size_t i = 0; i < records.size(); ++i) {
    views.push_back({static_cast<int>(i), "w" + std::to_string(i), &records[i]});
  }
  return views;
}

TEST(HangDiagnosisTest, ARankThatNeverEnteredTheCollectiveIsNamedWithWhatItWasDoing) {
  std::vector<v1::RankRecord> records(3);
  records[0] = Record("the optimizer step", 61);
  records[1] = Record("data loading", 61);
  records[2] = Record("the optimizer step", 61);
  for (int rank : {0, 2}) {
    Add(records[rank], "all-reduce", 1531, true);
    Add(records[rank], "all-reduce", 1532, false);
    Add(records[rank], "all-reduce", 1533, false);
  }
  Add(records[1], "all-reduce", 1531, true);
  EXPECT_EQ(DiagnoseHang(Views(records), false),
            "rank 1 (w1) never entered all-reduce #1532: it has been in data loading for 61 s");
}

TEST(HangDiagnosisTest, TheRankFurthestBehindIsTheCulpritAndTheOthersBehindAreListed) {
  std::vector<v1::RankRecord> records(3);
  records[0] = Record("the optimizer step", 10);
  records[1] = Record("the forward pass", 10);
  records[2] = Record("the backward pass", 12);
  Add(records[0], "barrier", 7, false);
  Add(records[1], "all-reduce", 6, true);
  Add(records[2], "all-reduce", 5, true);
  EXPECT_EQ(DiagnoseHang(Views(records), false),
            "rank 2 (w2) never entered all-reduce #6: it has been in the backward pass for 12 s "
            "(also behind: rank 1)");
}

TEST(HangDiagnosisTest, AStoppedProcessIsSaidToBeStopped) {
  std::vector<v1::RankRecord> records(2);
  records[0] = Record("the optimizer step", 30);
  records[1] = Record("the forward pass", 31, "stopped");
  Add(records[0], "all-reduce", 4, false);
  Add(records[1], "all-reduce", 3, true);
  EXPECT_EQ(DiagnoseHang(Views(records), false),
            "rank 1 (w1) never entered all-reduce #4: its process was stopped (SIGSTOP or a "
            "debugger) in the forward pass, 31 s after entering it");
  // Stopped inside the collective every rank entered: named by its state.
  records[1] = Record("the optimizer step", 31, "stopped");
  Add(records[1], "all-reduce", 4, false);
  EXPECT_EQ(DiagnoseHang(Views(records), false),
            "rank 1 (w1): its process was stopped (SIGSTOP or a debugger) in the optimizer step, "
            "31 s after entering it");
}

TEST(HangDiagnosisTest, APipelineStageThatNeverSentIsNamed) {
  std::vector<v1::RankRecord> records(3);
  records[0] = Record("the forward pass", 40);
  records[1] = Record("the forward pass", 40);
  records[2] = Record("the forward pass", 40);
  Add(records[0], "send", 6, true, 1);
  Add(records[1], "receive", 6, true, 0);
  Add(records[1], "send", 6, true, 2);
  Add(records[2], "receive", 6, true, 1);
  // Stage 1 received #7 from stage 0 but never sent its #7 on: stage 2 waits for it.
  Add(records[0], "send", 7, true, 1);
  Add(records[1], "receive", 7, true, 0);
  Add(records[2], "receive", 7, false, 1);
  EXPECT_EQ(
      DiagnoseHang(Views(records), false),
      "rank 1 (w1) never sent message #7 to rank 2: it has been in the forward pass for 40 s");
}

TEST(HangDiagnosisTest, EveryRankInTheSameCollectiveBlamesNoRank) {
  std::vector<v1::RankRecord> records(2);
  records[0] = Record("the optimizer step", 30);
  records[1] = Record("the optimizer step", 30);
  Add(records[0], "all-reduce", 9, false);
  Add(records[1], "all-reduce", 9, false);
  EXPECT_EQ(DiagnoseHang(Views(records), false),
            "every rank entered all-reduce #9 and none finished it: no rank held the others up; "
            "suspect the network between the workers");
}

TEST(HangDiagnosisTest, AStallWithoutCollectivesNamesTheRankLongestInItsPhase) {
  std::vector<v1::RankRecord> records(1);
  records[0] = Record("data loading", 95);
  EXPECT_EQ(DiagnoseHang(Views(records), false), "");
  EXPECT_EQ(DiagnoseHang(Views(records), true),
            "rank 0 (w0): it has been in data loading for 95 s");
}

// Entered `ms_ago` before its record was read, and not ended.
void Waiting(v1::RankRecord& r, const std::string& kind, int64_t seq, int64_t ms_ago,
             int peer = -1) {
  Add(r, kind, seq, false, peer);
  r.mutable_recent(r.recent_size() - 1)->set_started_unix_ms(kRead - ms_ago);
}

TEST(HangDiagnosisTest, ARankIsSaidToHoldTheOthersUpOnlyOnceTheyHaveWaitedLongEnough) {
  // A healthy job read rank by rank: rank 0 entered all-reduce #12 4 ms before its read; rank 1,
  // read a little earlier, was still in its backward pass.
  std::vector<v1::RankRecord> records(2);
  records[0] = Record("the backward pass", 0);
  records[1] = Record("the backward pass", 0);
  Add(records[0], "all-reduce", 11, true);
  Add(records[1], "all-reduce", 11, true);
  Waiting(records[0], "all-reduce", 12, 4);
  EXPECT_EQ(DiagnoseHang(Views(records), false, absl::Seconds(1)), "");
  EXPECT_EQ(DiagnoseHang(Views(records), false),
            "rank 1 (w1) never entered all-reduce #12: it has been in the backward pass for 0 s");
  // Waited 1.5 s: held up.
  records[0].mutable_recent(1)->set_started_unix_ms(kRead - 1500);
  EXPECT_EQ(DiagnoseHang(Views(records), false, absl::Seconds(1)),
            "rank 1 (w1) never entered all-reduce #12: it has been in the backward pass for 0 s");

  // Both inside the same all-reduce for a few milliseconds: the network is not suspect yet.
  Waiting(records[1], "all-reduce", 12, 3);
  records[0].mutable_recent(1)->set_started_unix_ms(kRead - 3);
  EXPECT_EQ(DiagnoseHang(Views(records), false, absl::Seconds(1)), "");
  EXPECT_NE(DiagnoseHang(Views(records), false), "");

  // A pipeline message just awaited.
  std::vector<v1::RankRecord> stages(2);
  stages[0] = Record("the forward pass", 0);
  stages[1] = Record("the forward pass", 0);
  Waiting(stages[1], "receive", 3, 2, 0);
  EXPECT_EQ(DiagnoseHang(Views(stages), false, absl::Seconds(1)), "");
  EXPECT_EQ(DiagnoseHang(Views(stages), false),
            "rank 0 (w0) never sent message #3 to rank 1: it has been in the forward pass for 0 s");

  // A stopped process is named at once.
  records[1] = Record("the forward pass", 0, "stopped");
  Add(records[1], "all-reduce", 11, true);
  EXPECT_EQ(DiagnoseHang(Views(records), false, absl::Seconds(1)),
            "rank 1 (w1): its process was stopped (SIGSTOP or a debugger) in the forward pass, 0 s "
            "after entering it");
}

TEST(HangDiagnosisTest, MissingOrBrokenRecordsNameNothing) {
  EXPECT_EQ(DiagnoseHang({}, true), "");
  std::vector<RankView> none = {{0, "w0", nullptr}, {1, "w1", nullptr}};
  EXPECT_EQ(DiagnoseHang(none, true), "");
  v1::RankRecord broken;
  broken.set_error("flight-record: not a flight record");
  std::vector<RankView> views = {{0, "w0", &broken}};
  EXPECT_EQ(DiagnoseHang(views, true), "");
}

}  // namespace
}  // namespace trainyard
