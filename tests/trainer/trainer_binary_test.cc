// Runs the real trainyard-trainer binary in standalone mode (no coordinator), in a temporary
// task folder, as the worker agent would.

#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/flight_record.h"
#include "common/storage/checkpoint_layout.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "tests/trainer/test_files.h"
#include "tests/trainer/test_tasks.h"
#include "trainyard/v1/agent_service.grpc.pb.h"
#include "trainyard/v1/agent_service.pb.h"

namespace {

using ::testing::HasSubstr;

using ::trainyard::trainer::test_files::FileExists;
using ::trainyard::trainer::test_files::MakeTempDir;
using ::trainyard::trainer::test_files::ReadFile;
using ::trainyard::trainer::test_files::StepFile;
using ::trainyard::trainer::test_tasks::SingleRankTask;

std::string EnvOr(const char* name, const std::string& fallback) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : fallback;
}

std::string TrainerPath() { return EnvOr("TRAINYARD_BIN_DIR", ".") + "/trainyard-trainer"; }
std::string SourceDir() { return EnvOr("TRAINYARD_SOURCE_DIR", "."); }

struct ProcessResult {
  int exit_code = -1;
  std::string out;  // stdout
};

// Starts `argv` in `cwd` with stdout on a pipe and stderr passed through. If `on_line` is given,
// it sees each stdout line as it arrives and may return true to send SIGTERM to the child.
ProcessResult RunProcess(const std::vector<std::string>& argv, const std::string& cwd,
                         const std::function<bool(const std::string&)>& on_line = nullptr) {
  int fds[2];
  EXPECT_EQ(pipe(fds), 0);
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], 1);
    close(fds[0]);
    close(fds[1]);
    if (chdir(cwd.c_str()) != 0) _exit(126);
    setenv("OMP_NUM_THREADS", "1", 1);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  close(fds[1]);
  ProcessResult result;
  std::string pending;
  bool signalled = false;
  char buffer[4096];
  ssize_t n;
  while ((n = read(fds[0], buffer, sizeof(buffer))) > 0) {
    result.out.append(buffer, n);
    pending.append(buffer, n);
    size_t newline;
    while ((newline = pending.find('\n')) != std::string::npos) {
      const std::string line = pending.substr(0, newline);
      pending.erase(0, newline + 1);
      if (on_line && !signalled && on_line(line)) {
        kill(pid, SIGTERM);
        signalled = true;
      }
    }
  }
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

// Writes `task` to {dir}/task.pb and runs the trainer on it (standalone without a coordinator).
ProcessResult RunTrainer(const trainyard::v1::Task& task, const std::string& dir,
                         const std::function<bool(const std::string&)>& on_line = nullptr,
                         const std::string& coordinator = "",
                         const std::vector<std::string>& flags = {}) {
  std::ofstream(dir + "/task.pb", std::ios::binary) << task.SerializeAsString();
  std::vector<std::string> argv = {TrainerPath(), "--task_file=" + dir + "/task.pb"};
  if (!coordinator.empty()) argv.push_back("--coordinator=" + coordinator);
  argv.insert(argv.end(), flags.begin(), flags.end());
  return RunProcess(argv, dir, on_line);
}

// The step of a progress line ("step=12 total=..."), -1 for other lines.
int64_t StepOfLine(const std::string& line) {
  static const std::regex kStep(R"(^step=(\d+) .*)");
  std::smatch m;
  return std::regex_match(line, m, kStep) ? std::stoll(m[1]) : -1;
}

