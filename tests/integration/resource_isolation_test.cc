// Limits per task on a shared worker, with the real coordinator, agent and trainers: a rank that
// goes over its memory limit is killed, reported OUT_OF_MEMORY with its limit and peak and not
// retried, while another job's rank on the same worker and the agent run on; the same without
// cgroups (the agent's watch); a rank held to its share of a CPU; a model too large for its
// limit or any worker refused at submission; and data larger than the limit read a window at a
// time.

#include <signal.h>
#include <sys/wait.h>

#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/common/process_cpu.h"
#include "tests/integration/cluster.h"

namespace trainyard::testing {
namespace {

constexpr char kPython[] = "/usr/bin/python3";
constexpr int64_t kMiB = int64_t{1} << 20;

// A TorchScript model that keeps 16 MiB more at every training step (tests/integration/
// leaky_model.py), written into `dir`.
std::string WriteLeakyModel(const std::string& dir) {
  const std::string model = dir + "/leaky.pt";
  Process writer({kPython, SourceDir() + "/tests/integration/leaky_model.py", "--out", model},
                 dir + "/leaky.log");
  std::optional<int> status = writer.Wait(absl::Seconds(120));
  EXPECT_TRUE(status.has_value() && WIFEXITED(*status) && WEXITSTATUS(*status) == 0)
      << writer.Log();
  return model;
}

std::string LeakyJobYaml(const std::string& model, const std::string& memory) {
  return absl::StrCat(R"(name: leaky
model: {torchscript: )",
                      model, R"(}
data:
  synthetic: {samples: 2048, features: 16, classes: 4}
batch_size: 32
optimizer: {name: sgd, lr: 0.01}
max_steps: 10000
restart: {max_failures: 3}
resources: {memory: )",
                      memory, "}\n");
}

// The failed leaky job: one rank, killed for memory at `limit`, with its peak, and not restarted
// although its restart.max_failures would allow it.
void ExpectOutOfMemory(const v1::Job& job, int64_t limit, const std::string& how) {
  EXPECT_EQ(job.state(), v1::FAILED) << job.reason();
  EXPECT_TRUE(absl::StrContains(job.reason(), "out of memory: killed at its limit of"))
      << job.reason();
  EXPECT_TRUE(absl::StrContains(job.reason(), how)) << job.reason();
  EXPECT_TRUE(absl::StrContains(job.reason(), "a user error: the job is not restarted"))
      << job.reason();
  EXPECT_EQ(job.generation(), 1);
  EXPECT_EQ(job.restarts_size(), 0);
  ASSERT_EQ(job.tasks_size(), 1);
  const v1::TaskInfo& task = job.tasks(0);
  EXPECT_TRUE(task.out_of_memory());
  EXPECT_EQ(task.memory_limit_bytes(), limit);
  EXPECT_GE(task.memory_peak_bytes(), limit * 3 / 4) << task.message();
}

TEST(ResourceIsolationTest, OutOfMemoryIsNamedAndTheNeighbourRunsOn) {
  if (!std::filesystem::exists(kPython)) GTEST_SKIP() << "no " << kPython;
  ClusterOptions options;
  options.slots_per_worker = 2;
  Cluster cluster(options);
  const std::string model = WriteLeakyModel(cluster.state_dir());

  // The neighbour, held after 2 updates so that it is certainly running when the other dies.
  cluster.Hold("steady", 2);
  auto steady = cluster.Submit(SyntheticJobYaml("steady", 20, "resources: {memory: 1GiB}\n"));
  ASSERT_TRUE(steady.ok()) << steady.status();
  auto held = cluster.WaitFor(steady->id(), [](const v1::Job& j) {
    return j.state() == v1::RUNNING && j.progress().step() >= 2;
  });
  ASSERT_TRUE(held.ok()) << held.status();
  const std::string steady_task = held->tasks(0).task_id();
  std::optional<pid_t> steady_pid = cluster.TrainerPid(0, steady_task);
  ASSERT_TRUE(steady_pid.has_value());

  auto leaky = cluster.Submit(LeakyJobYaml(model, "256MiB"));
  ASSERT_TRUE(leaky.ok()) << leaky.status();
  auto failed = cluster.WaitForFinal(leaky->id());
  ASSERT_TRUE(failed.ok()) << failed.status();
  ExpectOutOfMemory(*failed, 256 * kMiB, "OOM killer in its cgroup");
  EXPECT_LE(failed->tasks(0).memory_peak_bytes(), 256 * kMiB);

  // `describe` names it.
  Cluster::CliResult described = cluster.Cli({"describe", leaky->id()});
  EXPECT_EQ(described.exit_code, 0) << described.output;
  EXPECT_TRUE(absl::StrContains(described.output, "OOM")) << described.output;
  EXPECT_TRUE(absl::StrContains(described.output, "/256.0 MiB")) << described.output;

  // The neighbour and the agent never noticed: the same trainer, still held at its step.
  EXPECT_TRUE(ProcessAlive(*steady_pid));
  EXPECT_TRUE(cluster.worker(0).running());
  auto still = cluster.Get(steady->id());
  ASSERT_TRUE(still.ok());
  EXPECT_EQ(still->state(), v1::RUNNING) << still->reason();
  EXPECT_EQ(still->generation(), 1);
  // The worker says how it holds its tasks.
  Cluster::CliResult workers = cluster.Cli({"workers"});
  EXPECT_TRUE(absl::StrContains(workers.output, "cgroup v")) << workers.output;
  EXPECT_TRUE(absl::StrContains(workers.output, "1.0 GiB/")) << workers.output;

  cluster.Release("steady");
  auto done = cluster.WaitForFinal(steady->id());
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::SUCCEEDED) << done->reason();
  EXPECT_FALSE(done->tasks(0).out_of_memory());
  EXPECT_EQ(done->tasks(0).memory_limit_bytes(), 1024 * kMiB);
  EXPECT_GT(done->tasks(0).memory_peak_bytes(), 0);
}

// Where the agent cannot make cgroups (forced here with --isolation=watch), it watches each
// task's resident memory and stops it at its limit, reported the same way.
TEST(ResourceIsolationTest, WithoutCgroupsTheAgentsWatchStopsIt) {
  if (!std::filesystem::exists(kPython)) GTEST_SKIP() << "no " << kPython;
  ClusterOptions options;
  options.worker_args = {"--isolation=watch"};
  Cluster cluster(options);
  const std::string model = WriteLeakyModel(cluster.state_dir());
  auto leaky = cluster.Submit(LeakyJobYaml(model, "320MiB"));
  ASSERT_TRUE(leaky.ok()) << leaky.status();
  auto failed = cluster.WaitForFinal(leaky->id());
  ASSERT_TRUE(failed.ok()) << failed.status();
  ExpectOutOfMemory(*failed, 320 * kMiB, "the agent's watch of its resident memory");
  EXPECT_GT(failed->tasks(0).memory_peak_bytes(), 320 * kMiB);
  Cluster::CliResult workers = cluster.Cli({"workers"});
  EXPECT_TRUE(absl::StrContains(workers.output, "watch")) << workers.output;
}

// A rank given a quarter of a CPU trains with a quarter: its CPU time over an interval of its
// training, against the wall time, with a model that keeps a whole core busy.
TEST(ResourceIsolationTest, ARankGetsItsShareOfACpu) {
  Cluster cluster;
  auto job = cluster.Submit(R"(name: busy
model:
  builtin: mlp
  args: {inputs: 256, hidden: [1024, 1024], classes: 4}
data:
  synthetic: {samples: 4096, features: 256, classes: 4}
batch_size: 256
optimizer: {name: sgd, lr: 0.01}
max_steps: 1000000
log_every_steps: 1
resources: {cpus: 0.25}
)");
  ASSERT_TRUE(job.ok()) << job.status();
  auto running = cluster.WaitFor(job->id(), [](const v1::Job& j) {
    return j.state() == v1::RUNNING && j.progress().step() >= 2;
  });
  ASSERT_TRUE(running.ok()) << running.status();
  std::optional<pid_t> pid = cluster.TrainerPid(0, running->tasks(0).task_id());
  ASSERT_TRUE(pid.has_value());
  const double cpu0 = CpuSeconds(*pid);
  const absl::Time t0 = absl::Now();
  absl::SleepFor(absl::Seconds(3));  // the interval measured, not a wait for an event
  const double cpu1 = CpuSeconds(*pid);
  const double wall = absl::ToDoubleSeconds(absl::Now() - t0);
  ASSERT_GE(cpu0, 0);
  EXPECT_LE((cpu1 - cpu0) / wall, 0.35) << cpu1 - cpu0 << " s of CPU in " << wall << " s";
  EXPECT_GT((cpu1 - cpu0) / wall, 0.05) << cpu1 - cpu0 << " s of CPU in " << wall << " s";
  auto cancelled = cluster.Cli({"cancel", job->id()});
  EXPECT_EQ(cancelled.exit_code, 0) << cancelled.output;
}

// A model far too large for its own resources.memory, or for any worker, is refused at
// submission with the numbers (by the coordinator's estimate: parameters, gradients, AdamW's two
// states); one that fits runs.
TEST(ResourceIsolationTest, TooLargeIsRefusedAtSubmissionWithTheNumbers) {
  ClusterOptions options;
  options.worker_args = {"--memory=1GiB"};
  Cluster cluster(options);
  // 16 -> 16384 -> 16384 -> 4: 268 million parameters, 1.0 GiB of them alone.
  const std::string big_model = R"(name: big
model:
  builtin: mlp
  args: {inputs: 16, hidden: [16384, 16384], classes: 4}
data:
  synthetic: {samples: 2048, features: 16, classes: 4}
batch_size: 32
optimizer: {name: adamw, lr: 0.01}
max_steps: 5
)";
  auto own_limit = cluster.Submit(big_model + "resources: {memory: 512MiB}\n");
  ASSERT_FALSE(own_limit.ok());
  EXPECT_EQ(own_limit.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(
      own_limit.status().message(),
      "resources.memory: 512.0 MiB is less than a rank needs by estimate: 4.1 GiB (parameters "
      "1.0 GiB, gradients 1.0 GiB, adamw state 2.0 GiB"))
      << own_limit.status();

