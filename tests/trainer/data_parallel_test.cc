// Data-parallel training with the real trainer binary: one process per rank, meeting through a
// real coordinator (JobManager and its gRPC server, in this test's process) and reducing with
// Gloo on loopback. The same job on 2 and 3 ranks must end where it ends on 1 rank with the same
// global batch.

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/rpc/credentials.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/api/coordinator_server.h"
#include "server/jobs/job_manager.h"
#include "server/store/sqlite_job_store.h"
#include "worker/trainer/model/model.h"

extern char** environ;

namespace trainyard {
namespace {

std::string EnvOr(const char* name, const std::string& fallback) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : fallback;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

class DataParallelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "data_parallel_test.XXXXXX";
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
    JobManagerOptions options;
    options.checkpoint_root = "file://" + dir_ + "/ckpt";
    options.worker_timeout = absl::Hours(1);  // no agents here to renew the leases
    // The trainers present the credentials their tasks carry, as under a real agent.
    options.task_credential_key = RandomBytes(32);
    auto store = SqliteJobStore::Open(dir_ + "/state.db");
    ASSERT_TRUE(store.ok()) << store.status();
    auto manager = JobManager::Create(RealClock::Get(), *std::move(store),
                                      std::make_unique<LogStore>(dir_ + "/logs"), options);
    ASSERT_TRUE(manager.ok()) << manager.status();
    manager_ = *std::move(manager);
    auto token_store = SqliteJobStore::Open(dir_ + "/state.db");
    ASSERT_TRUE(token_store.ok()) << token_store.status();
    token_store_ = *std::move(token_store);
    auto auth = Authenticator::Create(*token_store_, options.task_credential_key, RealClock::Get());
    ASSERT_TRUE(auth.ok()) << auth.status();
    auth_ = *std::move(auth);
    auto server = CoordinatorServer::Start(*manager_, *auth_, {});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    for (int i = 0; i < 3; ++i) {
      v1::RegisterWorkerRequest request;
      request.set_name(absl::StrCat("w", i));
      request.set_address("127.0.0.1");
      request.set_slots(8);
      ASSERT_TRUE(manager_->RegisterWorker(request).ok());
    }
  }

  void TearDown() override {
    server_.reset();
    manager_.reset();
    auth_.reset();
    std::filesystem::remove_all(dir_);
  }

  static v1::JobSpec Spec(const std::string& name, int world, const std::string& optimizer) {
    v1::JobSpec spec;
    spec.set_name(name);
    spec.set_strategy(v1::DATA_PARALLEL);
    spec.mutable_workers()->set_min(world);
    spec.mutable_workers()->set_max(world);
    spec.mutable_model()->set_builtin("mlp");
    spec.mutable_model()->mutable_args()->set_inputs(8);
    spec.mutable_model()->mutable_args()->add_hidden(16);
    spec.mutable_model()->mutable_args()->set_classes(3);
    v1::SyntheticData& data = *spec.mutable_data()->mutable_synthetic();
    data.set_samples(240);
    data.set_features(8);
    data.set_classes(3);
    data.set_noise(1.5);
    spec.set_batch_size(12);
    spec.set_max_steps(20);
    spec.set_seed(3);
    v1::OptimizerSpec& opt = *spec.mutable_optimizer();
    opt.set_name(optimizer);
    if (optimizer == "sgd") {
      opt.set_lr(0.05);
      opt.set_momentum(0.9);
    } else {
      opt.set_lr(0.01);
      opt.set_weight_decay(0.01);
    }
    spec.set_collective_timeout_seconds(30);
    return spec;
  }

