// The coordinator's metrics over a real JobManager (SQLite store, fake clock): gauges agree with
// the state, counters and histograms follow the events, per-job series come and go with jobs.

#include "server/api/metrics.h"

#include <memory>
#include <regex>
#include <sstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/text_serializer.h"
#include "server/jobs/job_manager.h"
#include "tests/common/prometheus_text.h"
#include "tests/server/job_manager_fixture.h"
#include "tests/server/test_util.h"

namespace trainyard {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class MetricsTest : public JobManagerTest {
 protected:
  void SetUp() override {
    metrics_ = std::make_shared<CoordinatorMetrics>();
    JobManagerOptions options;
    options.event_sink = metrics_.get();
    Open(options);
    JobManager* m = manager_.get();
    metrics_->SetSnapshotSource([m] { return m->MetricsSnapshot(); });
  }

  // The manager goes first: metrics_, its event sink, would otherwise be destroyed before it.
  void TearDown() override { manager_.reset(); }

  std::shared_ptr<CoordinatorMetrics> metrics_;
};

TEST_F(MetricsTest, GaugesFollowTheStateAndPerJobSeriesEndWithTheJob) {
  Register("w1", 2, 4);
  std::string text = Scrape(*metrics_);
  EXPECT_EQ(Value(text, R"(trainyard_workers{state="ready"})"), 1);
  EXPECT_EQ(Value(text, R"(trainyard_slots{state="free"})"), 2);
  EXPECT_EQ(Value(text, R"(trainyard_gpus{state="free"})"), 4);
  EXPECT_EQ(Value(text, R"(trainyard_jobs{state="pending"})"), 0);

  v1::JobSpec spec = TestSpec("gpu", 1, 1, /*gpus=*/2);
  spec.mutable_checkpoint()->set_every_steps(5);
  spec.set_max_runtime_seconds(3600);
  auto job = manager_->SubmitJob(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  manager_->SubmitJob(TestSpec("waits", 1, 1, /*gpus=*/8)).IgnoreError();  // never fits
  clock_.Advance(absl::Seconds(3));
  text = Scrape(*metrics_);
  EXPECT_EQ(Value(text, R"(trainyard_jobs{state="pending"})"), 2);
  EXPECT_EQ(Value(text, "trainyard_job_submissions_total"), 2);
  EXPECT_EQ(Value(text, "trainyard_pending_oldest_age_seconds"), 3);

  manager_->Tick();
  text = Scrape(*metrics_);
  EXPECT_EQ(Value(text, R"(trainyard_jobs{state="scheduled"})"), 1);
  EXPECT_EQ(Value(text, R"(trainyard_gpus{state="used"})"), 2);
  EXPECT_EQ(Value(text, R"(trainyard_gpus{state="free"})"), 2);
  EXPECT_EQ(Value(text, "trainyard_job_scheduling_latency_seconds_count"), 1);
  EXPECT_EQ(Value(text, "trainyard_job_scheduling_latency_seconds_sum"), 3);
  EXPECT_EQ(Value(text, R"(trainyard_job_scheduling_latency_seconds_bucket{le="2.5"})"), 0);
  EXPECT_EQ(Value(text, R"(trainyard_job_scheduling_latency_seconds_bucket{le="5"})"), 1);
  const std::string id = job->id();
  EXPECT_EQ(
      Value(text, absl::StrCat(R"(trainyard_job_state{job=")", id, R"(",state="scheduled"})")), 1);
  // The job that never fits has no per-job series.
  EXPECT_THAT(text, Not(HasSubstr("waits-2\"")));

  ASSERT_TRUE(Report("w1", absl::StrCat(id, ".g1.r0"), v1::TASK_RUNNING).ok());
  v1::JobProgress progress;
  progress.set_step(10);
  progress.set_total_steps(100);
  progress.set_loss(0.5);
  progress.set_samples_per_second(1000);
  progress.set_data_wait_seconds(0.001);
  progress.set_compute_seconds(0.02);
  progress.set_communication_seconds(0.003);
  progress.set_checkpoint_seconds(0.004);
  // As a pipeline's rank 0 reports its stages (the job's spec does not matter here).
  v1::PipelineStageTime& stage = *progress.add_pipeline_stages();
  stage.set_stage(1);
  stage.set_busy_seconds(0.03);
  stage.set_idle_seconds(0.01);
  stage.set_bubble(0.25);
  stage.set_ideal_bubble(0.2);
  ASSERT_TRUE(manager_->ReportProgress(id, 1, 0, progress).ok());
  clock_.Advance(absl::Seconds(2));
  v1::CommitCheckpointRequest commit;
  commit.set_job_id(id);
  commit.set_generation(1);
  commit.set_step(10);
  ASSERT_TRUE(manager_->CommitCheckpoint(commit).ok());
  clock_.Advance(absl::Seconds(5));

  text = Scrape(*metrics_);
  const std::string job_label = absl::StrCat("{job=\"", id, "\"}");
  EXPECT_EQ(Value(text, "trainyard_job_step" + job_label), 10);
  EXPECT_EQ(Value(text, "trainyard_job_total_steps" + job_label), 100);
  EXPECT_EQ(Value(text, "trainyard_job_committed_step" + job_label), 10);
  EXPECT_EQ(Value(text, "trainyard_job_loss" + job_label), 0.5);
  EXPECT_EQ(Value(text, "trainyard_job_samples_per_second" + job_label), 1000);
  EXPECT_EQ(Value(text, absl::StrCat(R"(trainyard_job_step_time_seconds{job=")", id,
                                     R"(",phase="compute"})")),
            0.02);
  EXPECT_EQ(Value(text, absl::StrCat(R"(trainyard_job_step_time_seconds{job=")", id,
                                     R"(",phase="communication"})")),
            0.003);
  EXPECT_EQ(Value(text, absl::StrCat(R"(trainyard_pipeline_stage_seconds{job=")", id,
                                     R"(",stage="1",state="idle"})")),
            0.01);
  EXPECT_EQ(
      Value(text, absl::StrCat(R"(trainyard_pipeline_bubble_ratio{job=")", id, R"(",stage="1"})")),
      0.25);
  EXPECT_EQ(Value(text, "trainyard_pipeline_ideal_bubble_ratio" + job_label), 0.2);
  EXPECT_EQ(Value(text, "trainyard_job_last_checkpoint_age_seconds" + job_label), 5);
  EXPECT_EQ(Value(text, "trainyard_job_last_checkpoint_commit_latency_seconds" + job_label), 2);
  EXPECT_EQ(Value(text, "trainyard_checkpoint_commit_latency_seconds_count"), 1);
  EXPECT_EQ(Value(text, "trainyard_job_running_seconds" + job_label), 7);
  EXPECT_EQ(Value(text, "trainyard_job_max_runtime_seconds" + job_label), 3600);
  EXPECT_EQ(Value(text, "trainyard_job_gpus" + job_label), 2);
  // Two GPUs held for 7 s since it was placed.
  EXPECT_EQ(Value(text, "trainyard_job_gpu_seconds_total" + job_label), 14);
  EXPECT_EQ(Value(text, "trainyard_job_restarts_total" + job_label), 0);

  ASSERT_TRUE(manager_->CancelJob(id, "").ok());
  text = Scrape(*metrics_);
  EXPECT_THAT(text, Not(HasSubstr(id)));
  EXPECT_EQ(Value(text, R"(trainyard_jobs{state="cancelled"})"), 1);
  EXPECT_EQ(Value(text, R"(trainyard_jobs_finished_total{state="cancelled"})"), 1);
  // Its trainer holds the GPUs until its agent reports it stopped.
  EXPECT_EQ(Value(text, R"(trainyard_gpus{state="used"})"), 2);
  ASSERT_TRUE(Report("w1", absl::StrCat(id, ".g1.r0"), v1::TASK_STOPPED, 0, "", 15).ok());
  EXPECT_EQ(Value(Scrape(*metrics_), R"(trainyard_gpus{state="used"})"), 0);
}

