// GroupCommitter (many mutations in one transaction, in order, failures isolated) and the
// JobManager's behaviour when a store write fails, both over FakeJobStore.

#include "server/group_commit.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/job_manager.h"
#include "tests/common/fake_clock.h"
#include "tests/server/fake_job_store.h"
#include "tests/server/test_util.h"

namespace trainyard {
namespace {

using ::testing::ElementsAre;
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

}  // namespace
}  // namespace trainyard