  auto no_worker = cluster.Submit(big_model);
  ASSERT_FALSE(no_worker.ok());
  EXPECT_EQ(no_worker.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(
      absl::StrContains(no_worker.status().message(), "a rank needs 4.1 GiB (parameters 1.0 GiB"))
      << no_worker.status();
  EXPECT_TRUE(absl::StrContains(no_worker.status().message(),
                                "by estimate, more than any worker offers (the largest, "
                                "worker-0, 1.0 GiB)"))
      << no_worker.status();

  auto asks_too_much = cluster.Submit(SyntheticJobYaml("asks", 5, "resources: {memory: 2GiB}\n"));
  ASSERT_FALSE(asks_too_much.ok());
  EXPECT_TRUE(absl::StrContains(asks_too_much.status().message(),
                                "resources.memory: 2.0 GiB per rank is more than any worker "
                                "offers (the largest, worker-0, 1.0 GiB)"))
      << asks_too_much.status();

  auto small = cluster.Submit(SyntheticJobYaml("small", 5, "resources: {memory: 512MiB}\n"));
  ASSERT_TRUE(small.ok()) << small.status();
  auto done = cluster.WaitForFinal(small->id());
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::SUCCEEDED) << done->reason();
  EXPECT_GT(done->memory_estimate().rank().total_bytes(), 0);
  EXPECT_LT(done->memory_estimate().rank().total_bytes(), 512 * kMiB);
}

