// `trainyard up`, the local cluster people try Trainyard on: a worker that dies is reported and
// stays down while the coordinator and the other workers go on, and a job running on it recovers
// on the spare worker, as on a real cluster.

#include <signal.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/rpc/channel.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster.h"

namespace trainyard::testing {
namespace {

using ::testing::HasSubstr;
using trainyard::v1::Job;

constexpr char kJobName[] = "up-recovery";

std::string JobYaml() {
  return absl::StrCat("name: ", kJobName, R"(
strategy: data_parallel
workers: 2
model: {builtin: mlp, args: {inputs: 16, hidden: [32], classes: 4}}
data: {synthetic: {samples: 2048, features: 16, classes: 4, noise: 0.5}}
batch_size: 32
optimizer: {name: sgd, lr: 0.05}
seed: 3
collective_timeout: 20s
checkpoint: {every_steps: 10}
max_steps: 200
)");
}

// The workers the coordinator knows, or an empty list while it cannot be asked.
std::vector<v1::Worker> ListWorkers(v1::JobService::Stub& jobs) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::ListWorkersResponse response;
  if (!jobs.ListWorkers(&context, v1::ListWorkersRequest(), &response).ok()) return {};
  return {response.workers().begin(), response.workers().end()};
}

std::string CommandLine(pid_t pid) {
  std::string text = ReadFile(absl::StrCat("/proc/", pid, "/cmdline"));
  for (char& c : text) c = c == '\0' ? ' ' : c;
  return text;
}

// Where `trainyard up` leaves the CLI's credentials, and where the CLI finds them: a folder of
// `dir`, not the user's.
std::map<std::string, std::string> ConfigEnv(const TempDir& dir) {
  return {{"XDG_CONFIG_HOME", dir.path() + "/config"}};
}

// `trainyard up` with `workers` workers in a folder of `dir`, and the coordinator it started.
struct LocalCluster {
  LocalCluster(const TempDir& dir, int workers, std::map<std::string, std::string> env = {},
               const std::string& port = "0", const std::string& name = "up")
      : state_dir(dir.path() + "/" + name),
        up({BinDir() + "/trainyard", "up", "--workers", absl::StrCat(workers), "--slots", "1",
            "--port", port, "--state-dir", state_dir},
           dir.path() + "/" + name + ".log", WithConfig(dir, std::move(env))) {}

  static std::map<std::string, std::string> WithConfig(const TempDir& dir,
                                                       std::map<std::string, std::string> env) {
    env.merge(ConfigEnv(dir));
    return env;
  }

  // Waits for the coordinator's port and for `count` READY workers; false (the caller fails)
  // if they do not come within 30 s each.
  bool WaitForWorkers(int count) {
    int port = 0;
    if (!PollUntil(
            [&] {
              return absl::SimpleAtoi(
                         absl::StripAsciiWhitespace(ReadFile(state_dir + "/coordinator.port")),
                         &port) &&
                     port > 0;
            },
            absl::Seconds(30))) {
      return false;
    }
    address = absl::StrCat("127.0.0.1:", port);
    ClientCredentials admin;
    admin.token = std::string(absl::StripAsciiWhitespace(ReadFile(state_dir + "/admin.token")));
    auto channel = NewClientChannel(address, admin);
    if (!channel.ok()) return false;
    jobs = v1::JobService::NewStub(*channel);
    return PollUntil(
        [&] {
          workers = ListWorkers(*jobs);
          int ready = 0;
          for (const v1::Worker& w : workers) ready += w.state() == v1::READY;
          return ready == count;
        },
        absl::Seconds(30));
  }

