// Hangs that name their rank, on the real coordinator, agents and trainers: a data-parallel rank
// stuck in its data read (asked of `trainyard debug` while it hangs, then named by the restart),
// a rank frozen with SIGSTOP, and a pipeline stage that never sends. Each is held where the test
// needs it (the trainers' test holds), never caught by timing.

#include <signal.h>

#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster.h"

namespace trainyard::testing {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using trainyard::v1::Job;

std::string DataParallelJob(const std::string& name, const std::string& collective_timeout) {
  return absl::StrCat("name: ", name, R"(
strategy: data_parallel
workers: 2
model:
  builtin: mlp
  args: {inputs: 16, hidden: [32], classes: 4}
data:
  synthetic: {samples: 2048, features: 16, classes: 4, noise: 0.5}
batch_size: 32
optimizer: {name: sgd, lr: 0.05, momentum: 0.9}
max_steps: 100000000
log_every_steps: 5
seed: 7
collective_timeout: )",
                      collective_timeout, "\n");
}

// Waits for the job's first restart to carry a diagnosis; returns it (empty on a timeout, with a
// test failure).
std::string FirstDiagnosis(Cluster& cluster, const std::string& id) {
  auto job = cluster.WaitFor(
      id, [](const Job& j) { return j.restarts_size() > 0 && !j.restarts(0).diagnosis().empty(); },
      absl::Seconds(120));
  EXPECT_TRUE(job.ok()) << job.status();
  return job.ok() ? job->restarts(0).diagnosis() : "";
}

// Rank 1 of a 2-rank job is held in its data read before update 11; rank 0 waits for it in the
// all-reduce of that update.
absl::StatusOr<Job> HoldRankOneInItsData(Cluster& cluster, const std::string& name,
                                         const std::string& collective_timeout) {
  cluster.WriteHoldFile(name + ".data", "1 10");
  auto submitted = cluster.Submit(DataParallelJob(name, collective_timeout));
  if (!submitted.ok()) return submitted.status();
  const std::string id = submitted->id();
  if (!PollUntil(
          [&] {
            auto logs = cluster.Logs(id, 1);
            return logs.ok() && logs->find("in its data read at step 10") != std::string::npos;
          },
          absl::Seconds(120))) {
    return absl::DeadlineExceededError("rank 1 was never held in its data read");
  }
  return cluster.Get(id);
}

TEST(HangTest, DebugNamesARankStuckInItsDataReadWhileItHangs) {
  Cluster cluster(QuickRestarts(2));
  // The collective timeout is far away: the job hangs for as long as the test asks.
  auto held = HoldRankOneInItsData(cluster, "stuck-data", "600s");
  ASSERT_TRUE(held.ok()) << held.status();
  const int culprit_worker = WorkerOfRank(*held, 1);
  // Rank 0 enters the all-reduce that rank 1 never does as soon as its own backward pass is done.
  Cluster::CliResult debug;
  ASSERT_TRUE(PollUntil(
      [&] {
        debug = cluster.Cli({"debug", held->id()});
        return debug.exit_code == 0 && debug.output.find("never entered") != std::string::npos;
      },
      absl::Seconds(60)))
      << debug.output;
  EXPECT_THAT(debug.output,
              ContainsRegex(absl::StrCat("Diagnosis: rank 1 \\(worker-", culprit_worker,
                                         "\\) never entered all-reduce #[0-9]+: it has been in "
                                         "data loading for [0-9]+ s")));
  EXPECT_THAT(debug.output, ContainsRegex("all-reduce #[0-9]+ \\([0-9.]+ KiB\\) waiting"));
  // Every thread's stack of each trainer, rank 1's showing where it waits.
  Cluster::CliResult stacks = cluster.Cli({"debug", held->id(), "--stacks"});
  ASSERT_EQ(stacks.exit_code, 0) << stacks.output;
  EXPECT_THAT(stacks.output, HasSubstr("Stacks:"));
  EXPECT_THAT(stacks.output, HasSubstr("Thread 1"));
  EXPECT_THAT(stacks.output, HasSubstr("RunTrainer"));
  // It still runs: the debugger let it go.
  EXPECT_EQ(cluster.Get(held->id())->state(), v1::RUNNING);
  cluster.RemoveHoldFile("stuck-data.data");
  EXPECT_EQ(cluster.Cli({"cancel", held->id()}).exit_code, 0);
}

