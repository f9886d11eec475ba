#include "server/jobs/job_manager.h"

#include <algorithm>
#include <atomic>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/jobs/job_manager_internal.h"
#include "server/store/sqlite_job_store.h"
#include "tests/common/fake_clock.h"
#include "tests/common/run_shell.h"
#include "tests/server/job_manager_fixture.h"

namespace trainyard {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

TEST_F(JobManagerTest, SingleJobRunsToSuccess) {
  Register("w1", 2);
  const std::string id = Submit(TestSpec("tiny"));
  EXPECT_EQ(id, "tiny-1");
  v1::Job job = Get(id);
  EXPECT_EQ(job.state(), v1::PENDING);
  EXPECT_EQ(job.checkpoint_uri(), "file:///ckpt/tiny-1");
  EXPECT_EQ(job.committed_step(), -1);

  manager_->Tick();
  job = Get(id);
  EXPECT_EQ(job.state(), v1::SCHEDULED);
  EXPECT_EQ(job.generation(), 1);
  ASSERT_EQ(job.tasks_size(), 1);
  EXPECT_EQ(job.tasks(0).worker_id(), "w1");

  v1::SyncResponse sync = Sync("w1");
  ASSERT_EQ(sync.tasks_size(), 1);
  const v1::Task& task = sync.tasks(0);
  EXPECT_EQ(task.task_id(), "tiny-1.g1.r0");
  EXPECT_EQ(task.job_id(), id);
  EXPECT_EQ(task.generation(), 1);
  EXPECT_EQ(task.world_size(), 1);
  EXPECT_EQ(task.spec().name(), "tiny");
  EXPECT_EQ(task.checkpoint_uri(), "file:///ckpt/tiny-1");
  EXPECT_EQ(task.slots(), 1);
  EXPECT_EQ(task.gpus(), 0);

  ASSERT_TRUE(Report("w1", task.task_id(), v1::TASK_RUNNING).ok());
  EXPECT_EQ(Get(id).state(), v1::RUNNING);
  ASSERT_EQ(manager_->ListWorkers().size(), 1u);
  EXPECT_EQ(manager_->ListWorkers()[0].slots_used(), 1);

  ASSERT_TRUE(Report("w1", task.task_id(), v1::TASK_EXITED, 0).ok());
  job = Get(id);
  EXPECT_EQ(job.state(), v1::SUCCEEDED);
  EXPECT_GT(job.finished_unix_ms(), 0);
  EXPECT_THAT(Reasons(job), ElementsAre("submitted", "placed on w1", "rank 0 running on w1",
                                        "training finished: rank 0 exited with code 0"));
  EXPECT_EQ(job.events(3).from(), v1::RUNNING);
  EXPECT_EQ(job.events(3).to(), v1::SUCCEEDED);
  // The finished task leaves the worker's desired state; repeating the report changes nothing.
  v1::SyncResponse after = Sync("w1", sync.version());
  EXPECT_THAT(after.tasks(), IsEmpty());
  ASSERT_TRUE(Report("w1", task.task_id(), v1::TASK_EXITED, 0).ok());
  EXPECT_EQ(Get(id).events_size(), 4);
  EXPECT_EQ(manager_->ListWorkers()[0].slots_used(), 0);
}

// A TorchScript archive laid out as torch.jit.save writes it, whose code is `code`.
void WriteModel(const std::string& path, const std::string& code) {
  const auto [rc, out] = testing::RunShell(absl::StrCat(
      "/usr/bin/python3 -c \"import sys, zipfile; ",
      "z = zipfile.ZipFile(sys.argv[1], 'w', zipfile.ZIP_DEFLATED); ",
      "z.writestr('m/code/__torch__.py', sys.argv[2]); z.writestr('m/version', '3\\n')\" '", path,
      "' '", code, "'"));
  ASSERT_EQ(rc, 0) << out;
}

void RegisterRuntime(JobManager& manager, const std::string& name, int slots,
                     const std::string& version, const std::vector<std::string>& ops) {
  v1::RegisterWorkerRequest request;
  request.set_name(name);
  request.set_slots(slots);
  if (!version.empty()) {
    request.mutable_runtime()->set_libtorch_version(version);
    request.mutable_runtime()->set_max_model_format_version(10);
    for (const std::string& op : ops) request.mutable_runtime()->add_ops(op);
  }
  ASSERT_TRUE(manager.RegisterWorker(request).ok());
}

// The operators a model calls (read from its archive at submission) decide which workers may
// run it: none that lacks one, and a submission no live worker can run is refused, naming the
// operator, the LibTorch versions and the workers.
TEST_F(JobManagerTest, ModelsGoOnlyToWorkersWhoseLibTorchHasTheirOperators) {
  const std::string model = dir_.path() + "/attention.pt";
  WriteModel(model,
             "def forward(x):\n  y = torch.linear(x, w, None)\n"
             "  return torch.scaled_dot_product_attention(y, y, y)\n");
  v1::JobSpec spec = TestSpec("attention");
  spec.mutable_model()->set_torchscript(model);
  const std::vector<std::string> old_ops = {"aten::linear", "aten::relu"};
  RegisterRuntime(*manager_, "old", 4, "1.13.0", old_ops);
  RegisterRuntime(*manager_, "silent", 4, "", {});

  absl::StatusOr<v1::Job> refused = manager_->SubmitJob(spec);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr(model));
  EXPECT_THAT(refused.status().message(),
              HasSubstr("LibTorch 1.13.0 (old) lacks aten::scaled_dot_product_attention"));
  EXPECT_THAT(refused.status().message(), HasSubstr("silent did not say"));

  // A worker whose LibTorch has it: the job goes there, though the others have more room.
  RegisterRuntime(*manager_, "new", 1, "2.6.0",
                  {"aten::linear", "aten::relu", "aten::scaled_dot_product_attention"});
  const std::string id = Submit(spec);
  EXPECT_THAT(Get(id).model_needs().ops(),
              ElementsAre("aten::linear", "aten::scaled_dot_product_attention"));
  manager_->Tick();
  v1::Job job = Get(id);
  ASSERT_EQ(job.tasks_size(), 1);
  EXPECT_EQ(job.tasks(0).worker_id(), "new");

  // While it runs, a second one waits for it, not for the others' free slots.
  const std::string second = Submit(spec);
  manager_->Tick();
  EXPECT_EQ(Get(second).state(), v1::PENDING);
  EXPECT_THAT(Get(second).reason(), HasSubstr("needs 1 slot, 0 free"));

  // Once "new" is gone, what waits says why.
  ASSERT_TRUE(manager_->CancelJob(id, "").ok());
  PassTime(absl::Seconds(30), {"old", "silent"});
  EXPECT_THAT(Get(second).reason(),
              HasSubstr("LibTorch 1.13.0 (old) lacks aten::scaled_dot_product_attention"));

  // A model with only what every LibTorch has runs anywhere; the workers show what they run.
  WriteModel(model, "def forward(x):\n  return torch.relu(x)\n");
  const std::string plain = Submit(spec);
  manager_->Tick();
  EXPECT_EQ(Get(plain).tasks(0).worker_id(), "old");
  for (const v1::Worker& w : manager_->ListWorkers()) {
    EXPECT_EQ(w.libtorch_version(), w.id() == "old"   ? "1.13.0"
                                    : w.id() == "new" ? "2.6.0"
                                                      : "")
        << w.id();
  }
}

TEST_F(JobManagerTest, AModelThatIsNotTorchScriptIsRefusedAtSubmission) {
  const std::string model = dir_.path() + "/weights.safetensors";
  { std::ofstream(model) << "{\"a\": 1}"; }
  v1::JobSpec spec = TestSpec("weights");
  spec.mutable_model()->set_torchscript(model);
  absl::StatusOr<v1::Job> refused = manager_->SubmitJob(spec);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("model.torchscript: "));
  EXPECT_THAT(refused.status().message(), HasSubstr("not a TorchScript archive"));
  // Where the coordinator cannot read it (another machine's disk), the trainer checks.
  spec.mutable_model()->set_torchscript("/no/such/folder/net.pt");
  const std::string id = Submit(spec);
  EXPECT_FALSE(Get(id).has_model_needs());
}

// model.stages: every file is read at submission, their operators joined; a file that is not
// TorchScript is refused naming its place in the list.
TEST_F(JobManagerTest, EveryFileOfAModelInStagesIsReadAtSubmission) {
  const std::string first = dir_.path() + "/first.pt";
  const std::string second = dir_.path() + "/second.pt";
  WriteModel(first, "def forward(x):\n  return torch.relu(x)\n");
  WriteModel(second, "def forward(x):\n  return torch.tanh(x)\n");
  v1::JobSpec spec = TestSpec("stages");
  spec.mutable_model()->clear_builtin();
  spec.mutable_model()->add_stages(first);
  spec.mutable_model()->add_stages(second);
  const std::string id = Submit(spec);
  const v1::ModelNeeds needs = Get(id).model_needs();
  EXPECT_THAT(needs.ops(), ElementsAre("aten::relu", "aten::tanh"));
  EXPECT_THAT(needs.read(), ElementsAre(first, second));
  EXPECT_EQ(needs.stage_tensor_bytes_size(), 2);

  const std::string weights = dir_.path() + "/weights.safetensors";
  { std::ofstream(weights) << "{\"a\": 1}"; }
  spec.mutable_model()->set_stages(1, weights);
  absl::StatusOr<v1::Job> refused = manager_->SubmitJob(spec);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("model.stages[1]: "));
}