  std::string state_dir;
  Process up;
  std::string address;
  std::unique_ptr<v1::JobService::Stub> jobs;
  std::vector<v1::Worker> workers;
};

TEST(LocalClusterTest, AKilledWorkerStaysDownAndItsJobRecoversOnTheSpare) {
  TempDir dir;
  const std::string hold_dir = dir.path() + "/holds";
  std::filesystem::create_directories(hold_dir);
  LocalCluster cluster(dir, 3, {{kTestHoldDirEnv, hold_dir}});
  Process& up = cluster.up;
  ASSERT_TRUE(cluster.WaitForWorkers(3)) << up.Log();
  const std::string& address = cluster.address;
  v1::JobService::Stub& jobs = *cluster.jobs;
  std::vector<v1::Worker> workers = cluster.workers;

  // The job is held mid-run (after a committed checkpoint) until the worker is gone.
  SetTestHold(hold_dir, kJobName, 25);
  const std::string spec_path = dir.path() + "/job.yaml";
  { std::ofstream(spec_path) << JobYaml(); }
  // The CLI finds the credentials `up` left for it, without flags.
  const auto submit =
      RunCli(address, dir.path(), {"submit", spec_path}, absl::Seconds(120), ConfigEnv(dir));
  ASSERT_EQ(submit.exit_code, 0) << submit.output;
  const std::string id = submit.FirstLine();
  auto held = WatchJobUntil(
      jobs, id,
      [](const Job& job) {
        return job.state() == v1::RUNNING && job.progress().step() == 25 &&
               job.committed_step() >= 20;
      },
      absl::Seconds(120));
  ASSERT_TRUE(held.ok()) << held.status();

  // `trainyard workers` shows each agent's host and process id, and the tasks it runs.
  workers = ListWorkers(jobs);
  const auto listed = RunCli(address, dir.path(), {"workers"}, absl::Seconds(120), ConfigEnv(dir));
  ASSERT_EQ(listed.exit_code, 0) << listed.output;
  std::string victim;
  pid_t victim_pid = 0;
  for (const v1::Worker& w : workers) {
    ASSERT_GT(w.pid(), 0) << w.id();
    EXPECT_THAT(listed.output, HasSubstr(absl::StrCat(" ", w.pid(), " ")));
    EXPECT_THAT(CommandLine(w.pid()), HasSubstr("--name=" + w.id())) << "pid " << w.pid();
    for (const std::string& task : w.task_ids()) {
      if (task == absl::StrCat(id, ".g1.r1")) {
        victim = w.id();
        victim_pid = w.pid();
      }
    }
  }
  ASSERT_FALSE(victim.empty()) << listed.output;
  EXPECT_THAT(listed.output, HasSubstr(absl::StrCat(id, ".g1.r1")));

  // The machine of rank 1 vanishes. Its trainer dies with its agent (parent-death signal).
  ASSERT_EQ(kill(victim_pid, SIGKILL), 0);
  ClearTestHold(hold_dir, kJobName);
  auto done = WatchJobUntil(
      jobs, id,
      [](const Job& job) {
        return job.state() == v1::SUCCEEDED || job.state() == v1::FAILED ||
               job.state() == v1::CANCELLED;
      },
      absl::Seconds(180));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::SUCCEEDED) << done->reason();
  ASSERT_EQ(done->restarts_size(), 1);
  EXPECT_EQ(done->restarts(0).reason(), v1::WORKER_LOST) << done->restarts(0).message();
  EXPECT_GE(done->restarts(0).resumed_step(), held->committed_step());
  for (const v1::TaskInfo& t : done->tasks()) {
    if (t.generation() == 2) {
      EXPECT_NE(t.worker_id(), victim);
    }
  }

  // Reported, and the rest of the cluster went on.
  EXPECT_TRUE(up.running());
  const std::string log = up.Log();
  EXPECT_THAT(log, HasSubstr(absl::StrCat(victim, " killed by signal 9")));
  EXPECT_THAT(log, HasSubstr(absl::StrCat(victim, " stays down")));
  int ready = 0;
  for (const v1::Worker& w : ListWorkers(jobs)) ready += w.state() == v1::READY;
  EXPECT_EQ(ready, 2);

