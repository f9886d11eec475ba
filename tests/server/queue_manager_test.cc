// The JobManager's queues: stored, admitted to, and the scheduler's preemptions carried out
// (stop deadlines, SCHEDULER_PREEMPTED restarts that draw on no budget), on a fake clock.

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/job_manager_fixture.h"

namespace trainyard {
namespace {

using ::testing::HasSubstr;

v1::Queue MakeQueue(const std::string& name, int slots, int borrow,
                    std::vector<std::string> users = {}) {
  v1::Queue q;
  q.set_name(name);
  q.set_quota_slots(slots);
  q.set_quota_gpus(0);
  q.set_borrow_slots(borrow);
  q.set_borrow_gpus(0);
  q.set_weight(1);
  for (const std::string& u : users) q.add_users(u);
  return q;
}

// A copy of the queue named `name` (the list is often a temporary: a pointer into it would
// dangle, as AddressSanitizer found).
std::optional<v1::Queue> Find(const std::vector<v1::Queue>& queues, const std::string& name) {
  for (const v1::Queue& q : queues) {
    if (q.name() == name) return q;
  }
  return std::nullopt;
}

TEST_F(JobManagerTest, QueuesAreStoredAndSubmissionsAdmittedToThem) {
  // The default queue is there before any is made.
  const std::vector<v1::Queue> none = manager_->ListQueues();
  ASSERT_EQ(none.size(), 1u);
  EXPECT_EQ(none[0].name(), "default");
  EXPECT_TRUE(none[0].status().implicit());

  ASSERT_TRUE(manager_->CreateQueue(MakeQueue("team-a", 2, 0, {"alice"}), "root").ok());
  EXPECT_EQ(manager_->CreateQueue(MakeQueue("team-a", 1, 0), "root").status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(manager_->CreateQueue(MakeQueue("Bad Name", 1, 0), "root").status().code(),
            absl::StatusCode::kInvalidArgument);
  v1::Queue negative_weight = MakeQueue("w", 1, 0);
  negative_weight.set_weight(-1);
  EXPECT_THAT(manager_->CreateQueue(negative_weight, "root").status().message(),
              HasSubstr("weight"));
  Reopen();
  const std::vector<v1::Queue> queues = manager_->ListQueues();
  const std::optional<v1::Queue> a = Find(queues, "team-a");
  ASSERT_TRUE(a.has_value()) << "queues survive a restart";
  EXPECT_EQ(a->created_by(), "root");
  EXPECT_EQ(a->quota_slots(), 2);
  ASSERT_TRUE(Find(queues, "default").has_value());

  // alice's jobs go to the queue that lists her; others' to the default one.
  Principal alice{Role::kUser, "alice", {}};
  Principal bob{Role::kUser, "bob", {}};
  auto job = manager_->SubmitJob(TestSpec("mine", 2, 2), &alice);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec().queue(), "team-a");
  job = manager_->SubmitJob(TestSpec("theirs"), &bob);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec().queue(), "default");
  // A queue that does not list bob refuses him; one that does not exist, everyone; a job
  // larger than the queue ever allows is refused with the numbers.
  v1::JobSpec to_a = TestSpec("to-a");
  to_a.set_queue("team-a");
  EXPECT_EQ(manager_->SubmitJob(to_a, &bob).status().code(), absl::StatusCode::kPermissionDenied);
  v1::JobSpec nowhere = TestSpec("nowhere");
  nowhere.set_queue("team-z");
  EXPECT_THAT(manager_->SubmitJob(nowhere, &alice).status().message(),
              HasSubstr("no queue 'team-z' (queues: team-a, default)"));
  v1::JobSpec big = TestSpec("big", 3, 3);
  big.set_queue("team-a");
  EXPECT_EQ(manager_->SubmitJob(big, &alice).status().message(),
            "queue 'team-a' lets a job hold at most 2 slots of quota; this one needs 3 slots");
  // A queue with jobs not finished cannot be deleted.
  EXPECT_EQ(manager_->DeleteQueue("team-a").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(manager_->DeleteQueue("team-q").code(), absl::StatusCode::kNotFound);
}

// A queue's max_priority caps the priority its users' jobs ask for; an admin's job may ask for
// more. Set to 0 it keeps users at the default priority; unset, nothing is capped.
TEST_F(JobManagerTest, AQueueCapsThePriorityOfItsUsersJobs) {
  v1::Queue shared = MakeQueue("shared", -1, -1);
  shared.set_max_priority(5);
  ASSERT_TRUE(manager_->CreateQueue(shared, "root").ok());
  Reopen();
  const std::optional<v1::Queue> stored = Find(manager_->ListQueues(), "shared");
  ASSERT_TRUE(stored.has_value());
  ASSERT_TRUE(stored->has_max_priority()) << "the cap is stored with the queue";
  EXPECT_EQ(stored->max_priority(), 5);
  const std::optional<v1::Queue> fallback = Find(manager_->ListQueues(), "default");
  ASSERT_TRUE(fallback.has_value());
  EXPECT_FALSE(fallback->has_max_priority());

  Principal alice{Role::kUser, "alice", {}};
  Principal root{Role::kAdmin, "root", {}};
  auto in_shared = [](const std::string& name, int priority) {
    v1::JobSpec spec = TestSpec(name, 1, 1, 0, priority);
    spec.set_queue("shared");
    return spec;
  };
  const absl::Status over = manager_->SubmitJob(in_shared("over", 6), &alice).status();
  EXPECT_EQ(over.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(over.message(),
            "priority: 6 is above the cap of queue 'shared' (max_priority 5); only an admin may "
            "ask for more");
  EXPECT_TRUE(manager_->SubmitJob(in_shared("at", 5), &alice).ok());
  EXPECT_TRUE(manager_->SubmitJob(in_shared("admins", 50), &root).ok());
  // Another queue's cap is not this one's: the default queue has none.
  EXPECT_TRUE(manager_->SubmitJob(TestSpec("elsewhere", 1, 1, 0, 50), &alice).ok());

  shared.set_max_priority(0);
  ASSERT_TRUE(manager_->UpdateQueue(shared, "root").ok());
  EXPECT_EQ(manager_->SubmitJob(in_shared("one", 1), &alice).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(manager_->SubmitJob(in_shared("zero", 0), &alice).ok());
  shared.clear_max_priority();
  ASSERT_TRUE(manager_->UpdateQueue(shared, "root").ok());
  EXPECT_TRUE(manager_->SubmitJob(in_shared("uncapped", 1000), &alice).ok());
}

TEST_F(JobManagerTest, APreemptedJobSavesThenWaitsWithoutSpendingARestartBudget) {
  JobManagerOptions options;
  options.preemption_exempt = absl::Minutes(2);
  Reopen(options);
  Register("w1", 1);
  v1::JobSpec low_spec = TestSpec("low");
  low_spec.mutable_restart()->set_max_preemptions(0);  // a budget this must not draw on
  const std::string low = Submit(low_spec);
  manager_->Tick();
  ASSERT_TRUE(Report("w1", low + ".g1.r0", v1::TASK_RUNNING).ok());
  const std::string high = Submit(TestSpec("high", 1, 1, 0, /*priority=*/5));
  manager_->Tick();
  // The victim is asked to save and stop, with why; the urgent job waits for it.
  v1::Job asked = Get(low);
  EXPECT_EQ(asked.state(), v1::RUNNING);
  EXPECT_THAT(asked.preempted_for(),
              HasSubstr(absl::StrCat("for ", high, " (priority 5 over 0 in queue default)")));
  ASSERT_EQ(asked.tasks_size(), 1);
  EXPECT_GT(asked.tasks(0).stop_deadline_unix_ms(), 0);
  EXPECT_THAT(Reasons(asked).back(), HasSubstr("preempted by the scheduler for " + high));
  EXPECT_THAT(Get(high).reason(), HasSubstr("preempting " + low));
  // Another pass changes nothing: no second preemption, no placement over the saving rank.
  manager_->Tick();
  EXPECT_EQ(Get(high).state(), v1::PENDING);
  EXPECT_EQ(manager_->ListQueues()[0].status().preemptions(), 1);
  // The rank saves at its step and exits; the victim restarts as SCHEDULER_PREEMPTED, and the
  // urgent job takes the slot.
  ASSERT_TRUE(
      Report("w1", low + ".g1.r0", v1::TASK_EXITED, 143, "stopped by SIGTERM at step 7").ok());
  manager_->Tick();
  const v1::Job stopped = Get(low);
  EXPECT_EQ(stopped.state(), v1::PENDING) << stopped.reason();
  ASSERT_EQ(stopped.restarts_size(), 1);
  EXPECT_EQ(stopped.restarts(0).reason(), v1::SCHEDULER_PREEMPTED);
  EXPECT_TRUE(stopped.preempted_for().empty());
  EXPECT_EQ(Get(high).state(), v1::SCHEDULED);
  EXPECT_EQ(stopped.position(), 1);
  // When the urgent job is done, the victim runs again.
  ASSERT_TRUE(Report("w1", high + ".g1.r0", v1::TASK_EXITED, 0).ok());
  manager_->Tick();
  EXPECT_EQ(Get(low).state(), v1::SCHEDULED);
  EXPECT_EQ(Get(low).generation(), 2);
  ASSERT_TRUE(Report("w1", low + ".g2.r0", v1::TASK_RUNNING).ok());
  // Just resumed, it is not preempted again before --preemption_exempt_time.
  const std::string again = Submit(TestSpec("again", 1, 1, 0, /*priority=*/5));
  manager_->Tick();
  EXPECT_TRUE(Get(low).preempted_for().empty());
  EXPECT_THAT(Get(again).reason(), HasSubstr("waiting for capacity"));
  clock_.Advance(absl::Minutes(2));
  Sync("w1");
  manager_->Tick();
  EXPECT_THAT(Get(low).preempted_for(), HasSubstr("for " + again));
}

// A preemption decided before a coordinator restart is carried through after it.
TEST_F(JobManagerTest, APreemptionSurvivesACoordinatorRestart) {
  Register("w1", 1);
  const std::string low = Submit(TestSpec("low"));
  manager_->Tick();
  ASSERT_TRUE(Report("w1", low + ".g1.r0", v1::TASK_RUNNING).ok());
  const std::string high = Submit(TestSpec("high", 1, 1, 0, /*priority=*/5));
  manager_->Tick();
  ASSERT_FALSE(Get(low).preempted_for().empty());
  Reopen();
  EXPECT_THAT(Get(low).preempted_for(), HasSubstr("for " + high));
  EXPECT_GT(Get(low).tasks(0).stop_deadline_unix_ms(), 0);
  // Its agent registers again with what it runs, as agents do when their coordinator restarts:
  // until then nothing new is placed on the worker.
  v1::RegisterWorkerRequest again;
  again.set_name("w1");
  again.set_slots(1);
  v1::TaskStatus* running = again.add_tasks();
  running->set_task_id(low + ".g1.r0");
  running->set_state(v1::TASK_RUNNING);
  ASSERT_TRUE(manager_->RegisterWorker(again).ok());
  ASSERT_TRUE(Report("w1", low + ".g1.r0", v1::TASK_EXITED, 143, "stopped at step 3").ok());
  manager_->Tick();
  ASSERT_EQ(Get(low).restarts_size(), 1);
  EXPECT_EQ(Get(low).restarts(0).reason(), v1::SCHEDULER_PREEMPTED);
  EXPECT_EQ(Get(high).state(), v1::SCHEDULED);
}

TEST_F(JobManagerTest, AQueueTakesBackItsQuotaFromABorrower) {
  Register("w1", 1);
  Register("w2", 1);
  ASSERT_TRUE(manager_->CreateQueue(MakeQueue("a", 1, -1), "root").ok());
  ASSERT_TRUE(manager_->CreateQueue(MakeQueue("b", 1, 0), "root").ok());
  v1::JobSpec wide = TestSpec("wide", 2, 2);
  wide.set_queue("a");
  const std::string borrower = Submit(wide);
  manager_->Tick();
  ASSERT_EQ(Get(borrower).state(), v1::SCHEDULED);
  const std::optional<v1::Queue> a = Find(manager_->ListQueues(), "a");
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->status().used_slots(), 2);
  EXPECT_EQ(a->status().borrowed_slots(), 1);
  v1::JobSpec own = TestSpec("own");
  own.set_queue("b");
  const std::string owner = Submit(own);
  manager_->Tick();
  EXPECT_THAT(Get(borrower).preempted_for(),
              HasSubstr(absl::StrCat("for ", owner, " of queue b, which reclaims its quota")));
  // Not preemptible: never on borrowed capacity, so nothing of it is ever taken back.
  v1::JobSpec fixed = TestSpec("fixed", 2, 2);
  fixed.set_queue("a");
  fixed.set_preemptible(false);
  EXPECT_THAT(manager_->SubmitJob(fixed).status().message(),
              HasSubstr("preemptible: false runs within the quota only"));
}

}  // namespace
}  // namespace trainyard