// The trainer-facing half of AgentService: records reports, keeps the newest keep_last commits
// (all while keep_last is 0), their step folders derived from checkpoint_uri as the coordinator
// derives them.
class FakeAgentService final : public trainyard::v1::AgentService::Service {
 public:
  grpc::Status ReportProgress(grpc::ServerContext*,
                              const trainyard::v1::ReportProgressRequest* request,
                              trainyard::v1::ReportProgressResponse*) override {
    absl::MutexLock lock(&mu_);
    progress_.push_back(*request);
    return grpc::Status::OK;
  }
  grpc::Status CommitCheckpoint(grpc::ServerContext*,
                                const trainyard::v1::CommitCheckpointRequest* request,
                                trainyard::v1::CommitCheckpointResponse* response) override {
    absl::MutexLock lock(&mu_);
    commits_.push_back(*request);
    live_.push_back(trainyard::CheckpointStepUri(checkpoint_uri, request->step()));
    while (keep_last > 0 && static_cast<int>(live_.size()) > keep_last) {
      response->add_retired_uris(live_.front());
      live_.erase(live_.begin());
    }
    return grpc::Status::OK;
  }
  grpc::Status ReportModel(grpc::ServerContext*, const trainyard::v1::ReportModelRequest* request,
                           trainyard::v1::ReportModelResponse*) override {
    absl::MutexLock lock(&mu_);
    models_.push_back(*request);
    return grpc::Status::OK;
  }

  absl::Mutex mu_;
  std::vector<trainyard::v1::ReportProgressRequest> progress_ ABSL_GUARDED_BY(mu_);
  std::vector<trainyard::v1::CommitCheckpointRequest> commits_ ABSL_GUARDED_BY(mu_);
  std::vector<trainyard::v1::ReportModelRequest> models_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> live_ ABSL_GUARDED_BY(mu_);
  // Set before the trainer runs.
  std::string checkpoint_uri;
  int keep_last = 0;
};

struct FakeCoordinatorServer {
  FakeAgentService service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;

  // On `port`, or one the kernel picks when it is 0.
  explicit FakeCoordinatorServer(int on_port = 0) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort(absl::StrCat("127.0.0.1:", on_port), grpc::InsecureServerCredentials(),
                             &port);
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
  }
  ~FakeCoordinatorServer() {
    if (server != nullptr) server->Shutdown();
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port); }
};

trainyard::v1::Task BaseTask(const std::string& checkpoint_dir) {
  trainyard::v1::Task task = SingleRankTask("jobx", checkpoint_dir);
  auto& spec = *task.mutable_spec();
  spec.mutable_model()->set_builtin("mlp");
  spec.mutable_model()->mutable_args()->add_hidden(16);
  spec.set_batch_size(16);
  spec.mutable_optimizer()->set_name("sgd");
  spec.mutable_optimizer()->set_lr(0.1);
  spec.mutable_optimizer()->set_momentum(0.9);
  spec.set_loss("cross_entropy");
  spec.set_seed(3);
  return task;
}

// BaseTask on a small synthetic dataset (64 samples of 4 features, 2 classes), for `max_steps`.
trainyard::v1::Task SyntheticTask(const std::string& checkpoint_dir, int64_t max_steps) {
  trainyard::v1::Task task = BaseTask(checkpoint_dir);
  auto& synthetic = *task.mutable_spec()->mutable_data()->mutable_synthetic();
  synthetic.set_samples(64);
  synthetic.set_features(4);
  synthetic.set_classes(2);
  task.mutable_spec()->set_max_steps(max_steps);
  return task;
}

std::vector<double> LossesOf(const std::string& out) {
  static const std::regex kLine(
      R"(^step=(\d+) total=(\d+) loss=([0-9.]+) lr=\S+ samples_per_s=[0-9.]+ epoch=\d+.*$)");
  std::vector<double> losses;
  for (absl::string_view line : absl::StrSplit(out, '\n')) {
    std::smatch m;
    const std::string s(line);
    if (std::regex_match(s, m, kLine)) losses.push_back(std::stod(m[3]));
  }
  return losses;
}

double MeanOfFirst(const std::vector<double>& v, size_t n) {
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += v[i];
  return sum / static_cast<double>(n);
}

double MeanOfLast(const std::vector<double>& v, size_t n) {
  double sum = 0;
  for (size_t i = v.size() - n; i < v.size(); ++i) sum += v[i];
  return sum / static_cast<double>(n);
}

