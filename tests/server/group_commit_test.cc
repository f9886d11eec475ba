// GroupCommitter (many mutations in one transaction, in order, failures isolated) and the
// JobManager's behaviour when a store write fails, both over FakeJobStore.

#include "server/store/group_commit.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/jobs/job_manager.h"
#include "tests/common/fake_clock.h"
#include "tests/server/fake_job_store.h"
#include "tests/server/test_util.h"

namespace trainyard {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::SizeIs;

StoreMutation JobWrite(const std::string& id, int64_t seq) {
  StoreMutation m;
  StoredJob job;
  job.seq = seq;
  job.job.set_id(id);
  m.jobs.push_back(job);
  m.next_job_seq = seq + 1;
  return m;
}

std::vector<std::string> JobIds(const StoreMutation& m) {
  std::vector<std::string> ids;
  for (const StoredJob& j : m.jobs) ids.push_back(j.job.id());
  return ids;
}

TEST(GroupCommitterTest, WritesQueuedDuringACommitShareTheNextTransactionInOrder) {
  FakeJobStore store;
  GroupCommitter committer(&store);
  absl::Notification entered;
  absl::Notification release;
  store.HoldNextWrite(&entered, &release);
  absl::Status first;
  std::thread leader([&] { first = committer.Apply(JobWrite("a-1", 1)); });
  entered.WaitForNotification();  // a-1 is being written
  auto b = committer.Enqueue(JobWrite("b-3", 3));
  auto c = committer.Enqueue(JobWrite("c-2", 2));
  release.Notify();
  leader.join();
  ASSERT_TRUE(first.ok()) << first;
  EXPECT_TRUE(committer.Wait(c).ok());
  EXPECT_TRUE(committer.Wait(b).ok());  // already written with c
  const std::vector<StoreMutation> written = store.transactions();
  ASSERT_THAT(written, SizeIs(2));
  EXPECT_THAT(JobIds(written[0]), ElementsAre("a-1"));
  EXPECT_THAT(JobIds(written[1]), ElementsAre("b-3", "c-2"));  // queue order
  EXPECT_EQ(written[1].next_job_seq, 4);                       // the largest wins
  EXPECT_EQ(committer.transactions(), 2);
  EXPECT_EQ(committer.mutations(), 3);
}

TEST(GroupCommitterTest, AFailingWriteFailsOnlyItsOwnCaller) {
  FakeJobStore store;
  store.FailWhen([](const StoreMutation& m) {
    for (const StoredJob& j : m.jobs) {
      if (j.job.id() == "bad-2") return true;
    }
    return false;
  });
  GroupCommitter committer(&store);
  absl::Notification entered;
  absl::Notification release;
  store.HoldNextWrite(&entered, &release);
  std::thread leader([&] { EXPECT_TRUE(committer.Apply(JobWrite("a-1", 1)).ok()); });
  entered.WaitForNotification();
  auto bad = committer.Enqueue(JobWrite("bad-2", 2));
  auto good = committer.Enqueue(JobWrite("c-3", 3));
  release.Notify();
  leader.join();
  EXPECT_EQ(committer.Wait(bad).code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(committer.Wait(good).ok());
  auto contents = store.LoadAll();
  ASSERT_TRUE(contents.ok());
  std::vector<std::string> ids;
  for (const StoredJob& j : contents->jobs) ids.push_back(j.job.id());
  EXPECT_THAT(ids, ElementsAre("a-1", "c-3"));
}

TEST(GroupCommitterTest, ManyThreadsGetEveryWriteDurableWithFewerTransactions) {
  FakeJobStore store;
  GroupCommitter committer(&store);
  constexpr int kThreads = 8;
  constexpr int kEach = 200;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        const int64_t seq = t * kEach + i + 1;
        ASSERT_TRUE(committer.Apply(JobWrite("j-" + std::to_string(seq), seq)).ok());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  auto contents = store.LoadAll();
  ASSERT_TRUE(contents.ok());
  EXPECT_THAT(contents->jobs, SizeIs(kThreads * kEach));
  EXPECT_EQ(committer.mutations(), kThreads * kEach);
  EXPECT_LE(committer.transactions(), kThreads * kEach);
}

// ---- JobManager when a write fails ----

TEST(MergeMutationTest, WhatIsWrittenAfterItWasRemovedStays) {
  StoreMutation into;
  into.removed_workers.push_back("w1");
  into.removed_jobs.push_back("old-1");
  StoreMutation from;
  v1::Worker w;
  w.set_id("w1");  // registered again after it was forgotten
  from.workers.push_back(w);
  from.removed_jobs.push_back("old-2");
  MergeMutation(into, std::move(from));
  EXPECT_THAT(into.workers, SizeIs(1));
  EXPECT_THAT(into.removed_workers, SizeIs(0));
  EXPECT_THAT(into.removed_jobs, ElementsAre("old-1", "old-2"));
}

class StoreFailureTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = std::make_unique<FakeJobStore>();
    store_ = store.get();
    JobManagerOptions options;
    options.checkpoint_root = "file:///ckpt";
    auto manager = JobManager::Create(clock_, std::move(store),
                                      std::make_unique<LogStore>(dir_.path() + "/logs"), options);
    ASSERT_TRUE(manager.ok()) << manager.status();
    manager_ = *std::move(manager);
  }

