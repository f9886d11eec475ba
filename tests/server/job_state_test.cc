#include "server/lifecycle/job_state.h"

#include "gtest/gtest.h"

namespace trainyard {
namespace {

TEST(JobStateTest, LegalPathRecordsEvents) {
  v1::Job job;
  job.set_state(v1::PENDING);
  const absl::Time t0 = absl::FromUnixMillis(1000);
  ASSERT_TRUE(TransitionJob(job, v1::SCHEDULED, "placed on w1", t0).ok());
  ASSERT_TRUE(TransitionJob(job, v1::RUNNING, "rank 0 running", t0 + absl::Seconds(1)).ok());
  auto event = TransitionJob(job, v1::SUCCEEDED, "done", t0 + absl::Seconds(5));
  ASSERT_TRUE(event.ok());
  EXPECT_EQ(event->from(), v1::RUNNING);
  EXPECT_EQ(event->to(), v1::SUCCEEDED);
  EXPECT_EQ(job.state(), v1::SUCCEEDED);
  EXPECT_EQ(job.reason(), "done");
  EXPECT_EQ(job.started_unix_ms(), 2000);
  EXPECT_EQ(job.finished_unix_ms(), 6000);
  ASSERT_EQ(job.events_size(), 3);
  EXPECT_EQ(job.events(0).reason(), "placed on w1");
  EXPECT_EQ(job.events(2).time_unix_ms(), 6000);
}

TEST(JobStateTest, IllegalTransitionsAreRefusedAndLeaveTheJobAlone) {
  v1::Job job;
  job.set_state(v1::PENDING);
  auto bad = TransitionJob(job, v1::RUNNING, "skip", absl::UnixEpoch());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(job.state(), v1::PENDING);
  EXPECT_EQ(job.events_size(), 0);

  for (v1::JobState final_state : {v1::SUCCEEDED, v1::FAILED, v1::CANCELLED}) {
    EXPECT_TRUE(IsFinalJobState(final_state));
    for (v1::JobState to : {v1::PENDING, v1::SCHEDULED, v1::RUNNING, v1::SUCCEEDED, v1::FAILED,
                            v1::CANCELLED, v1::RESTARTING}) {
      EXPECT_EQ(CheckJobTransition(final_state, to).code(), absl::StatusCode::kFailedPrecondition);
    }
  }
  EXPECT_EQ(CheckJobTransition(v1::RUNNING, v1::PENDING).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(CheckJobTransition(v1::RUNNING, v1::RESTARTING).ok());
  EXPECT_TRUE(CheckJobTransition(v1::RESTARTING, v1::PENDING).ok());
  EXPECT_TRUE(CheckJobTransition(v1::PENDING, v1::CANCELLED).ok());
  EXPECT_FALSE(IsFinalJobState(v1::RESTARTING));
}

}  // namespace
}  // namespace trainyard
