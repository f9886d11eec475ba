// The real coordinator, a worker agent and trainers on loopback: a job's whole life.

#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/sha256.h"
#include "common/storage/checkpoint_layout.h"
#include "common/storage/object_store.h"
#include "common/storage/uri.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/cluster.h"

namespace trainyard::testing {
namespace {

using trainyard::v1::Job;

ClusterOptions NoWorkers() {
  ClusterOptions options;
  options.workers = 0;
  return options;
}

// The shared small job, checkpointing every `every_steps` (0: only at the end), keeping 2.
std::string SyntheticJob(const std::string& name, int64_t max_steps, int64_t every_steps = 0) {
  return SyntheticJobYaml(
      name, max_steps,
      absl::StrCat("checkpoint: {every_steps: ", every_steps, ", keep_last: 2}\n"));
}

// Checks a committed checkpoint folder: its manifest lists every object with its size and hash.
void ExpectValidManifest(const std::string& step_uri) {
  auto store = OpenObjectStore(step_uri);
  ASSERT_TRUE(store.ok()) << store.status();
  auto manifest_uri = NewestManifestUri(**store, step_uri);
  ASSERT_TRUE(manifest_uri.ok()) << manifest_uri.status();
  auto manifest_text = (*store)->Get(*manifest_uri);
  ASSERT_TRUE(manifest_text.ok()) << manifest_text.status();
  nlohmann::json manifest = nlohmann::json::parse(*manifest_text);
  ASSERT_TRUE(manifest.contains("objects"));
  ASSERT_GE(manifest["objects"].size(), 3u);
  bool has_model = false;
  for (const auto& object : manifest["objects"]) {
    const std::string name = object["name"];
    has_model |= absl::StartsWith(name, "model.g");
    auto data = (*store)->Get(JoinUri(step_uri, name));
    ASSERT_TRUE(data.ok()) << data.status();
    EXPECT_EQ(static_cast<int64_t>(data->size()), object["size"].get<int64_t>()) << name;
    EXPECT_EQ(Sha256Hex(*data), object["sha256"].get<std::string>()) << name;
  }
  EXPECT_TRUE(has_model);
}

TEST(JobLifecycleTest, SubmittedJobTrainsToSuccessWithCheckpoints) {
  Cluster cluster;
  auto submitted = cluster.Submit(SyntheticJob("learns", 60, 20));
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  EXPECT_EQ(submitted->state(), v1::PENDING);

  auto job = cluster.WaitForFinal(submitted->id());
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->state(), v1::SUCCEEDED) << job->reason();

  auto described = cluster.Get(job->id());
  ASSERT_TRUE(described.ok());
  EXPECT_EQ(described->progress().step(), 60);
  EXPECT_EQ(described->committed_step(), 60);
  std::vector<v1::JobState> path;
  for (const auto& event : described->events()) path.push_back(event.to());
  EXPECT_EQ(path,
            (std::vector<v1::JobState>{v1::PENDING, v1::SCHEDULED, v1::RUNNING, v1::SUCCEEDED}));
  for (const auto& event : described->events()) EXPECT_FALSE(event.reason().empty());
  // The placed task reaches the idle agent through its long poll, not at its next poll.
  EXPECT_LT(described->events(2).time_unix_ms() - described->events(1).time_unix_ms(), 1000);

  // Loss at the end is clearly below the loss at the start.
  auto logs = cluster.Logs(job->id());
  ASSERT_TRUE(logs.ok()) << logs.status();
  std::map<int64_t, double> losses = ParseStepLosses(*logs);
  ASSERT_EQ(losses.count(1), 1u) << *logs;
  ASSERT_EQ(losses.count(60), 1u) << *logs;
  EXPECT_LT(losses[60], 0.5 * losses[1]);

  // Checkpoints at 40 and 60 are kept (keep_last 2); 20 was retired and its objects deleted.
  grpc::ClientContext context;
  v1::ListCheckpointsRequest request;
  request.set_job_id(job->id());
  v1::ListCheckpointsResponse checkpoints;
  ASSERT_TRUE(cluster.jobs().ListCheckpoints(&context, request, &checkpoints).ok());
  ASSERT_EQ(checkpoints.checkpoints_size(), 2);
  EXPECT_EQ(checkpoints.checkpoints(0).step(), 60);
  EXPECT_EQ(checkpoints.checkpoints(1).step(), 40);
  for (const auto& checkpoint : checkpoints.checkpoints()) ExpectValidManifest(checkpoint.uri());
  auto store = OpenObjectStore(job->checkpoint_uri());
  ASSERT_TRUE(store.ok());
  auto retired = (*store)->List(JoinUri(job->checkpoint_uri(), "step-000000000020/"));
  ASSERT_TRUE(retired.ok());
  EXPECT_TRUE(retired->empty());

