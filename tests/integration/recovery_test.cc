// Automatic recovery on the real coordinator, worker agents and trainers on loopback: lost
// workers, preemption notices (SIGTERM and the cloud endpoints), failures and their budget, a
// coordinator killed mid-job, hangs, elastic restarts and fencing of old attempts.

#include <signal.h>
#include <sys/wait.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/formats/safetensors.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster.h"
#include "trainyard/v1/agent_service.grpc.pb.h"

namespace trainyard::testing {
namespace {

using ::testing::HasSubstr;
using trainyard::v1::Job;

// A data-parallel job that takes a few seconds: big enough per step that a failure lands
// mid-job, small enough to train fast. No dropout and no shuffling randomness beyond the seed,
// so an interrupted run can be compared with an uninterrupted one.
std::string RecoveryJob(const std::string& name, const std::string& workers, int64_t max_steps,
                        const std::string& extra = "") {
  return absl::StrCat("name: ", name, R"(
strategy: data_parallel
workers: )",
                      workers, R"(
model:
  builtin: mlp
  args: {inputs: 32, hidden: [256, 256], classes: 4}
data:
  synthetic: {samples: 4096, features: 32, classes: 4, noise: 0.5}
batch_size: 48
optimizer: {name: sgd, lr: 0.02, momentum: 0.9}
log_every_steps: 10
seed: 11
collective_timeout: 30s
checkpoint: {every_steps: 25, keep_last: 2}
max_steps: )",
                      max_steps, "\n", extra);
}

TEST(RecoveryTest, KilledWorkerRestartsTheGangAndEndsLikeAnUninterruptedRun) {
  Cluster cluster(QuickRestarts(3));
  const Job reference = RunToSuccess(cluster, RecoveryJob("reference", "2", 400));

  auto running = SubmitAndHold(cluster, "survivor", RecoveryJob("survivor", "2", 400), 60, 50);
  ASSERT_TRUE(running.ok()) << running.status();
  ASSERT_EQ(running->state(), v1::RUNNING) << running->reason();
  const std::string id = running->id();
  // The machine of rank 1 vanishes: its agent and its trainer die at once.
  const int victim = WorkerOfRank(*running, 1);
  ASSERT_GE(victim, 0);
  std::optional<pid_t> trainer = cluster.TrainerPid(victim, TaskId(*running, 1));
  ASSERT_TRUE(trainer.has_value());
  // What rank 0 of this attempt presents to the coordinator, from its task folder.
  v1::Task task_g1;
  ASSERT_TRUE(task_g1.ParseFromString(ReadFile(absl::StrCat(
      cluster.worker_dir(WorkerOfRank(*running, 0)), "/tasks/", TaskId(*running, 0), "/task.pb"))));
  const std::string credential_g1 = task_g1.credential();
  ASSERT_FALSE(credential_g1.empty());
  cluster.worker(victim).Signal(SIGKILL);
  kill(*trainer, SIGKILL);
  // The surviving rank cannot finish without its peer: let it go on into the broken gang.
  cluster.Release("survivor");

  auto done = cluster.WaitForFinal(id, absl::Seconds(240));
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->state(), v1::SUCCEEDED) << done->reason();
  ASSERT_EQ(done->restarts_size(), 1);
  EXPECT_EQ(done->restarts(0).reason(), v1::WORKER_LOST) << done->restarts(0).message();
  EXPECT_TRUE(done->restarts(0).recovered());
  // Resumed from a checkpoint, not from the start (which would end at the same parameters).
  EXPECT_GE(done->restarts(0).resumed_step(), running->committed_step());
  EXPECT_EQ(done->generation(), 2);
  const auto describe = cluster.Cli({"describe", id});
  EXPECT_THAT(describe.output, HasSubstr("worker_lost"));
  EXPECT_THAT(describe.output, HasSubstr("Restarts:         1"));
  EXPECT_LE(MaxDifference(CommittedModel(reference), CommittedModel(*done)), 1e-5);

  // A trainer of the first attempt that reports now is refused, even with the credential of its
  // own attempt, which the coordinator handed its worker.
  auto stub = v1::AgentService::NewStub(cluster.NewChannel(credential_g1));
  grpc::ClientContext context;
  v1::ReportProgressRequest request;
  request.set_job_id(id);
  request.set_generation(1);
  request.mutable_progress()->set_step(5);
  v1::ReportProgressResponse response;
  const grpc::Status stale = stub->ReportProgress(&context, request, &response);
  EXPECT_EQ(stale.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
}