TEST(TrainerBinaryTest, TrainsSyntheticDataStandalone) {
  const std::string dir = MakeTempDir();
  trainyard::v1::Task task = BaseTask(dir + "/ckpt");
  auto& spec = *task.mutable_spec();
  auto& synthetic = *spec.mutable_data()->mutable_synthetic();
  synthetic.set_samples(320);
  synthetic.set_features(6);
  synthetic.set_classes(4);
  synthetic.set_noise(0.4f);
  spec.mutable_data()->set_validation_split(0.2f);
  spec.set_max_steps(60);
  spec.set_log_every_steps(1);
  spec.mutable_checkpoint()->set_every_steps(25);
  ProcessResult run = RunTrainer(task, dir);
  ASSERT_EQ(run.exit_code, 0) << run.out;
  EXPECT_THAT(run.out, HasSubstr("start: model=mlp"));
  EXPECT_THAT(run.out, ::testing::ContainsRegex(
                           "step=20 total=60 loss=[0-9]+\\.[0-9]{8} lr=0\\.1 "
                           "samples_per_s=[0-9]+\\.[0-9] epoch=1 val_accuracy=[01]\\.[0-9]{4}"));
  const std::vector<double> losses = LossesOf(run.out);
  ASSERT_EQ(losses.size(), 60u) << run.out;
  EXPECT_LT(MeanOfLast(losses, 5), 0.5 * MeanOfFirst(losses, 5)) << run.out;
  EXPECT_TRUE(FileExists(StepFile(dir + "/ckpt/step-000000000025", "MANIFEST")));
  EXPECT_TRUE(FileExists(StepFile(dir + "/ckpt/step-000000000050", "MANIFEST")));
  const std::string manifest = ReadFile(StepFile(dir + "/ckpt/step-000000000060", "MANIFEST"));
  EXPECT_THAT(manifest, HasSubstr("\"format\": \"trainyard-checkpoint/1\""));
  EXPECT_THAT(manifest, HasSubstr("\"name\": \"optimizer.g"));
  EXPECT_TRUE(FileExists(dir + "/ckpt/final/model.safetensors"));
  EXPECT_FALSE(FileExists(dir + "/termination-message"));
}

TEST(TrainerBinaryTest, MissingDataExitsWithUserErrorAndMessage) {
  const std::string dir = MakeTempDir();
  trainyard::v1::Task task = BaseTask(dir + "/ckpt");
  const std::string pattern = dir + "/nothing-*.safetensors";
  task.mutable_spec()->mutable_data()->set_train(pattern);
  task.mutable_spec()->set_max_steps(10);
  ProcessResult run = RunTrainer(task, dir);
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_EQ(ReadFile(dir + "/termination-message"),
            "data.train: no files match '" + pattern + "'\n");
}

TEST(TrainerBinaryTest, SigtermStopsAtAStepBoundaryWithACheckpoint) {
  const std::string dir = MakeTempDir();
  trainyard::v1::Task task = SyntheticTask(dir + "/ckpt", 100000000);
  auto& spec = *task.mutable_spec();
  spec.set_log_every_steps(5);
  ProcessResult run =
      RunTrainer(task, dir, [](const std::string& line) { return line.rfind("step=5 ", 0) == 0; });
  EXPECT_EQ(run.exit_code, 143) << run.out;
  const std::string message = ReadFile(dir + "/termination-message");
  static const std::regex kMessage(R"(stopped by SIGTERM at step (\d+)\n)");
  std::smatch m;
  ASSERT_TRUE(std::regex_match(message, m, kMessage)) << message;
  const int step = std::stoi(m[1]);
  EXPECT_GE(step, 5);
  char folder[64];
  std::snprintf(folder, sizeof(folder), "/ckpt/step-%012d", step);
  EXPECT_TRUE(FileExists(StepFile(dir + folder, "MANIFEST"))) << folder;
  EXPECT_FALSE(FileExists(dir + "/ckpt/final/model.safetensors"));
}

