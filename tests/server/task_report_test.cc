// DecideTaskReport: what a task's new status means for its job.

#include "server/jobs/task_report.h"

#include <string>

#include "gtest/gtest.h"

namespace trainyard {
namespace {

using Kind = TaskReportOutcome::Kind;

// A job in `state` whose current attempt (generation 2) has `ranks` ranks on w1, all running.
v1::Job Attempt(v1::JobState state, int ranks) {
  v1::Job job;
  job.set_id("j-1");
  job.set_state(state);
  job.set_generation(2);
  for (int r = 0; r < ranks; ++r) {
    v1::TaskInfo* t = job.add_tasks();
    t->set_task_id("j-1.g2.r" + std::to_string(r));
    t->set_generation(2);
    t->set_rank(r);
    t->set_worker_id("w1");
    t->set_state(v1::TASK_RUNNING);
  }
  return job;
}

TEST(TaskReportTest, TheFirstRunningRankStartsTheAttempt) {
  v1::Job job = Attempt(v1::SCHEDULED, 2);
  TaskReportOutcome out = DecideTaskReport(job, job.tasks(1));
  EXPECT_EQ(out.kind, Kind::kRunning);
  EXPECT_EQ(out.reason, "rank 1 running on w1");
  EXPECT_TRUE(out.started);
  job.set_state(v1::RUNNING);
  EXPECT_EQ(DecideTaskReport(job, job.tasks(1)).kind, Kind::kRecordOnly);
}

TEST(TaskReportTest, AFailedRankEndsTheAttemptWithItsCause) {
  v1::Job job = Attempt(v1::RUNNING, 2);
  v1::TaskInfo* t = job.mutable_tasks(0);
  t->set_state(v1::TASK_EXITED);
  t->set_exit_code(2);
  t->set_message("data.train: no files");
  TaskReportOutcome out = DecideTaskReport(job, *t);
  EXPECT_EQ(out.kind, Kind::kEndAttempt);
  EXPECT_EQ(out.restart_reason, v1::FAILURE);
  EXPECT_EQ(out.reason, "rank 0 exited with code 2: data.train: no files");
}

// Killed at its memory limit: the user's error, even while a stop was asked of it, and never
// retried (the same limit would stop it again).
TEST(TaskReportTest, OutOfMemoryIsTheUsersError) {
  v1::Job job = Attempt(v1::RUNNING, 2);
  v1::TaskInfo* t = job.mutable_tasks(1);
  t->set_state(v1::TASK_EXITED);
  t->set_exit_code(137);
  t->set_signal(9);
  t->set_stop_deadline_unix_ms(1);
  t->set_out_of_memory(true);
  t->set_message("out of memory: killed at its limit of 256.0 MiB, peak 256.0 MiB");
  TaskReportOutcome out = DecideTaskReport(job, *t);
  EXPECT_EQ(out.kind, Kind::kEndAttempt);
  EXPECT_EQ(out.restart_reason, v1::OUT_OF_MEMORY);
  EXPECT_TRUE(out.user_error);
  EXPECT_EQ(out.reason,
            "rank 1 killed by signal 9 (SIGKILL): out of memory: killed at its limit of 256.0 "
            "MiB, peak 256.0 MiB");
}

TEST(TaskReportTest, WhileRestartingALaterRankMayNameTheCauseBetter) {
  v1::Job job = Attempt(v1::RESTARTING, 2);
  job.add_restarts()->set_reason(v1::INFRASTRUCTURE);  // a peer's lost connection came first
  v1::TaskInfo* t = job.mutable_tasks(1);
  t->set_state(v1::TASK_EXITED);
  t->set_exit_code(1);
  TaskReportOutcome out = DecideTaskReport(job, *t);
  EXPECT_EQ(out.kind, Kind::kRestartingTaskEnded);
  EXPECT_TRUE(out.relabel);
  EXPECT_EQ(out.restart_reason, v1::FAILURE);
  // A rank the coordinator stopped names nothing.
  t->set_state(v1::TASK_STOPPED);
  EXPECT_FALSE(DecideTaskReport(job, *t).relabel);
}

TEST(TaskReportTest, TheAttemptSucceedsWhenEveryTaskExitedZero) {
  v1::Job job = Attempt(v1::RUNNING, 2);
  job.mutable_tasks(0)->set_state(v1::TASK_EXITED);
  EXPECT_EQ(DecideTaskReport(job, job.tasks(0)).kind, Kind::kRecordOnly);
  job.mutable_tasks(1)->set_state(v1::TASK_EXITED);
  TaskReportOutcome out = DecideTaskReport(job, job.tasks(1));
  EXPECT_EQ(out.kind, Kind::kSucceeded);
  EXPECT_EQ(out.reason, "training finished: all 2 ranks exited with code 0");
}

TEST(TaskReportTest, ReportsOfAnotherAttemptChangeOnlyTheTask) {
  v1::Job job = Attempt(v1::RUNNING, 1);
  v1::TaskInfo old = job.tasks(0);
  old.set_generation(1);
  old.set_state(v1::TASK_EXITED);
  old.set_exit_code(1);
  EXPECT_EQ(DecideTaskReport(job, old).kind, Kind::kRecordOnly);
  job.set_state(v1::PENDING);  // after a restart, still generation 2
  job.mutable_tasks(0)->set_state(v1::TASK_EXITED);
  EXPECT_EQ(DecideTaskReport(job, job.tasks(0)).kind, Kind::kRecordOnly);
}

}  // namespace
}  // namespace trainyard