// 150,000 samples of 1024 float32 features into `data`: 614 MB in 38 shards of about 16 MiB.
void WriteShards(Cluster& cluster, const std::string& data) {
  Process writer({kPython, SourceDir() + "/examples/write_dataset.py", "--out-dir", data,
                  "--samples", "150000", "--features", "1024", "--classes", "4", "--files", "38",
                  "--seed", "3", "--trainyard", BinDir() + "/trainyard"},
                 cluster.state_dir() + "/write.log");
  std::optional<int> status = writer.Wait(absl::Seconds(300));
  ASSERT_TRUE(status.has_value() && WIFEXITED(*status) && WEXITSTATUS(*status) == 0)
      << writer.Log();
}

// An MLP over the shards WriteShards wrote into `data`, batches of 64, then `rest` of the spec.
std::string ShardsJob(const std::string& name, const std::string& data, const std::string& rest) {
  return absl::StrCat("name: ", name, R"(
model:
  builtin: mlp
  args: {inputs: 1024, hidden: [16], classes: 4}
data: {train: ")",
                      data, R"(/train-*.safetensors"}
batch_size: 64
optimizer: {name: sgd, lr: 0.01}
)",
                      rest);
}

// 600 MB of local shards under a 256 MiB limit: the default order would read at random across
// all of it, evicting shards before their rows are used; the trainer chooses a window that keeps
// the shards it holds within its data share, says so in the job's events, and trains within the
// limit. Under half of that the shards cannot fit even one batch's window: refused, naming the
// field.
TEST(ResourceIsolationTest, DataLargerThanTheLimitGetsAWindowThatFits) {
  if (!std::filesystem::exists(kPython)) GTEST_SKIP() << "no " << kPython;
  Cluster cluster;
  const std::string data = cluster.state_dir() + "/data";
  ASSERT_NO_FATAL_FAILURE(WriteShards(cluster, data));
  auto yaml = [&](const std::string& name, const std::string& memory) {
    return ShardsJob(name, data,
                     absl::StrCat("max_steps: 300\nresources: {memory: ", memory, "}\n"));
  };
  auto windowed = cluster.Submit(yaml("windowed", "256MiB"));
  ASSERT_TRUE(windowed.ok()) << windowed.status();
  auto done = cluster.WaitForFinal(windowed->id(), absl::Seconds(300));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::SUCCEEDED) << done->reason();
  EXPECT_FALSE(done->tasks(0).out_of_memory());
  EXPECT_LE(done->tasks(0).memory_peak_bytes(), 256 * kMiB);
  bool told = false;
  for (const v1::JobEvent& e : done->events()) {
    told |= absl::StrContains(e.reason(), "data.shuffle_window is ") &&
            absl::StrContains(e.reason(), "memory limit");
  }
  EXPECT_TRUE(told) << done->DebugString();
  Cluster::CliResult described = cluster.Cli({"describe", done->id()});
  EXPECT_TRUE(absl::StrContains(described.output, "data.shuffle_window is ")) << described.output;

  auto too_small = cluster.Submit(yaml("too-small", "128MiB"));
  ASSERT_TRUE(too_small.ok()) << too_small.status();
  auto failed = cluster.WaitForFinal(too_small->id(), absl::Seconds(300));
  ASSERT_TRUE(failed.ok()) << failed.status();
  EXPECT_EQ(failed->state(), v1::FAILED);
  EXPECT_TRUE(absl::StrContains(failed->reason(), "data.shuffle_window: ")) << failed->reason();
  EXPECT_TRUE(absl::StrContains(failed->reason(), "not even windows of one batch"))
      << failed->reason();
}