TEST(TrainerBinaryTest, TrainsATorchScriptModelOnSafetensorsFiles) {
  const std::string dir = MakeTempDir();
  const std::string python = "/usr/bin/python3";
  if (std::system((python + " -c 'import torch, numpy' 2>/dev/null").c_str()) != 0) {
    GTEST_SKIP() << "needs /usr/bin/python3 with torch and numpy";
  }
  ProcessResult data = RunProcess(
      {python, SourceDir() + "/examples/write_dataset.py", "--out-dir", dir + "/data", "--samples",
       "400", "--features", "10", "--classes", "3", "--files", "3", "--seed", "5"},
      dir);
  ASSERT_EQ(data.exit_code, 0) << data.out;
  ProcessResult model = RunProcess(
      {python, SourceDir() + "/examples/write_torchscript_model.py", "--out", dir + "/net.pt",
       "--inputs", "10", "--hidden", "16", "--classes", "3", "--seed", "2"},
      dir);
  ASSERT_EQ(model.exit_code, 0) << model.out;

  trainyard::v1::Task task = BaseTask(dir + "/ckpt");
  auto& spec = *task.mutable_spec();
  spec.mutable_model()->set_torchscript("file://" + dir + "/net.pt");
  spec.mutable_data()->set_train("file://" + dir + "/data/train-*.safetensors");
  spec.mutable_data()->set_features("x");
  spec.mutable_data()->set_labels("y");
  spec.mutable_optimizer()->set_name("adam");
  spec.mutable_optimizer()->set_lr(0.01);
  spec.set_epochs(4);
  spec.set_log_every_steps(1);
  ProcessResult run = RunTrainer(task, dir);
  ASSERT_EQ(run.exit_code, 0) << run.out;
  EXPECT_THAT(run.out, HasSubstr("start: model=torchscript"));
  EXPECT_THAT(run.out, HasSubstr("step=100 total=100 "));  // 400 / 16 = 25 steps per epoch
  const std::vector<double> losses = LossesOf(run.out);
  ASSERT_EQ(losses.size(), 100u);
  EXPECT_LT(MeanOfLast(losses, 5), 0.5 * MeanOfFirst(losses, 5)) << run.out;
  EXPECT_TRUE(FileExists(dir + "/ckpt/final/model.pt"));
  EXPECT_TRUE(FileExists(StepFile(dir + "/ckpt/step-000000000100", "MANIFEST")));

  // A module whose input width does not fit the data, and a file that is no module at all, are
  // user errors named in the termination message.
  ProcessResult narrow =
      RunProcess({python, SourceDir() + "/examples/write_torchscript_model.py", "--out",
                  dir + "/narrow.pt", "--inputs", "7", "--hidden", "4", "--classes", "3"},
                 dir);
  ASSERT_EQ(narrow.exit_code, 0) << narrow.out;
  spec.mutable_model()->set_torchscript(dir + "/narrow.pt");
  task.set_checkpoint_uri("file://" + dir + "/ckpt2");
  run = RunTrainer(task, dir);
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_THAT(ReadFile(dir + "/termination-message"),
              ::testing::StartsWith("model: forward() fails on the data:"));
  std::ofstream(dir + "/junk.pt") << "not a module";
  spec.mutable_model()->set_torchscript("file://" + dir + "/junk.pt");
  run = RunTrainer(task, dir);
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_THAT(ReadFile(dir + "/termination-message"),
              ::testing::StartsWith("model.torchscript: cannot load 'file://" + dir + "/junk.pt'"));

  // A module that calls an operator this LibTorch lacks (as a PyTorch 2 module calls
  // aten::scaled_dot_product_attention, which 1.13 lacks) is refused before LibTorch loads it,
  // naming the operator and the version.
  ProcessResult future =
      RunProcess({python, "-c",
                  "import sys, zipfile\n"
                  "src = zipfile.ZipFile(sys.argv[1]); dst = zipfile.ZipFile(sys.argv[2], 'w')\n"
                  "for n in src.namelist():\n"
                  "    b = src.read(n)\n"
                  "    if n.endswith('/code/__torch__.py'):\n"
                  "        b += b'\\ndef later(x: Tensor) -> Tensor:\\n  return "
                  "torch.not_in_any_libtorch(x)\\n'\n"
                  "    dst.writestr(n, b)\n",
                  dir + "/net.pt", dir + "/future.pt"},
                 dir);
  ASSERT_EQ(future.exit_code, 0) << future.out;
  spec.mutable_model()->set_torchscript("file://" + dir + "/future.pt");
  run = RunTrainer(task, dir);
  EXPECT_EQ(run.exit_code, 2);
  trainyard::v1::TrainerRuntime runtime;
  ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(
      RunProcess({TrainerPath(), "--runtime"}, dir).out, &runtime));
  const std::string& version = runtime.libtorch_version();
  EXPECT_EQ(ReadFile(dir + "/termination-message"),
            "model.torchscript: 'file://" + dir + "/future.pt' needs what this worker's LibTorch " +
                version +
                " lacks: aten::not_in_any_libtorch (the model was saved by a newer PyTorch; run it "
                "on workers with a newer LibTorch)\n");
}

