// Pipeline jobs on the real coordinator, worker agents and trainers on loopback: a 2-stage job and
// a 2 x 2 job end where the single job ends, a job resumes on another stage count, a stage's
// machine killed with SIGKILL restarts the job from its checkpoint, and a stage's machine
// preempted with SIGTERM saves at the step every stage agrees on and loses none; a model in one
// TorchScript file per stage trains as the single job on its files does.

#include <signal.h>
#include <sys/wait.h>

#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/formats/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/run_shell.h"
#include "tests/integration/cluster.h"

namespace trainyard::testing {
namespace {

using ::testing::HasSubstr;
using trainyard::v1::Job;

// A small transformer job; `strategy_lines` says how it is distributed ("strategy: pipeline\n
// workers: 2\npipeline: ..."), `extra` adds top-level lines and `checkpoint_extra` to its
// checkpoint section (", resume_from: ID").
std::string LmJob(const std::string& name, const std::string& tokens,
                  const std::string& strategy_lines, int64_t max_steps,
                  const std::string& extra = "", const std::string& checkpoint_extra = "") {
  return absl::StrCat("name: ", name, "\n", strategy_lines, R"(
model:
  builtin: transformer
  args: {vocab: 32, context: 16, layers: 2, dim: 32, heads: 2}
data: {tokens: )",
                      tokens, R"(, validation_split: 0.05}
batch_size: 8
optimizer: {name: adamw, lr: 0.001}
log_every_steps: 5
seed: 7
collective_timeout: 20s
checkpoint: {every_steps: 10, keep_last: 2)",
                      checkpoint_extra, R"(}
restart: {max_failures: 2}
max_steps: )",
                      max_steps, "\n", extra);
}

std::string Pipeline(int stages, int replicas, const std::string& schedule = "1f1b") {
  return absl::StrCat("strategy: pipeline\nworkers: ", stages * replicas,
                      "\npipeline: {stages: ", stages, ", microbatches: 2, schedule: ", schedule,
                      "}");
}

constexpr int64_t kSteps = 40;

// 2 stages and 2 x 2 train as the single job does; a job stopped at step 20 on 2 stages resumes
// on 4 and ends there too. Each stage reports its busy and idle time, which describe and the
// job's progress show.
TEST(PipelineIntegrationTest, StagesAndReplicasTrainAsTheSingleJobDoes) {
  Cluster cluster(QuickRestarts(4));
  TempDir data;
  const std::string tokens = WriteTokens(data.path());
  const Job single = RunToSuccess(cluster, LmJob("single", tokens, "strategy: single", kSteps));
  const auto reference = CommittedModel(single);
  ASSERT_FALSE(reference.empty());

  const Job two = RunToSuccess(cluster, LmJob("two", tokens, Pipeline(2, 1, "gpipe"), kSteps));
  EXPECT_EQ(two.committed_step(), kSteps);
  EXPECT_LE(MaxDifference(reference, CommittedModel(two)), 1e-5);
  EXPECT_EQ(two.reason(), "training finished: all 2 ranks exited with code 0");
  ASSERT_EQ(two.progress().pipeline_stages_size(), 2);
  for (const v1::PipelineStageTime& s : two.progress().pipeline_stages()) {
    EXPECT_GT(s.busy_seconds(), 0) << s.stage();
    EXPECT_GE(s.bubble(), 0);
    EXPECT_LT(s.bubble(), 1);
    EXPECT_NEAR(s.ideal_bubble(), 1.0 / 3.0, 1e-9);  // (2 - 1) / (2 + 2 - 1)
  }
  const auto describe = cluster.Cli({"describe", two.id()});
  EXPECT_THAT(describe.output, HasSubstr("1 replica, 2 micro-batches, gpipe"));
  EXPECT_THAT(describe.output, HasSubstr("Bubble:"));

  const Job grid = RunToSuccess(cluster, LmJob("grid", tokens, Pipeline(2, 2), kSteps));
  EXPECT_LE(MaxDifference(reference, CommittedModel(grid)), 1e-5);
  EXPECT_EQ(grid.progress().world_size(), 4);

  // Stopped at step 20 on 2 stages, resumed on 4.
  const Job half =
      RunToSuccess(cluster, LmJob("half", tokens, Pipeline(2, 1), kSteps, "stop_at_step: 20\n"));
  EXPECT_EQ(half.committed_step(), 20);
  const Job four = RunToSuccess(cluster, LmJob("four", tokens, Pipeline(4, 1), kSteps, "",
                                               absl::StrCat(", resume_from: ", half.id())));
  EXPECT_EQ(four.progress().attempt_start_step(), 20);
  EXPECT_LE(MaxDifference(reference, CommittedModel(four)), 1e-5);
}

// A model in two TorchScript files (model.stages), one per stage of a pipeline, ends where the
// single job chaining the same files ends; its export is one model.pt per file, which PyTorch
// loads and chains.
TEST(PipelineIntegrationTest, AModelInTorchScriptFilesTrainsOneFilePerStage) {
  if (std::system("/usr/bin/python3 -c 'import torch' 2>/dev/null") != 0) {
    GTEST_SKIP() << "needs /usr/bin/python3 with torch to write the modules";
  }
  Cluster cluster(QuickRestarts(2));
  TempDir dir;
  const auto [written, write_output] = RunShell(absl::StrCat(
      "/usr/bin/python3 -c \"import sys, torch; from torch import nn; torch.manual_seed(3); "
      "torch.jit.script(nn.Sequential(nn.Linear(8, 32), nn.ReLU())).save(sys.argv[1] + '/a.pt'); "
      "torch.jit.script(nn.Sequential(nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 3)))"
      ".save(sys.argv[1] + '/b.pt')\" ",
      dir.path(), " 2>&1"));
  ASSERT_EQ(written, 0) << write_output;
  auto job = [&](const std::string& name, const std::string& strategy_lines) {
    return ScriptFilesJobYaml(name, strategy_lines, {dir.path() + "/a.pt", dir.path() + "/b.pt"});
  };
  const Job single = RunToSuccess(cluster, job("single", "strategy: single"));
  const auto reference = CommittedModel(single);
  ASSERT_EQ(reference.size(), 6u);
  EXPECT_EQ(reference.count("1.2.weight"), 1u);
  const Job piped = RunToSuccess(cluster, job("piped", "strategy: pipeline\nworkers: 2"));
  EXPECT_EQ(piped.committed_step(), 20);
  EXPECT_LE(MaxDifference(reference, CommittedModel(piped)), 1e-5);
  ASSERT_THAT(piped.model_uri(), ::testing::EndsWith("/final/stages"));
  const std::string exported(absl::StripPrefix(piped.model_uri(), "file://"));
  const auto [loaded, output] =
      RunShell(absl::StrCat("/usr/bin/python3 -c \"import sys, torch; "
                            "a, b = (torch.jit.load(sys.argv[1] + f'/{i}.pt') for i in (0, 1)); "
                            "print(tuple(b(a(torch.zeros(4, 8))).shape), '%.9g' % float(getattr(b, "
                            "'2').weight[1, 2]))\" ",
                            exported, " 2>&1"));
  ASSERT_EQ(loaded, 0) << output;
  EXPECT_THAT(output, HasSubstr("(4, 3) "));
  // The trained weight, as the last checkpoint holds it ([3, 16]: row 1, column 2).
  double exported_weight = 0;
  ASSERT_TRUE(absl::SimpleAtod(output.substr(output.find(") ") + 2), &exported_weight)) << output;
  EXPECT_NEAR(exported_weight, reference.at("1.2.weight")[1 * 16 + 2], 1e-5);
}

// The machine of the last stage vanishes (SIGKILL to its agent and trainer): the job restarts
// from its last committed checkpoint. Then the same stage's machine gets a preemption notice
// (SIGTERM to its agent): every stage saves at the step they agree on, and the next attempt
// starts there, losing no step. Both end where the uninterrupted job ends.
TEST(PipelineIntegrationTest, AStageKilledOrPreemptedRecoversWithoutLosingCommittedWork) {
  // Four machines: one is lost, one preempted, and two are still there for the last attempt.
  Cluster cluster(QuickRestarts(4));
  TempDir data;
  const std::string tokens = WriteTokens(data.path());
  const auto reference =
      CommittedModel(RunToSuccess(cluster, LmJob("reference", tokens, "strategy: single", kSteps)));

  auto running =
      SubmitAndHold(cluster, "killed", LmJob("killed", tokens, Pipeline(2, 1), kSteps), 15, 10);
  ASSERT_TRUE(running.ok()) << running.status();
  const int victim = WorkerOfRank(*running, 1);
  ASSERT_GE(victim, 0);
  std::optional<pid_t> trainer = cluster.TrainerPid(victim, TaskId(*running, 1));
  ASSERT_TRUE(trainer.has_value());
  cluster.worker(victim).Signal(SIGKILL);
  kill(*trainer, SIGKILL);
  cluster.Release("killed");
  auto done = cluster.WaitForFinal(running->id(), absl::Seconds(240));
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->state(), v1::SUCCEEDED) << done->reason();
  ASSERT_EQ(done->restarts_size(), 1);
  EXPECT_EQ(done->restarts(0).reason(), v1::WORKER_LOST) << done->restarts(0).message();
  EXPECT_EQ(done->restarts(0).resumed_step(), 10);
  EXPECT_LE(MaxDifference(reference, CommittedModel(*done)), 1e-5);