  // The trained model was exported.
  ASSERT_FALSE(described->model_uri().empty());
  EXPECT_TRUE((*store)->Head(described->model_uri()).ok());

  // Deleted with its checkpoints and model: its folder is gone, and so is the job.
  auto folder = LocalPath(job->checkpoint_uri());
  ASSERT_TRUE(folder.ok());
  ASSERT_TRUE(std::filesystem::exists(*folder));
  auto objects = (*store)->List(job->checkpoint_uri() + "/");
  ASSERT_TRUE(objects.ok());
  ASSERT_GT(objects->size(), 2u);  // two checkpoints and the model
  auto deleted = cluster.Cli({"delete", job->id(), "--checkpoints"});
  EXPECT_EQ(deleted.exit_code, 0) << deleted.output;
  EXPECT_TRUE(absl::StrContains(deleted.output,
                                absl::StrCat("deleted ", objects->size(), " checkpoint objects")))
      << deleted.output;
  EXPECT_FALSE(std::filesystem::exists(*folder));
  EXPECT_EQ(cluster.Get(job->id()).status().code(), absl::StatusCode::kNotFound);
}

TEST(JobLifecycleTest, CancelStopsTheRunningTrainer) {
  Cluster cluster;
  auto submitted = cluster.Submit(SyntheticJob("cancel-me", 100000000));
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  auto running = cluster.WaitFor(submitted->id(), [](const Job& job) {
    return job.state() == v1::RUNNING && job.progress().step() > 0;
  });
  ASSERT_TRUE(running.ok()) << running.status();
  const std::string task_id = absl::StrCat(submitted->id(), ".g1.r0");
  std::optional<pid_t> pid = cluster.TrainerPid(0, task_id);
  ASSERT_TRUE(pid.has_value());
  ASSERT_TRUE(ProcessAlive(*pid));

  auto cancel = cluster.Cli({"cancel", submitted->id()});
  EXPECT_EQ(cancel.exit_code, 0) << cancel.output;
  auto job = cluster.WaitForFinal(submitted->id());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::CANCELLED);
  // The agent stops the trainer (SIGTERM, then SIGKILL) and reports it stopped once reaped.
  EXPECT_TRUE(PollUntil([&] { return !ProcessAlive(*pid); }, absl::Seconds(30)));
  EXPECT_TRUE(PollUntil(
      [&] {
        auto now = cluster.Get(submitted->id());
        return now.ok() && now->tasks_size() == 1 && now->tasks(0).state() == v1::TASK_STOPPED;
      },
      absl::Seconds(30)));
  auto cancel_again = cluster.Cli({"cancel", submitted->id()});
  EXPECT_NE(cancel_again.exit_code, 0);
}

// What the user guide promises: a cancel makes rank 0 save and commit the step it stopped at, and
// `submit --resume-from` starts from there.
TEST(JobLifecycleTest, ACancelCommitsTheStepItStoppedAtAndAResumeStartsThere) {
  Cluster cluster;
  auto held = SubmitAndHold(cluster, "cancel-save", SyntheticJob("cancel-save", 100000000, 5),
                            /*held_at=*/13, /*committed=*/10);
  ASSERT_TRUE(held.ok()) << held.status();
  auto cancel = cluster.Cli({"cancel", held->id()});
  ASSERT_EQ(cancel.exit_code, 0) << cancel.output;
  auto cancelled = cluster.WaitForFinal(held->id());
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state(), v1::CANCELLED);
  // The stop's checkpoint commits as the trainer exits, after the job turned CANCELLED.
  ASSERT_TRUE(PollUntil(
      [&] {
        auto job = cluster.Get(held->id());
        return job.ok() && job->committed_step() == 13;
      },
      absl::Seconds(60)))
      << *cluster.Logs(held->id());

  const std::string spec_path = cluster.state_dir() + "/../cancel-save.yaml";
  std::ofstream(spec_path) << SyntheticJob("cancel-save", 20, 5);
  auto submit = cluster.Cli({"submit", spec_path, "--resume-from", held->id(), "--wait"});
  EXPECT_EQ(submit.exit_code, 0) << submit.output;
  auto logs = cluster.Logs(submit.FirstLine());
  ASSERT_TRUE(logs.ok());
  std::map<int64_t, double> losses = ParseStepLosses(*logs);
  ASSERT_FALSE(losses.empty()) << *logs;
  EXPECT_EQ(losses.begin()->first, 14) << *logs;
}