TEST_F(MetricsTest, QueuesShowQuotaUseBorrowingAndPreemptions) {
  Register("w1", 2);
  v1::Queue a;
  a.set_name("team-a");
  a.set_quota_slots(1);
  a.set_borrow_slots(-1);
  a.set_quota_gpus(0);
  ASSERT_TRUE(manager_->CreateQueue(a, "root").ok());
  v1::JobSpec wide = TestSpec("wide", 2, 2);
  wide.set_queue("team-a");
  const std::string id = Submit(wide);
  manager_->Tick();
  ASSERT_EQ(Get(id).state(), v1::SCHEDULED);
  ASSERT_TRUE(Report("w1", id + ".g1.r0", v1::TASK_RUNNING).ok());
  // Another job waits in the default queue: the scheduler makes room for it next pass.
  Submit(TestSpec("waits"));
  std::string text = Scrape(*metrics_);
  EXPECT_EQ(Value(text, R"(trainyard_queue_quota{queue="team-a",resource="slots"})"), 1);
  EXPECT_EQ(Value(text, R"(trainyard_queue_used{queue="team-a",resource="slots"})"), 2);
  EXPECT_EQ(Value(text, R"(trainyard_queue_borrowed{queue="team-a",resource="slots"})"), 1);
  // The default queue's quota is what team-a's leaves: one slot.
  EXPECT_EQ(Value(text, R"(trainyard_queue_quota{queue="default",resource="slots"})"), 1);
  EXPECT_EQ(Value(text, R"(trainyard_queue_pending_jobs{queue="default"})"), 1);
  // The default queue's job is within its quota: it takes back the borrowed slot.
  manager_->Tick();
  text = Scrape(*metrics_);
  EXPECT_EQ(Value(text, R"(trainyard_queue_preemptions_total{queue="team-a"})"), 1);
  EXPECT_EQ(Value(text, R"(trainyard_queue_preemptions_total{queue="default"})"), 0);
}