  // Ctrl-C stops what is left, cleanly.
  up.Signal(SIGINT);
  std::optional<int> status = up.Wait(absl::Seconds(60));
  ASSERT_TRUE(status.has_value()) << up.Log();
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << up.Log();
  for (const v1::Worker& w : workers) EXPECT_FALSE(ProcessAlive(w.pid())) << w.id();
}

// The coordinator's end still stops the whole local cluster, with a non-zero exit.
TEST(LocalClusterTest, TheCoordinatorsEndStopsEverything) {
  TempDir dir;
  LocalCluster cluster(dir, 2);
  Process& up = cluster.up;
  const std::string& state_dir = cluster.state_dir;
  ASSERT_TRUE(cluster.WaitForWorkers(2)) << up.Log();
  const std::vector<v1::Worker> workers = cluster.workers;
  std::optional<pid_t> coordinator;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    pid_t pid = 0;
    if (!absl::SimpleAtoi(entry.path().filename().string(), &pid)) continue;
    const std::string command = CommandLine(pid);
    if (absl::StrContains(command, "trainyard-coordinator") &&
        absl::StrContains(command, "--state_dir=" + state_dir)) {
      coordinator = pid;
    }
  }
  ASSERT_TRUE(coordinator.has_value());
  ASSERT_EQ(kill(*coordinator, SIGKILL), 0);
  std::optional<int> status = up.Wait(absl::Seconds(60));
  ASSERT_TRUE(status.has_value()) << up.Log();
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 1) << up.Log();
  EXPECT_THAT(up.Log(), HasSubstr("the coordinator is gone"));
  for (const v1::Worker& w : workers) EXPECT_FALSE(ProcessAlive(w.pid())) << w.id();
}

// The files named `name` under `dir`, with their contents.
std::map<std::string, std::string> FilesNamed(const std::string& dir, const std::string& name) {
  std::map<std::string, std::string> found;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (it->path().filename() == name) found[it->path().string()] = ReadFile(it->path().string());
  }
  return found;
}

TEST(LocalClusterTest, ASecondUpOnTheSamePortSaysSoAndLeavesTheFirstAlone) {
  TempDir dir;
  LocalCluster first(dir, 1);
  ASSERT_TRUE(first.WaitForWorkers(1)) << first.up.Log();
  const std::string port = first.address.substr(first.address.find(':') + 1);
  const std::map<std::string, std::string> tokens = FilesNamed(dir.path() + "/config", "token");
  ASSERT_EQ(tokens.size(), 1u);

  // A second `up` on that port is refused at once and says where the running cluster is.
  LocalCluster second(dir, 1, {}, port, "up2");
  std::optional<int> status = second.up.Wait(absl::Seconds(30));
  ASSERT_TRUE(status.has_value()) << second.up.Log();
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 1) << second.up.Log();
  EXPECT_THAT(second.up.Log(), HasSubstr("127.0.0.1:" + port + " is already served"));
  EXPECT_THAT(second.up.Log(), HasSubstr("export TRAINYARD_COORDINATOR=127.0.0.1:" + port));

  // Nor can a coordinator started by hand share the port (gRPC would, unless told not to).
  Process coordinator({BinDir() + "/trainyard-coordinator", "--listen=127.0.0.1:" + port,
                       "--state_dir=" + dir.path() + "/by-hand", "--metrics_listen="},
                      dir.path() + "/by-hand.log");
  status = coordinator.Wait(absl::Seconds(30));
  ASSERT_TRUE(status.has_value()) << coordinator.Log();
  EXPECT_FALSE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << coordinator.Log();
  EXPECT_THAT(coordinator.Log(), HasSubstr("cannot listen on 127.0.0.1:" + port));

  // The first cluster is as it was: the CLI's token for it unchanged, its one worker READY.
  EXPECT_EQ(FilesNamed(dir.path() + "/config", "token"), tokens);
  EXPECT_TRUE(first.WaitForWorkers(1));
  EXPECT_EQ(first.workers.size(), 1u);
}

}  // namespace
}  // namespace trainyard::testing