  v1::JobSpec Spec(const std::string& name) { return TestSpec(name); }

  absl::Status Register(const std::string& name, int slots,
                        std::vector<v1::TaskStatus> tasks = {}) {
    v1::RegisterWorkerRequest request;
    request.set_name(name);
    request.set_slots(slots);
    request.set_hostname("host-" + name);
    request.set_pid(42);
    for (v1::TaskStatus& t : tasks) *request.add_tasks() = std::move(t);
    return manager_->RegisterWorker(request).status();
  }

  // Submits a one-rank job, places it and reports its rank running; returns its id.
  std::string StartOneRankJob(const std::string& name) {
    auto job = manager_->SubmitJob(Spec(name));
    EXPECT_TRUE(job.ok()) << job.status();
    manager_->Tick();
    auto placed = manager_->GetJob(job->id());
    EXPECT_TRUE(placed.ok() && placed->tasks_size() == 1);
    v1::TaskStatus running;
    running.set_task_id(placed->tasks(0).task_id());
    running.set_state(v1::TASK_RUNNING);
    EXPECT_TRUE(manager_->ReportTaskStatus(placed->tasks(0).worker_id(), running).ok());
    EXPECT_EQ(manager_->GetJob(job->id())->state(), v1::RUNNING);
    return job->id();
  }

  const v1::Worker* StoredWorker(const StoreContents& contents, const std::string& id) {
    for (const v1::Worker& w : contents.workers) {
      if (w.id() == id) return &w;
    }
    return nullptr;
  }

  TempDir dir_;
  FakeClock clock_;
  FakeJobStore* store_ = nullptr;
  std::unique_ptr<JobManager> manager_;
};

TEST_F(StoreFailureTest, ASubmissionThatIsNotWrittenIsNotThere) {
  store_->FailWhen([](const StoreMutation& m) { return !m.jobs.empty(); });
  auto refused = manager_->SubmitJob(Spec("lost"));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  auto list = manager_->ListJobs({}, 0, "");
  ASSERT_TRUE(list.ok());
  EXPECT_THAT(list->jobs, SizeIs(0));
  EXPECT_EQ(manager_->MetricsSnapshot().jobs_by_state[v1::PENDING], 0);
  store_->FailWhen(nullptr);
  auto job = manager_->SubmitJob(Spec("kept"));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->id(), "kept-2");  // the failed one's number is not reused
}

