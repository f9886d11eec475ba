#include "server/jobs/rendezvous.h"

#include <memory>
#include <string>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/jobs/job_manager.h"
#include "tests/common/fake_clock.h"
#include "tests/server/job_manager_fixture.h"
#include "tests/server/test_util.h"

namespace trainyard {
namespace {

using ::testing::HasSubstr;

TEST(RendezvousTest, SetThenGet) {
  FakeClock clock;
  Rendezvous rv(clock);
  ASSERT_TRUE(rv.Set("job", 1, "0", "addr-0").ok());
  absl::StatusOr<std::string> value = rv.Get("job", 1, "0", absl::ZeroDuration());
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "addr-0");
  // Replacing a value is allowed; the latest wins.
  ASSERT_TRUE(rv.Set("job", 1, "0", "addr-0b").ok());
  EXPECT_EQ(*rv.Get("job", 1, "0", absl::ZeroDuration()), "addr-0b");
}

TEST(RendezvousTest, NamespacesAreSeparateByJobAndGeneration) {
  FakeClock clock;
  Rendezvous rv(clock);
  ASSERT_TRUE(rv.Set("job", 1, "k", "g1").ok());
  ASSERT_TRUE(rv.Set("other", 1, "k", "other").ok());
  EXPECT_EQ(rv.Get("job", 2, "k", absl::ZeroDuration()).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(*rv.Get("job", 1, "k", absl::ZeroDuration()), "g1");
  EXPECT_EQ(*rv.Get("other", 1, "k", absl::ZeroDuration()), "other");
}

TEST(RendezvousTest, GetWaitsForASetFromAnotherThread) {
  FakeClock clock;
  Rendezvous rv(clock);
  std::thread setter([&] {
    // Set only once the Get really waits, so that the wake-up is what answers it.
    while (rv.WaitersForTesting() == 0) std::this_thread::yield();
    ASSERT_TRUE(rv.Set("job", 1, "id", "42").ok());
  });
  absl::StatusOr<std::string> value = rv.Get("job", 1, "id", absl::Seconds(30));
  setter.join();
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "42");
}

TEST(RendezvousTest, GetTimesOut) {
  FakeClock clock;
  Rendezvous rv(clock);
  absl::StatusOr<std::string> value = rv.Get("job", 1, "never", absl::Milliseconds(50));
  EXPECT_EQ(value.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(value.status().message(), HasSubstr("'never' not set"));
}

TEST(RendezvousTest, Limits) {
  FakeClock clock;
  RendezvousOptions options;
  options.max_keys_per_namespace = 2;
  options.max_value_bytes = 8;
  options.max_key_bytes = 4;
  Rendezvous rv(clock, options);
  EXPECT_EQ(rv.Set("job", 1, "", "v").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(rv.Set("job", 1, "toolong", "v").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(rv.Set("job", 1, "a", std::string(9, 'x')).code(),
            absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(rv.Set("job", 1, "a", std::string(8, 'x')).ok());
  ASSERT_TRUE(rv.Set("job", 1, "b", "v").ok());
  EXPECT_EQ(rv.Set("job", 1, "c", "v").code(), absl::StatusCode::kResourceExhausted);
  // Replacing an existing key does not count as a new one; other namespaces have their own room.
  EXPECT_TRUE(rv.Set("job", 1, "b", "w").ok());
  EXPECT_TRUE(rv.Set("job", 2, "c", "v").ok());
}

TEST(RendezvousTest, EndAttemptsDropsAndWakesWaitersAndRefusesLateCalls) {
  FakeClock clock;
  Rendezvous rv(clock);
  ASSERT_TRUE(rv.Set("job", 1, "a", "1").ok());
  ASSERT_TRUE(rv.Set("job", 2, "a", "2").ok());
  ASSERT_TRUE(rv.Set("other", 1, "a", "x").ok());
  EXPECT_EQ(rv.NamespaceCount(), 3);

  absl::StatusOr<std::string> waited;
  std::thread waiter([&] { waited = rv.Get("job", 2, "never", absl::Hours(1)); });
  while (rv.WaitersForTesting() == 0) std::this_thread::yield();  // it really waits
  rv.EndAttempts("job", 2);
  waiter.join();  // woken at once, not after an hour
  EXPECT_EQ(waited.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(waited.status().message(), HasSubstr("has ended"));
  EXPECT_EQ(rv.NamespaceCount(), 1);
  EXPECT_EQ(rv.Set("job", 1, "a", "late").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(rv.Get("job", 2, "a", absl::ZeroDuration()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // A newer attempt starts clean.
  EXPECT_TRUE(rv.Set("job", 3, "a", "3").ok());
  EXPECT_EQ(*rv.Get("other", 1, "a", absl::ZeroDuration()), "x");
}

TEST(RendezvousTest, AForgottenJobLeavesNothingBehind) {
  FakeClock clock;
  Rendezvous rv(clock);
  ASSERT_TRUE(rv.Set("job", 3, "a", "1").ok());
  rv.EndAttempts("job", 3);
  ASSERT_TRUE(rv.Set("other", 1, "a", "x").ok());
  rv.Forget("job");
  EXPECT_EQ(rv.NamespaceCount(), 1);
  // The record that its attempts ended is gone too: nothing of the job is refused any more.
  EXPECT_TRUE(rv.Set("job", 1, "a", "again").ok());
  EXPECT_EQ(*rv.Get("other", 1, "a", absl::ZeroDuration()), "x");
}

TEST(RendezvousTest, IdleNamespacesExpireWhenAnotherIsCreated) {
  FakeClock clock;
  RendezvousOptions options;
  options.idle_ttl = absl::Hours(1);
  Rendezvous rv(clock, options);
  ASSERT_TRUE(rv.Set("old", 1, "a", "1").ok());
  clock.Advance(absl::Minutes(30));
  ASSERT_TRUE(rv.Set("recent", 1, "a", "1").ok());
  clock.Advance(absl::Minutes(45));
  ASSERT_TRUE(rv.Set("new", 1, "a", "1").ok());
  EXPECT_EQ(rv.NamespaceCount(), 2);  // "old" idle for 75 min is gone
  EXPECT_EQ(rv.Get("old", 1, "a", absl::ZeroDuration()).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(RendezvousTest, ShutdownWakesWaiters) {
  FakeClock clock;
  Rendezvous rv(clock);
  absl::StatusOr<std::string> waited;
  std::thread waiter([&] { waited = rv.Get("job", 1, "k", absl::Hours(1)); });
  while (rv.WaitersForTesting() == 0) std::this_thread::yield();  // it really waits
  rv.Shutdown();
  waiter.join();
  EXPECT_EQ(waited.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(rv.Set("job", 1, "k", "v").code(), absl::StatusCode::kUnavailable);
}

// The store as the coordinator serves it: fenced by generation, gone with the attempt.
class JobManagerRendezvousTest : public JobManagerTest {
 protected:
  void SetUp() override {
    Open();
    for (const char* name : {"w1", "w2"}) {
      v1::RegisterWorkerRequest request;
      request.set_name(name);
      request.set_address(std::string("10.0.0.") + (name[1] == '1' ? "1" : "2"));
      request.set_slots(1);
      ASSERT_TRUE(manager_->RegisterWorker(request).ok());
    }
    auto job = manager_->SubmitJob(TestSpec("dp", 2, 2));
    ASSERT_TRUE(job.ok()) << job.status();
    id_ = job->id();
    manager_->Tick();
  }

  std::string id_;
};

TEST_F(JobManagerRendezvousTest, TasksCarryTheirWorkersAddress) {
  for (int rank = 0; rank < 2; ++rank) {
    absl::StatusOr<v1::Task> task = manager_->TaskFor(id_ + ".g1.r" + std::to_string(rank));
    ASSERT_TRUE(task.ok()) << task.status();
    const std::string expected =
        manager_->GetJob(id_)->tasks(rank).worker_id() == "w1" ? "10.0.0.1" : "10.0.0.2";
    EXPECT_EQ(task->worker_address(), expected);
  }
}

TEST_F(JobManagerRendezvousTest, FencedByJobAndGeneration) {
  ASSERT_EQ(manager_->GetJob(id_)->generation(), 1);
  EXPECT_TRUE(manager_->RendezvousSet(id_, 1, "0", "a").ok());
  EXPECT_EQ(*manager_->RendezvousGet(id_, 1, "0", absl::Seconds(1)), "a");
  EXPECT_EQ(manager_->RendezvousSet("nope", 1, "0", "a").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(manager_->RendezvousSet(id_, 0, "0", "a").code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(manager_->RendezvousGet(id_, 2, "0", absl::ZeroDuration()).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(JobManagerRendezvousTest, EndOfTheAttemptWakesWaitersAndClearsTheStore) {
  ASSERT_TRUE(manager_->RendezvousSet(id_, 1, "0", "a").ok());
  absl::StatusOr<std::string> waited;
  std::thread waiter([&] { waited = manager_->RendezvousGet(id_, 1, "1", absl::Seconds(30)); });
  // End the attempt only once the Get really waits, so that the wake-up is what answers it.
  while (manager_->RendezvousWaitersForTesting() == 0) std::this_thread::yield();
  ASSERT_TRUE(manager_->CancelJob(id_, "test").ok());
  waiter.join();
  EXPECT_EQ(waited.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(manager_->RendezvousGet(id_, 1, "0", absl::ZeroDuration()).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace trainyard
