// Data-parallel jobs on the real coordinator, two worker agents and their trainers on loopback.

#include <signal.h>

#include <optional>
#include <string>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster.h"

namespace trainyard::testing {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;
using trainyard::v1::Job;

std::string DataParallelJob(const std::string& name, int64_t max_steps) {
  return absl::StrCat(R"(
name: )",
                      name, R"(
strategy: data_parallel
workers: 2
model:
  builtin: mlp
  args: {inputs: 16, hidden: [32], classes: 4}
data:
  synthetic: {samples: 2048, features: 16, classes: 4, noise: 0.5}
batch_size: 32
optimizer: {name: sgd, lr: 0.05, momentum: 0.9}
max_steps: )",
                      max_steps, R"(
log_every_steps: 5
seed: 7
collective_timeout: 5s
checkpoint: {every_steps: 20, keep_last: 2}
)");
}

ClusterOptions TwoWorkers() {
  ClusterOptions options;
  options.workers = 2;
  options.slots_per_worker = 1;
  return options;
}

// The worker index that runs `rank` of the job's first attempt.
int WorkerOf(const Job& job, int rank) {
  for (const auto& task : job.tasks()) {
    if (task.rank() == rank) return task.worker_id() == "worker-0" ? 0 : 1;
  }
  return -1;
}

TEST(DataParallelTest, TwoRanksOnTwoWorkersTrainToSuccess) {
  Cluster cluster(TwoWorkers());
  auto submitted = cluster.Submit(DataParallelJob("dp-two", 40));
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  auto job = cluster.WaitForFinal(submitted->id());
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->state(), v1::SUCCEEDED) << job->reason();
  EXPECT_EQ(job->reason(), "training finished: all 2 ranks exited with code 0");
  ASSERT_EQ(job->tasks_size(), 2);
  EXPECT_NE(job->tasks(0).worker_id(), job->tasks(1).worker_id());  // spread
  EXPECT_EQ(job->progress().step(), 40);
  EXPECT_EQ(job->progress().world_size(), 2);
  EXPECT_GT(job->progress().compute_seconds(), 0) << job->progress().DebugString();
  EXPECT_EQ(job->committed_step(), 40);  // rank 0 checkpoints
  EXPECT_FALSE(job->model_uri().empty());
  auto logs = cluster.Logs(job->id(), 1);
  ASSERT_TRUE(logs.ok());
  EXPECT_THAT(*logs, HasSubstr("gloo: rank 1 of 2 connected"));
  EXPECT_THAT(*logs, HasSubstr("step=40 total=40"));
}

// Kills (or freezes) one rank mid-job and checks that the other does not hang in all-reduce.
// The victim's agent is frozen first when its rank is killed: the coordinator then cannot hear of
// the death and stop the survivor before the survivor finds the dead peer on its own, which is
// what this test is about (the coordinator's answer to a rank killed by a signal nobody sent is
// checked in task_report_test and local_cluster_test).
class DeadPeerTest : public ::testing::TestWithParam<int> {};

TEST_P(DeadPeerTest, TheOtherRankExitsWithACommunicatorErrorAndTheJobLeavesRunning) {
  const int sig = GetParam();
  Cluster cluster(TwoWorkers());
  auto submitted = cluster.Submit(DataParallelJob("dp-peer", 100000000));
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  auto running = cluster.WaitFor(submitted->id(), [](const Job& job) {
    return job.state() == v1::RUNNING && job.progress().step() >= 10;
  });
  ASSERT_TRUE(running.ok()) << running.status();
  const int victim_worker = WorkerOf(*running, 1);
  const int survivor_worker = WorkerOf(*running, 0);
  ASSERT_GE(victim_worker, 0);
  std::optional<pid_t> victim =
      cluster.TrainerPid(victim_worker, absl::StrCat(submitted->id(), ".g1.r1"));
  std::optional<pid_t> survivor =
      cluster.TrainerPid(survivor_worker, absl::StrCat(submitted->id(), ".g1.r0"));
  ASSERT_TRUE(victim.has_value() && survivor.has_value());

  Process& victim_agent = cluster.worker(victim_worker);
  if (sig == SIGKILL) victim_agent.Signal(SIGSTOP);
  absl::Cleanup thaw = [&] {
    victim_agent.Signal(SIGCONT);
    if (sig == SIGSTOP) kill(*victim, SIGCONT);  // a killed one's pid may be another's by now
  };
  const absl::Time start = absl::Now();
  ASSERT_EQ(kill(*victim, sig), 0);
  // The surviving rank ends on its own: at once when the peer's connections close, within the
  // 5 s collective timeout when the peer is frozen.
  EXPECT_TRUE(PollUntil([&] { return !ProcessAlive(*survivor); }, absl::Seconds(20)));
  const absl::Duration survivor_exit = absl::Now() - start;
  EXPECT_LT(survivor_exit, absl::Seconds(12));
  // Rank 0's exit, an infrastructure error, is all the coordinator has heard: a restart.
  auto job = cluster.WaitFor(
      submitted->id(),
      [](const Job& j) {
        return j.state() == v1::FAILED || j.state() == v1::CANCELLED || j.restarts_size() > 0;
      },
      absl::Seconds(60));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->restarts_size(), 1) << job->reason();
  EXPECT_EQ(job->restarts(0).reason(), v1::INFRASTRUCTURE) << job->restarts(0).message();

  // Rank 0's own report: an infrastructure exit naming the collective.
  ASSERT_TRUE(PollUntil(
      [&] {
        auto now = cluster.Get(submitted->id());
        return now.ok() && now->tasks(0).state() != v1::TASK_RUNNING &&
               now->tasks(0).state() != v1::TASK_STARTING;
      },
      absl::Seconds(30)));
  auto described = cluster.Get(submitted->id());
  ASSERT_TRUE(described.ok());
  const v1::TaskInfo& rank0 =
      described->tasks(0).rank() == 0 ? described->tasks(0) : described->tasks(1);
  EXPECT_EQ(rank0.exit_code(), 3) << rank0.message();
  EXPECT_THAT(rank0.message(), AnyOf(HasSubstr("all-reduce"), HasSubstr("broadcast")));
  if (sig == SIGSTOP) {
    EXPECT_THAT(rank0.message(), HasSubstr("collective timeout of 5s"));
    EXPECT_GE(survivor_exit, absl::Seconds(4));
  }
  // Cancelled while the victim (or its agent) is still frozen: what it reports once thawed cannot
  // end the job first.
  EXPECT_EQ(cluster.Cli({"cancel", submitted->id()}).exit_code, 0);
  std::move(thaw).Invoke();
  auto cancelled = cluster.WaitForFinal(submitted->id(), absl::Seconds(60));
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state(), v1::CANCELLED) << cancelled->reason();
}

INSTANTIATE_TEST_SUITE_P(KilledOrFrozen, DeadPeerTest, ::testing::Values(SIGKILL, SIGSTOP),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::string(info.param == SIGKILL ? "Killed" : "Frozen");
                         });

}  // namespace
}  // namespace trainyard::testing
