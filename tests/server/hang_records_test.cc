// The JobManager's use of the ranks' flight records: a hang's diagnosis on the restart, and
// `trainyard debug`'s asks to the agents.

#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/jobs/job_manager.h"
#include "tests/server/job_manager_fixture.h"

namespace trainyard {
namespace {

using ::testing::HasSubstr;

// A record read at `read_ms` of a rank `seconds` into `phase`, its newest collective all-reduce
// #`last` (ended unless `waiting`).
v1::RankRecord Record(const std::string& phase, int64_t read_ms, int64_t seconds, int64_t last,
                      bool waiting) {
  v1::RankRecord r;
  r.set_phase(phase);
  r.set_read_unix_ms(read_ms);
  r.set_phase_since_unix_ms(read_ms - seconds * 1000);
  r.set_process_state("sleeping");
  v1::CollectiveRecord* c = r.add_recent();
  c->set_kind("all-reduce");
  c->set_seq(last);
  c->set_peer(-1);
  c->set_started_unix_ms(read_ms - 1000);
  c->set_ended_unix_ms(waiting ? 0 : read_ms - 900);
  c->set_failed(waiting);
  return r;
}

class HangRecordsTest : public JobManagerTest {
 protected:
  // A 2-rank job running on w1 and w2: its id, and each rank's worker and task.
  struct Running {
    std::string id;
    std::string worker[2];
    std::string task[2];
  };
  Running Start() {
    Register("w1", 1);
    Register("w2", 1);
    Running out;
    out.id = Submit(TestSpec("dp", 2, 2));
    manager_->Tick();
    for (const std::string w : {"w1", "w2"}) {
      v1::SyncResponse s = Sync(w);
      EXPECT_EQ(s.tasks_size(), 1);
      if (s.tasks_size() != 1) continue;
      out.worker[s.tasks(0).rank()] = w;
      out.task[s.tasks(0).rank()] = s.tasks(0).task_id();
    }
    for (int r : {0, 1}) EXPECT_TRUE(Report(out.worker[r], out.task[r], v1::TASK_RUNNING).ok());
    return out;
  }