  // The preemption of a stage's machine: held mid-run so that the notice lands there.
  cluster.Hold("spot", 15);
  auto submitted = cluster.Submit(LmJob("spot", tokens, Pipeline(2, 1), kSteps));
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  auto held = cluster.WaitFor(submitted->id(), [](const Job& job) {
    return job.state() == v1::RUNNING && job.progress().step() == 15;
  });
  ASSERT_TRUE(held.ok()) << held.status();
  const int preempted = WorkerOfRank(*held, 1);
  ASSERT_GE(preempted, 0);
  cluster.worker(preempted).Signal(SIGTERM);
  std::optional<int> exit = cluster.worker(preempted).Wait(absl::Seconds(60));
  EXPECT_TRUE(exit.has_value() && WIFEXITED(*exit) && WEXITSTATUS(*exit) == 0);
  auto recovered = cluster.WaitFor(submitted->id(), [](const Job& job) {
    return job.restarts_size() >= 1 && job.restarts(0).recovered();
  });
  ASSERT_TRUE(recovered.ok()) << recovered.status();
  const v1::Restart& restart = recovered->restarts(0);
  EXPECT_EQ(restart.reason(), v1::PREEMPTED) << restart.message();
  EXPECT_EQ(restart.steps_lost(), 0) << restart.message();
  EXPECT_EQ(restart.resumed_step(), StoppedAtStep(*recovered, 1));
  EXPECT_GE(restart.resumed_step(), 15);
  cluster.Release("spot");
  auto finished = cluster.WaitForFinal(submitted->id(), absl::Seconds(240));
  ASSERT_TRUE(finished.ok()) << finished.status();
  ASSERT_EQ(finished->state(), v1::SUCCEEDED) << finished->reason();
  EXPECT_LE(MaxDifference(reference, CommittedModel(*finished)), 1e-5);
}

}  // namespace
}  // namespace trainyard::testing