TEST_F(MetricsTest, JobsByStateAddUpToSubmissions) {
  Register("w1", 1);
  for (int i = 0; i < 4; ++i) manager_->SubmitJob(TestSpec("j")).IgnoreError();
  manager_->Tick();
  const std::string text = Scrape(*metrics_);
  double sum = 0;
  for (const char* state :
       {"pending", "scheduled", "running", "restarting", "succeeded", "failed", "cancelled"}) {
    const double v = Value(text, absl::StrCat(R"(trainyard_jobs{state=")", state, "\"}"));
    ASSERT_FALSE(std::isnan(v)) << state;
    sum += v;
  }
  EXPECT_EQ(sum, 4);
  EXPECT_EQ(Value(text, "trainyard_job_submissions_total"), 4);
}

TEST_F(MetricsTest, LostWorkerIsCounted) {
  Register("w1", 1);
  clock_.Advance(absl::Seconds(11));
  manager_->Tick();
  const std::string text = Scrape(*metrics_);
  EXPECT_EQ(Value(text, "trainyard_workers_lost_total"), 1);
  EXPECT_EQ(Value(text, R"(trainyard_workers{state="lost"})"), 1);
  EXPECT_EQ(Value(text, R"(trainyard_slots{state="free"})"), 0);
}

TEST_F(MetricsTest, WorkersHeldByAMassLossAreUnreachableNotLost) {
  Register("w1", 1);
  Register("w2", 1);
  EXPECT_EQ(Value(Scrape(*metrics_), "trainyard_workers_unreachable"), 0);
  clock_.Advance(absl::Seconds(11));  // both leases at once
  manager_->Tick();
  const std::string text = Scrape(*metrics_);
  EXPECT_EQ(Value(text, "trainyard_workers_unreachable"), 2);
  EXPECT_EQ(Value(text, "trainyard_workers_lost_total"), 0);
  EXPECT_EQ(Value(text, R"(trainyard_workers{state="ready"})"), 0);
  EXPECT_EQ(Value(text, R"(trainyard_workers{state="unreachable"})"), 2);
  EXPECT_EQ(Value(text, R"(trainyard_slots{state="free"})"), 0);
}

TEST(CoordinatorMetricsTest, TasksOutOfMemoryAreCountedByRole) {
  CoordinatorMetrics metrics;
  EXPECT_EQ(Value(Scrape(metrics), R"(trainyard_tasks_out_of_memory_total{role="rank"})"), 0);
  EXPECT_EQ(Value(Scrape(metrics), R"(trainyard_tasks_out_of_memory_total{role="shard"})"), 0);
  v1::Job job;
  job.set_id("j-1");
  v1::TaskInfo task;
  task.set_out_of_memory(true);
  metrics.OnTaskOutOfMemory(job, task);
  task.set_role(v1::TASK_ROLE_SHARD);
  metrics.OnTaskOutOfMemory(job, task);
  metrics.OnTaskOutOfMemory(job, task);
  const std::string text = Scrape(metrics);
  EXPECT_EQ(Value(text, R"(trainyard_tasks_out_of_memory_total{role="rank"})"), 1);
  EXPECT_EQ(Value(text, R"(trainyard_tasks_out_of_memory_total{role="shard"})"), 2);
}