// A job without resources.memory on workers that offer tasks less memory than its shards: the
// coordinator fixes the memory its data order is fitted to at the first placement (the smallest
// of its workers'), and every attempt picks the same window from it wherever it runs: here a
// restart lands on a worker that offers more, and still reads the data in the same order.
TEST(ResourceIsolationTest, WithoutResourcesMemoryTheWindowIsFixedAtTheFirstPlacement) {
  if (!std::filesystem::exists(kPython)) GTEST_SKIP() << "no " << kPython;
  ClusterOptions options = QuickRestarts(2);
  options.worker_args.push_back("--memory=1{i}00MiB");  // 1000 MiB and 1100 MiB
  Cluster cluster(options);
  const std::string data = cluster.state_dir() + "/data";
  ASSERT_NO_FATAL_FAILURE(WriteShards(cluster, data));
  cluster.Hold("fixed", 20);
  auto submitted =
      cluster.Submit(ShardsJob("fixed", data, "max_steps: 100\ncheckpoint: {every_steps: 10}\n"));
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  // The windows each attempt's rank chose, from its events.
  auto windows = [](const v1::Job& job) {
    std::vector<std::string> out;
    for (const v1::JobEvent& e : job.events()) {
      const size_t at = e.reason().find("data.shuffle_window is ");
      if (at != std::string::npos)
        out.push_back(e.reason().substr(at, e.reason().find(' ', at + 23) - at));
    }
    return out;
  };
  auto held = cluster.WaitFor(submitted->id(), [&](const v1::Job& job) {
    return job.state() == v1::RUNNING && job.progress().step() == 20 &&
           job.committed_step() >= 10 && windows(job).size() == 1;
  });
  ASSERT_TRUE(held.ok()) << held.status();
  const int first = WorkerOfRank(*held, 0);
  const int64_t expected = (first == 0 ? 1000 : 1100) * kMiB;
  EXPECT_EQ(held->data_memory_bytes(), expected);
  EXPECT_NE(windows(*held)[0], "data.shuffle_window is 0");
  // A notice to its worker: the next attempt runs on the other one, which offers more.
  cluster.worker(first).Signal(SIGTERM);
  auto again = cluster.WaitFor(submitted->id(), [&](const v1::Job& job) {
    return job.generation() == 2 && job.state() == v1::RUNNING && windows(job).size() == 2;
  });
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(WorkerOfRank(*again, 0), 1 - first);
  EXPECT_EQ(again->data_memory_bytes(), expected);
  EXPECT_EQ(windows(*again)[1], windows(*again)[0]);
  cluster.Release("fixed");
  auto done = cluster.WaitForFinal(submitted->id(), absl::Seconds(300));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::SUCCEEDED) << done->reason();
  Cluster::CliResult described = cluster.Cli({"describe", done->id()});
  EXPECT_TRUE(absl::StrContains(described.output, "Data memory:")) << described.output;
}

}  // namespace
}  // namespace trainyard::testing