TEST(RecoveryTest, AJobWhoseDataCannotBeReadFailsAtOnceWithItsCause) {
  Cluster cluster(QuickRestarts(1));
  // A spec whose data cannot be read would fail the same way on every attempt: a user error
  // (the trainer's exit code 2) is not retried, whatever max_failures allows.
  const std::string yaml = R"(name: always-fails
model: {builtin: mlp, args: {inputs: 4, hidden: [8], classes: 2}}
data: {train: /nonexistent/train-*.safetensors}
max_steps: 10
restart: {max_failures: 1}
)";
  auto broken = cluster.Submit(yaml);
  ASSERT_TRUE(broken.ok()) << broken.status();
  auto done = cluster.WaitForFinal(broken->id(), absl::Seconds(60));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::FAILED);
  EXPECT_EQ(done->generation(), 1);
  EXPECT_EQ(done->restarts_size(), 0);
  EXPECT_THAT(done->reason(), HasSubstr("exited with code 2: data.train"));
  EXPECT_THAT(done->reason(), HasSubstr("(a user error: the job is not restarted)"));
}

TEST(RecoveryTest, StalledRankIsRestartedAsAHang) {
  Cluster cluster(QuickRestarts(1));
  auto submitted = cluster.Submit(SyntheticJobYaml("stall", 100000000, "stall_timeout: 3s\n"));
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  auto running = cluster.WaitFor(submitted->id(), [](const Job& job) {
    return job.state() == v1::RUNNING && job.progress().step() >= 5;
  });
  ASSERT_TRUE(running.ok()) << running.status();
  std::optional<pid_t> trainer = cluster.TrainerPid(0, TaskId(*running, 0));
  ASSERT_TRUE(trainer.has_value());
  ASSERT_EQ(kill(*trainer, SIGSTOP), 0);
  // Alive (its agent keeps the lease) but no progress: a hang, and a new attempt.
  auto restarted = cluster.WaitFor(
      submitted->id(),
      [](const Job& job) { return job.restarts_size() > 0 && job.restarts(0).recovered(); },
      absl::Seconds(60));
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  ASSERT_GE(restarted->restarts_size(), 1) << restarted->reason();
  EXPECT_EQ(restarted->restarts(0).reason(), v1::HANG);
  EXPECT_THAT(restarted->restarts(0).message(), HasSubstr("no step progress for 3s"));
  EXPECT_FALSE(ProcessAlive(*trainer));  // the agent killed the frozen trainer
  EXPECT_EQ(cluster.Cli({"cancel", submitted->id()}).exit_code, 0);
}

TEST(RecoveryTest, CoordinatorKilledMidJobComesBackAndTheJobSucceeds) {
  Cluster cluster(QuickRestarts(2));
  auto running = SubmitAndHold(cluster, "durable", RecoveryJob("durable", "2", 400), 30, 25);
  ASSERT_TRUE(running.ok()) << running.status();
  // Acknowledged just before the crash: it must exist after.
  auto queued = cluster.Submit(SyntheticJobYaml("acknowledged", 5));
  ASSERT_TRUE(queued.ok()) << queued.status();
  cluster.KillCoordinator(SIGKILL);
  // The trainers train on while the coordinator is down, and report once it is back.
  cluster.Release("durable");
  cluster.StartCoordinator();

  auto done = cluster.WaitForFinal(running->id(), absl::Seconds(240));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::SUCCEEDED) << done->reason();
  // The trainers kept training and reported again: the same attempt, never a second one.
  EXPECT_EQ(done->generation(), 1);
  EXPECT_EQ(done->restarts_size(), 0);
  auto acknowledged = cluster.WaitForFinal(queued->id(), absl::Seconds(120));
  ASSERT_TRUE(acknowledged.ok()) << acknowledged.status();
  EXPECT_EQ(acknowledged->state(), v1::SUCCEEDED) << acknowledged->reason();
}