TEST(CoordinatorMetricsTest, RestartsArePresentAtZeroAndCountedByReason) {
  CoordinatorMetrics metrics;
  std::string text = Scrape(metrics);
  for (const char* reason : {"preempted", "worker_lost", "hang", "infrastructure", "failure"}) {
    EXPECT_EQ(Value(text, absl::StrCat(R"(trainyard_restarts_total{reason=")", reason, "\"}")), 0)
        << reason;
  }
  EXPECT_EQ(Value(text, R"(trainyard_preemptions_total{reason="cloud_notice"})"), 0);
  EXPECT_EQ(Value(text, R"(trainyard_restart_recovery_phase_seconds_count{phase="rendezvous"})"),
            0);

  v1::Job job;
  job.set_id("j-1");
  v1::Restart preempted;
  preempted.set_reason(v1::PREEMPTED);
  preempted.set_message("preemption notice for worker w2 (SIGTERM): rank 1 exited with code 143");
  metrics.OnRestart(job, preempted);
  // The task's reason after the notice may name a signal too: only the notice's source counts.
  preempted.set_message(
      "preemption notice for worker w3 (gce): rank 0 killed by signal 15 (SIGTERM)");
  metrics.OnRestart(job, preempted);
  v1::Restart lost;
  lost.set_reason(v1::WORKER_LOST);
  metrics.OnRestart(job, lost);
  lost.set_recovered(true);
  lost.set_steps_lost(20);
  lost.set_recovery_seconds(4);
  lost.set_rendezvous_seconds(0.5);
  metrics.OnRecovered(job, lost);
  text = Scrape(metrics);
  EXPECT_EQ(Value(text, R"(trainyard_restarts_total{reason="preempted"})"), 2);
  EXPECT_EQ(Value(text, R"(trainyard_preemptions_total{reason="cloud_notice"})"), 1);
  EXPECT_EQ(Value(text, R"(trainyard_restarts_total{reason="worker_lost"})"), 1);
  EXPECT_EQ(Value(text, R"(trainyard_preemptions_total{reason="termination_signal"})"), 1);
  EXPECT_EQ(Value(text, "trainyard_restart_lost_steps_total"), 20);
  EXPECT_EQ(Value(text, "trainyard_restart_recovery_seconds_count"), 1);
  EXPECT_EQ(Value(text, "trainyard_restart_recovery_seconds_sum"), 4);
  EXPECT_EQ(Value(text, R"(trainyard_restart_recovery_phase_seconds_sum{phase="rendezvous"})"),
            0.5);
}

TEST(CoordinatorMetricsTest, CommitThatOvertakesProgressReportsIsTimedAtTheStepRate) {
  CoordinatorMetrics metrics;
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  metrics.OnProgress("j-1", 100, t0);
  metrics.OnProgress("j-1", 200, t0 + absl::Seconds(1));
  // 100 steps a second: step 250 was reached at t0 + 1.5 s.
  metrics.OnCheckpointCommitted("j-1", 250, t0 + absl::Seconds(3), absl::InfinitePast());
  const std::string text = Scrape(metrics);
  EXPECT_EQ(Value(text, "trainyard_checkpoint_commit_latency_seconds_count"), 1);
  EXPECT_DOUBLE_EQ(Value(text, "trainyard_checkpoint_commit_latency_seconds_sum"), 1.5);
}

TEST(CoordinatorMetricsTest, CommitLatencyRunsFromTheTrainersSnapshot) {
  CoordinatorMetrics metrics;
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  metrics.OnProgress("j-1", 100, t0);
  metrics.OnCheckpointCommitted("j-1", 100, t0 + absl::Milliseconds(2750),
                                t0 + absl::Milliseconds(500));
  const std::string text = Scrape(metrics);
  EXPECT_EQ(Value(text, "trainyard_checkpoint_commit_latency_seconds_count"), 1);
  EXPECT_DOUBLE_EQ(Value(text, "trainyard_checkpoint_commit_latency_seconds_sum"), 2.25);
}

TEST(CoordinatorMetricsTest, ReasonLabels) {
  EXPECT_EQ(PreemptionReasonLabel("preemption notice for worker w (gce): rank 0 ..."),
            "cloud_notice");
  EXPECT_EQ(PreemptionReasonLabel("preemption notice for worker w (aws): rank 0 ..."),
            "cloud_notice");
  EXPECT_EQ(PreemptionReasonLabel("preemption notice for worker w (SIGTERM): rank 0 ..."),
            "termination_signal");
  EXPECT_EQ(PreemptionReasonLabel("rank 0 lost: worker w lost"), "other");
}

}  // namespace
}  // namespace trainyard
