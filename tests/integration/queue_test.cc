// Sharing a cluster on the real coordinator, worker agents and trainers on loopback: a job of
// higher priority preempts a running one through the coordinated save (0 steps lost, the victim
// resumes exactly), a queue takes back the quota another queue borrowed, and queues refuse what
// they can never hold, or a priority above their cap for users.

#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster.h"

namespace trainyard::testing {
namespace {

using ::testing::HasSubstr;
using trainyard::v1::Job;

// A data-parallel job of two ranks that takes a few seconds, deterministic (so that an
// interrupted run can be compared with an uninterrupted one).
std::string TwoRankJob(const std::string& name, int64_t max_steps, const std::string& extra = "") {
  return absl::StrCat("name: ", name, R"(
strategy: data_parallel
workers: 2
model:
  builtin: mlp
  args: {inputs: 32, hidden: [128], classes: 4}
data:
  synthetic: {samples: 2048, features: 32, classes: 4, noise: 0.5}
batch_size: 32
optimizer: {name: sgd, lr: 0.02, momentum: 0.9}
log_every_steps: 10
seed: 5
collective_timeout: 30s
checkpoint: {every_steps: 20, keep_last: 2}
max_steps: )",
                      max_steps, "\n", extra);
}

ClusterOptions TwoWorkers() {
  ClusterOptions options;
  options.workers = 2;
  options.slots_per_worker = 1;
  options.coordinator_args = {"--restart_backoff=200ms"};
  options.worker_args = {"--sync_wait=500ms"};
  return options;
}

constexpr int64_t kHeldAfter = 25;

bool HasEvent(const Job& job, const std::string& text) {
  for (const v1::JobEvent& e : job.events()) {
    if (e.reason().find(text) != std::string::npos) return true;
  }
  return false;
}

// Waits for `id` to be preempted by the scheduler (its first restart recorded and recovered) and
// checks that no step was lost: the next attempt starts where the gang saved.
void ExpectPreemptedWithoutLoss(Cluster& cluster, const std::string& id) {
  auto recovered = cluster.WaitFor(
      id, [](const Job& job) { return job.restarts_size() >= 1 && job.restarts(0).recovered(); });
  ASSERT_TRUE(recovered.ok()) << recovered.status();
  const v1::Restart& r = recovered->restarts(0);
  EXPECT_EQ(r.reason(), v1::SCHEDULER_PREEMPTED) << r.message();
  EXPECT_THAT(r.message(), HasSubstr("preempted by the scheduler for "));
  EXPECT_EQ(r.steps_lost(), 0) << r.message();
  const int64_t stopped = StoppedAtStep(*recovered, 1);
  EXPECT_GE(stopped, kHeldAfter);
  EXPECT_EQ(r.resumed_step(), stopped) << "the next attempt must start where the gang stopped";
}

TEST(QueueTest, HigherPriorityPreemptsWithoutLossAndTheVictimResumesExactly) {
  Cluster cluster(TwoWorkers());
  const Job reference = RunToSuccess(cluster, TwoRankJob("low-reference", 200));
  // The low-priority job fills both workers and is held after kHeldAfter updates.
  cluster.Hold("low", kHeldAfter);
  auto low = cluster.Submit(TwoRankJob("low", 200));
  ASSERT_TRUE(low.ok()) << low.status();
  auto held = cluster.WaitFor(low->id(), [](const Job& job) {
    return job.state() == v1::RUNNING && job.progress().step() == kHeldAfter;
  });
  ASSERT_TRUE(held.ok()) << held.status();
  // An urgent job arrives: the low one saves at a step its ranks agree on and leaves.
  auto high = cluster.Submit(TwoRankJob("high", 40, "priority: 10\n"));
  ASSERT_TRUE(high.ok()) << high.status();
  ExpectPreemptedWithoutLoss(cluster, low->id());
  cluster.Release("low");
  auto high_done = cluster.WaitForFinal(high->id(), absl::Seconds(180));
  ASSERT_TRUE(high_done.ok()) << high_done.status();
  EXPECT_EQ(high_done->state(), v1::SUCCEEDED) << high_done->reason();
  EXPECT_EQ(high_done->restarts_size(), 0);
  auto low_done = cluster.WaitForFinal(low->id(), absl::Seconds(240));
  ASSERT_TRUE(low_done.ok()) << low_done.status();
  EXPECT_EQ(low_done->state(), v1::SUCCEEDED) << low_done->reason();
  ASSERT_EQ(low_done->restarts_size(), 1);
  EXPECT_TRUE(HasEvent(*low_done, absl::StrCat("preempted by the scheduler for ", high->id(),
                                               " (priority 10 over 0 in queue default)")));
  // The urgent job ran while the low one waited: it ended before the low one came back.
  int64_t low_resumed_ms = 0;
  for (const v1::JobEvent& e : low_done->events()) {
    if (e.to() == v1::SCHEDULED && e.from() == v1::PENDING) low_resumed_ms = e.time_unix_ms();
  }
  EXPECT_GE(low_resumed_ms, high_done->started_unix_ms());
  // Exact resume: bit for bit the uninterrupted run.
  EXPECT_EQ(MaxDifference(CommittedModel(reference), CommittedModel(*low_done)), 0.0);
}

TEST(QueueTest, AQueueTakesBackWhatAnotherBorrowedAndRefusesWhatItCanNeverHold) {
  Cluster cluster(TwoWorkers());
  // Team a may use one slot of its own and borrow the other; team b owns one slot.
  auto made = cluster.Cli({"queue", "create", "team-a", "--slots", "1", "--users", "alice"});
  ASSERT_EQ(made.exit_code, 0) << made.output;
  made = cluster.Cli({"queue", "create", "team-b", "--slots", "1", "--borrow-slots", "0"});
  ASSERT_EQ(made.exit_code, 0) << made.output;
  // What a queue can never hold is refused at submission, with the numbers.
  const std::string spec = cluster.state_dir() + "/too-big.yaml";
  {
    std::ofstream out(spec);
    out << TwoRankJob("too-big", 10, "queue: team-b\n");
  }
  auto refused = cluster.Cli({"submit", spec});
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_THAT(refused.output,
              HasSubstr("queue 'team-b' lets a job hold at most 1 slots of quota; this one "
                        "needs 2 slots"));
  auto unknown = cluster.Submit(TwoRankJob("nowhere", 10, "queue: team-z\n"));
  ASSERT_FALSE(unknown.ok());
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("no queue 'team-z'"));
  // A user a queue does not list may not submit to it.
  const std::string bob = cluster.CreateToken("bob", v1::TOKEN_USER);
  auto bob_channel = v1::JobService::NewStub(cluster.NewChannel(bob));
  {
    grpc::ClientContext context;
    v1::SubmitJobRequest request;
    request.set_spec_yaml(TwoRankJob("bobs", 10, "queue: team-a\n"));
    v1::Job response;
    const grpc::Status status = bob_channel->SubmitJob(&context, request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED) << status.error_message();
  }