TEST(RecoveryTest, ElasticJobContinuesOnFewerWorkersLikeAnUninterruptedRun) {
  Cluster cluster(QuickRestarts(3));
  const Job reference = RunToSuccess(cluster, RecoveryJob("elastic-reference", "3", 400));

  auto running =
      SubmitAndHold(cluster, "elastic", RecoveryJob("elastic", "{min: 2, max: 3}", 400), 60, 50);
  ASSERT_TRUE(running.ok()) << running.status();
  const std::string id = running->id();
  ASSERT_EQ(running->progress().world_size(), 3);
  const int victim = WorkerOfRank(*running, 2);
  ASSERT_GE(victim, 0);
  std::optional<pid_t> trainer = cluster.TrainerPid(victim, TaskId(*running, 2));
  ASSERT_TRUE(trainer.has_value());
  cluster.worker(victim).Signal(SIGKILL);
  kill(*trainer, SIGKILL);
  cluster.Release("elastic");

  auto done = cluster.WaitForFinal(id, absl::Seconds(240));
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->state(), v1::SUCCEEDED) << done->reason();
  EXPECT_EQ(done->progress().world_size(), 2);
  ASSERT_EQ(done->restarts_size(), 1);
  EXPECT_EQ(done->restarts(0).reason(), v1::WORKER_LOST);
  EXPECT_GE(done->restarts(0).resumed_step(), running->committed_step());
  EXPECT_LE(MaxDifference(CommittedModel(reference), CommittedModel(*done)), 1e-5);
}

// Every attempt of a preempted job is held this many updates after it starts (Cluster::Hold),
// so that the notice always lands mid-run, however fast the machine trains.
constexpr int64_t kHeldAfter = 30;

// Preempts the worker running rank 0 of the job's current attempt, held kHeldAfter updates in
// (the caller holds the job), by `preempt(worker index)`, and checks that the next attempt
// starts exactly where the gang stopped. Returns the preempted worker's index.
int PreemptAndCheckNoStepLost(Cluster& cluster, const std::string& id, int64_t generation,
                              const std::function<void(int)>& preempt) {
  auto running = cluster.WaitFor(id, [generation](const Job& job) {
    return job.state() == v1::RUNNING && job.generation() == generation &&
           job.progress().step() == job.progress().attempt_start_step() + kHeldAfter;
  });
  EXPECT_TRUE(running.ok()) << running.status();
  if (!running.ok() || running->state() != v1::RUNNING) return -1;
  const int victim = WorkerOfRank(*running, 0);
  preempt(victim);
  // The agent saves, reports and exits within its grace period.
  std::optional<int> exit = cluster.worker(victim).Wait(absl::Seconds(30));
  EXPECT_TRUE(exit.has_value() && WIFEXITED(*exit) && WEXITSTATUS(*exit) == 0)
      << "agent of worker " << victim << " did not exit 0 in time";
  auto recovered = cluster.WaitFor(id, [generation](const Job& job) {
    return job.restarts_size() >= generation && job.restarts(generation - 1).recovered();
  });
  EXPECT_TRUE(recovered.ok()) << recovered.status();
  if (!recovered.ok() || recovered->restarts_size() < generation) return victim;
  const v1::Restart& r = recovered->restarts(generation - 1);
  EXPECT_EQ(r.reason(), v1::PREEMPTED) << r.message();
  EXPECT_EQ(r.steps_lost(), 0) << r.message();
  const int64_t stopped = StoppedAtStep(*recovered, generation);
  EXPECT_GT(stopped, 0);
  EXPECT_EQ(r.resumed_step(), stopped) << "the next attempt must start where the gang stopped";
  return victim;
}