TEST_F(JobManagerTest, FailingRankFailsTheJobAndStopsTheOthers) {
  Register("w1", 1);
  Register("w2", 1);
  const std::string id = Submit(TestSpec("dp", 2, 2));
  manager_->Tick();
  v1::SyncResponse s1 = Sync("w1");
  v1::SyncResponse s2 = Sync("w2");
  ASSERT_EQ(s1.tasks_size(), 1);
  ASSERT_EQ(s2.tasks_size(), 1);
  EXPECT_EQ(s1.tasks(0).world_size(), 2);
  EXPECT_EQ(Get(id).events(1).reason(), "placed on w1, w2");
  const std::string rank1 = s1.tasks(0).rank() == 1 ? s1.tasks(0).task_id() : s2.tasks(0).task_id();
  const std::string w_rank1 = s1.tasks(0).rank() == 1 ? "w1" : "w2";
  const std::string w_rank0 = w_rank1 == "w1" ? "w2" : "w1";
  const std::string rank0 =
      rank1 == s1.tasks(0).task_id() ? s2.tasks(0).task_id() : s1.tasks(0).task_id();

  ASSERT_TRUE(Report(w_rank0, rank0, v1::TASK_RUNNING).ok());
  ASSERT_TRUE(Report(w_rank1, rank1, v1::TASK_EXITED, 2, "data.train: no files match x").ok());
  v1::Job job = Get(id);
  EXPECT_EQ(job.state(), v1::FAILED);
  EXPECT_EQ(job.reason(), "rank 1 exited with code 2: data.train: no files match x");
  // Rank 0 is told to stop: its worker no longer wants it.
  EXPECT_THAT(Sync(w_rank0).tasks(), IsEmpty());
  // A report from the wrong worker is refused.
  EXPECT_EQ(Report(w_rank1, rank0, v1::TASK_STOPPED).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(Report(w_rank0, rank0, v1::TASK_STOPPED).ok());
  EXPECT_EQ(Get(id).state(), v1::FAILED);
}

TEST_F(JobManagerTest, SignalAndFailedToStartNameTheCause) {
  Register("w1", 2);
  const std::string a = Submit(TestSpec("a"));
  const std::string b = Submit(TestSpec("b"));
  manager_->Tick();
  ASSERT_TRUE(Report("w1", a + ".g1.r0", v1::TASK_EXITED, 0, "out of memory", 9).ok());
  ASSERT_TRUE(Report("w1", b + ".g1.r0", v1::TASK_FAILED_TO_START, 0, "exec: no such file").ok());
  EXPECT_EQ(Get(a).reason(), "rank 0 killed by signal 9 (SIGKILL): out of memory");
  EXPECT_EQ(Get(b).reason(), "rank 0 failed to start: exec: no such file");
}

TEST_F(JobManagerTest, CancelEmptiesTheDesiredState) {
  Register("w1", 1);
  const std::string id = Submit(TestSpec("tiny"));
  manager_->Tick();
  v1::SyncResponse before = Sync("w1");
  ASSERT_EQ(before.tasks_size(), 1);
  auto cancelled = manager_->CancelJob(id, "");
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state(), v1::CANCELLED);
  EXPECT_EQ(cancelled->reason(), "cancelled by user");
  v1::SyncResponse after = Sync("w1", before.version());
  EXPECT_NE(after.version(), before.version());
  EXPECT_THAT(after.tasks(), IsEmpty());
  EXPECT_EQ(manager_->CancelJob(id, "").status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(manager_->CancelJob("nope-9", "").status().code(), absl::StatusCode::kNotFound);
  // The stopping trainer holds its slot until the agent reports it gone; then the capacity is
  // free again for the next job.
  ASSERT_TRUE(Report("w1", id + ".g1.r0", v1::TASK_RUNNING).ok());
  const std::string next = Submit(TestSpec("next"));
  manager_->Tick();
  EXPECT_EQ(Get(next).state(), v1::PENDING);
  ASSERT_TRUE(Report("w1", id + ".g1.r0", v1::TASK_STOPPED, 143).ok());
  manager_->Tick();
  EXPECT_EQ(Get(next).state(), v1::SCHEDULED);
}

TEST_F(JobManagerTest, AStopNeverReportedHoldsCapacityOnlyForABoundedTime) {
  Register("w1", 1);
  const std::string id = Submit(TestSpec("tiny"));
  manager_->Tick();
  ASSERT_TRUE(manager_->CancelJob(id, "").ok());
  const std::string next = Submit(TestSpec("next"));
  manager_->Tick();
  EXPECT_EQ(Get(next).state(), v1::PENDING);
  // Keep the worker's lease alive while the hold runs out.
  for (int i = 0; i < 7; ++i) {
    clock_.Advance(absl::Seconds(9));
    Sync("w1");
  }
  manager_->Tick();
  EXPECT_EQ(Get(next).state(), v1::SCHEDULED);
}

TEST_F(JobManagerTest, BadSpecIsRefusedAndNothingIsStored) {
  v1::JobSpec spec = TestSpec("bad");
  spec.mutable_optimizer()->set_lr(-1);
  auto job = manager_->SubmitJob(spec);
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(job.status().message()), HasSubstr("optimizer.lr"));

  job = manager_->SubmitJobYaml("name: x\nbatch_size: abc\n");
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(job.status().message()), HasSubstr("batch_size"));

  job = manager_->SubmitJobYaml(std::string((1 << 20) + 1, '#'));
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);

  v1::JobSpec resume = TestSpec("resume");
  resume.mutable_checkpoint()->set_resume_from("ghost-7");
  job = manager_->SubmitJob(resume);
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(job.status().message(), "checkpoint.resume_from: no job 'ghost-7'");

  v1::JobSpec ps = TestSpec("ps");
  ps.set_strategy(v1::PARAMETER_SERVER);
  ps.mutable_parameter_servers()->set_shards(1);
  ps.mutable_parameter_servers()->set_dense("allreduce");
  job = manager_->SubmitJob(ps);
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(job.status().message()), HasSubstr("parameter_servers.dense: allreduce"));

  auto list = manager_->ListJobs({}, 0, "");
  ASSERT_TRUE(list.ok());
  EXPECT_THAT(list->jobs, IsEmpty());
  Reopen();
  list = manager_->ListJobs({}, 0, "");
  ASSERT_TRUE(list.ok());
  EXPECT_THAT(list->jobs, IsEmpty());
  // No sequence number was spent.
  EXPECT_EQ(Submit(TestSpec("good")), "good-1");
}

TEST_F(JobManagerTest, YamlSubmission) {
  auto job = manager_->SubmitJobYaml(R"(
name: mnist-mlp
strategy: data_parallel
workers: {min: 2, max: 4}
model:
  builtin: mlp
  args: {inputs: 4, hidden: [8], classes: 2}
data:
  synthetic: {samples: 64, features: 4, classes: 2}
batch_size: 64
max_steps: 10
max_runtime: 12h
checkpoint: {uri: "file:///elsewhere/", keep_last: 2}
)");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->id(), "mnist-mlp-1");
  EXPECT_EQ(job->spec().max_runtime_seconds(), 12 * 3600);
  EXPECT_EQ(job->checkpoint_uri(), "file:///elsewhere/mnist-mlp-1");
}

TEST_F(JobManagerTest, TheRequestsResumeFromReplacesTheSpecs) {
  const std::string first = Submit(TestSpec("first"));
  const std::string yaml = R"(
name: follow
model:
  builtin: mlp
  args: {inputs: 4, hidden: [8], classes: 2}
data:
  synthetic: {samples: 64, features: 4, classes: 2}
max_steps: 10
checkpoint: {resume_from: ghost-7}
)";
  // As the spec says: a job that does not exist.
  EXPECT_EQ(manager_->SubmitJobYaml(yaml).status().message(),
            "checkpoint.resume_from: no job 'ghost-7'");
  SubmitOptions options;
  options.resume_from = first;
  absl::StatusOr<v1::Job> job = manager_->SubmitJobYaml(yaml, nullptr, options);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec().checkpoint().resume_from(), first);
  // The same for a spec message.
  v1::JobSpec spec = TestSpec("follow-spec");
  spec.mutable_checkpoint()->set_resume_from("ghost-7");
  job = manager_->SubmitJob(spec, nullptr, options);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec().checkpoint().resume_from(), first);
}

TEST_F(JobManagerTest, TheAttemptACancelStoppedCommitsTheStepItStoppedAt) {
  Register("w1", 1);
  const std::string id = Submit(TestSpec("stopped"));
  manager_->Tick();
  ASSERT_TRUE(manager_->CancelJob(id, "").ok());
  ASSERT_EQ(Get(id).state(), v1::CANCELLED);
  // Rank 0 of the cancelled attempt saves the step it stopped at, and commits it.
  v1::CommitCheckpointRequest commit;
  commit.set_job_id(id);
  commit.set_generation(1);
  commit.set_step(7);
  commit.set_size_bytes(10);
  absl::StatusOr<std::vector<std::string>> retired = manager_->CommitCheckpoint(commit);
  ASSERT_TRUE(retired.ok()) << retired.status();
  EXPECT_EQ(Get(id).committed_step(), 7);
  EXPECT_EQ(Get(id).state(), v1::CANCELLED);
  // Only that attempt, and nothing else of it: the job is over.
  commit.set_generation(2);
  EXPECT_EQ(manager_->CommitCheckpoint(commit).status().code(),
            absl::StatusCode::kFailedPrecondition);
  v1::JobProgress progress;
  progress.set_step(7);
  EXPECT_EQ(manager_->ReportProgress(id, 1, 0, progress).code(),
            absl::StatusCode::kFailedPrecondition);
  // A job resumed from it starts at that step.
  v1::JobSpec follow = TestSpec("follow");
  follow.mutable_checkpoint()->set_resume_from(id);
  const std::string follow_id = Submit(follow);
  Register("w2", 1);  // w1 may be held while the cancelled trainer stops
  manager_->Tick();
  absl::StatusOr<v1::Task> task = manager_->TaskFor(follow_id + ".g1.r0");
  ASSERT_TRUE(task.ok()) << task.status();
  ASSERT_GE(task->resume_checkpoints_size(), 1);
  EXPECT_EQ(task->resume_checkpoints(0), "file:///ckpt/" + id + "/step-000000000007");
}