  // Team a's two-rank job borrows team b's idle slot.
  cluster.Hold("borrower", kHeldAfter);
  auto borrower = cluster.Submit(TwoRankJob("borrower", 200, "queue: team-a\n"));
  ASSERT_TRUE(borrower.ok()) << borrower.status();
  auto held = cluster.WaitFor(borrower->id(), [](const Job& job) {
    return job.state() == v1::RUNNING && job.progress().step() == kHeldAfter;
  });
  ASSERT_TRUE(held.ok()) << held.status();
  auto described = cluster.Cli({"queue", "describe", "team-a"});
  EXPECT_EQ(described.exit_code, 0) << described.output;
  EXPECT_THAT(described.output, HasSubstr("2 slots (1 borrowed)"));
  // Team b wants its slot back: the borrower saves and leaves, b's job runs, then a's resumes.
  std::string owner_spec = TwoRankJob("owner", 40, "queue: team-b\n");
  owner_spec.replace(owner_spec.find("workers: 2"), 10, "workers: 1");
  auto owner = cluster.Submit(owner_spec);
  ASSERT_TRUE(owner.ok()) << owner.status();
  ExpectPreemptedWithoutLoss(cluster, borrower->id());
  cluster.Release("borrower");
  auto owner_done = cluster.WaitForFinal(owner->id(), absl::Seconds(180));
  ASSERT_TRUE(owner_done.ok()) << owner_done.status();
  EXPECT_EQ(owner_done->state(), v1::SUCCEEDED) << owner_done->reason();
  auto borrower_done = cluster.WaitForFinal(borrower->id(), absl::Seconds(240));
  ASSERT_TRUE(borrower_done.ok()) << borrower_done.status();
  EXPECT_EQ(borrower_done->state(), v1::SUCCEEDED) << borrower_done->reason();
  EXPECT_TRUE(HasEvent(*borrower_done, "which reclaims its quota from queue team-a"));
  auto listed = cluster.Cli({"queue", "list"});
  EXPECT_EQ(listed.exit_code, 0) << listed.output;
  EXPECT_THAT(listed.output, HasSubstr("team-b"));
  // A queue with jobs not finished cannot go; an empty one can.
  auto deleted = cluster.Cli({"queue", "delete", "team-a"});
  EXPECT_EQ(deleted.exit_code, 0) << deleted.output;
}