// What the agent reports at registration: the trainer's LibTorch, as PyTorch of the same build
// names it, and its operators, sorted, among them every one a scripted module of that PyTorch
// calls.
TEST(TrainerBinaryTest, RuntimeSaysWhatThisTrainerRuns) {
  const std::string dir = MakeTempDir();
  ProcessResult run = RunProcess({TrainerPath(), "--runtime"}, dir);
  ASSERT_EQ(run.exit_code, 0) << run.out;
  trainyard::v1::TrainerRuntime runtime;
  ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(run.out, &runtime)) << run.out;
  // PyTorch's own name for its version ("1.13.0a0+git...", "2.6.0+debian") begins with it.
  const std::string python = "/usr/bin/python3";
  if (std::system((python + " -c 'import torch' 2>/dev/null").c_str()) == 0) {
    ProcessResult peer = RunProcess({python, "-c", "import torch; print(torch.__version__)"}, dir);
    EXPECT_THAT(peer.out, ::testing::StartsWith(runtime.libtorch_version()));
  }
  EXPECT_GE(runtime.max_model_format_version(), 3);
  EXPECT_TRUE(std::is_sorted(runtime.ops().begin(), runtime.ops().end()));
  EXPECT_GT(runtime.ops_size(), 1000);
  for (const char* op : {"aten::linear", "aten::layer_norm", "prim::RaiseException"}) {
    EXPECT_TRUE(std::binary_search(runtime.ops().begin(), runtime.ops().end(), op)) << op;
  }
  if (!std::filesystem::exists("/dev/nvidia0")) {
    EXPECT_FALSE(runtime.cuda());
  }
}

TEST(TrainerBinaryTest, ReportsToTheCoordinatorAndDeletesRetiredCheckpoints) {
  FakeCoordinatorServer coordinator;
  ASSERT_NE(coordinator.server, nullptr);
  const std::string dir = MakeTempDir();
  trainyard::v1::Task task = SyntheticTask(dir + "/ckpt", 40);
  task.set_generation(3);
  auto& spec = *task.mutable_spec();
  spec.mutable_checkpoint()->set_every_steps(10);
  spec.mutable_checkpoint()->set_keep_last(2);
  coordinator.service.checkpoint_uri = task.checkpoint_uri();
  coordinator.service.keep_last = 2;
  ProcessResult run = RunTrainer(task, dir, nullptr, coordinator.address());
  ASSERT_EQ(run.exit_code, 0) << run.out;

  absl::MutexLock lock(&coordinator.service.mu_);
  const auto& commits = coordinator.service.commits_;
  ASSERT_EQ(commits.size(), 4u);
  for (size_t i = 0; i < commits.size(); ++i) {
    EXPECT_EQ(commits[i].job_id(), "jobx");
    EXPECT_EQ(commits[i].generation(), 3);
    EXPECT_EQ(commits[i].step(), 10 * static_cast<int64_t>(i + 1));
    EXPECT_GT(commits[i].size_bytes(), 0);
  }
  EXPECT_FALSE(FileExists(StepFile(dir + "/ckpt/step-000000000010", "model")));
  EXPECT_FALSE(FileExists(StepFile(dir + "/ckpt/step-000000000020", "MANIFEST")));
  EXPECT_TRUE(FileExists(StepFile(dir + "/ckpt/step-000000000030", "MANIFEST")));
  EXPECT_TRUE(FileExists(StepFile(dir + "/ckpt/step-000000000040", "MANIFEST")));

  const auto& progress = coordinator.service.progress_;
  ASSERT_FALSE(progress.empty());
  EXPECT_EQ(progress.back().job_id(), "jobx");
  EXPECT_EQ(progress.back().generation(), 3);
  EXPECT_EQ(progress.back().progress().step(), 40);
  EXPECT_EQ(progress.back().progress().total_steps(), 40);
  EXPECT_GT(progress.back().progress().loss(), 0);
  ASSERT_EQ(coordinator.service.models_.size(), 1u);
  EXPECT_EQ(coordinator.service.models_[0].uri(),
            "file://" + dir + "/ckpt/final/model.safetensors");
}