TEST(JobLifecycleTest, BadSpecIsRefusedNamingTheField) {
  Cluster cluster(NoWorkers());
  auto refused =
      cluster.Submit(absl::StrReplaceAll(SyntheticJob("bad", 10), {{"lr: 0.01", "lr: -1"}}));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("optimizer.lr"), absl::string_view::npos)
      << refused.status();

  // Through the CLI: the message names the field, the exit code says the spec was bad, and
  // nothing was stored.
  const std::string spec_path = cluster.state_dir() + "/../bad.yaml";
  {
    std::ofstream out(spec_path);
    out << absl::StrReplaceAll(SyntheticJob("bad", 10), {{"hidden: [32]", "hiden: [32]"}});
  }
  auto cli = cluster.Cli({"submit", spec_path});
  EXPECT_EQ(cli.exit_code, 2) << cli.output;
  EXPECT_NE(cli.output.find("model.args.hiden"), std::string::npos) << cli.output;
  auto listed = cluster.Cli({"jobs", "-o", "json"});
  EXPECT_EQ(listed.exit_code, 0) << listed.output;
  EXPECT_EQ(listed.output.find("\"bad"), std::string::npos) << listed.output;
}

// The workers say which LibTorch their trainers run (`trainyard workers`), and a model that calls
// an operator none of them has is refused at submission, naming it and the version: it never
// reaches a worker. (The archive is laid out as torch.jit.save writes it; its code calls
// torch.not_in_any_libtorch as a PyTorch 2 module calls torch.scaled_dot_product_attention, which
// LibTorch 1.13 lacks.)
TEST(JobLifecycleTest, AModelNoWorkerCanLoadIsRefusedNamingWhatItLacks) {
  Cluster cluster;
  Process runtime({BinDir() + "/trainyard-trainer", "--runtime"},
                  cluster.state_dir() + "/../runtime.log");
  ASSERT_TRUE(runtime.Wait(absl::Seconds(60)).has_value());
  const std::string log = runtime.Log();
  const size_t at = log.find("libtorch_version: \"");
  ASSERT_NE(at, std::string::npos) << log;
  const std::string version = log.substr(at + 19, log.find('"', at + 19) - at - 19);
  auto workers = cluster.Cli({"workers"});
  ASSERT_EQ(workers.exit_code, 0) << workers.output;
  EXPECT_NE(workers.output.find("LIBTORCH"), std::string::npos) << workers.output;
  EXPECT_NE(workers.output.find(" " + version), std::string::npos) << workers.output;

  // Paths in specs are taken as written (no ".."): the folder above the state folder, by name.
  const std::string dir = std::filesystem::path(cluster.state_dir()).parent_path().string();
  Process write({"/usr/bin/python3", "-c",
                 "import sys, zipfile\n"
                 "z = zipfile.ZipFile(sys.argv[1], 'w', zipfile.ZIP_DEFLATED)\n"
                 "z.writestr('m/code/__torch__.py', 'class M(Module):\\n  def forward(self, x: "
                 "Tensor) -> Tensor:\\n    return torch.not_in_any_libtorch(torch.relu(x))\\n')\n"
                 "z.writestr('m/version', '3\\n')\n",
                 dir + "/future.pt"},
                dir + "/write.log");
  ASSERT_EQ(write.Wait(absl::Seconds(60)), 0) << write.Log();
  const std::string spec_path = dir + "/future.yaml";
  std::ofstream(spec_path) << absl::StrReplaceAll(
      SyntheticJob("future", 10), {{"builtin: mlp\n  args: {inputs: 16, hidden: [32], classes: 4}",
                                    absl::StrCat("torchscript: ", dir, "/future.pt")}});
  auto cli = cluster.Cli({"submit", spec_path});
  EXPECT_NE(cli.exit_code, 0) << cli.output;
  EXPECT_NE(cli.output.find(absl::StrCat("LibTorch ", version)), std::string::npos) << cli.output;
  EXPECT_NE(cli.output.find("lacks aten::not_in_any_libtorch"), std::string::npos) << cli.output;
  auto listed = cluster.Cli({"jobs", "-o", "json"});
  EXPECT_EQ(listed.output.find("\"future"), std::string::npos) << listed.output;
}

TEST(JobLifecycleTest, FailingTrainerFailsTheJobWithItsCause) {
  Cluster cluster;
  const std::string yaml =
      absl::StrReplaceAll(SyntheticJob("no-data", 10),
                          {{"synthetic: {samples: 2048, features: 16, classes: 4, noise: 0.5}",
                            "train: /nonexistent/train-*.safetensors"}});
  auto submitted = cluster.Submit(yaml);
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  auto job = cluster.WaitForFinal(submitted->id());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::FAILED);
  EXPECT_NE(job->reason().find("data.train"), std::string::npos) << job->reason();

  auto describe = cluster.Cli({"describe", submitted->id()});
  EXPECT_EQ(describe.exit_code, 0) << describe.output;
  EXPECT_NE(describe.output.find("FAILED"), std::string::npos) << describe.output;
  EXPECT_NE(describe.output.find("data.train"), std::string::npos) << describe.output;
}