TEST_F(StoreFailureTest, AProgressReportThatIsNotWrittenIsRefusedAndNotShown) {
  v1::RegisterWorkerRequest worker;
  worker.set_name("w1");
  worker.set_slots(1);
  ASSERT_TRUE(manager_->RegisterWorker(worker).ok());
  auto job = manager_->SubmitJob(Spec("tiny"));
  ASSERT_TRUE(job.ok());
  manager_->Tick();
  v1::JobProgress progress;
  progress.set_step(5);
  ASSERT_TRUE(manager_->ReportProgress(job->id(), 1, 0, progress).ok());
  store_->FailWhen([](const StoreMutation& m) { return !m.progress.empty(); });
  progress.set_step(6);
  EXPECT_EQ(manager_->ReportProgress(job->id(), 1, 0, progress).code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(manager_->GetJob(job->id())->progress().step(), 5);
}

TEST_F(StoreFailureTest, ACancelThatIsNotWrittenChangesNothing) {
  auto job = manager_->SubmitJob(Spec("tiny"));
  ASSERT_TRUE(job.ok());
  store_->FailWhen([](const StoreMutation& m) { return !m.events.empty(); });
  EXPECT_EQ(manager_->CancelJob(job->id(), "").status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(manager_->GetJob(job->id())->state(), v1::PENDING);
  store_->FailWhen(nullptr);
  EXPECT_EQ(manager_->CancelJob(job->id(), "").status().code(), absl::StatusCode::kOk);
}

// An agent that comes back without a rank it ran: its registration and the rank's loss are one
// transaction; when it cannot be written, neither the store nor the coordinator keeps either.
TEST_F(StoreFailureTest, ARegistrationAndTheLossesItFindsAreOneTransaction) {
  ASSERT_TRUE(Register("w1", 1).ok());
  const std::string id = StartOneRankJob("tiny");
  const int64_t registered = manager_->ListWorkers()[0].registered_unix_ms();
  clock_.Advance(absl::Seconds(2));

  store_->FailWhen([](const StoreMutation& m) { return !m.jobs.empty(); });
  EXPECT_EQ(Register("w1", 1).code(), absl::StatusCode::kUnavailable);
  auto job = manager_->GetJob(id);
  EXPECT_EQ(job->state(), v1::RUNNING);
  EXPECT_EQ(job->tasks(0).state(), v1::TASK_RUNNING);
  EXPECT_EQ(manager_->ListWorkers()[0].registered_unix_ms(), registered);
  auto stored = store_->LoadAll();
  ASSERT_TRUE(stored.ok());
  ASSERT_NE(StoredWorker(*stored, "w1"), nullptr);
  EXPECT_EQ(StoredWorker(*stored, "w1")->registered_unix_ms(), registered);
  EXPECT_EQ(stored->jobs[0].job.state(), v1::RUNNING);

  store_->FailWhen(nullptr);
  const size_t before = store_->transactions().size();
  ASSERT_TRUE(Register("w1", 1).ok());
  const std::vector<StoreMutation> written = store_->transactions();
  ASSERT_EQ(written.size(), before + 1);
  EXPECT_THAT(written.back().workers, SizeIs(1));
  EXPECT_THAT(JobIds(written.back()), testing::Contains(id));
  job = manager_->GetJob(id);
  EXPECT_NE(job->state(), v1::RUNNING);
  EXPECT_THAT(job->restarts(), SizeIs(1));
  EXPECT_GT(manager_->ListWorkers()[0].registered_unix_ms(), registered);
}

// A preemption notice drains the worker and gives every rank on it a stop deadline in one
// transaction: a failed write leaves the worker READY and no job with a deadline.
TEST_F(StoreFailureTest, APreemptionNoticeIsOneTransaction) {
  ASSERT_TRUE(Register("w1", 2).ok());
  const std::string a = StartOneRankJob("a");
  const std::string b = StartOneRankJob("b");
  v1::ReportPreemptionRequest notice;
  notice.set_worker_id("w1");
  notice.set_deadline_unix_ms(absl::ToUnixMillis(clock_.Now() + absl::Seconds(30)));
  notice.set_source("SIGTERM");

  // Only the write that holds job b fails; without one transaction, a and the worker would stay.
  store_->FailWhen([b](const StoreMutation& m) {
    for (const StoredJob& j : m.jobs) {
      if (j.job.id() == b) return true;
    }
    return false;
  });
  EXPECT_EQ(manager_->ReportPreemption(notice).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(manager_->ListWorkers()[0].state(), v1::READY);
  for (const std::string& id : {a, b}) {
    auto job = manager_->GetJob(id);
    EXPECT_EQ(job->tasks(0).stop_deadline_unix_ms(), 0) << id;
    EXPECT_EQ(job->state(), v1::RUNNING) << id;
  }
  auto stored = store_->LoadAll();
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(StoredWorker(*stored, "w1")->state(), v1::READY);
  for (const StoredJob& j : stored->jobs) {
    EXPECT_EQ(j.job.tasks(0).stop_deadline_unix_ms(), 0) << j.job.id();
  }

  store_->FailWhen(nullptr);
  const size_t before = store_->transactions().size();
  ASSERT_TRUE(manager_->ReportPreemption(notice).ok());
  const std::vector<StoreMutation> written = store_->transactions();
  ASSERT_EQ(written.size(), before + 1);
  EXPECT_THAT(written.back().workers, SizeIs(1));
  EXPECT_THAT(JobIds(written.back()), testing::UnorderedElementsAre(a, b));
  EXPECT_EQ(manager_->ListWorkers()[0].state(), v1::DRAINING);
  for (const std::string& id : {a, b}) {
    EXPECT_EQ(manager_->GetJob(id)->tasks(0).stop_deadline_unix_ms(), notice.deadline_unix_ms());
  }
}

// A finished job leaves memory once nothing of it runs: what asks for it reads it from the store,
// whole; listing reads summaries from the store without loading whole jobs.
TEST_F(StoreFailureTest, AFinishedJobIsReadFromTheStoreWhenAskedFor) {
  ASSERT_TRUE(Register("w1", 1).ok());
  const std::string id = StartOneRankJob("done");
  EXPECT_THAT(manager_->GetJob(id)->events(), SizeIs(3));  // submitted, placed, running
  EXPECT_EQ(store_->job_loads(), 0);
  v1::TaskStatus exited;
  exited.set_task_id(id + ".g1.r0");
  exited.set_state(v1::TASK_EXITED);
  ASSERT_TRUE(manager_->ReportTaskStatus("w1", exited).ok());
  manager_->Tick();  // its rank ended: nothing holds capacity, the job leaves memory
  auto job = manager_->GetJob(id);
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(store_->job_loads(), 1);
  EXPECT_EQ(job->state(), v1::SUCCEEDED);
  EXPECT_THAT(job->events(), SizeIs(4));
  ASSERT_THAT(job->tasks(), SizeIs(1));
  EXPECT_EQ(job->tasks(0).state(), v1::TASK_EXITED);
  auto list = manager_->ListJobs({}, 0, "");
  ASSERT_TRUE(list.ok());
  ASSERT_THAT(list->jobs, SizeIs(1));
  EXPECT_EQ(list->jobs[0].state(), v1::SUCCEEDED);
  EXPECT_EQ(store_->job_loads(), 1);
  // Still counted, and still refused a cancel for what it is.
  EXPECT_EQ(manager_->MetricsSnapshot().jobs_by_state[v1::SUCCEEDED], 1);
  auto cancel = manager_->CancelJob(id, "");
  EXPECT_EQ(cancel.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(cancel.status().message(), HasSubstr("already SUCCEEDED"));
  EXPECT_EQ(manager_->CancelJob("none-9", "").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(manager_->GetJob("none-9").status().code(), absl::StatusCode::kNotFound);
  // A watch sends it once and ends.
  std::vector<v1::JobState> watched;
  ASSERT_TRUE(manager_
                  ->WatchJob(
                      id,
                      [&](const v1::Job& j) {
                        watched.push_back(j.state());
                        return true;
                      },
                      [] { return false; })
                  .ok());
  EXPECT_THAT(watched, ElementsAre(v1::SUCCEEDED));
}

// A job that checkpoints for weeks keeps a few checkpoint records, not one per save.
TEST_F(StoreFailureTest, CheckpointRecordsStayFewOverManyCommits) {
  ASSERT_TRUE(Register("w1", 1).ok());
  v1::JobSpec spec = Spec("long");
  spec.mutable_checkpoint()->set_keep_last(2);
  auto job = manager_->SubmitJob(spec);
  ASSERT_TRUE(job.ok());
  manager_->Tick();
  for (int step = 100; step <= 10000; step += 100) {
    v1::CommitCheckpointRequest request;
    request.set_job_id(job->id());
    request.set_generation(1);
    request.set_step(step);
    auto retired = manager_->CommitCheckpoint(request);
    ASSERT_TRUE(retired.ok()) << retired.status();
    if (step >= 300) {
      EXPECT_THAT(*retired, ElementsAre(absl::StrFormat("file:///ckpt/%s/step-%012d", job->id(),
                                                        step - 200)));
    }
  }
  // The two kept and the one the last commit retired (for a retry of it).
  auto stored = store_->LoadAll();
  ASSERT_TRUE(stored.ok());
  EXPECT_THAT(stored->checkpoints, SizeIs(3));
  EXPECT_THAT(*manager_->ListCheckpoints(job->id()), SizeIs(2));
}

}  // namespace
}  // namespace trainyard