TEST(TrainerBinaryTest, UnreachableCoordinatorAtTheEndIsAnInfrastructureError) {
  std::string address;
  {
    FakeCoordinatorServer gone;  // a port that nothing listens on once it shuts down
    address = gone.address();
  }
  const std::string dir = MakeTempDir();
  trainyard::v1::Task task = SyntheticTask(dir + "/ckpt", 5);
  ProcessResult run = RunTrainer(task, dir, nullptr, address, {"--coordinator_retry=1s"});
  EXPECT_EQ(run.exit_code, 3) << run.out;
  EXPECT_THAT(ReadFile(dir + "/termination-message"), HasSubstr("checkpoint commit of step 5"));
  // The checkpoint itself was written; only its commit failed.
  EXPECT_TRUE(FileExists(StepFile(dir + "/ckpt/step-000000000005", "MANIFEST")));
}

TEST(TrainerBinaryTest, TrainingRidesOutACoordinatorRestart) {
  auto before = std::make_unique<FakeCoordinatorServer>();
  ASSERT_NE(before->server, nullptr);
  const int port = before->port;
  const std::string dir = MakeTempDir();
  trainyard::v1::Task task = SyntheticTask(dir + "/ckpt", 100000000);
  auto& spec = *task.mutable_spec();
  spec.set_log_every_steps(1);
  spec.mutable_checkpoint()->set_every_steps(20);
  spec.mutable_checkpoint()->set_keep_last(1000);
  // The coordinator goes away after step 30 and comes back on the same port once the trainer
  // has gone on for 25 steps without it and 3 s have passed (how fast it trains is the
  // machine's business); once the restarted one has taken a commit, the trainer is stopped.
  std::unique_ptr<FakeCoordinatorServer> after;
  absl::Time down_since = absl::InfiniteFuture();
  int64_t down_at_step = -1, up_at_step = -1;
  ProcessResult run = RunTrainer(
      task, dir,
      [&](const std::string& line) {
        const int64_t step = StepOfLine(line);
        if (step < 0) return false;
        if (down_at_step < 0 && step >= 30) {
          before->server->Shutdown();
          down_since = absl::Now();
          down_at_step = step;
        } else if (after == nullptr && step > down_at_step + 25 &&
                   absl::Now() - down_since >= absl::Seconds(3)) {
          after = std::make_unique<FakeCoordinatorServer>(port);
          up_at_step = step;
        } else if (after != nullptr) {
          absl::MutexLock lock(&after->service.mu_);
          return !after->service.commits_.empty();
        }
        return false;
      },
      before->address());
  ASSERT_NE(after, nullptr) << run.out;
  ASSERT_NE(after->server, nullptr);
  EXPECT_EQ(run.exit_code, 143) << run.out;
  // Training went on while the coordinator was away.
  EXPECT_GT(up_at_step, down_at_step + 20);
  absl::MutexLock lock(&after->service.mu_);
  const auto& commits = after->service.commits_;
  ASSERT_FALSE(commits.empty());
  // The first commit the restarted coordinator saw is of a checkpoint saved while it was down.
  EXPECT_GT(commits.front().step(), down_at_step - 20);
  EXPECT_LE(commits.front().step(), up_at_step);
  EXPECT_FALSE(after->service.progress_.empty());
}