TEST(RecoveryTest, SigtermToABusyAgentCheckpointsAtTheAgreedStepAndLosesNothing) {
  Cluster cluster(QuickRestarts(3));
  const Job reference = RunToSuccess(cluster, RecoveryJob("sigterm-reference", "2", 1000));
  cluster.Hold("sigterm", kHeldAfter);
  auto submitted = cluster.Submit(RecoveryJob("sigterm", "2", 1000));
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  const int victim = PreemptAndCheckNoStepLost(
      cluster, submitted->id(), 1, [&](int worker) { cluster.worker(worker).Signal(SIGTERM); });
  cluster.Release("sigterm");
  auto done = cluster.WaitForFinal(submitted->id(), absl::Seconds(240));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::SUCCEEDED) << done->reason();
  ASSERT_EQ(done->restarts_size(), 1);
  EXPECT_THAT(
      done->restarts(0).message(),
      HasSubstr(absl::StrCat("preemption notice for worker worker-", victim, " (SIGTERM)")));
  // Exact resume: on CPU and the same world size, bit for bit the uninterrupted run.
  EXPECT_EQ(MaxDifference(CommittedModel(reference), CommittedModel(*done)), 0.0);
}

TEST(RecoveryTest, ThreePreemptionsInARowStillSucceed) {
  Cluster cluster(QuickRestarts(4));
  cluster.Hold("spot", kHeldAfter);
  auto submitted = cluster.Submit(RecoveryJob("spot", "1", 8000));
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  for (int generation = 1; generation <= 3; ++generation) {
    PreemptAndCheckNoStepLost(cluster, submitted->id(), generation,
                              [&](int worker) { cluster.worker(worker).Signal(SIGTERM); });
  }
  cluster.Release("spot");
  auto done = cluster.WaitForFinal(submitted->id(), absl::Seconds(240));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::SUCCEEDED) << done->reason();
  EXPECT_EQ(done->restarts_size(), 3);
  EXPECT_EQ(done->generation(), 4);
}

class NoticeUrlTest : public ::testing::TestWithParam<std::string> {};

TEST_P(NoticeUrlTest, CloudNoticeActsLikeSigterm) {
  TempDir flags;
  const std::string port_file = flags.path() + "/port";
  Process server({"/usr/bin/python3", SourceDir() + "/tests/integration/notice_server.py",
                  flags.path(), port_file},
                 flags.path() + "/server.log");
  std::string port;
  ASSERT_TRUE(PollUntil(
      [&] {
        port = std::string(absl::StripAsciiWhitespace(ReadFile(port_file)));
        return !port.empty();
      },
      absl::Seconds(20)))
      << server.Log();
  const bool gce = GetParam() == "gce";
  ClusterOptions options = QuickRestarts(3);
  options.worker_args.push_back(absl::StrCat(
      "--preemption_notice_url=http://127.0.0.1:", port, "/worker-{i}",
      gce ? "/computeMetadata/v1/instance/preempted" : "/latest/meta-data/spot/instance-action"));
  options.worker_args.push_back("--preemption_poll_interval=200ms");
  Cluster cluster(options);
  const std::string name = absl::StrCat("notice-", GetParam());
  cluster.Hold(name, kHeldAfter);
  auto submitted = cluster.Submit(RecoveryJob(name, "2", 1000));
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  PreemptAndCheckNoStepLost(cluster, submitted->id(), 1, [&](int worker) {
    std::ofstream(absl::StrCat(flags.path(), "/worker-", worker)) << "preempted\n";
  });
  cluster.Release(name);
  auto done = cluster.WaitForFinal(submitted->id(), absl::Seconds(240));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::SUCCEEDED) << done->reason();
  ASSERT_EQ(done->restarts_size(), 1);
  EXPECT_THAT(done->restarts(0).message(), HasSubstr(absl::StrCat("(", GetParam(), ")")));
}

INSTANTIATE_TEST_SUITE_P(Shapes, NoticeUrlTest, ::testing::Values("gce", "aws"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
}  // namespace trainyard::testing
