// The JobManager's restart policy: lost workers, hangs, preemption notices, failures and their
// budgets, backoff, recovery records, fencing of old attempts.

#include <signal.h>

#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/exit_codes.h"
#include "common/restart_reason.h"
#include "common/spec/job_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/jobs/restart_policy.h"
#include "tests/server/job_manager_fixture.h"

namespace trainyard {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

class RecoveryTest : public JobManagerTest {
 protected:
  // Places `id` (all workers given keep their leases) and reports every rank running. Returns
  // the worker of each rank.
  std::vector<std::string> Start(const std::string& id) {
    manager_->Tick();
    const v1::Job job = Get(id);
    EXPECT_EQ(job.state(), v1::SCHEDULED) << job.reason();
    std::vector<std::string> workers;
    for (const v1::TaskInfo& t : job.tasks()) {
      if (t.generation() != job.generation()) continue;
      EXPECT_TRUE(Report(t.worker_id(), t.task_id(), v1::TASK_RUNNING).ok());
      workers.push_back(t.worker_id());
    }
    EXPECT_EQ(Get(id).state(), v1::RUNNING);
    return workers;
  }

  std::string TaskOf(const std::string& id, int rank) {
    const v1::Job job = Get(id);
    return absl::StrCat(id, ".g", job.generation(), ".r", rank);
  }

  absl::Status Progress(const std::string& id, int64_t generation, int64_t step,
                        int64_t start_step = 0) {
    v1::JobProgress progress;
    progress.set_step(step);
    progress.set_attempt_start_step(start_step);
    progress.set_rendezvous_seconds(0.25);
    progress.set_checkpoint_load_seconds(0.5);
    return manager_->ReportProgress(id, generation, 0, progress);
  }

  absl::Status Commit(const std::string& id, int64_t generation, int64_t step) {
    v1::CommitCheckpointRequest request;
    request.set_job_id(id);
    request.set_generation(generation);
    request.set_step(step);
    return manager_->CommitCheckpoint(request).status();
  }

  // Lets the restart backoff pass (the clock moves by exactly the backoff drawn).
  void PassBackoff(const std::string& id) {
    const v1::Job job = Get(id);
    ASSERT_EQ(job.state(), v1::PENDING) << job.reason();
    clock_.Advance(absl::Milliseconds(job.restarts(job.restarts_size() - 1).backoff_ms()));
  }