TEST(TrainerBinaryTest, AStopTooCloseToItsDeadlineSkipsItsCheckpoint) {
  // The trainer stops at the first step boundary after the signal. When that is a step where a
  // periodic checkpoint was due anyway, it is kept and the skip goes unseen: try again, a few
  // times at most.
  for (int attempt = 0; attempt < 4; ++attempt) {
    const std::string dir = MakeTempDir();
    trainyard::v1::Task task = SyntheticTask(dir + "/ckpt", 100000000);
    auto& spec = *task.mutable_spec();
    spec.set_log_every_steps(1);
    spec.mutable_checkpoint()->set_every_steps(5);
    // Less time than the 1 s margin alone, once the saves of steps 5 and 10 were measured.
    ProcessResult run = RunTrainer(task, dir, [&](const std::string& line) {
      if (StepOfLine(line) != 12) return false;
      std::ofstream(dir + "/stop-deadline")
          << absl::ToUnixMillis(absl::Now() + absl::Milliseconds(900)) << "\n";
      return true;
    });
    EXPECT_EQ(run.exit_code, 143) << run.out;
    const std::string message = ReadFile(dir + "/termination-message");
    static const std::regex kMessage(R"(stopped by SIGTERM at step (\d+)(.*)\n)");
    std::smatch m;
    ASSERT_TRUE(std::regex_match(message, m, kMessage)) << message;
    const int step = std::stoi(m[1]);
    char folder[64];
    std::snprintf(folder, sizeof(folder), "/ckpt/step-%012d", step);
    if (step % 5 == 0) {
      EXPECT_TRUE(FileExists(StepFile(dir + folder, "MANIFEST"))) << message;
      continue;
    }
    EXPECT_EQ(m[2],
              "; its checkpoint was skipped: it would not have been saved before the deadline");
    EXPECT_FALSE(FileExists(StepFile(dir + folder, "MANIFEST"))) << folder;
    return;
  }
  GTEST_SKIP() << "every run stopped where a periodic checkpoint was due";
}

// The trainer keeps its flight record in its task folder; a test hold of its data read ({job}.data
// holding "RANK K") keeps it in the data phase after K updates, as the record shows, until the
// hold's file is removed.
TEST(TrainerBinaryTest, KeepsAFlightRecordThatShowsItHeldInItsDataRead) {
  const std::string dir = MakeTempDir();
  const std::string holds = MakeTempDir();
  trainyard::v1::Task task = SyntheticTask("", 8);
  task.mutable_spec()->set_name("held-in-data");
  task.mutable_spec()->set_log_every_steps(1);
  std::ofstream(holds + "/held-in-data.data") << "0 3\n";
  const std::string record_path = dir + "/" + trainyard::kFlightRecordFile;
  bool held = false;
  setenv("TRAINYARD_TEST_HOLD_DIR", holds.c_str(), 1);
  ProcessResult run = RunTrainer(task, dir, [&](const std::string& line) {
    if (StepOfLine(line) != 3) return false;
    // After its third update it waits in its data read, and stays there.
    const absl::Time give_up = absl::Now() + absl::Seconds(30);
    absl::StatusOr<trainyard::FlightRecordSnapshot> record;
    do {
      absl::SleepFor(absl::Milliseconds(5));
      record = trainyard::ReadFlightRecord(record_path);
    } while (absl::Now() < give_up &&
             !(record.ok() && record->phase == trainyard::RankPhase::kData && record->step == 3));
    EXPECT_TRUE(record.ok()) << record.status();
    absl::SleepFor(absl::Milliseconds(200));
    absl::StatusOr<trainyard::FlightRecordSnapshot> later =
        trainyard::ReadFlightRecord(record_path);
    held = record.ok() && later.ok() && later->phase == trainyard::RankPhase::kData &&
           later->step == 3 && later->phase_since_unix_ms == record->phase_since_unix_ms;
    std::remove((holds + "/held-in-data.data").c_str());
    return false;
  });
  unsetenv("TRAINYARD_TEST_HOLD_DIR");
  ASSERT_EQ(run.exit_code, 0) << run.out;
  EXPECT_TRUE(held);
  absl::StatusOr<trainyard::FlightRecordSnapshot> record = trainyard::ReadFlightRecord(record_path);
  ASSERT_TRUE(record.ok()) << record.status();
  EXPECT_EQ(record->phase, trainyard::RankPhase::kFinishing);
  EXPECT_EQ(record->step, 8);
  EXPECT_TRUE(record->recent.empty());  // one rank: no collectives
}

}  // namespace