  absl::Status Ended(const std::string& worker, const std::string& task, v1::TaskState state,
                     int exit_code, int signal, const v1::RankRecord& record) {
    v1::TaskStatus status;
    status.set_task_id(task);
    status.set_state(state);
    status.set_exit_code(exit_code);
    status.set_signal(signal);
    status.set_message(exit_code == 3 ? "all-reduce: no progress within the collective timeout"
                                      : "");
    *status.mutable_record() = record;
    return manager_->ReportTaskStatus(worker, status);
  }
};

TEST_F(HangRecordsTest, ATimedOutCollectiveNamesTheRankThatNeverEnteredIt) {
  const Running job = Start();
  const int64_t now = absl::ToUnixMillis(clock_.Now());
  ASSERT_TRUE(Ended(job.worker[0], job.task[0], v1::TASK_EXITED, 3, 0,
                    Record("the optimizer step", now, 5, 12, true))
                  .ok());
  EXPECT_EQ(Get(job.id).state(), v1::RESTARTING);
  // Killed by its agent, which read its record first.
  ASSERT_TRUE(Ended(job.worker[1], job.task[1], v1::TASK_STOPPED, 137, 9,
                    Record("data loading", now, 7, 11, false))
                  .ok());
  const v1::Job after = Get(job.id);
  ASSERT_EQ(after.restarts_size(), 1);
  EXPECT_EQ(after.restarts(0).reason(), v1::INFRASTRUCTURE);
  const std::string expected = absl::StrCat("rank 1 (", job.worker[1],
                                            ") never entered all-reduce #12: it has been in data "
                                            "loading for 7 s");
  EXPECT_EQ(after.restarts(0).diagnosis(), expected);
  bool event = false;
  for (const v1::JobEvent& e : after.events()) event |= e.reason() == "diagnosis: " + expected;
  EXPECT_TRUE(event) << after.DebugString();
  // Kept with the job: a coordinator restart shows it too.
  Reopen();
  EXPECT_EQ(Get(job.id).restarts(0).diagnosis(), expected);
}

TEST_F(HangRecordsTest, AStallNamesTheRankLongestInItsPhase) {
  Register("w1", 1);
  v1::JobSpec spec = TestSpec("stalls");
  spec.set_stall_timeout_seconds(30);
  const std::string id = Submit(spec);
  manager_->Tick();
  const std::string task = id + ".g1.r0";
  ASSERT_TRUE(Report("w1", task, v1::TASK_RUNNING).ok());
  v1::JobProgress progress;
  progress.set_step(5);
  ASSERT_TRUE(manager_->ReportProgress(id, 1, 0, progress).ok());
  clock_.Advance(absl::Seconds(31));
  Sync("w1");
  manager_->Tick();
  ASSERT_EQ(Get(id).state(), v1::RESTARTING);
  // Its agent read the record before it stopped the rank: 31 s in its data read.
  const int64_t now = absl::ToUnixMillis(clock_.Now());
  v1::RankRecord record = Record("data loading", now, 31, 20, false);
  v1::TaskStatus status;
  status.set_task_id(task);
  status.set_state(v1::TASK_STOPPED);
  status.set_signal(15);
  *status.mutable_record() = record;
  ASSERT_TRUE(manager_->ReportTaskStatus("w1", status).ok());
  const v1::Job job = Get(id);
  ASSERT_EQ(job.restarts_size(), 1);
  EXPECT_EQ(job.restarts(0).reason(), v1::HANG);
  EXPECT_EQ(job.restarts(0).diagnosis(), "rank 0 (w1): it has been in data loading for 31 s");
}

TEST_F(HangRecordsTest, AFailureOfTheUsersCodeGetsNoDiagnosis) {
  const Running job = Start();
  const int64_t now = absl::ToUnixMillis(clock_.Now());
  // Exit 1 (a bug in the user's model, say): max_failures 0 ends the job; nothing is diagnosed.
  ASSERT_TRUE(Ended(job.worker[0], job.task[0], v1::TASK_EXITED, 1, 0,
                    Record("the forward pass", now, 1, 3, false))
                  .ok());
  ASSERT_TRUE(Ended(job.worker[1], job.task[1], v1::TASK_STOPPED, 137, 9,
                    Record("data loading", now, 7, 2, false))
                  .ok());
  const v1::Job after = Get(job.id);
  EXPECT_EQ(after.state(), v1::FAILED) << after.reason();
  for (const v1::Restart& r : after.restarts()) EXPECT_EQ(r.diagnosis(), "");
}

TEST_F(HangRecordsTest, DebugAsksEachWorkerOnItsSyncAndGathersTheRecords) {
  const Running job = Start();
  const uint64_t known[2] = {Sync(job.worker[0]).version(), Sync(job.worker[1]).version()};
  absl::StatusOr<v1::DebugJobResponse> debug;
  std::thread asker([&] { debug = manager_->DebugJob(job.id, true, absl::Seconds(60)); });
  const int64_t now = absl::ToUnixMillis(clock_.Now());
  for (int r : {0, 1}) {
    // The ask wakes the worker's long poll and rides on its answer until answered.
    v1::SyncResponse s = Sync(job.worker[r], known[r], 60000);
    ASSERT_EQ(s.debug_asks_size(), 1) << s.DebugString();
    EXPECT_TRUE(s.debug_asks(0).stacks());
    ASSERT_EQ(s.debug_asks(0).task_ids_size(), 1);
    EXPECT_EQ(s.debug_asks(0).task_ids(0), job.task[r]);
    v1::ReportDebugRequest answer;
    answer.set_worker_id(job.worker[r]);
    answer.set_ask_id(s.debug_asks(0).ask_id());
    v1::TaskRecord* t = answer.add_tasks();
    t->set_task_id(job.task[r]);
    *t->mutable_record() = r == 0 ? Record("the optimizer step", now, 40, 9, true)
                                  : Record("the forward pass", now, 41, 8, false);
    // Only the worker asked may answer for its tasks.
    v1::ReportDebugRequest stranger = answer;
    stranger.set_worker_id("w9");
    EXPECT_EQ(manager_->ReportDebug(stranger).code(), absl::StatusCode::kPermissionDenied);
    ASSERT_TRUE(manager_->ReportDebug(answer).ok());
    EXPECT_EQ(Sync(job.worker[r], s.version()).debug_asks_size(), 0);  // answered: not again
  }
  asker.join();
  ASSERT_TRUE(debug.ok()) << debug.status();
  ASSERT_EQ(debug->ranks_size(), 2);
  for (const v1::RankDebug& rank : debug->ranks()) {
    EXPECT_TRUE(rank.has_record()) << rank.DebugString();
    EXPECT_EQ(rank.worker_id(), job.worker[rank.rank()]);
  }
  EXPECT_EQ(
      debug->diagnosis(),
      absl::StrCat("rank 1 (", job.worker[1],
                   ") never entered all-reduce #9: it has been in the forward pass for 41 s"));
  // Over: a late answer is refused.
  v1::ReportDebugRequest late;
  late.set_worker_id(job.worker[0]);
  late.set_ask_id("debug-1");
  EXPECT_EQ(manager_->ReportDebug(late).code(), absl::StatusCode::kNotFound);
}

TEST_F(HangRecordsTest, DebugSaysWhichWorkersDidNotAnswer) {
  const Running job = Start();
  absl::StatusOr<v1::DebugJobResponse> debug =
      manager_->DebugJob(job.id, false, absl::Milliseconds(200));
  ASSERT_TRUE(debug.ok()) << debug.status();
  ASSERT_EQ(debug->ranks_size(), 2);
  for (const v1::RankDebug& rank : debug->ranks()) {
    EXPECT_FALSE(rank.has_record());
    EXPECT_EQ(rank.error(),
              absl::StrCat("worker ", rank.worker_id(), " did not answer within 200ms"));
  }
  EXPECT_EQ(debug->diagnosis(), "");
  EXPECT_EQ(manager_->DebugJob("nope-1", false, absl::Seconds(1)).status().code(),
            absl::StatusCode::kNotFound);
  const std::string pending = Submit(TestSpec("waits", 3, 3));
  absl::StatusOr<v1::DebugJobResponse> none = manager_->DebugJob(pending, false, absl::Seconds(1));
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(none.status().message(), HasSubstr("no rank of it runs now"));
}

}  // namespace
}  // namespace trainyard