// An admin caps with the CLI the priority users' jobs may ask for in a queue: a user's job over
// the cap is refused naming it, one at the cap and an admin's over it are taken, and the queue's
// list and description show the cap.
TEST(QueueTest, AnAdminCapsThePriorityUsersMayAskForInAQueue) {
  Cluster cluster(ClusterOptions{});
  auto made = cluster.Cli({"queue", "create", "shared", "--max-priority", "3"});
  ASSERT_EQ(made.exit_code, 0) << made.output;
  EXPECT_THAT(made.output, HasSubstr("users' max priority 3"));
  auto listed = cluster.Cli({"queue", "list", "--output", "json"});
  ASSERT_EQ(listed.exit_code, 0) << listed.output;
  EXPECT_THAT(listed.output, HasSubstr("\"maxPriority\": 3"));
  listed = cluster.Cli({"queue", "list"});
  EXPECT_THAT(listed.output, HasSubstr("MAX PRIORITY"));
  auto described = cluster.Cli({"queue", "describe", "shared"});
  EXPECT_THAT(described.output, HasSubstr("3 for users' jobs (admins' exempt)"));
  EXPECT_NE(cluster.Cli({"queue", "update", "shared", "--max-priority", "high"}).exit_code, 0);

  auto job = [](const std::string& name, int priority) {
    std::string spec =
        TwoRankJob(name, 10, absl::StrCat("queue: shared\npriority: ", priority, "\n"));
    spec.replace(spec.find("workers: 2"), 10, "workers: 1");
    return spec;
  };
  auto bob =
      v1::JobService::NewStub(cluster.NewChannel(cluster.CreateToken("bob", v1::TOKEN_USER)));
  auto submit_as_bob = [&bob](const std::string& spec) {
    grpc::ClientContext context;
    v1::SubmitJobRequest request;
    request.set_spec_yaml(spec);
    v1::Job response;
    return bob->SubmitJob(&context, request, &response);
  };
  grpc::Status status = submit_as_bob(job("over", 4));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED) << status.error_message();
  EXPECT_THAT(status.error_message(),
              HasSubstr("priority: 4 is above the cap of queue 'shared' (max_priority 3)"));
  status = submit_as_bob(job("at-cap", 3));
  EXPECT_TRUE(status.ok()) << status.error_message();
  auto admins = cluster.Submit(job("admins", 10));
  EXPECT_TRUE(admins.ok()) << admins.status();

  auto updated = cluster.Cli({"queue", "update", "shared", "--max-priority", "none"});
  ASSERT_EQ(updated.exit_code, 0) << updated.output;
  EXPECT_THAT(updated.output, HasSubstr("users' max priority none"));
  status = submit_as_bob(job("uncapped", 4));
  EXPECT_TRUE(status.ok()) << status.error_message();
}

}  // namespace
}  // namespace trainyard::testing