TEST_F(JobManagerTest, DataTheCoordinatorCanSeeIsCheckedAtSubmission) {
  char tmpl[] = "/tmp/job_manager_test.XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  v1::JobSpec spec = TestSpec("files");
  spec.mutable_data()->clear_synthetic();
  spec.mutable_data()->set_train(dir + "/train-*.safetensors");
  absl::StatusOr<v1::Job> job = manager_->SubmitJob(spec);
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(job.status().message()), HasSubstr("data.train: no files match"));
  // Where it cannot look, it says so in the job's events and lets the workers find out.
  spec.mutable_data()->set_train("/nonexistent-folder/train-*.safetensors");
  job = manager_->SubmitJob(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_THAT(job->events(0).reason(),
              HasSubstr("not checked: data.train (/nonexistent-folder/ is not on the "
                        "coordinator's machine)"));
  rmdir(dir.c_str());
}

TEST_F(JobManagerTest, TooManyActiveJobs) {
  JobManagerOptions options;
  options.max_active_jobs = 2;
  Reopen(options);
  Submit(TestSpec("a"));
  Submit(TestSpec("b"));
  EXPECT_EQ(manager_->SubmitJob(TestSpec("c")).status().code(),
            absl::StatusCode::kResourceExhausted);
}

TEST_F(JobManagerTest, ReportsFromAnOldGenerationAreFenced) {
  Register("w1", 1);
  const std::string id = Submit(TestSpec("tiny"));
  manager_->Tick();
  v1::JobProgress progress;
  progress.set_step(5);
  absl::Status stale = manager_->ReportProgress(id, 0, 0, progress);
  EXPECT_EQ(stale.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(stale.message(), "stale generation 0, current 1");
  EXPECT_EQ(manager_->ReportProgress(id, 2, 0, progress).code(),
            absl::StatusCode::kFailedPrecondition);
  v1::CommitCheckpointRequest commit;
  commit.set_job_id(id);
  commit.set_generation(0);
  commit.set_step(5);
  EXPECT_EQ(manager_->CommitCheckpoint(commit).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(manager_->ReportModel(id, 0, "file:///m").code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(manager_->ReportProgress("nope-1", 1, 0, progress).code(), absl::StatusCode::kNotFound);

  ASSERT_TRUE(manager_->ReportProgress(id, 1, 0, progress).ok());
  EXPECT_EQ(Get(id).progress().step(), 5);
  ASSERT_TRUE(manager_->ReportModel(id, 1, "file:///models/tiny").ok());
  EXPECT_EQ(Get(id).model_uri(), "file:///models/tiny");
}

TEST_F(JobManagerTest, CheckpointCommitAndRetention) {
  Register("w1", 1);
  v1::JobSpec spec = TestSpec("ck");
  spec.mutable_checkpoint()->set_keep_last(2);
  const std::string id = Submit(spec);
  manager_->Tick();
  auto commit = [&](int64_t step) {
    v1::CommitCheckpointRequest request;
    request.set_job_id(id);
    request.set_generation(1);
    request.set_step(step);
    request.set_size_bytes(100 + step);
    return manager_->CommitCheckpoint(request);
  };
  ASSERT_TRUE(commit(10).ok());
  ASSERT_TRUE(commit(20).ok());
  auto retired = commit(30);
  ASSERT_TRUE(retired.ok()) << retired.status();
  EXPECT_THAT(*retired, ElementsAre("file:///ckpt/ck-1/step-000000000010"));
  // Committing the same step again (a retry whose first answer was lost) changes nothing and
  // hands back the same folders to delete, also after a coordinator restart.
  retired = commit(30);
  ASSERT_TRUE(retired.ok());
  EXPECT_THAT(*retired, ElementsAre("file:///ckpt/ck-1/step-000000000010"));
  EXPECT_EQ(Get(id).committed_step(), 30);
  Reopen();
  retired = commit(20);
  ASSERT_TRUE(retired.ok());
  EXPECT_THAT(*retired, IsEmpty());
  retired = commit(30);
  ASSERT_TRUE(retired.ok());
  EXPECT_THAT(*retired, ElementsAre("file:///ckpt/ck-1/step-000000000010"));

  // The spec's keep_last decides: each new step retires the oldest kept.
  retired = commit(35);
  ASSERT_TRUE(retired.ok()) << retired.status();
  EXPECT_THAT(*retired, ElementsAre("file:///ckpt/ck-1/step-000000000020"));
  retired = commit(36);
  ASSERT_TRUE(retired.ok()) << retired.status();
  EXPECT_THAT(*retired, ElementsAre("file:///ckpt/ck-1/step-000000000030"));

  // The folders are the job's own, derived from its checkpoint URI and the step.
  auto list = manager_->ListCheckpoints(id);
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ((*list)[0].step(), 36);
  EXPECT_EQ((*list)[0].uri(), "file:///ckpt/ck-1/step-000000000036");
  EXPECT_EQ((*list)[1].step(), 35);
  EXPECT_EQ((*list)[1].size_bytes(), 135);
  EXPECT_EQ(manager_->ListCheckpoints("nope-1").status().code(), absl::StatusCode::kNotFound);

  // A job resuming from this one gets its own checkpoints first, then this job's.
  v1::JobSpec follow = TestSpec("follow");
  follow.mutable_checkpoint()->set_resume_from(id);
  const std::string follow_id = Submit(follow);
  auto task = [&] {
    Register("w2", 1);
    manager_->Tick();
    return manager_->TaskFor(follow_id + ".g1.r0");
  }();
  ASSERT_TRUE(task.ok()) << task.status();
  EXPECT_THAT(task->resume_checkpoints(), ElementsAre("file:///ckpt/ck-1/step-000000000036",
                                                      "file:///ckpt/ck-1/step-000000000035"));

  Reopen();
  list = manager_->ListCheckpoints(id);
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ((*list)[0].step(), 36);
  EXPECT_EQ(Get(id).committed_step(), 36);
}

TEST_F(JobManagerTest, SyncLongPollWakesWhenATaskIsPlaced) {
  Register("w1", 1);
  const uint64_t version = Sync("w1").version();
  // Nothing changes: a zero wait answers at once with the same version.
  EXPECT_EQ(Sync("w1", version, 0).version(), version);

  absl::Notification done;
  v1::SyncResponse response;
  absl::Duration waited;
  std::thread poller([&] {
    const absl::Time start = absl::Now();
    response = Sync("w1", version, 5000);
    waited = absl::Now() - start;
    done.Notify();
  });
  // Change nothing until the call really waits, so that the wake-up is what returns it.
  while (manager_->BlockedSyncsForTesting() == 0 && !done.HasBeenNotified())
    std::this_thread::yield();
  ASSERT_FALSE(done.HasBeenNotified()) << "the long poll returned without a change";
  Submit(TestSpec("tiny"));
  manager_->Tick();
  poller.join();
  ASSERT_TRUE(done.HasBeenNotified());
  ASSERT_EQ(response.tasks_size(), 1);
  EXPECT_NE(response.version(), version);
  // Well under the 5 s the call could have waited: the placement woke it.
  EXPECT_LT(waited, absl::Seconds(2));
}

TEST_F(JobManagerTest, LostWorkerRestartsItsJobs) {
  Register("w1", 1);
  Register("w2", 1);
  const std::string id = Submit(TestSpec("tiny"));
  manager_->Tick();
  const std::string worker = Get(id).tasks(0).worker_id();
  const std::string other = worker == "w1" ? "w2" : "w1";
  clock_.Advance(absl::Seconds(6));
  Sync(other);  // keeps its lease
  clock_.Advance(absl::Seconds(4));
  manager_->Tick();
  v1::Job job = Get(id);
  // Its only rank was on the lost worker: nothing to wait for, so straight back to PENDING.
  EXPECT_EQ(job.state(), v1::PENDING);
  ASSERT_EQ(job.restarts_size(), 1);
  EXPECT_EQ(job.restarts(0).reason(), v1::WORKER_LOST);
  EXPECT_EQ(job.restarts(0).message(),
            absl::StrCat("rank 0 lost: worker ", worker, " lost (no heartbeat for 10s)"));
  // The lease ran out 10 s after the last heartbeat, which is when it was detected.
  EXPECT_EQ(job.restarts(0).detected_unix_ms() - job.restarts(0).failed_unix_ms(), 10000);
  for (const v1::Worker& w : manager_->ListWorkers()) {
    EXPECT_EQ(w.state(), w.id() == worker ? v1::LOST : v1::READY) << w.id();
  }
  EXPECT_TRUE(Sync(worker).reregister());
  EXPECT_TRUE(Sync("stranger").reregister());
  EXPECT_FALSE(Sync(other).reregister());
}

TEST_F(JobManagerTest, MaxRuntime) {
  Register("w1", 1);
  v1::JobSpec spec = TestSpec("slow");
  spec.set_max_runtime_seconds(20);
  const std::string id = Submit(spec);
  manager_->Tick();
  ASSERT_TRUE(Report("w1", id + ".g1.r0", v1::TASK_RUNNING).ok());
  for (int i = 0; i < 2; ++i) {
    clock_.Advance(absl::Seconds(9));
    Sync("w1");
    manager_->Tick();
    EXPECT_EQ(Get(id).state(), v1::RUNNING);
  }
  clock_.Advance(absl::Seconds(2));
  manager_->Tick();
  EXPECT_EQ(Get(id).state(), v1::FAILED);
  EXPECT_EQ(Get(id).reason(), "exceeded max_runtime 20s");
}

TEST_F(JobManagerTest, PendingReasonsWithoutEventSpam) {
  const std::string id = Submit(TestSpec("tiny"));
  manager_->Tick();
  manager_->Tick();
  v1::Job job = Get(id);
  EXPECT_EQ(job.reason(), "no workers registered");
  EXPECT_EQ(job.events_size(), 1);
  Register("w1", 1);
  const std::string gpu = Submit(TestSpec("gpu", 1, 1, 4));
  manager_->Tick();
  EXPECT_EQ(Get(gpu).reason(), "needs 4 GPUs per rank; the largest worker has 0");
  EXPECT_EQ(Get(id).state(), v1::SCHEDULED);
  const std::string waiting = Submit(TestSpec("waiting"));
  manager_->Tick();
  EXPECT_EQ(Get(waiting).reason(), "waiting for capacity: needs 1 slot, 0 free");
  EXPECT_EQ(Get(waiting).events_size(), 1);
}

// Between full passes the scheduler looks only at new submissions and the job blocking the
// queue; that must decide as a full pass would: order, priorities and capacity freed.
TEST_F(JobManagerTest, SchedulingOnlyWhatChangedKeepsTheQueueOrder) {
  Register("w1", 1);
  // Not preemptible: the urgent job below waits rather than stop it.
  v1::JobSpec fixed = TestSpec("running");
  fixed.set_preemptible(false);
  const std::string running = Submit(fixed);
  manager_->Tick();
  ASSERT_EQ(Get(running).state(), v1::SCHEDULED);
  const std::string blocked = Submit(TestSpec("blocked"));
  manager_->Tick();
  EXPECT_EQ(Get(blocked).reason(), "waiting for capacity: needs 1 slot, 0 free");
  std::vector<std::string> behind;
  for (int i = 0; i < 5; ++i) {
    behind.push_back(Submit(TestSpec("behind")));
    manager_->Tick();
  }
  for (const std::string& id : behind) {
    EXPECT_EQ(Get(id).reason(), absl::StrCat("queued behind ", blocked));
  }
  EXPECT_EQ(Get(blocked).reason(), "waiting for capacity: needs 1 slot, 0 free");
  // A submission that goes before the blocker takes its place at the head.
  const std::string urgent = Submit(TestSpec("urgent", 1, 1, 0, /*priority=*/5));
  manager_->Tick();
  EXPECT_EQ(Get(urgent).reason(), "waiting for capacity: needs 1 slot, 0 free");
  EXPECT_EQ(Get(blocked).reason(), absl::StrCat("queued behind ", urgent));
  const std::string last = Submit(TestSpec("last"));
  manager_->Tick();
  EXPECT_EQ(Get(last).reason(), absl::StrCat("queued behind ", urgent));
  // Capacity comes free: the head of the queue gets it, not the newest.
  ASSERT_TRUE(Report("w1", running + ".g1.r0", v1::TASK_EXITED).ok());
  manager_->Tick();
  EXPECT_EQ(Get(urgent).state(), v1::SCHEDULED);
  EXPECT_EQ(Get(blocked).state(), v1::PENDING);
  EXPECT_EQ(Get(last).state(), v1::PENDING);
  // A pending job's reason is shown but not written: it is derived again after a restart.
  Reopen();
  EXPECT_EQ(Get(last).reason(), "submitted");
  Register("w1", 1);
  manager_->Tick();
  EXPECT_EQ(Get(last).reason(), absl::StrCat("queued behind ", blocked));
}

TEST_F(JobManagerTest, EverythingSurvivesARestart) {
  Register("w1", 2);
  const std::string id = Submit(TestSpec("tiny"));
  manager_->Tick();
  ASSERT_TRUE(Report("w1", id + ".g1.r0", v1::TASK_RUNNING).ok());
  v1::JobProgress progress;
  progress.set_step(7);
  progress.set_loss(0.5);
  ASSERT_TRUE(manager_->ReportProgress(id, 1, 0, progress).ok());
  const v1::Job before = Get(id);

  Reopen();
  v1::Job after = Get(id);
  EXPECT_EQ(after.state(), v1::RUNNING);
  EXPECT_EQ(after.generation(), 1);
  EXPECT_EQ(after.progress().step(), 7);
  EXPECT_EQ(Reasons(after), Reasons(before));
  ASSERT_EQ(after.tasks_size(), 1);
  EXPECT_EQ(after.tasks(0).state(), v1::TASK_RUNNING);
  auto workers = manager_->ListWorkers();
  ASSERT_EQ(workers.size(), 1u);
  EXPECT_EQ(workers[0].id(), "w1");
  EXPECT_EQ(workers[0].slots_used(), 1);
  // The worker is asked to register again with what it runs, and then gets its task back.
  EXPECT_TRUE(Sync("w1").reregister());
  v1::RegisterWorkerRequest again;
  again.set_name("w1");
  again.set_slots(1);
  v1::TaskStatus* running = again.add_tasks();
  running->set_task_id(id + ".g1.r0");
  running->set_state(v1::TASK_RUNNING);
  ASSERT_TRUE(manager_->RegisterWorker(again).ok());
  v1::SyncResponse sync = Sync("w1");
  EXPECT_FALSE(sync.reregister());
  ASSERT_EQ(sync.tasks_size(), 1);
  EXPECT_EQ(Get(id).state(), v1::RUNNING);
  // The sequence continues.
  EXPECT_EQ(Submit(TestSpec("tiny")), "tiny-2");
  ASSERT_TRUE(Report("w1", id + ".g1.r0", v1::TASK_EXITED).ok());
  EXPECT_EQ(Get(id).state(), v1::SUCCEEDED);
}

// An acknowledged progress report survives a crash: what a crash right after the call would
// leave (the database read beside the running manager) already has it.
TEST_F(JobManagerTest, ProgressIsWrittenBeforeItIsAcknowledged) {
  Register("w1", 1);
  const std::string id = Submit(TestSpec("tiny"));
  manager_->Tick();
  ASSERT_TRUE(Report("w1", id + ".g1.r0", v1::TASK_RUNNING).ok());
  auto stored_step = [&]() -> int64_t {
    auto store = SqliteJobStore::Open(dir_.path() + "/state.db");
    EXPECT_TRUE(store.ok()) << store.status();
    auto contents = (*store)->LoadAll();
    EXPECT_TRUE(contents.ok()) << contents.status();
    for (const StoredJob& job : contents->jobs) {
      if (job.job.id() == id) return job.job.progress().step();
    }
    return -1;
  };
  v1::JobProgress progress;
  for (int64_t step : {3, 4, 9}) {
    progress.set_step(step);
    ASSERT_TRUE(manager_->ReportProgress(id, 1, 0, progress).ok());
    EXPECT_EQ(Get(id).progress().step(), step);
    EXPECT_EQ(stored_step(), step);
  }
  // A state change after it keeps it (the job's row does not put an older step back).
  ASSERT_TRUE(Report("w1", id + ".g1.r0", v1::TASK_EXITED).ok());
  EXPECT_EQ(stored_step(), 9);
  Reopen();
  EXPECT_EQ(Get(id).progress().step(), 9);
}

TEST_F(JobManagerTest, ReRegisteringWithoutARunningTaskRestartsItsJob) {
  Register("w1", 1);
  const std::string id = Submit(TestSpec("tiny"));
  manager_->Tick();
  ASSERT_TRUE(Report("w1", id + ".g1.r0", v1::TASK_RUNNING).ok());
  Register("w1", 1);  // the agent restarted and runs nothing
  const v1::Job job = Get(id);
  EXPECT_EQ(job.state(), v1::PENDING);
  ASSERT_EQ(job.restarts_size(), 1);
  EXPECT_EQ(job.restarts(0).reason(), v1::WORKER_LOST);
  EXPECT_THAT(job.restarts(0).message(), HasSubstr("rank 0 lost"));
}

TEST_F(JobManagerTest, ShipLogsIsIdempotentAndStreamsByRank) {
  Register("w1", 2);
  const std::string id = Submit(TestSpec("logs", 2, 2));
  manager_->Tick();
  const std::string r0 = id + ".g1.r0";
  const std::string r1 = id + ".g1.r1";
  EXPECT_EQ(*manager_->ShipLogs("w1", r0, 0, "hello "), 6);
  EXPECT_EQ(*manager_->ShipLogs("w1", r0, 0, "hello "), 6);       // resent: skipped
  EXPECT_EQ(*manager_->ShipLogs("w1", r0, 3, "lo world\n"), 12);  // overlapping
  EXPECT_EQ(*manager_->ShipLogs("w1", r0, 40, "gap"), 12);        // gap: resend from 12
  EXPECT_EQ(*manager_->ShipLogs("w1", r1, 0, "rank one\n"), 9);
  EXPECT_EQ(manager_->ShipLogs("w1", "nope.g1.r0", 0, "x").status().code(),
            absl::StatusCode::kNotFound);
  // Only the task's own worker writes its log.
  EXPECT_EQ(manager_->ShipLogs("w9", r0, 12, "forged\n").status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(manager_->ShipLogs("", r0, 12, "forged\n").status().code(),
            absl::StatusCode::kFailedPrecondition);

  std::string rank0;
  ASSERT_TRUE(manager_
                  ->StreamLogs(
                      id, LogSelection{0, std::nullopt}, false,
                      [&](const v1::TaskInfo& task, absl::string_view data) {
                        EXPECT_EQ(task.rank(), 0);
                        rank0 += std::string(data);
                        return true;
                      },
                      [] { return false; })
                  .ok());
  EXPECT_EQ(rank0, "hello world\n");
  std::vector<std::pair<int, std::string>> all;
  ASSERT_TRUE(manager_
                  ->StreamLogs(
                      id, LogSelection{}, false,
                      [&](const v1::TaskInfo& task, absl::string_view data) {
                        all.emplace_back(task.rank(), std::string(data));
                        return true;
                      },
                      [] { return false; })
                  .ok());
  EXPECT_THAT(all, ElementsAre(std::make_pair(0, std::string("hello world\n")),
                               std::make_pair(1, std::string("rank one\n"))));
  EXPECT_EQ(
      manager_->StreamLogs(id, LogSelection{-2, std::nullopt}, false, nullptr, nullptr).code(),
      absl::StatusCode::kInvalidArgument);
  // A rank the job does not have is an error, not an empty stream (`logs JOB --rank 5`).
  absl::Status none =
      manager_->StreamLogs(id, LogSelection{2, std::nullopt}, false, nullptr, nullptr);
  EXPECT_EQ(none.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(none.message()), HasSubstr("has ranks 0 to 1, not 2"));
}

TEST_F(JobManagerTest, FollowedLogsEndWhenTheJobEnds) {
  Register("w1", 1);
  const std::string id = Submit(TestSpec("follow"));
  manager_->Tick();
  const std::string task = id + ".g1.r0";
  ASSERT_TRUE(manager_->ShipLogs("w1", task, 0, "step 1\n").ok());
  absl::Notification got_first;
  std::string followed;
  absl::Status result;
  std::thread follower([&] {
    result = manager_->StreamLogs(
        id, LogSelection{0, std::nullopt}, true,
        [&](const v1::TaskInfo&, absl::string_view data) {
          followed += std::string(data);
          if (!got_first.HasBeenNotified()) got_first.Notify();
          return true;
        },
        [] { return false; });
  });
  got_first.WaitForNotification();
  ASSERT_TRUE(manager_->ShipLogs("w1", task, 7, "step 2\n").ok());
  ASSERT_TRUE(Report("w1", task, v1::TASK_EXITED).ok());
  follower.join();
  EXPECT_TRUE(result.ok()) << result;
  EXPECT_EQ(followed, "step 1\nstep 2\n");
}

// Following the log of a finished job ends after the last pieces, however busy other jobs' logs
// are.
TEST_F(JobManagerTest, FollowedLogOfAFinishedJobEndsWhileOtherJobsLog) {
  Register("w1", 2);
  const std::string done = Submit(TestSpec("done"));
  const std::string busy = Submit(TestSpec("busy"));
  manager_->Tick();
  ASSERT_TRUE(manager_->ShipLogs("w1", done + ".g1.r0", 0, "last words\n").ok());
  ASSERT_TRUE(Report("w1", done + ".g1.r0", v1::TASK_EXITED).ok());
  ASSERT_EQ(Get(done).state(), v1::SUCCEEDED);

  std::atomic<bool> followed_to_the_end{false};
  std::atomic<bool> writer_gave_up{false};
  // The other job logs without pause until the follower is done (or for at most 30 s, which
  // only a follower that never ends reaches).
  std::thread writer([&] {
    const absl::Time give_up = absl::Now() + absl::Seconds(30);
    int64_t offset = 0;
    while (!followed_to_the_end.load()) {
      if (absl::Now() > give_up) {
        writer_gave_up = true;
        return;
      }
      auto next = manager_->ShipLogs("w1", busy + ".g1.r0", offset, "tick\n");
      ASSERT_TRUE(next.ok()) << next.status();
      offset = *next;
    }
  });
  std::string followed;
  absl::Status result = manager_->StreamLogs(
      done, LogSelection{}, true,
      [&](const v1::TaskInfo&, absl::string_view data) {
        followed += std::string(data);
        return true;
      },
      [] { return false; });
  followed_to_the_end = true;
  writer.join();
  EXPECT_TRUE(result.ok()) << result;
  EXPECT_EQ(followed, "last words\n");
  EXPECT_FALSE(writer_gave_up.load()) << "the follow ended only when the other job went quiet";
}

TEST_F(JobManagerTest, WatchSendsEveryChangeAndEndsWhenFinal) {
  Register("w1", 1);
  const std::string id = Submit(TestSpec("watched"));
  std::vector<v1::JobState> seen;
  absl::Notification first;
  absl::Status result;
  std::thread watcher([&] {
    result = manager_->WatchJob(
        id,
        [&](const v1::Job& job) {
          if (seen.empty() || seen.back() != job.state()) seen.push_back(job.state());
          if (!first.HasBeenNotified()) first.Notify();
          return true;
        },
        [] { return false; });
  });
  first.WaitForNotification();
  manager_->Tick();
  ASSERT_TRUE(Report("w1", id + ".g1.r0", v1::TASK_RUNNING).ok());
  ASSERT_TRUE(Report("w1", id + ".g1.r0", v1::TASK_EXITED).ok());
  watcher.join();
  EXPECT_TRUE(result.ok()) << result;
  ASSERT_GE(seen.size(), 2u);
  EXPECT_EQ(seen.front(), v1::PENDING);
  EXPECT_EQ(seen.back(), v1::SUCCEEDED);
  EXPECT_EQ(manager_->WatchJob("nope-1", nullptr, nullptr).code(), absl::StatusCode::kNotFound);
}

TEST_F(JobManagerTest, ListJobsNewestFirstWithPagesAndFilters) {
  for (int i = 0; i < 5; ++i) Submit(TestSpec("job"));
  ASSERT_TRUE(manager_->CancelJob("job-2", "").ok());
  std::vector<std::string> ids;
  std::string token;
  int pages = 0;
  do {
    auto page = manager_->ListJobs({}, 2, token);
    ASSERT_TRUE(page.ok()) << page.status();
    for (const v1::Job& job : page->jobs) {
      ids.push_back(job.id());
      EXPECT_EQ(job.events_size(), 0);
    }
    token = page->next_page_token;
    ++pages;
  } while (!token.empty());
  EXPECT_THAT(ids, ElementsAre("job-5", "job-4", "job-3", "job-2", "job-1"));
  EXPECT_EQ(pages, 3);
  auto cancelled = manager_->ListJobs({v1::CANCELLED}, 0, "");
  ASSERT_TRUE(cancelled.ok());
  ASSERT_EQ(cancelled->jobs.size(), 1u);
  EXPECT_EQ(cancelled->jobs[0].id(), "job-2");
  EXPECT_EQ(manager_->ListJobs({}, 0, "garbage!").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(JobManagerTest, PriorityJumpsTheQueue) {
  Register("w1", 1);
  Register("w0", 0);
  const std::string low = Submit(TestSpec("low"));
  const std::string high = Submit(TestSpec("high", 1, 1, 0, 10));
  manager_->Tick();
  EXPECT_EQ(Get(high).state(), v1::SCHEDULED);
  EXPECT_EQ(Get(low).state(), v1::PENDING);
}

v1::JobSpec PsSpec(const std::string& name, int workers, int shards) {
  v1::JobSpec spec = TestSpec(name, workers, workers);
  spec.set_strategy(v1::PARAMETER_SERVER);
  spec.mutable_parameter_servers()->set_shards(shards);
  return spec;
}

// Shards are tasks of the job: placed with the ranks, counted in capacity, sent to their agents
// with their role, and part of the job's success.
TEST_F(JobManagerTest, ParameterServerShardsAreTasksOfTheJob) {
  Register("w1", 2);
  Register("w2", 2);
  const std::string id = Submit(PsSpec("ps", 2, 2));
  manager_->Tick();
  v1::Job job = Get(id);
  ASSERT_EQ(job.state(), v1::SCHEDULED);
  EXPECT_THAT(job.reason(), HasSubstr("; parameter-server shards on "));
  std::map<std::string, v1::TaskInfo> tasks;
  for (const v1::TaskInfo& t : job.tasks()) tasks[t.task_id()] = t;
  ASSERT_THAT(tasks, SizeIs(4));
  for (const char* suffix : {".g1.r0", ".g1.r1", ".g1.s0", ".g1.s1"}) {
    ASSERT_EQ(tasks.count(id + suffix), 1u) << suffix;
  }
  const v1::TaskInfo& s1 = tasks[id + ".g1.s1"];
  EXPECT_EQ(s1.role(), v1::TASK_ROLE_SHARD);
  EXPECT_EQ(s1.shard(), 1);
  // Spread: each worker runs one rank and one shard, and is full.
  EXPECT_NE(tasks[id + ".g1.s0"].worker_id(), s1.worker_id());
  for (const v1::Worker& w : manager_->ListWorkers()) {
    EXPECT_EQ(w.slots_used(), 2) << w.id();
    EXPECT_THAT(w.task_ids(), SizeIs(2));
  }
  auto task = manager_->TaskFor(id + ".g1.s1");
  ASSERT_TRUE(task.ok()) << task.status();
  EXPECT_EQ(task->role(), v1::TASK_ROLE_SHARD);
  EXPECT_EQ(task->shard(), 1);
  EXPECT_EQ(task->world_size(), 2);  // the ranks it serves
  EXPECT_EQ(task->slots(), 1);
  EXPECT_EQ(task->gpus(), 0);
  auto rank = manager_->TaskFor(id + ".g1.r1");
  ASSERT_TRUE(rank.ok());
  EXPECT_EQ(rank->role(), v1::TASK_ROLE_RANK);
  EXPECT_EQ(rank->world_size(), 2);
  // Nothing else fits while it runs.
  const std::string other = Submit(TestSpec("other"));
  manager_->Tick();
  EXPECT_EQ(Get(other).state(), v1::PENDING);

  for (const auto& [task_id, t] : tasks) {
    ASSERT_TRUE(Report(t.worker_id(), task_id, v1::TASK_RUNNING).ok());
  }
  EXPECT_EQ(Get(id).state(), v1::RUNNING);
  // The ranks finish first; the job succeeds only once the shards have exited too.
  ASSERT_TRUE(Report(tasks[id + ".g1.r0"].worker_id(), id + ".g1.r0", v1::TASK_EXITED).ok());
  ASSERT_TRUE(Report(tasks[id + ".g1.r1"].worker_id(), id + ".g1.r1", v1::TASK_EXITED).ok());
  ASSERT_TRUE(Report(tasks[id + ".g1.s0"].worker_id(), id + ".g1.s0", v1::TASK_EXITED).ok());
  EXPECT_EQ(Get(id).state(), v1::RUNNING);
  ASSERT_TRUE(Report(s1.worker_id(), id + ".g1.s1", v1::TASK_EXITED).ok());
  job = Get(id);
  EXPECT_EQ(job.state(), v1::SUCCEEDED);
  EXPECT_EQ(job.reason(), "training finished: all 2 ranks and 2 shards exited with code 0");

  // Roles survive a restart of the coordinator.
  Reopen();
  job = Get(id);
  int shards = 0;
  for (const v1::TaskInfo& t : job.tasks()) shards += t.role() == v1::TASK_ROLE_SHARD;
  EXPECT_EQ(shards, 2);
}

TEST_F(JobManagerTest, ParameterServerJobWaitsForRoomForItsShards) {
  Register("w1", 2);
  Register("w2", 1);
  const std::string id = Submit(PsSpec("ps", 2, 2));
  manager_->Tick();
  v1::Job job = Get(id);
  EXPECT_EQ(job.state(), v1::PENDING);
  EXPECT_EQ(job.reason(),
            "needs 2 ranks of 1 slot and 2 parameter-server shards of 1 slot; the cluster has 3 "
            "slots");
}

TEST_F(JobManagerTest, AFailedShardRestartsTheJobAndIsNamed) {
  Register("w1", 4);
  v1::JobSpec spec = PsSpec("ps", 1, 1);
  spec.mutable_restart()->set_max_failures(1);
  const std::string id = Submit(spec);
  manager_->Tick();
  ASSERT_TRUE(Report("w1", id + ".g1.r0", v1::TASK_RUNNING).ok());
  ASSERT_TRUE(Report("w1", id + ".g1.s0", v1::TASK_RUNNING).ok());
  ASSERT_TRUE(Report("w1", id + ".g1.s0", v1::TASK_EXITED, 0, "", SIGKILL).ok());
  v1::Job job = Get(id);
  EXPECT_EQ(job.state(), v1::RESTARTING);
  ASSERT_THAT(job.restarts(), SizeIs(1));
  EXPECT_EQ(job.restarts(0).message(), "shard 0 killed by signal 9 (SIGKILL)");
}

TEST_F(JobManagerTest, ShardLogsAreSelectedByShard) {
  Register("w1", 4);
  const std::string id = Submit(PsSpec("ps", 1, 1));
  manager_->Tick();
  ASSERT_TRUE(manager_->ShipLogs("w1", id + ".g1.r0", 0, "rank zero\n").ok());
  ASSERT_TRUE(manager_->ShipLogs("w1", id + ".g1.s0", 0, "shard zero\n").ok());
  auto read = [&](LogSelection selection) {
    std::vector<std::string> out;
    absl::Status s = manager_->StreamLogs(
        id, selection, false,
        [&](const v1::TaskInfo& task, absl::string_view data) {
          out.push_back(absl::StrCat(
              task.role() == v1::TASK_ROLE_SHARD ? "s" : "r",
              task.role() == v1::TASK_ROLE_SHARD ? task.shard() : task.rank(), ":", data));
          return true;
        },
        [] { return false; });
    EXPECT_TRUE(s.ok()) << s;
    return out;
  };
  EXPECT_THAT(read(LogSelection{}), ElementsAre("r0:rank zero\n", "s0:shard zero\n"));
  EXPECT_THAT(read(LogSelection{0, std::nullopt}), ElementsAre("r0:rank zero\n"));
  EXPECT_THAT(read(LogSelection{-1, 0}), ElementsAre("s0:shard zero\n"));
  // A shard the job does not have is an error, not an empty stream.
  absl::Status none = manager_->StreamLogs(id, LogSelection{-1, 3}, false, nullptr, nullptr);
  EXPECT_EQ(none.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(none.message()), HasSubstr("has shards 0 to 0, not 3"));
  EXPECT_EQ(manager_->StreamLogs(id, LogSelection{-1, -1}, false, nullptr, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

// A coordinator that runs for months keeps only what is recent: finished jobs go with their
// events, tasks, logs and checkpoint records after job_retention, LOST workers after
// lost_worker_retention; jobs not finished stay however old they are.
TEST_F(JobManagerTest, FinishedJobsAndLostWorkersAreForgottenAfterTheirRetention) {
  JobManagerOptions options;
  options.job_retention = absl::Hours(1);
  options.lost_worker_retention = absl::Minutes(30);
  Reopen(options);
  Register("w1", 1);
  Register("w2", 0);  // goes away for good
  const std::string done = RunOneRankJob(TestSpec("done"), "step 1\n", /*checkpoint=*/true);
  ASSERT_EQ(Get(done).state(), v1::SUCCEEDED);
  const std::string waiting = Submit(TestSpec("waiting", 1, 1, /*gpus=*/1));  // never fits
  const std::string log_dir = dir_.path() + "/logs/" + done;
  ASSERT_TRUE(std::filesystem::exists(log_dir));

  // Time passes; w1 keeps its lease, w2 does not.
  auto pass = [&](absl::Duration d) { PassTime(d, {"w1"}); };
  pass(absl::Minutes(20));
  std::map<std::string, v1::WorkerState> workers;
  for (const v1::Worker& w : manager_->ListWorkers()) workers[w.id()] = w.state();
  EXPECT_EQ(workers, (std::map<std::string, v1::WorkerState>{{"w1", v1::READY}, {"w2", v1::LOST}}));
  pass(absl::Minutes(39));
  EXPECT_TRUE(manager_->GetJob(done).ok());
  EXPECT_THAT(manager_->ListWorkers(), SizeIs(1));  // w2 forgotten
  pass(absl::Minutes(2));
  EXPECT_EQ(manager_->GetJob(done).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(manager_->ListCheckpoints(done).status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(std::filesystem::exists(log_dir));
  EXPECT_EQ(Get(waiting).state(), v1::PENDING);
  auto listed = manager_->ListJobs({}, 0, "");
  ASSERT_TRUE(listed.ok());
  ASSERT_THAT(listed->jobs, SizeIs(1));
  EXPECT_EQ(listed->jobs[0].id(), waiting);
  // Gone from the database too: a restarted coordinator does not bring them back, and the
  // next job's number still follows on.
  Reopen(options);
  EXPECT_EQ(manager_->GetJob(done).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(manager_->GetJob(waiting).ok());
  ASSERT_THAT(manager_->ListWorkers(), SizeIs(1));
  EXPECT_EQ(manager_->ListWorkers()[0].id(), "w1");
  EXPECT_EQ(Submit(TestSpec("next")), "next-3");
}

// A job that restarts for weeks does not grow without bound: its events and restart records are
// capped, what was dropped is counted, and restart budgets still count every restart.
TEST_F(JobManagerTest, EventsAndRestartRecordsAreCappedAndBudgetsCountWhatWasDropped) {
  JobManagerOptions options;
  options.max_job_events = 20;
  options.max_job_restart_records = 3;
  options.restart_backoff = absl::ZeroDuration();
  Reopen(options);
  Register("w1", 1);
  v1::JobSpec spec = TestSpec("flaky");
  spec.mutable_restart()->set_max_failures(5);
  const std::string id = Submit(spec);
  for (int generation = 1; generation <= 6; ++generation) {
    manager_->Tick();
    ASSERT_EQ(Get(id).generation(), generation);
    const std::string task = absl::StrCat(id, ".g", generation, ".r0");
    ASSERT_TRUE(Report("w1", task, v1::TASK_RUNNING).ok());
    ASSERT_TRUE(manager_->ReportEvent(id, generation, "data loaded").ok());
    ASSERT_TRUE(Report("w1", task, v1::TASK_EXITED, 1, "boom").ok());
  }
  v1::Job job = Get(id);
  // The sixth failure is past max_failures 5, though only three restart records are kept.
  EXPECT_EQ(job.state(), v1::FAILED);
  EXPECT_THAT(job.reason(), HasSubstr("max_failures"));
  EXPECT_THAT(job.restarts(), SizeIs(3));
  EXPECT_EQ(job.restarts_dropped(), 2);
  EXPECT_EQ(job.dropped_failure_restarts(), 2);
  EXPECT_EQ(job.restarts(0).generation(), 3);
  ASSERT_THAT(job.events(), SizeIs(20));
  EXPECT_GT(job.events_dropped(), 0);
  EXPECT_EQ(job.events(0).to(), v1::PENDING);  // the submission is kept
  EXPECT_EQ(job.events(19).to(), v1::FAILED);  // and the end
  const std::vector<std::string> reasons = Reasons(job);

  // The database holds exactly what the coordinator shows.
  Reopen(options);
  job = Get(id);
  EXPECT_EQ(Reasons(job), reasons);
  EXPECT_THAT(job.restarts(), SizeIs(3));
  EXPECT_EQ(job.restarts_dropped(), 2);
}

TEST_F(JobManagerTest, ATaskLogPastTheLimitEndsWithTheCountOfWhatWasDropped) {
  max_task_log_bytes_ = 10;
  Reopen();
  Register("w1", 1);
  const std::string id = RunOneRankJob(TestSpec("chatty"), "0123456789abcdef\n");
  const std::string text = AllLogs(id);
  EXPECT_THAT(text, ::testing::StartsWith("0123456789\n[trainyard: this task's log reached"));
  EXPECT_THAT(text, ::testing::EndsWith("[trainyard: 7 bytes of later output were not kept]\n"));
}

// What a coordinator holds stays flat over a day of short jobs once the retention period has
// passed: a day on a fake clock, a job a minute through the whole lifecycle (placed, running,
// logs, a checkpoint, success), finished jobs kept for an hour.
TEST_F(JobManagerTest, ADayOfShortJobsLeavesMemoryDatabaseAndLogsFlat) {
  JobManagerOptions options;
  options.job_retention = absl::Hours(1);
  Reopen(options);
  Register("w1", 1);
  auto bytes_under = [](const std::string& path) {
    int64_t total = 0;
    for (const auto& e : std::filesystem::recursive_directory_iterator(path)) {
      if (e.is_regular_file()) total += static_cast<int64_t>(e.file_size());
    }
    return total;
  };
  auto files_under = [](const std::string& path) {
    int64_t n = 0;
    for (const auto& e : std::filesystem::recursive_directory_iterator(path))
      n += e.is_regular_file();
    return n;
  };
  struct Sample {
    size_t jobs;
    size_t in_memory;
    int64_t db_bytes;
    int64_t log_files;
  };
  std::vector<Sample> samples;  // at each hour
  for (int minute = 1; minute <= 24 * 60; ++minute) {
    const std::string id =
        RunOneRankJob(TestSpec("short"), std::string(2000, 'x') + "\n", /*checkpoint=*/true);
    ASSERT_EQ(Get(id).state(), v1::SUCCEEDED);
    PassTime(absl::Minutes(1), {"w1"});
    if (minute % 60 == 0) {
      auto listed = manager_->ListJobs({}, 0, "");
      ASSERT_TRUE(listed.ok());
      samples.push_back({listed->jobs.size(), manager_->JobsInMemoryForTesting(),
                         bytes_under(dir_.path()) - bytes_under(dir_.path() + "/logs"),
                         files_under(dir_.path() + "/logs")});
    }
  }
  // After the first two hours everything is as it was at two hours, give or take the database's
  // write-ahead log, which SQLite reuses rather than grows.
  const Sample& settled = samples[1];
  EXPECT_LE(settled.jobs, 61u);
  for (size_t hour = 2; hour < samples.size(); ++hour) {
    EXPECT_LE(samples[hour].jobs, settled.jobs) << "hour " << hour + 1;
    // Finished jobs are in the store only: memory holds at most the one job just finished.
    EXPECT_LE(samples[hour].in_memory, 1u) << "hour " << hour + 1;
    EXPECT_LE(samples[hour].log_files, settled.log_files) << "hour " << hour + 1;
    EXPECT_LE(samples[hour].db_bytes, settled.db_bytes * 3 / 2) << "hour " << hour + 1;
  }
  EXPECT_THAT(manager_->ListWorkers(), SizeIs(1));
}

// After a restart the coordinator holds only the jobs not finished; a finished job is read from
// the store whole (describe and logs of it show all of it), listed and counted.
TEST_F(JobManagerTest, AFinishedJobIsWholeAfterARestart) {
  Register("w1", 1);
  const std::string id = RunOneRankJob(TestSpec("done"), "step 1\n");
  const std::string task = id + ".g1.r0";
  const v1::Job before = Get(id);
  ASSERT_EQ(before.state(), v1::SUCCEEDED);
  const std::string pending = Submit(TestSpec("waits", 1, 1, /*gpus=*/1));  // no GPU here
  Reopen();
  EXPECT_EQ(manager_->JobsInMemoryForTesting(), 1u);
  auto listed = manager_->ListJobs({}, 0, "");
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_THAT(listed->jobs, SizeIs(2));
  EXPECT_EQ(listed->jobs[0].id(), pending);
  EXPECT_EQ(listed->jobs[1].id(), id);
  const ClusterMetricsSnapshot metrics = manager_->MetricsSnapshot();
  EXPECT_EQ(metrics.jobs_by_state.at(v1::SUCCEEDED), 1);
  EXPECT_EQ(metrics.jobs_by_state.at(v1::PENDING), 1);
  const v1::Job after = Get(id);
  EXPECT_EQ(Reasons(after), Reasons(before));
  ASSERT_EQ(after.tasks_size(), 1);
  EXPECT_EQ(after.tasks(0).task_id(), task);
  EXPECT_EQ(after.tasks(0).state(), v1::TASK_EXITED);
  EXPECT_EQ(AllLogs(id, /*follow=*/true), "step 1\n");
}

// A job that will resume from another's checkpoints keeps that job (and its checkpoint records)
// from being removed, however old it is.
TEST_F(JobManagerTest, AJobResumedFromIsKeptWhileItsFollowerWaits) {
  JobManagerOptions options;
  options.job_retention = absl::Hours(1);
  Reopen(options);
  Register("w1", 1);
  const std::string done = Submit(TestSpec("done"));
  manager_->Tick();
  ASSERT_TRUE(Report("w1", done + ".g1.r0", v1::TASK_EXITED, 0).ok());
  v1::JobSpec follow = TestSpec("follow", 1, 1, /*gpus=*/1);  // waits: no GPU here
  follow.mutable_checkpoint()->set_resume_from(done);
  const std::string follower = Submit(follow);
  PassTime(absl::Hours(2), {"w1"});
  EXPECT_TRUE(manager_->GetJob(done).ok());
  ASSERT_TRUE(manager_->CancelJob(follower, "").ok());
  PassTime(absl::Minutes(2), {"w1"});
  EXPECT_EQ(manager_->GetJob(done).status().code(), absl::StatusCode::kNotFound);
}

// A job resuming from a finished job's checkpoints gets them at placement, whether the finished
// job had left memory before the submission or the coordinator restarted in between.
TEST_F(JobManagerTest, AJobResumesFromTheCheckpointsOfAJobInTheStoreOnly) {
  Register("w1", 1);
  const std::string done = RunOneRankJob(TestSpec("done"), "", /*checkpoint=*/true);
  manager_->Tick();
  ASSERT_EQ(manager_->JobsInMemoryForTesting(), 0u);
  auto checkpoints = manager_->ListCheckpoints(done);
  ASSERT_TRUE(checkpoints.ok()) << checkpoints.status();
  ASSERT_THAT(*checkpoints, SizeIs(1));
  const std::string uri = (*checkpoints)[0].uri();
  v1::JobSpec follow = TestSpec("follow", 1, 1, /*gpus=*/1);  // waits: no GPU yet
  follow.mutable_checkpoint()->set_resume_from(done);
  const std::string follower = Submit(follow);
  Reopen();
  EXPECT_EQ(manager_->JobsInMemoryForTesting(), 2u);  // the follower and its source
  Register("w2", 1, /*gpus=*/1);
  manager_->Tick();
  ASSERT_EQ(Get(follower).state(), v1::SCHEDULED);
  auto task = manager_->TaskFor(follower + ".g1.r0");
  ASSERT_TRUE(task.ok()) << task.status();
  EXPECT_THAT(task->resume_checkpoints(), ElementsAre(uri));
  // Once the follower is done, nothing needs the source in memory.
  ASSERT_TRUE(Report("w2", follower + ".g1.r0", v1::TASK_EXITED, 0).ok());
  manager_->Tick();
  EXPECT_EQ(manager_->JobsInMemoryForTesting(), 0u);
  EXPECT_EQ(Submit(follow), "follow-3");  // the source is read from the store again
  EXPECT_EQ(manager_->JobsInMemoryForTesting(), 2u);
}

// Pages of a listing run across the jobs in memory and those in the store only, in one order,
// each job once.
TEST_F(JobManagerTest, ListingPagesThroughJobsInMemoryAndInTheStore) {
  Register("w1", 1);
  std::vector<std::string> expected;  // newest first
  for (int i = 0; i < 3; ++i) {
    expected.insert(expected.begin(), RunOneRankJob(TestSpec("done"), ""));
    expected.insert(expected.begin(), Submit(TestSpec("waits", 1, 1, /*gpus=*/1)));
  }
  manager_->Tick();
  ASSERT_EQ(manager_->JobsInMemoryForTesting(), 3u);
  for (int page_size : {1, 2, 4, 100}) {
    std::vector<std::string> ids;
    std::string token;
    do {
      auto page = manager_->ListJobs({}, page_size, token);
      ASSERT_TRUE(page.ok()) << page.status();
      EXPECT_LE(static_cast<int>(page->jobs.size()), page_size);
      for (const v1::Job& job : page->jobs) ids.push_back(job.id());
      token = page->next_page_token;
    } while (!token.empty());
    EXPECT_EQ(ids, expected) << "page size " << page_size;
  }
  auto succeeded = manager_->ListJobs({v1::SUCCEEDED}, 2, "");
  ASSERT_TRUE(succeeded.ok());
  ASSERT_THAT(succeeded->jobs, SizeIs(2));
  EXPECT_EQ(succeeded->jobs[0].id(), expected[1]);
  EXPECT_EQ(succeeded->jobs[1].id(), expected[3]);
  EXPECT_FALSE(succeeded->next_page_token.empty());
}

// A delete right after a job ends (a `cancel`, then a `delete`) waits for its trainers to be seen
// gone, and succeeds; one whose trainers stay is refused when the wait runs out. The waits are on
// the manager's clock: the test sees the delete waiting before it lets the trainer go.
TEST_F(JobManagerTest, ADeleteRightAfterTheEndWaitsForTheTrainersToStop) {
  delete_stop_wait_ = absl::Seconds(60);
  Reopen();
  Register("w1", 1);
  const std::string id = Submit(TestSpec("done"));
  manager_->Tick();
  ASSERT_TRUE(Report("w1", id + ".g1.r0", v1::TASK_RUNNING).ok());
  ASSERT_TRUE(Report("w1", id + ".g1.r0", v1::TASK_EXITED, 0).ok());
  absl::Status deleted = absl::UnknownError("not run");
  std::thread deleter([&] { deleted = manager_->DeleteJob(id, /*validate_only=*/false); });
  const std::optional<absl::Time> until = clock_.AwaitWaiter();
  ASSERT_TRUE(until.has_value()) << "the delete did not wait for the trainer";
  EXPECT_EQ(*until, clock_.Now() + absl::Seconds(60));
  manager_->Tick();  // sees the trainer gone
  deleter.join();
  EXPECT_TRUE(deleted.ok()) << deleted;
  EXPECT_EQ(manager_->GetJob(id).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(JobManagerTest, ADeleteIsRefusedWhenTheTrainersStayPastTheWait) {
  delete_stop_wait_ = absl::Seconds(30);
  Reopen();
  Register("w1", 1);
  const std::string held = Submit(TestSpec("held"));
  manager_->Tick();
  ASSERT_TRUE(Report("w1", held + ".g1.r0", v1::TASK_RUNNING).ok());
  ASSERT_TRUE(manager_->CancelJob(held, "").ok());  // its trainer has not reported gone
  absl::Status refused;
  std::thread deleter([&] { refused = manager_->DeleteJob(held, /*validate_only=*/false); });
  const std::optional<absl::Time> until = clock_.AwaitWaiter();
  ASSERT_TRUE(until.has_value()) << "the delete did not wait for the trainer";
  clock_.AdvanceTo(*until);
  deleter.join();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(), HasSubstr("still stopping after 30s"));
  EXPECT_TRUE(manager_->GetJob(held).ok());
}

// A finished job can be deleted at once, with its logs and records, and is then gone for good; a
// job not finished, one whose trainers may still be stopping and one that another job resumes
// from cannot.
TEST_F(JobManagerTest, AFinishedJobCanBeDeletedNow) {
  Register("w1", 1);
  const std::string id = Submit(TestSpec("done"));
  manager_->Tick();
  const std::string task = id + ".g1.r0";
  ASSERT_TRUE(Report("w1", task, v1::TASK_RUNNING).ok());
  ASSERT_TRUE(manager_->ShipLogs("w1", task, 0, "step 1\n").ok());
  absl::Status running = manager_->DeleteJob(id, /*validate_only=*/false);
  EXPECT_EQ(running.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(running.message(), HasSubstr("RUNNING: cancel it first"));
  ASSERT_TRUE(Report("w1", task, v1::TASK_EXITED, 0).ok());
  // Until a tick has seen its trainer gone, the job may still hold its slot.
  EXPECT_THAT(manager_->DeleteJob(id, false).message(), HasSubstr("still stopping"));
  manager_->Tick();
  v1::JobSpec follow = TestSpec("follow", 1, 1, /*gpus=*/1);  // waits: no GPU here
  follow.mutable_checkpoint()->set_resume_from(id);
  const std::string follower = Submit(follow);
  absl::Status source = manager_->DeleteJob(id, false);
  EXPECT_EQ(source.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(source.message(), HasSubstr("job " + follower + " resumes from its checkpoints"));
  ASSERT_TRUE(manager_->CancelJob(follower, "").ok());
  manager_->Tick();

  // A check deletes nothing.
  ASSERT_TRUE(manager_->DeleteJob(id, /*validate_only=*/true).ok());
  EXPECT_EQ(Get(id).state(), v1::SUCCEEDED);
  const std::string log_dir = dir_.path() + "/logs/" + id;
  ASSERT_TRUE(std::filesystem::exists(log_dir));

  ASSERT_TRUE(manager_->DeleteJob(id, false).ok());
  EXPECT_EQ(manager_->GetJob(id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(std::filesystem::exists(log_dir));
  auto listed = manager_->ListJobs({}, 0, "");
  ASSERT_TRUE(listed.ok());
  ASSERT_THAT(listed->jobs, SizeIs(1));
  EXPECT_EQ(listed->jobs[0].id(), follower);
  EXPECT_EQ(manager_->MetricsSnapshot().jobs_by_state.count(v1::SUCCEEDED), 0u);
  EXPECT_EQ(manager_->DeleteJob(id, false).code(), absl::StatusCode::kNotFound);
  Reopen();
  EXPECT_EQ(manager_->GetJob(id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(manager_->GetJob(follower).ok());
}

// A pipeline's stages may each have their own memory: each rank reserves and is limited to its
// stage's, and a stage smaller than its own estimate is refused naming it.
TEST_F(JobManagerTest, PipelineStagesHaveTheirOwnMemory) {
  Register("w1", 2);
  const std::string yaml = R"(name: stages
strategy: pipeline
workers: 2
model: {builtin: transformer, args: {vocab: 256, context: 32, layers: 4, dim: 1024, heads: 16}}
data: {tokens: /nonexistent-data/t-*.safetensors}
batch_size: 16
max_steps: 10
)";
  auto job = manager_->SubmitJobYaml(yaml + "pipeline: {stages: 2, memory: [1GiB, 512MiB]}\n");
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->memory_estimate().stages_size(), 2);
  manager_->Tick();
  auto rank0 = manager_->TaskFor(job->id() + ".g1.r0");
  auto rank1 = manager_->TaskFor(job->id() + ".g1.r1");
  ASSERT_TRUE(rank0.ok() && rank1.ok());
  EXPECT_EQ(rank0->memory_limit_bytes(), int64_t{1} << 30);
  EXPECT_EQ(rank1->memory_limit_bytes(), int64_t{512} << 20);
  auto small = manager_->SubmitJobYaml(yaml + "pipeline: {stages: 2, memory: [1GiB, 128MiB]}\n");
  ASSERT_FALSE(small.ok());
  EXPECT_THAT(small.status().message(),
              HasSubstr("pipeline.memory[1]: 128.0 MiB is less than stage 1 needs by estimate"));
}

}  // namespace
}  // namespace trainyard

namespace trainyard {
namespace {

// The segments a spec's paths are looked up by: job ids of submissions and of search trials,
// nothing else (a trial's folder is as much its owner's as a job's).
TEST(JobIdFormTest, SubmissionsAndTrialsAndNothingElse) {
  using job_manager_internal::IsJobIdForm;
  for (const char* id : {"tiny-1", "run-2-57", "exp-s3.t1.r0", "a-s3-s4.t12.r3"}) {
    EXPECT_TRUE(IsJobIdForm(id)) << id;
  }
  for (const char* other :
       {"ckpt", "data", "tiny", "tiny-", "-1", "Tiny-1", "tiny-1a", "exp-s3.t1", "exp-s3.t1.r",
        "exp-s.t1.r0", "model.safetensors", "step-000000000010x", "final"}) {
    EXPECT_FALSE(IsJobIdForm(other)) << other;
  }
}

}  // namespace
}  // namespace trainyard

namespace trainyard {
namespace {

// The reports that speak for a job are its metric history: written with them, read back after a
// time, thinned within the bound as the job goes on, and whole after the coordinator restarts.
TEST_F(JobManagerTest, ProgressReportsAreTheJobsMetricHistoryWithinItsBound) {
  JobManagerOptions options;
  options.metric_history = MetricHistoryBound{10, 5, 2};
  Reopen(options);
  Register("w1", 1);
  const std::string id = Submit(TestSpec("curve"));
  manager_->Tick();
  auto report = [&](int64_t step, int rank = 0) {
    clock_.Advance(absl::Milliseconds(10));
    v1::JobProgress progress;
    progress.set_step(step);
    progress.set_loss(1.0 / static_cast<double>(step));
    ASSERT_TRUE(manager_->ReportProgress(id, 1, rank, progress).ok());
  };
  for (int64_t step = 1; step <= 100; ++step) report(step);
  auto steps_of = [&](int64_t after_ms) {
    absl::StatusOr<std::vector<v1::MetricPoint>> history = manager_->MetricHistoryOf(id, after_ms);
    EXPECT_TRUE(history.ok()) << history.status();
    std::vector<int64_t> steps;
    for (const v1::MetricPoint& p : *history) steps.push_back(p.progress().step());
    return steps;
  };
  std::vector<int64_t> steps = steps_of(0);
  EXPECT_LE(static_cast<int64_t>(steps.size()), options.metric_history.max_points());
  ASSERT_FALSE(steps.empty());
  EXPECT_EQ(steps.back(), 100);
  EXPECT_LE(steps.front(), 100 / 3);  // the start of the run is still drawn, thinned
  EXPECT_TRUE(std::is_sorted(steps.begin(), steps.end()));
  for (int64_t s = 90; s <= 100; ++s) {
    EXPECT_TRUE(std::find(steps.begin(), steps.end(), s) != steps.end()) << s;
  }
  absl::StatusOr<std::vector<v1::MetricPoint>> all = manager_->MetricHistoryOf(id, 0);
  ASSERT_TRUE(all.ok());
  EXPECT_DOUBLE_EQ(all->back().progress().loss(), 0.01);
  // What came after a point: the newest only.
  EXPECT_EQ(steps_of((*all)[all->size() - 2].unix_ms()), std::vector<int64_t>{100});
  // A rank behind rank 0 does not speak for the job: no point.
  report(50, /*rank=*/1);
  EXPECT_EQ(steps_of(0).size(), steps.size());

  // After a restart the history is whole, and thinning goes on where it was.
  Reopen(options);
  EXPECT_EQ(steps_of(0), steps);
  for (int64_t step = 101; step <= 200; ++step) report(step);
  steps = steps_of(0);
  EXPECT_LE(static_cast<int64_t>(steps.size()), options.metric_history.max_points());
  EXPECT_EQ(steps.back(), 200);
  EXPECT_LE(steps.front(), 200 / 3);
}

}  // namespace
}  // namespace trainyard