  // Renews every lease but `except`'s.
  void KeepAlive(const std::vector<std::string>& workers, const std::string& except = "") {
    for (const std::string& w : workers) {
      if (w != except) Sync(w);
    }
  }
};

TEST(RestartPolicyTest, ClassifiesHowARankEnded) {
  v1::TaskInfo t;
  t.set_state(v1::TASK_EXITED);
  t.set_exit_code(2);
  EXPECT_EQ(ClassifyTaskEnd(t), v1::FAILURE);
  t.set_exit_code(kExitInfrastructure);
  EXPECT_EQ(ClassifyTaskEnd(t), v1::INFRASTRUCTURE);
  t.set_exit_code(kExitStoppedBySignal);
  EXPECT_EQ(ClassifyTaskEnd(t), v1::INFRASTRUCTURE);
  t.set_stop_deadline_unix_ms(1);  // told to save for a preemption: however it ends
  EXPECT_EQ(ClassifyTaskEnd(t), v1::PREEMPTED);
  t.set_stop_deadline_unix_ms(0);
  t.set_state(v1::TASK_FAILED_TO_START);
  EXPECT_EQ(ClassifyTaskEnd(t), v1::FAILURE);
  t.set_state(v1::TASK_STOPPED);
  EXPECT_EQ(ClassifyTaskEnd(t), v1::INFRASTRUCTURE);
  EXPECT_LT(CauseRank(v1::INFRASTRUCTURE), CauseRank(v1::FAILURE));
  EXPECT_LT(CauseRank(v1::FAILURE), CauseRank(v1::WORKER_LOST));
}

TEST(RestartPolicyTest, BackoffGrowsWithRestartsInARowThatMadeNoProgress) {
  v1::Job job;
  job.add_restarts();
  EXPECT_EQ(RestartBackoff(job, absl::Seconds(1), absl::Seconds(60), 1.0), absl::Seconds(1));
  job.add_restarts();
  job.add_restarts();
  EXPECT_EQ(RestartBackoff(job, absl::Seconds(1), absl::Seconds(60), 1.0), absl::Seconds(4));
  EXPECT_EQ(RestartBackoff(job, absl::Seconds(1), absl::Seconds(60), 0.5), absl::Seconds(2));
  for (int i = 0; i < 10; ++i) job.add_restarts();
  EXPECT_EQ(RestartBackoff(job, absl::Seconds(1), absl::Seconds(60), 1.0), absl::Seconds(60));
  // An attempt that got to a step starts the count again.
  job.mutable_restarts(job.restarts_size() - 2)->set_recovered(true);
  EXPECT_EQ(RestartBackoff(job, absl::Seconds(1), absl::Seconds(60), 1.0), absl::Seconds(1));
  EXPECT_EQ(RestartBackoff(job, absl::ZeroDuration(), absl::Seconds(60), 1.0),
            absl::ZeroDuration());
}

TEST(RestartPolicyTest, AnAttemptThatGotFurtherRestartsAtOnce) {
  v1::Job job;
  for (int i = 0; i < 5; ++i) job.add_restarts();
  job.mutable_progress()->set_attempt_start_step(100);
  job.mutable_progress()->set_step(100);  // resumed, not one step further
  EXPECT_EQ(RestartBackoff(job, absl::Seconds(1), absl::Seconds(60), 1.0), absl::Seconds(16));
  job.mutable_progress()->set_step(101);
  // The progress of an earlier attempt: the one that ended never reported.
  EXPECT_EQ(RestartBackoff(job, absl::Seconds(1), absl::Seconds(60), 1.0), absl::Seconds(16));
  job.mutable_restarts(3)->set_recovered(true);
  EXPECT_EQ(RestartBackoff(job, absl::Seconds(1), absl::Seconds(60), 1.0), absl::ZeroDuration());
  v1::Job first;  // the first attempt's own progress
  first.add_restarts();
  first.mutable_progress()->set_step(3);
  EXPECT_EQ(RestartBackoff(first, absl::Seconds(1), absl::Seconds(60), 1.0), absl::ZeroDuration());
}

TEST(RestartPolicyTest, BudgetSpentNamesTheBudgetAndCountsDroppedRecords) {
  v1::Job job;
  job.mutable_spec()->mutable_restart()->set_max_failures(2);
  job.add_restarts()->set_reason(v1::FAILURE);
  EXPECT_FALSE(BudgetSpent(job, v1::FAILURE, 1).has_value());
  job.set_dropped_failure_restarts(1);
  EXPECT_EQ(BudgetSpent(job, v1::FAILURE, 1), " (3 failures; restart.max_failures is 2)");
  EXPECT_FALSE(BudgetSpent(job, v1::PREEMPTED, 1).has_value());  // unlimited by default
  job.mutable_spec()->mutable_restart()->set_max_failures(0);
  job.clear_restarts();
  job.set_dropped_failure_restarts(0);
  EXPECT_EQ(BudgetSpent(job, v1::FAILURE, 1), "");  // the cause says it all
}

TEST_F(RecoveryTest, LostWorkerRestartsTheGangFromTheCommittedStep) {
  Register("w1", 1);
  Register("w2", 1);
  Register("w3", 1);
  const std::string id = Submit(TestSpec("dp", 2, 2));
  const std::vector<std::string> workers = Start(id);
  ASSERT_THAT(workers, SizeIs(2));
  ASSERT_TRUE(Progress(id, 1, 10).ok());
  ASSERT_TRUE(Commit(id, 1, 10).ok());
  ASSERT_TRUE(Progress(id, 1, 14).ok());

  // Rank 1's machine vanishes: its lease runs out.
  const std::string dead = workers[1];
  const std::string survivor = workers[0];
  clock_.Advance(absl::Seconds(6));
  KeepAlive({"w1", "w2", "w3"}, dead);
  clock_.Advance(absl::Seconds(4));
  manager_->Tick();
  v1::Job job = Get(id);
  ASSERT_EQ(job.state(), v1::RESTARTING) << job.reason();
  ASSERT_EQ(job.restarts_size(), 1);
  EXPECT_EQ(job.restarts(0).reason(), v1::WORKER_LOST);
  EXPECT_EQ(job.restarts(0).generation(), 1);
  EXPECT_EQ(job.restarts(0).last_step(), 14);
  EXPECT_THAT(job.reason(), HasSubstr("restarting (worker_lost): rank 1 lost"));
  // The surviving rank leaves its worker's desired state and is to be killed at once (its gang
  // can neither save nor step), and the job waits for it before the next attempt.
  v1::SyncResponse told = Sync(survivor);
  EXPECT_THAT(told.tasks(), IsEmpty());
  EXPECT_THAT(told.kill_task_ids(), ElementsAre(id + ".g1.r0"));
  manager_->Tick();
  EXPECT_EQ(Get(id).state(), v1::RESTARTING);
  // Its last word: it had completed step 15, which the progress reports had not yet said.
  v1::TaskStatus last_word;
  last_word.set_task_id(id + ".g1.r0");
  last_word.set_state(v1::TASK_STOPPED);
  last_word.set_signal(9);
  last_word.set_last_step(15);
  ASSERT_TRUE(manager_->ReportTaskStatus(survivor, last_word).ok());
  EXPECT_THAT(Sync(survivor).kill_task_ids(), IsEmpty());
  job = Get(id);
  ASSERT_EQ(job.state(), v1::PENDING) << job.reason();
  EXPECT_EQ(job.restarts(0).last_step(), 15);
  // The attempt got further than it started: no backoff.
  EXPECT_EQ(job.restarts(0).backoff_ms(), 0);

  PassBackoff(id);
  KeepAlive({survivor, "w3"});
  Start(id);
  job = Get(id);
  EXPECT_EQ(job.generation(), 2);
  for (const v1::TaskInfo& t : job.tasks()) {
    if (t.generation() == 2) {
      EXPECT_NE(t.worker_id(), dead);
    }
  }
  auto task = manager_->TaskFor(id + ".g2.r0");
  ASSERT_TRUE(task.ok());
  ASSERT_THAT(task->resume_checkpoints(), SizeIs(1));
  EXPECT_THAT(task->resume_checkpoints(0), HasSubstr("step-000000000010"));

  // A trainer of the old attempt that comes back late is refused.
  absl::Status stale = Progress(id, 1, 15);
  EXPECT_EQ(stale.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(stale.message(), HasSubstr("stale generation 1, current 2"));
  EXPECT_EQ(Commit(id, 1, 15).code(), absl::StatusCode::kFailedPrecondition);

  // The new attempt's first step completes the restart's record.
  clock_.Advance(absl::Seconds(2));
  ASSERT_TRUE(Progress(id, 2, 11, /*start_step=*/10).ok());
  job = Get(id);
  const v1::Restart& r = job.restarts(0);
  EXPECT_TRUE(r.recovered());
  EXPECT_EQ(r.resumed_step(), 10);
  EXPECT_EQ(r.steps_lost(), 5);
  EXPECT_DOUBLE_EQ(r.detection_seconds(), 10.0);
  EXPECT_DOUBLE_EQ(r.rendezvous_seconds(), 0.25);
  EXPECT_DOUBLE_EQ(r.checkpoint_load_seconds(), 0.5);
  // On the fake clock: scheduled when the backoff passed, running at once, the first step 2 s
  // later, of which the trainer spent 0.75 s meeting its peers and loading the checkpoint.
  const double backoff_seconds = static_cast<double>(r.backoff_ms()) / 1000;
  EXPECT_DOUBLE_EQ(r.scheduling_seconds(), backoff_seconds);
  EXPECT_DOUBLE_EQ(r.start_seconds(), 0.0);
  EXPECT_DOUBLE_EQ(r.first_step_seconds(), 1.25);
  EXPECT_DOUBLE_EQ(r.recovery_seconds(), backoff_seconds + 2.0);
  EXPECT_THAT(job.events(job.events_size() - 1).reason(),
              HasSubstr("recovered from worker_lost: attempt 2 resumed at step 10, 5 steps lost"));
}

// A host cut off by a lease stream that broke: lost after the stream grace, not the Sync
// timeout; back, it registers again and the ranks it still runs of the ended attempt are killed
// at once, so that they write nothing.
TEST_F(RecoveryTest, AWorkerWhoseLeaseStreamBrokeIsLostAtOnceAndItsOldRanksKilledOnReturn) {
  Register("w1", 1);
  Register("w2", 1);
  Register("w3", 1);
  LeaseTicket registration[3];
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<LeaseTicket> r = manager_->OpenLease(absl::StrCat("w", i + 1));
    ASSERT_TRUE(r.ok()) << r.status();
    registration[i] = *r;
  }
  const std::string id = Submit(TestSpec("dp", 2, 2));
  const std::vector<std::string> workers = Start(id);
  ASSERT_TRUE(Progress(id, 1, 5).ok());
  const std::string cut = workers[1];
  const int index = cut[1] - '1';
  manager_->CloseLease(cut, registration[index]);
  clock_.Advance(absl::Milliseconds(499));
  manager_->Tick();
  EXPECT_EQ(Get(id).state(), v1::RUNNING);
  clock_.Advance(absl::Milliseconds(1));
  manager_->Tick();
  v1::Job job = Get(id);
  ASSERT_EQ(job.state(), v1::RESTARTING) << job.reason();
  EXPECT_THAT(job.restarts(0).message(), HasSubstr("its connection broke"));
  EXPECT_THAT(Sync(workers[0]).kill_task_ids(), ElementsAre(TaskOf(id, 0)));

  // The host comes back still running its rank of generation 1.
  v1::RegisterWorkerRequest again;
  again.set_name(cut);
  again.set_slots(1);
  v1::TaskStatus running;
  running.set_task_id(absl::StrCat(id, ".g1.r1"));
  running.set_state(v1::TASK_RUNNING);
  *again.add_tasks() = running;
  ASSERT_TRUE(manager_->RegisterWorker(again).ok());
  EXPECT_THAT(Sync(cut).kill_task_ids(), ElementsAre(absl::StrCat(id, ".g1.r1")));
  running.set_state(v1::TASK_STOPPED);
  running.set_signal(9);
  ASSERT_TRUE(manager_->ReportTaskStatus(cut, running).ok());
  EXPECT_THAT(Sync(cut).kill_task_ids(), IsEmpty());
}

// A busy host that goes quiet (cut off or frozen: no reset, and its connection is pinged only
// after a long silence) is found by its agent's beats: its stream is ended a beat timeout (1.5 s)
// after its last beat, the idle agent is asked for a word (its long poll answered), and with its
// answer the quiet one is lost a stream grace later; the agents that beat or answered are not.
TEST_F(RecoveryTest, ABusyWorkerWhoseBeatsStopIsLostOnceTheOthersAnswer) {
  std::map<std::string, int> ended;
  std::map<std::string, LeaseTicket> tickets;
  for (const std::string id : {"w1", "w2", "w3"}) {
    Register(id, 1);
    absl::StatusOr<LeaseTicket> ticket =
        manager_->OpenLease(id, /*beats=*/true, [&ended, id] { ++ended[id]; });
    ASSERT_TRUE(ticket.ok()) << ticket.status();
    tickets[id] = *ticket;
  }
  ASSERT_EQ(manager_->BeatInterval(), absl::Milliseconds(500));
  const std::string id = Submit(TestSpec("dp", 2, 2));
  const std::vector<std::string> workers = Start(id);
  const std::string beating = workers[0];
  const std::string quiet = workers[1];
  std::string idle;
  for (const std::string w : {"w1", "w2", "w3"}) {
    if (w != beating && w != quiet) idle = w;
  }
  auto beat = [&](const std::string& w) { manager_->LeaseBeat(w, tickets[w]); };
  absl::Time last_beat;
  for (int i = 0; i < 4; ++i) {
    clock_.Advance(absl::Milliseconds(500));
    beat(beating);
    if (i < 2) {
      beat(quiet);  // its last beat, 1 s in
      last_beat = clock_.Now();
    }
    manager_->Tick();
  }
  // 1 s after its last beat: two beats late, not yet a loss.
  EXPECT_EQ(Get(id).state(), v1::RUNNING);
  EXPECT_EQ(ended[quiet], 0);
  clock_.Advance(absl::Milliseconds(500));
  beat(beating);
  manager_->Tick();
  EXPECT_EQ(ended[quiet], 1);
  // Asked for a word, the idle agent has not answered yet: no decision.
  clock_.Advance(absl::Milliseconds(500));
  beat(beating);
  manager_->Tick();
  EXPECT_EQ(Get(id).state(), v1::RUNNING);
  // Its answer: the probe answered its long poll (a new version), and its next Sync is the word.
  Sync(idle);
  manager_->Tick();
  v1::Job job = Get(id);
  ASSERT_EQ(job.state(), v1::RESTARTING) << job.reason();
  EXPECT_THAT(job.restarts(0).message(), HasSubstr("no word from its agent"));
  EXPECT_THAT(job.restarts(0).message(), HasSubstr(quiet));
  // It failed after its last beat: the record's detection counts from there.
  EXPECT_EQ(job.restarts(0).failed_unix_ms(), absl::ToUnixMillis(last_beat));
  EXPECT_EQ(ended[beating], 0);
  EXPECT_EQ(ended[idle], 0);
}

TEST_F(RecoveryTest, InfrastructureErrorOfAPeerIsBlamedOnTheLostWorker) {
  Register("w1", 1);
  Register("w2", 1);
  const std::string id = Submit(TestSpec("dp", 2, 2));
  const std::vector<std::string> workers = Start(id);
  // Rank 0 sees its peer's connection drop before rank 1's lease runs out.
  ASSERT_TRUE(Report(workers[0], TaskOf(id, 0), v1::TASK_EXITED, 3, "peer lost").ok());
  v1::Job job = Get(id);
  ASSERT_EQ(job.state(), v1::RESTARTING);
  EXPECT_EQ(job.restarts(0).reason(), v1::INFRASTRUCTURE);
  clock_.Advance(absl::Seconds(10));
  KeepAlive({workers[0]});
  manager_->Tick();
  job = Get(id);
  ASSERT_EQ(job.state(), v1::PENDING) << job.reason();
  EXPECT_EQ(job.restarts(0).reason(), v1::WORKER_LOST);
  // Detected when the lease ran out, 10 s after the peer's last heartbeat.
  EXPECT_EQ(job.restarts(0).detected_unix_ms() - job.restarts(0).failed_unix_ms(), 10000);
}

TEST_F(RecoveryTest, FailuresDrawOnMaxFailures) {
  Register("w1", 1);
  v1::JobSpec spec = TestSpec("broken");
  spec.mutable_restart()->set_max_failures(1);
  const std::string id = Submit(spec);
  Start(id);
  ASSERT_TRUE(Report("w1", TaskOf(id, 0), v1::TASK_EXITED, 1, "std::bad_alloc").ok());
  v1::Job job = Get(id);
  ASSERT_EQ(job.state(), v1::PENDING) << job.reason();
  EXPECT_EQ(job.restarts(0).reason(), v1::FAILURE);
  PassBackoff(id);
  Sync("w1");
  Start(id);
  ASSERT_TRUE(Report("w1", TaskOf(id, 0), v1::TASK_EXITED, 1, "std::bad_alloc").ok());
  job = Get(id);
  EXPECT_EQ(job.state(), v1::FAILED);
  EXPECT_EQ(job.generation(), 2);
  EXPECT_EQ(job.reason(),
            "rank 0 exited with code 1: std::bad_alloc (2 failures; restart.max_failures is 1)");
}

// A rank killed with its agent (the agent restarted while it ran) is the machine's doing: the job
// restarts on its infrastructure budget even with no failures allowed (max_failures 0, the
// default). The agent reports it as
// ReconcilerTest.TaskOfAnEarlierAgentRunIsReportedLostNotRestarted shows.
TEST_F(RecoveryTest, ARankLostToAnAgentRestartIsNotTheJobsFailure) {
  Register("w1", 1);
  const std::string id = Submit(TestSpec("agent-restart"));
  Start(id);
  ASSERT_TRUE(Report("w1", TaskOf(id, 0), v1::TASK_STOPPED, 128 + SIGKILL,
                     "lost: the worker agent restarted while it ran", SIGKILL)
                  .ok());
  const v1::Job job = Get(id);
  ASSERT_EQ(job.state(), v1::PENDING) << job.reason();
  ASSERT_EQ(job.restarts_size(), 1);
  EXPECT_EQ(job.restarts(0).reason(), v1::INFRASTRUCTURE);
}

// A user error (exit code 2: no data, a model that cannot load) would end every attempt the same
// way: the job fails at once, whatever restart.max_failures allows.
TEST_F(RecoveryTest, AUserErrorIsNotRetried) {
  Register("w1", 1);
  v1::JobSpec spec = TestSpec("no-data");
  spec.mutable_restart()->set_max_failures(3);
  const std::string id = Submit(spec);
  Start(id);
  ASSERT_TRUE(Report("w1", TaskOf(id, 0), v1::TASK_EXITED, 2, "data.train: no files").ok());
  v1::Job job = Get(id);
  EXPECT_EQ(job.state(), v1::FAILED);
  EXPECT_EQ(job.generation(), 1);
  EXPECT_EQ(job.restarts_size(), 0);
  EXPECT_EQ(job.reason(),
            "rank 0 exited with code 2: data.train: no files (a user error: the job is not "
            "restarted)");
}

TEST_F(RecoveryTest, APeerFailureFoundWhileRestartingSpendsTheFailureBudget) {
  Register("w1", 1);
  Register("w2", 1);
  const std::string id = Submit(TestSpec("dp", 2, 2));  // max_failures 0
  const std::vector<std::string> workers = Start(id);
  ASSERT_TRUE(Report(workers[0], TaskOf(id, 0), v1::TASK_EXITED, 3, "peer lost").ok());
  ASSERT_EQ(Get(id).state(), v1::RESTARTING);
  ASSERT_TRUE(Report(workers[1], TaskOf(id, 1), v1::TASK_EXITED, 1, "out of memory").ok());
  const v1::Job job = Get(id);
  EXPECT_EQ(job.state(), v1::FAILED);
  EXPECT_EQ(job.reason(), "rank 1 exited with code 1: out of memory");
}

// The ranks of a restarting attempt hold their slots until their agents report them ended (they
// may be saving for a preemption): a job submitted meanwhile is not placed over them, and the
// workers' views and the metrics count them.
TEST_F(RecoveryTest, RanksOfARestartingAttemptHoldTheirSlotsUntilTheyEnd) {
  Register("w1", 1);
  Register("w2", 1);
  const std::string a = Submit(TestSpec("a", 2, 2));
  const std::vector<std::string> workers = Start(a);
  // Rank 0 fails on its own; rank 1 is still stopping.
  ASSERT_TRUE(Report(workers[0], TaskOf(a, 0), v1::TASK_EXITED, 3, "lost a peer").ok());
  ASSERT_EQ(Get(a).state(), v1::RESTARTING);
  const std::string b = Submit(TestSpec("b", 2, 2));
  manager_->Tick();
  EXPECT_EQ(Get(b).state(), v1::PENDING) << Get(b).reason();
  int used = 0;
  for (const v1::Worker& w : manager_->ListWorkers()) used += w.slots_used();
  EXPECT_EQ(used, 1);
  EXPECT_EQ(manager_->MetricsSnapshot().slots_used, 1);
  // Rank 1 ends: the slots are free again, and job a (first in the queue) gets them back.
  ASSERT_TRUE(Report(workers[1], TaskOf(a, 1), v1::TASK_STOPPED, 0, "", 15).ok());
  PassBackoff(a);
  manager_->Tick();
  EXPECT_EQ(Get(a).state(), v1::SCHEDULED) << Get(a).reason();
  EXPECT_EQ(Get(b).state(), v1::PENDING);
}

// A worker shown SUSPECT (here: not heard from since this coordinator started) takes nothing
// new until its agent is heard from again.
TEST_F(RecoveryTest, NothingNewGoesToASuspectWorker) {
  Register("w1", 1);
  Reopen();
  const std::string id = Submit(TestSpec("waits"));
  manager_->Tick();
  EXPECT_EQ(Get(id).state(), v1::PENDING);
  EXPECT_EQ(manager_->ListWorkers()[0].state(), v1::SUSPECT);
  Register("w1", 1);
  manager_->Tick();
  EXPECT_EQ(Get(id).state(), v1::SCHEDULED) << Get(id).reason();
}

TEST_F(RecoveryTest, StalledAttemptRestartsAsAHang) {
  Register("w1", 1);
  v1::JobSpec spec = TestSpec("stuck");
  spec.set_stall_timeout_seconds(30);
  const std::string id = Submit(spec);
  Start(id);
  ASSERT_TRUE(Progress(id, 1, 5).ok());
  clock_.Advance(absl::Seconds(20));
  Sync("w1");
  ASSERT_TRUE(Progress(id, 1, 5).ok());  // alive, but no new step
  clock_.Advance(absl::Seconds(9));
  Sync("w1");
  manager_->Tick();
  EXPECT_EQ(Get(id).state(), v1::RUNNING);
  clock_.Advance(absl::Seconds(1));
  Sync("w1");
  manager_->Tick();
  const v1::Job job = Get(id);
  ASSERT_EQ(job.state(), v1::RESTARTING);
  EXPECT_EQ(job.restarts(0).reason(), v1::HANG);
  EXPECT_EQ(job.restarts(0).message(), "no step progress for 30s (stall_timeout; last step 5)");
  // The stopped rank ends the wait.
  ASSERT_TRUE(Report("w1", TaskOf(id, 0), v1::TASK_STOPPED, 0, "", 9).ok());
  EXPECT_EQ(Get(id).state(), v1::PENDING);
}

// The next attempt resumes below the step the last one reached (here from the start, with no
// checkpoint); its steps are progress even while they stay below that step.
TEST_F(RecoveryTest, ARestartedAttemptRedoingLostStepsIsNotAHang) {
  Register("w1", 1);
  v1::JobSpec spec = TestSpec("redo");
  spec.set_stall_timeout_seconds(30);
  const std::string id = Submit(spec);
  Start(id);
  ASSERT_TRUE(Progress(id, 1, 50).ok());
  ASSERT_TRUE(Report("w1", TaskOf(id, 0), v1::TASK_EXITED, 3, "lost the store").ok());
  PassBackoff(id);
  Sync("w1");
  Start(id);
  for (int64_t step = 1; step <= 4; ++step) {
    clock_.Advance(absl::Seconds(20));
    Sync("w1");
    ASSERT_TRUE(Progress(id, 2, step * 10).ok());
    manager_->Tick();
    const v1::Job job = Get(id);
    ASSERT_EQ(job.state(), v1::RUNNING) << "at step " << step * 10 << ": " << job.reason();
  }
  EXPECT_EQ(Get(id).restarts_size(), 1);
}

TEST_F(RecoveryTest, PreemptionNoticeStopsTheGangAtOneStepAndRestartsElsewhere) {
  Register("w1", 1);
  Register("w2", 1);
  Register("w3", 1);
  const std::string id = Submit(TestSpec("dp", 2, 2));
  const std::vector<std::string> workers = Start(id);
  ASSERT_TRUE(Progress(id, 1, 17).ok());

  const std::string preempted = workers[1];
  std::vector<uint64_t> versions;
  for (const std::string& w : workers) versions.push_back(Sync(w).version());
  v1::ReportPreemptionRequest notice;
  notice.set_worker_id(preempted);
  notice.set_deadline_unix_ms(absl::ToUnixMillis(clock_.Now() + absl::Seconds(25)));
  notice.set_source("SIGTERM");
  ASSERT_TRUE(manager_->ReportPreemption(notice).ok());
  ASSERT_TRUE(manager_->ReportPreemption(notice).ok());  // idempotent
  for (const v1::Worker& w : manager_->ListWorkers()) {
    EXPECT_EQ(w.state(), w.id() == preempted ? v1::DRAINING : v1::READY) << w.id();
  }
  // Every rank, on every worker, is told to save and stop by the deadline: the workers' versions
  // moved, so their waiting polls return.
  for (size_t i = 0; i < workers.size(); ++i) {
    const std::string& w = workers[i];
    v1::SyncResponse sync = Sync(w);
    EXPECT_GT(sync.version(), versions[i]) << w;
    ASSERT_THAT(sync.tasks(), SizeIs(1));
    EXPECT_EQ(sync.tasks(0).stop_deadline_unix_ms(), notice.deadline_unix_ms());
  }
  v1::Job job = Get(id);
  EXPECT_EQ(job.state(), v1::RUNNING);
  EXPECT_THAT(job.events(job.events_size() - 1).reason(),
              HasSubstr(absl::StrCat("preemption notice for worker ", preempted, " (SIGTERM)")));

  // The gang agreed on step 20; rank 1 is out first, rank 0 commits and reports after.
  ASSERT_TRUE(Report(preempted, TaskOf(id, 1), v1::TASK_EXITED, 143, "stopped at step 20").ok());
  job = Get(id);
  ASSERT_EQ(job.state(), v1::RESTARTING);
  EXPECT_EQ(job.restarts(0).reason(), v1::PREEMPTED);
  EXPECT_THAT(job.restarts(0).message(), HasSubstr("(SIGTERM)"));
  ASSERT_TRUE(Commit(id, 1, 20).ok());
  ASSERT_TRUE(Progress(id, 1, 20).ok());
  ASSERT_TRUE(Report(workers[0], TaskOf(id, 0), v1::TASK_EXITED, 143, "stopped").ok());
  job = Get(id);
  ASSERT_EQ(job.state(), v1::PENDING);
  EXPECT_EQ(job.committed_step(), 20);
  EXPECT_EQ(job.restarts(0).last_step(), 20);

  // Nothing new goes to the draining worker.
  PassBackoff(id);
  KeepAlive({"w1", "w2", "w3"});
  Start(id);
  job = Get(id);
  for (const v1::TaskInfo& t : job.tasks()) {
    if (t.generation() == 2) {
      EXPECT_NE(t.worker_id(), preempted);
      EXPECT_EQ(t.stop_deadline_unix_ms(), 0);
    }
  }
  ASSERT_TRUE(Progress(id, 2, 21, /*start_step=*/20).ok());
  EXPECT_EQ(Get(id).restarts(0).steps_lost(), 0);
}

TEST_F(RecoveryTest, PreemptionsHaveTheirOwnBudget) {
  Register("w1", 1);
  v1::JobSpec spec = TestSpec("spot");
  spec.mutable_restart()->set_max_preemptions(1);
  const std::string id = Submit(spec);
  Start(id);
  Register("w1", 1);  // the machine came back as new, without the task
  PassBackoff(id);
  Start(id);
  Register("w1", 1);
  const v1::Job job = Get(id);
  EXPECT_EQ(job.state(), v1::FAILED);
  EXPECT_THAT(job.reason(), HasSubstr("restart.max_preemptions is 1"));
}

// A job that can never work for a reason outside its code (wrong object-store credentials: exit
// code 3 on every attempt) must not restart forever on the unlimited preemption budget.
TEST_F(RecoveryTest, InfrastructureErrorsHaveABudgetOfTheirOwn) {
  Register("w1", 1);
  v1::JobSpec spec = TestSpec("badcreds");
  ApplyJobSpecDefaults(spec);
  ASSERT_EQ(spec.restart().max_infrastructure_errors(), kDefaultMaxInfrastructureErrors);
  spec.mutable_restart()->set_max_infrastructure_errors(2);
  const std::string id = Submit(spec);
  for (int attempt = 1; attempt <= 3; ++attempt) {
    Start(id);
    ASSERT_TRUE(Report("w1", TaskOf(id, 0), v1::TASK_EXITED, kExitInfrastructure,
                       "checkpoint store: 403 Forbidden")
                    .ok());
    if (attempt < 3) PassBackoff(id);
  }
  v1::Job job = Get(id);
  EXPECT_EQ(job.state(), v1::FAILED) << job.reason();
  EXPECT_THAT(job.reason(), HasSubstr("403 Forbidden (3 restarts for hangs or infrastructure "
                                      "errors; restart.max_infrastructure_errors is 2)"));
  // Hangs share the budget; preemptions do not draw on it.
  EXPECT_EQ(BudgetOf(v1::HANG), RestartBudget::kInfrastructure);
  EXPECT_EQ(BudgetOf(v1::PREEMPTED), RestartBudget::kPreemptions);

  // A job stored before the field existed gets the default, not "unlimited".
  v1::RestartPolicy old_policy;
  EXPECT_EQ(BudgetLimit(old_policy, RestartBudget::kInfrastructure),
            kDefaultMaxInfrastructureErrors);
}

// An agent that never starts a rank (its trainer cannot be launched, the agent is wedged but
// still syncs) must not keep the job SCHEDULED forever, nor the started ranks waiting.
TEST_F(RecoveryTest, RanksThatNeverStartEndTheAttemptAfterTheStartTimeout) {
  Register("w1", 1);
  Register("w2", 1);
  const std::string id = Submit(TestSpec("stuck", 2, 2));
  manager_->Tick();
  v1::Job job = Get(id);
  ASSERT_EQ(job.state(), v1::SCHEDULED);
  // Rank 0 starts; rank 1's agent syncs but never launches it.
  ASSERT_TRUE(Report(job.tasks(0).worker_id(), TaskOf(id, 0), v1::TASK_RUNNING).ok());
  const std::string stuck_worker = job.tasks(1).worker_id();
  for (int i = 0; i < 119; ++i) {  // 9 min 55 s, leases kept
    clock_.Advance(absl::Seconds(5));
    KeepAlive({"w1", "w2"});
    manager_->Tick();
  }
  ASSERT_EQ(Get(id).state(), v1::RUNNING) << "ended before the start timeout";
  clock_.Advance(absl::Seconds(5));
  KeepAlive({"w1", "w2"});
  manager_->Tick();
  job = Get(id);
  ASSERT_EQ(job.state(), v1::RESTARTING) << job.reason();
  ASSERT_EQ(job.restarts_size(), 1);
  EXPECT_EQ(job.restarts(0).reason(), v1::INFRASTRUCTURE);
  EXPECT_THAT(job.restarts(0).message(),
              HasSubstr(absl::StrCat("rank 1 on ", stuck_worker, " did not start within 10m")));
}

// max_runtime bounds the job's time since it started, whatever state it is in: a job that keeps
// restarting (or waits for capacity after a restart) does not run past it.
TEST_F(RecoveryTest, MaxRuntimeCountsTimeSpentRestarting) {
  JobManagerOptions options;
  options.restart_backoff = absl::Minutes(10);
  options.restart_backoff_max = absl::Minutes(10);
  Reopen(options);
  Register("w1", 1);
  v1::JobSpec spec = TestSpec("bounded");
  spec.set_max_runtime_seconds(60);
  spec.mutable_restart()->set_max_failures(5);
  const std::string id = Submit(spec);
  Start(id);
  clock_.Advance(absl::Seconds(10));
  ASSERT_TRUE(Report("w1", TaskOf(id, 0), v1::TASK_EXITED, 1, "boom").ok());
  ASSERT_EQ(Get(id).state(), v1::PENDING);  // waiting out a backoff of 5 to 10 minutes
  clock_.Advance(absl::Seconds(49));
  Sync("w1");
  manager_->Tick();
  ASSERT_EQ(Get(id).state(), v1::PENDING);
  clock_.Advance(absl::Seconds(1));
  Sync("w1");
  manager_->Tick();
  const v1::Job job = Get(id);
  EXPECT_EQ(job.state(), v1::FAILED);
  EXPECT_EQ(job.reason(), "exceeded max_runtime 1m");
}

TEST_F(RecoveryTest, BackoffGrowsWhileAttemptsMakeNoProgressAndResetsAfter) {
  JobManagerOptions options;
  options.restart_backoff = absl::Seconds(1);
  options.restart_backoff_max = absl::Seconds(3);
  Reopen(options);
  Register("w1", 1);
  const std::string id = Submit(TestSpec("flaky"));
  auto fail_once = [&] {
    Start(id);
    EXPECT_TRUE(Report("w1", TaskOf(id, 0), v1::TASK_EXITED, 3, "store down").ok());
    const v1::Job job = Get(id);
    EXPECT_EQ(job.state(), v1::PENDING);
    return job.restarts(job.restarts_size() - 1).backoff_ms();
  };
  const int64_t b1 = fail_once();
  EXPECT_GE(b1, 500);
  EXPECT_LE(b1, 1000);
  PassBackoff(id);
  const int64_t b2 = fail_once();
  EXPECT_GE(b2, 1000);
  EXPECT_LE(b2, 2000);
  PassBackoff(id);
  const int64_t b3 = fail_once();  // capped at 3 s
  EXPECT_GE(b3, 1500);
  EXPECT_LE(b3, 3000);
  PassBackoff(id);
  Start(id);
  ASSERT_TRUE(Progress(id, 4, 1).ok());  // this attempt trains
  ASSERT_TRUE(Report("w1", TaskOf(id, 0), v1::TASK_EXITED, 3, "store down").ok());
  const v1::Job job = Get(id);
  EXPECT_LE(job.restarts(job.restarts_size() - 1).backoff_ms(), 1000);
}

TEST_F(RecoveryTest, RestartInProgressSurvivesACoordinatorRestart) {
  Register("w1", 1);
  Register("w2", 1);
  const std::string id = Submit(TestSpec("dp", 2, 2));
  const std::vector<std::string> workers = Start(id);
  ASSERT_TRUE(Report(workers[0], TaskOf(id, 0), v1::TASK_EXITED, 3, "peer lost").ok());
  ASSERT_EQ(Get(id).state(), v1::RESTARTING);
  Reopen();
  v1::Job job = Get(id);
  ASSERT_EQ(job.state(), v1::RESTARTING);
  ASSERT_EQ(job.restarts_size(), 1);
  ASSERT_TRUE(Report(workers[1], TaskOf(id, 1), v1::TASK_STOPPED, 143).ok());
  job = Get(id);
  EXPECT_EQ(job.state(), v1::PENDING);
  EXPECT_EQ(job.restarts(0).reason(), v1::INFRASTRUCTURE);
}

// A rank that died while the coordinator was down (its agent restarted too, or reaped it and
// forgot it) is found when the agent registers again after the coordinator's restart: the
// coordinator asks every agent it loaded from its database to do so.
TEST_F(RecoveryTest, TasksLostWhileTheCoordinatorWasDownAreFoundWhenAgentsRegisterAgain) {
  Register("w1", 1);
  Register("w2", 1);
  const std::string id = Submit(TestSpec("dp", 2, 2));
  const std::vector<std::string> workers = Start(id);
  Reopen();
  for (const std::string& w : workers) EXPECT_TRUE(Sync(w).reregister()) << w;
  // w1's agent still runs rank 0; w2's came back without rank 1.
  v1::RegisterWorkerRequest request;
  request.set_name(workers[0]);
  request.set_slots(1);
  v1::TaskStatus* running = request.add_tasks();
  running->set_task_id(TaskOf(id, 0));
  running->set_state(v1::TASK_RUNNING);
  ASSERT_TRUE(manager_->RegisterWorker(request).ok());
  EXPECT_EQ(Get(id).state(), v1::RUNNING);
  Register(workers[1], 1);
  const v1::Job job = Get(id);
  ASSERT_EQ(job.state(), v1::RESTARTING) << job.reason();
  EXPECT_EQ(job.restarts(0).reason(), v1::WORKER_LOST);
  EXPECT_THAT(job.restarts(0).message(), HasSubstr("rank 1 lost"));
}

TEST_F(RecoveryTest, AttemptThatFinishesWhileRestartingSucceeds) {
  Register("w1", 1);
  Register("w2", 1);
  v1::JobSpec spec = TestSpec("dp", 2, 2);
  spec.set_stall_timeout_seconds(5);
  const std::string id = Submit(spec);
  const std::vector<std::string> workers = Start(id);
  clock_.Advance(absl::Seconds(5));
  KeepAlive(workers);
  manager_->Tick();
  ASSERT_EQ(Get(id).state(), v1::RESTARTING);
  // Both ranks were saving their final checkpoint, slowly, and finish before the stop lands.
  ASSERT_TRUE(Report(workers[0], TaskOf(id, 0), v1::TASK_EXITED, 0).ok());
  EXPECT_EQ(Get(id).state(), v1::RESTARTING);
  ASSERT_TRUE(Report(workers[1], TaskOf(id, 1), v1::TASK_EXITED, 0).ok());
  EXPECT_EQ(Get(id).state(), v1::SUCCEEDED);
}

// A notice for the machine of a parameter-server shard stops the whole job at one step, shards
// included (they serve until the ranks have saved); a lost shard machine restarts the job.
TEST_F(RecoveryTest, PreemptionOrLossOfAShardMachineRestartsTheJob) {
  Register("w1", 1);
  Register("w2", 1);
  Register("w3", 2);
  v1::JobSpec spec = TestSpec("ps", 1, 1);
  spec.set_strategy(v1::PARAMETER_SERVER);
  spec.mutable_parameter_servers()->set_shards(1);
  const std::string id = Submit(spec);
  Start(id);
  v1::Job job = Get(id);
  std::string rank_worker;
  std::string shard_worker;
  for (const v1::TaskInfo& t : job.tasks()) {
    (t.role() == v1::TASK_ROLE_SHARD ? shard_worker : rank_worker) = t.worker_id();
  }
  ASSERT_NE(rank_worker, shard_worker);
  v1::ReportPreemptionRequest notice;
  notice.set_worker_id(shard_worker);
  notice.set_deadline_unix_ms(absl::ToUnixMillis(clock_.Now() + absl::Seconds(25)));
  notice.set_source("SIGTERM");
  ASSERT_TRUE(manager_->ReportPreemption(notice).ok());
  for (const std::string& w : {rank_worker, shard_worker}) {
    v1::SyncResponse sync = Sync(w);
    ASSERT_THAT(sync.tasks(), SizeIs(1)) << w;
    EXPECT_EQ(sync.tasks(0).stop_deadline_unix_ms(), notice.deadline_unix_ms()) << w;
  }
  // The deadline outlives a restart of the coordinator.
  Reopen();
  job = Get(id);
  for (const v1::TaskInfo& t : job.tasks()) {
    EXPECT_EQ(t.stop_deadline_unix_ms(), notice.deadline_unix_ms()) << t.task_id();
  }
  ASSERT_TRUE(Report(rank_worker, TaskOf(id, 0), v1::TASK_EXITED, 143, "stopped").ok());
  ASSERT_TRUE(Report(shard_worker, id + ".g1.s0", v1::TASK_EXITED, 0).ok());
  job = Get(id);
  ASSERT_EQ(job.state(), v1::PENDING);
  EXPECT_EQ(job.restarts(0).reason(), v1::PREEMPTED);
  // The agents register again with the restarted coordinator; the one being preempted (the
  // same process) stays DRAINING.
  Register("w1", 1);
  Register("w2", 1);
  Register("w3", 2);
  for (const v1::Worker& w : manager_->ListWorkers()) {
    EXPECT_EQ(w.state(), w.id() == shard_worker ? v1::DRAINING : v1::READY) << w.id();
  }

  // The next attempt runs elsewhere; its shard's machine vanishes.
  PassBackoff(id);
  KeepAlive({"w1", "w2", "w3"});
  Start(id);
  job = Get(id);
  for (const v1::TaskInfo& t : job.tasks()) {
    if (t.generation() != 2) continue;
    EXPECT_NE(t.worker_id(), shard_worker);
    if (t.role() == v1::TASK_ROLE_SHARD) shard_worker = t.worker_id();
  }
  clock_.Advance(absl::Seconds(11));
  std::vector<std::string> alive;
  for (std::string w : {"w1", "w2", "w3"}) {
    if (w != shard_worker) alive.push_back(w);
  }
  KeepAlive(alive);
  manager_->Tick();
  job = Get(id);
  ASSERT_THAT(job.restarts(), SizeIs(2));
  EXPECT_EQ(job.restarts(1).reason(), v1::WORKER_LOST);
  EXPECT_THAT(job.restarts(1).message(),
              HasSubstr(absl::StrCat("shard 0 lost: worker ", shard_worker)));
}

}  // namespace
}  // namespace trainyard