TEST(JobLifecycleTest, ResubmittedJobResumesFromTheKilledJobsCheckpoint) {
  Cluster cluster;
  auto first = cluster.Submit(SyntheticJob("resume", 100000000, 5));
  ASSERT_TRUE(first.ok()) << first.status();
  auto committed =
      cluster.WaitFor(first->id(), [](const Job& job) { return job.committed_step() >= 10; });
  ASSERT_TRUE(committed.ok()) << committed.status();
  std::optional<pid_t> pid = cluster.TrainerPid(0, absl::StrCat(first->id(), ".g1.r0"));
  ASSERT_TRUE(pid.has_value());
  ASSERT_EQ(kill(*pid, SIGKILL), 0);
  auto failed = cluster.WaitForFinal(first->id());
  ASSERT_TRUE(failed.ok()) << failed.status();
  EXPECT_EQ(failed->state(), v1::FAILED);
  const int64_t committed_step = failed->committed_step();
  ASSERT_GE(committed_step, 10);

  const std::string spec_path = cluster.state_dir() + "/../resume.yaml";
  {
    std::ofstream out(spec_path);
    out << SyntheticJob("resume", committed_step + 10, 5);
  }
  auto submit = cluster.Cli({"submit", spec_path, "--resume-from", first->id(), "--wait"});
  EXPECT_EQ(submit.exit_code, 0) << submit.output;
  auto second = cluster.Get(submit.FirstLine());
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->state(), v1::SUCCEEDED) << second->reason();

  // The second job's first step is the one after the committed step: nothing was redone.
  auto logs = cluster.Logs(second->id());
  ASSERT_TRUE(logs.ok());
  std::map<int64_t, double> losses = ParseStepLosses(*logs);
  ASSERT_FALSE(losses.empty()) << *logs;
  EXPECT_EQ(losses.begin()->first, committed_step + 1) << *logs;
  EXPECT_EQ(losses.rbegin()->first, committed_step + 10);
}

TEST(JobLifecycleTest, StateSurvivesACoordinatorRestart) {
  Cluster cluster(NoWorkers());
  auto submitted = cluster.Submit(SyntheticJob("durable", 10));
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  cluster.KillCoordinator(SIGKILL);
  cluster.StartCoordinator();
  auto job = cluster.Get(submitted->id());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::PENDING);
  EXPECT_EQ(job->spec().max_steps(), 10);
  ASSERT_GE(job->events_size(), 1);
  EXPECT_EQ(job->events(0).to(), v1::PENDING);
  // A job that cannot be placed says why.
  EXPECT_FALSE(job->reason().empty());
}

// A finished job's metric history (what the console charts) is in the store: whole after the
// coordinator is killed (-9) and started again.
TEST(JobLifecycleTest, AFinishedJobsMetricHistoryIsWholeAfterAKill9) {
  Cluster cluster;
  // Held at step 20 until the first points are in, so that the run reports more than its end.
  cluster.Hold("charted", 20);
  auto submitted = cluster.Submit(SyntheticJob("charted", 60));
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  auto history = [&]() {
    grpc::ClientContext context;
    v1::GetJobMetricsRequest request;
    request.set_id(submitted->id());
    v1::JobMetrics metrics;
    const grpc::Status status = cluster.jobs().GetJobMetrics(&context, request, &metrics);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return metrics;
  };
  ASSERT_TRUE(
      cluster
          .WaitFor(submitted->id(), [](const v1::Job& job) { return job.progress().step() == 20; })
          .ok());
  cluster.Release("charted");
  auto done = cluster.WaitForFinal(submitted->id());
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->state(), v1::SUCCEEDED) << done->reason();
  const v1::JobMetrics before = history();
  ASSERT_GE(before.points_size(), 2);
  EXPECT_TRUE(std::any_of(before.points().begin(), before.points().end(),
                          [](const v1::MetricPoint& p) { return p.progress().step() == 20; }));
  EXPECT_EQ(before.points(before.points_size() - 1).progress().step(), 60);
  cluster.KillCoordinator(SIGKILL);
  cluster.StartCoordinator();
  const v1::JobMetrics after = history();
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(before, after))
      << before.DebugString() << "\n---\n"
      << after.DebugString();
}

}  // namespace
}  // namespace trainyard::testing