TEST(HangTest, TheRestartNamesARankStuckInItsDataRead) {
  Cluster cluster(QuickRestarts(2));
  auto held = HoldRankOneInItsData(cluster, "stuck-restart", "5s");
  ASSERT_TRUE(held.ok()) << held.status();
  const int culprit_worker = WorkerOfRank(*held, 1);
  const std::string diagnosis = FirstDiagnosis(cluster, held->id());
  EXPECT_THAT(diagnosis, ContainsRegex(absl::StrCat(
                             "^rank 1 \\(worker-", culprit_worker,
                             "\\) never entered all-reduce #[0-9]+: it has been in data loading "
                             "for [0-9]+ s$")));
  const Job job = *cluster.Get(held->id());
  EXPECT_EQ(job.restarts(0).reason(), v1::INFRASTRUCTURE);
  bool event = false;
  for (const v1::JobEvent& e : job.events()) event |= e.reason() == "diagnosis: " + diagnosis;
  EXPECT_TRUE(event);
  Cluster::CliResult described = cluster.Cli({"describe", held->id()});
  EXPECT_THAT(described.output, HasSubstr("gen 1 diagnosis: " + diagnosis));
  cluster.RemoveHoldFile("stuck-restart.data");
  EXPECT_EQ(cluster.Cli({"cancel", held->id()}).exit_code, 0);
}

TEST(HangTest, TheRestartNamesAFrozenRank) {
  Cluster cluster(QuickRestarts(2));
  auto submitted = cluster.Submit(DataParallelJob("frozen", "5s"));
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  auto running = cluster.WaitFor(submitted->id(), [](const Job& job) {
    return job.state() == v1::RUNNING && job.progress().step() >= 10;
  });
  ASSERT_TRUE(running.ok()) << running.status();
  const int victim_worker = WorkerOfRank(*running, 1);
  std::optional<pid_t> victim = cluster.TrainerPid(victim_worker, TaskId(*running, 1));
  ASSERT_TRUE(victim.has_value());
  ASSERT_EQ(kill(*victim, SIGSTOP), 0);
  const std::string diagnosis = FirstDiagnosis(cluster, submitted->id());
  EXPECT_THAT(diagnosis, HasSubstr(absl::StrCat("rank 1 (worker-", victim_worker, ")")));
  EXPECT_THAT(diagnosis, HasSubstr("its process was stopped (SIGSTOP or a debugger) in "));
  kill(*victim, SIGCONT);
  EXPECT_EQ(cluster.Cli({"cancel", submitted->id()}).exit_code, 0);
}

TEST(HangTest, TheRestartNamesAPipelineStageThatNeverSends) {
  Cluster cluster(QuickRestarts(2));
  TempDir data;
  const std::string tokens = WriteTokens(data.path());
  // Stage 0's 21st send: the first activation of update 11 (two micro-batches an update).
  cluster.WriteHoldFile("silent-stage.send", "0 21");
  auto submitted = cluster.Submit(absl::StrCat(R"(name: silent-stage
strategy: pipeline
workers: 2
pipeline: {stages: 2, microbatches: 2, schedule: 1f1b}
model:
  builtin: transformer
  args: {vocab: 32, context: 16, layers: 2, dim: 32, heads: 2}
data: {tokens: )",
                                               tokens, R"(}
batch_size: 8
optimizer: {name: adamw, lr: 0.001}
seed: 7
collective_timeout: 5s
max_steps: 100000000
)"));
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  const std::string diagnosis = FirstDiagnosis(cluster, submitted->id());
  auto job = cluster.Get(submitted->id());
  ASSERT_TRUE(job.ok());
  // The restart's attempt 1: where stage 0 ran.
  int stage0_worker = -1;
  for (const v1::TaskInfo& t : job->tasks()) {
    if (t.generation() == 1 && t.rank() == 0) stage0_worker = WorkerIndex(t.worker_id());
  }
  EXPECT_THAT(diagnosis, ContainsRegex(absl::StrCat(
                             "^rank 0 \\(worker-", stage0_worker,
                             "\\) never sent message #21 to rank 1: it has been in the forward "
                             "pass for [0-9]+ s$")));
  cluster.RemoveHoldFile("silent-stage.send");
  EXPECT_EQ(cluster.Cli({"cancel", submitted->id()}).exit_code, 0);
}

}  // namespace
}  // namespace trainyard::testing