  // Submits `spec`, runs its ranks as trainer processes until they all exit, and returns the
  // exported model's tensors (rank 0 exports).
  std::map<std::string, torch::Tensor> Train(const v1::JobSpec& spec) {
    auto job = manager_->SubmitJob(spec);
    EXPECT_TRUE(job.ok()) << job.status();
    if (!job.ok()) return {};
    manager_->Tick();
    const int world = spec.workers().max();
    std::vector<pid_t> pids;
    for (int rank = 0; rank < world; ++rank) {
      absl::StatusOr<v1::Task> task = manager_->TaskFor(absl::StrCat(job->id(), ".g1.r", rank));
      EXPECT_TRUE(task.ok()) << task.status();
      if (!task.ok()) return {};
      EXPECT_EQ(task->world_size(), world);
      const std::string task_dir = absl::StrCat(dir_, "/", task->task_id());
      std::filesystem::create_directories(task_dir);
      std::ofstream(task_dir + "/task.pb", std::ios::binary) << task->SerializeAsString();
      pids.push_back(
          Spawn({EnvOr("TRAINYARD_BIN_DIR", ".") + "/trainyard-trainer", "--task_file=task.pb",
                 absl::StrCat("--coordinator=127.0.0.1:", server_->port())},
                task_dir));
    }
    for (int rank = 0; rank < world; ++rank) {
      int status = 0;
      waitpid(pids[rank], &status, 0);
      const std::string task_dir = absl::StrCat(dir_, "/", job->id(), ".g1.r", rank);
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
          << "rank " << rank << " of " << world << ":\n"
          << ReadFile(task_dir + "/log");
    }
    const std::string exported =
        absl::StrCat(dir_, "/ckpt/", job->id(), "/final/model.safetensors");
    absl::StatusOr<std::map<std::string, torch::Tensor>> tensors =
        trainer::DecodeTensors(ReadFile(exported));
    EXPECT_TRUE(tensors.ok()) << exported << ": " << tensors.status();
    return tensors.ok() ? *tensors : std::map<std::string, torch::Tensor>{};
  }

  static pid_t Spawn(const std::vector<std::string>& argv, const std::string& cwd) {
    const pid_t pid = fork();
    if (pid == 0) {
      if (chdir(cwd.c_str()) != 0) _exit(126);
      const int fd = open("log", O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      setenv("OMP_NUM_THREADS", "1", 1);
      std::vector<char*> args;
      for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
    return pid;
  }

  static void ExpectClose(const std::map<std::string, torch::Tensor>& expected,
                          const std::map<std::string, torch::Tensor>& actual,
                          const std::string& what) {
    ASSERT_FALSE(expected.empty());
    ASSERT_EQ(expected.size(), actual.size()) << what;
    for (const auto& [name, tensor] : expected) {
      ASSERT_TRUE(actual.count(name)) << what << ": " << name;
      const double diff = (actual.at(name) - tensor).abs().max().item<double>();
      EXPECT_LE(diff, 1e-5) << what << ": " << name;
    }
  }

  std::string dir_;
  std::unique_ptr<JobManager> manager_;
  std::unique_ptr<SqliteJobStore> token_store_;
  std::unique_ptr<Authenticator> auth_;
  std::unique_ptr<CoordinatorServer> server_;
};

TEST_F(DataParallelTest, TwoAndThreeRanksMatchOneRankWithSgdMomentum) {
  const auto one = Train(Spec("sgd-1", 1, "sgd"));
  // Training moved the parameters away from their start (the check below is not vacuous).
  v1::JobSpec untrained = Spec("sgd-0", 1, "sgd");
  untrained.mutable_optimizer()->set_lr(1e-12);
  const auto start = Train(untrained);
  ASSERT_FALSE(start.empty());
  ASSERT_EQ(start.size(), one.size());
  double moved = 0;
  for (const auto& [name, tensor] : one) {
    moved = std::max(moved, (tensor - start.at(name)).abs().max().item<double>());
  }
  EXPECT_GT(moved, 1e-2);
  ExpectClose(one, Train(Spec("sgd-2", 2, "sgd")), "2 ranks");
  ExpectClose(one, Train(Spec("sgd-3", 3, "sgd")), "3 ranks");
  v1::JobSpec accumulated = Spec("sgd-2-acc", 2, "sgd");
  accumulated.set_accumulate_steps(3);
  ExpectClose(one, Train(accumulated), "2 ranks, 3 micro-batches each");
}

TEST_F(DataParallelTest, TwoAndThreeRanksMatchOneRankWithAdamW) {
  const auto one = Train(Spec("adamw-1", 1, "adamw"));
  ExpectClose(one, Train(Spec("adamw-2", 2, "adamw")), "2 ranks");
  ExpectClose(one, Train(Spec("adamw-3", 3, "adamw")), "3 ranks");
}

}  // namespace
}  // namespace trainyard
