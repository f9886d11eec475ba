#include "worker/agent/metrics.h"

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/text_serializer.h"
#include "tests/common/prometheus_text.h"

namespace trainyard {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class FakeGpus final : public GpuMonitor {
 public:
  absl::StatusOr<int> Count() override { return 2; }
  std::vector<GpuSample> Sample() override {
    GpuSample a, b;
    a.index = 0;
    a.utilization_ratio = 0.75;
    a.memory_used_bytes = 1 << 30;
    a.memory_total_bytes = 4LL << 30;
    b.index = 1;
    b.memory_total_bytes = 4LL << 30;
    return {a, b};
  }
};

v1::TaskStatus Task(const std::string& job, int rank, v1::TaskState state, int64_t pid) {
  v1::TaskStatus t;
  t.set_task_id(absl::StrCat(job, ".g1.r", rank));
  t.set_job_id(job);
  t.set_rank(rank);
  t.set_state(state);
  t.set_pid(pid);
  return t;
}

void WriteFile(const std::string& path, const std::string& text) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path) << text;
}

TEST(ProcParsingTest, Stat) {
  auto cpu = ParseProcStat(
      "cpu  100 5 50 1000 10 1 2 3 0 0\ncpu0 50 2 25 500 5 0 1 1 0 0\n"
      "cpu1 50 3 25 500 5 1 1 2 0 0\nintr 1 2 3\n",
      100);
  ASSERT_TRUE(cpu.has_value());
  EXPECT_EQ(cpu->cpus, 2);
  EXPECT_DOUBLE_EQ(cpu->seconds_by_mode["user"], 1.0);
  EXPECT_DOUBLE_EQ(cpu->seconds_by_mode["idle"], 10.0);
  EXPECT_DOUBLE_EQ(cpu->seconds_by_mode["steal"], 0.03);
  EXPECT_FALSE(ParseProcStat("intr 1 2\n", 100).has_value());
}

TEST(ProcParsingTest, Meminfo) {
  auto memory = ParseMeminfo("MemTotal:  2048 kB\nMemFree: 100 kB\nMemAvailable:  1024 kB\n");
  ASSERT_TRUE(memory.has_value());
  EXPECT_EQ(memory->total_bytes, 2048 * 1024);
  EXPECT_EQ(memory->available_bytes, 1024 * 1024);
  EXPECT_FALSE(ParseMeminfo("MemTotal: 1 kB\n").has_value());
}

TEST(ProcParsingTest, PidStatWithAwkwardCommandName) {
  // utime 250 and stime 50 ticks are fields 14 and 15; the name holds ") (" and spaces.
  const std::string stat =
      "4242 (train er) (x) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0 100 "
      "1000000 500 18446744073709551615\n";
  auto seconds = ParsePidCpuSeconds(stat, 100);
  ASSERT_TRUE(seconds.has_value());
  EXPECT_DOUBLE_EQ(*seconds, 3.0);
  EXPECT_FALSE(ParsePidCpuSeconds("garbage", 100).has_value());
}

TEST(ProcParsingTest, VmRss) {
  EXPECT_EQ(ParseVmRssBytes("Name:\tx\nVmRSS:\t  1234 kB\n"), 1234 * 1024);
  EXPECT_FALSE(ParseVmRssBytes("Name:\tzombie\nState:\tZ\n").has_value());
}

TEST(AgentMetricsTest, FromAFakeProcTree) {
  const std::string root = absl::StrCat(::testing::TempDir(), "/proc-", getpid());
  WriteFile(root + "/stat", "cpu  200 0 100 700 0 0 0 0 0 0\ncpu0 200 0 100 700 0 0 0 0 0 0\n");
  WriteFile(root + "/meminfo", "MemTotal: 1000 kB\nMemAvailable: 400 kB\n");
  WriteFile(root + "/77/stat", "77 (trainyard-trai) R 1 77 77 0 -1 0 0 0 0 0 120 30 0 0 20 0\n");
  WriteFile(root + "/77/status", "Name:\ttrainyard-trai\nVmRSS:\t2048 kB\n");

  AgentMetricsSource source;
  source.worker_name = "w1";
  source.gpus_offered = 2;
  source.tasks = [] {
    return std::vector<v1::TaskStatus>{Task("job-1", 0, v1::TASK_RUNNING, 77),
                                       Task("job-0", 0, v1::TASK_EXITED, 0)};
  };
  source.gpus_allocated = [] { return 1; };
  FakeGpus gpus;
  AgentMetrics metrics(source, &gpus, root);
  const std::string text = Scrape(metrics);
  const long ticks = sysconf(_SC_CLK_TCK);  // NOLINT(runtime/int)
  EXPECT_EQ(Value(text, R"(trainyard_worker_info{worker="w1"})"), 1);
  EXPECT_EQ(Value(text, R"(trainyard_worker_trainers{state="running"})"), 1);
  EXPECT_EQ(Value(text, R"(trainyard_worker_trainers{state="exited"})"), 1);
  EXPECT_EQ(Value(text, R"(trainyard_worker_trainers{state="starting"})"), 0);
  EXPECT_DOUBLE_EQ(
      Value(text, R"(trainyard_worker_trainer_cpu_seconds_total{job="job-1",rank="0"})"),
      150.0 / ticks);
  EXPECT_EQ(Value(text, R"(trainyard_worker_trainer_resident_memory_bytes{job="job-1",rank="0"})"),
            2048 * 1024);
  EXPECT_THAT(text, Not(HasSubstr("job-0")));
  EXPECT_DOUBLE_EQ(Value(text, R"(trainyard_worker_cpu_seconds_total{mode="idle"})"),
                   700.0 / ticks);
  EXPECT_EQ(Value(text, "trainyard_worker_cpus"), 1);
  EXPECT_EQ(Value(text, "trainyard_worker_memory_total_bytes"), 1000 * 1024);
  EXPECT_EQ(Value(text, "trainyard_worker_memory_available_bytes"), 400 * 1024);
  EXPECT_EQ(Value(text, "trainyard_worker_gpus"), 2);
  EXPECT_EQ(Value(text, "trainyard_worker_gpus_allocated"), 1);
  EXPECT_EQ(Value(text, "trainyard_worker_gpu_monitoring"), 1);
  EXPECT_EQ(Value(text, R"(trainyard_worker_gpu_utilization_ratio{gpu="0"})"), 0.75);
  EXPECT_EQ(Value(text, R"(trainyard_worker_gpu_memory_used_bytes{gpu="0"})"), 1 << 30);
  EXPECT_EQ(Value(text, R"(trainyard_worker_gpu_memory_total_bytes{gpu="1"})"), 4LL << 30);
  std::filesystem::remove_all(root);
}

// A running parameter-server shard's counters come from the file it writes to its folder; a
// shard that has not written one yet, or a rank, exports none.
TEST(AgentMetricsTest, ShardCountersFromTheShardsFolder) {
  const std::string root = absl::StrCat(::testing::TempDir(), "/tasks-", getpid());
  WriteFile(root + "/ps-1.g1.s1/shard-metrics",
            "pushes 40\nstale_pushes 3\nstaleness_sum 57\npulls 41\nbytes_received 4096\n"
            "bytes_sent 8192\npull_wait_seconds 1.25\nversion 20\nnot a line\n");
  v1::TaskStatus shard = Task("ps-1", 0, v1::TASK_RUNNING, 0);
  shard.set_task_id("ps-1.g1.s1");
  shard.set_role(v1::TASK_ROLE_SHARD);
  shard.set_shard(1);
  v1::TaskStatus silent = shard;
  silent.set_task_id("ps-1.g1.s0");
  silent.set_shard(0);
  AgentMetricsSource source;
  source.worker_name = "w1";
  source.tasks = [&] {
    return std::vector<v1::TaskStatus>{shard, silent, Task("ps-1", 0, v1::TASK_RUNNING, 0)};
  };
  source.gpus_allocated = [] { return 0; };
  source.task_dir = [&root](const std::string& id) { return root + "/" + id; };
  AgentMetrics metrics(source, nullptr, root);
  const std::string text = Scrape(metrics);
  const std::string labels = R"({job="ps-1",shard="1"})";
  EXPECT_EQ(Value(text, "trainyard_ps_pushes_total" + labels), 40);
  EXPECT_EQ(Value(text, "trainyard_ps_stale_pushes_total" + labels), 3);
  EXPECT_EQ(Value(text, "trainyard_ps_push_staleness_versions_total" + labels), 57);
  EXPECT_EQ(Value(text, "trainyard_ps_pulls_total" + labels), 41);
  EXPECT_EQ(Value(text, "trainyard_ps_received_bytes_total" + labels), 4096);
  EXPECT_EQ(Value(text, "trainyard_ps_sent_bytes_total" + labels), 8192);
  EXPECT_EQ(Value(text, "trainyard_ps_pull_wait_seconds_total" + labels), 1.25);
  EXPECT_EQ(Value(text, "trainyard_ps_version" + labels), 20);
  EXPECT_THAT(text, Not(HasSubstr(R"(shard="0")")));
  std::filesystem::remove_all(root);

  // Without shards the families are absent, not empty.
  source.tasks = [] { return std::vector<v1::TaskStatus>{}; };
  EXPECT_THAT(Scrape(AgentMetrics(source, nullptr, root)), Not(HasSubstr("trainyard_ps_")));
}

TEST(AgentMetricsTest, RealProcOfThisProcess) {
  // Burn a little CPU so that this process has some to show.
  volatile double x = 0;
  for (int i = 0; i < 20'000'000; ++i) x = x + i * 1e-9;
  AgentMetricsSource source;
  source.worker_name = "self";
  source.tasks = [] {
    return std::vector<v1::TaskStatus>{Task("me", 0, v1::TASK_RUNNING, getpid())};
  };
  AgentMetrics metrics(source, nullptr);
  const std::string text = Scrape(metrics);
  EXPECT_GT(Value(text, R"(trainyard_worker_trainer_cpu_seconds_total{job="me",rank="0"})"), 0);
  EXPECT_GT(Value(text, R"(trainyard_worker_trainer_resident_memory_bytes{job="me",rank="0"})"),
            1 << 20);
  EXPECT_GT(Value(text, R"(trainyard_worker_cpu_seconds_total{mode="user"})"), 0);
  EXPECT_GE(Value(text, "trainyard_worker_cpus"), 1);
  EXPECT_GT(Value(text, "trainyard_worker_memory_total_bytes"), 0);
  EXPECT_EQ(Value(text, "trainyard_worker_gpu_monitoring"), 0);
  EXPECT_THAT(text, Not(HasSubstr("trainyard_worker_gpu_utilization_ratio")));
}

TEST(NvmlTest, MissingLibraryIsNotFound) {
  auto nvml = LoadNvml("libtrainyard-no-such-nvml.so.1");
  ASSERT_FALSE(nvml.ok());
  EXPECT_EQ(nvml.status().code(), absl::StatusCode::kNotFound);
}

TEST(NvmlTest, LibraryWithoutNvmlIsNotFound) {
  // libc loads but has none of NVML's functions.
  auto nvml = LoadNvml("libc.so.6");
  ASSERT_FALSE(nvml.ok());
  EXPECT_EQ(nvml.status().code(), absl::StatusCode::kNotFound);
}

TEST(NvmlTest, DefaultLibraryLoadsOnlyWithADriver) {
  auto nvml = LoadNvml();
  if (!std::filesystem::exists("/dev/nvidiactl")) {
    // No NVIDIA driver: the agent runs without GPU metrics.
    ASSERT_FALSE(nvml.ok());
    EXPECT_TRUE(absl::IsNotFound(nvml.status()) || absl::IsUnavailable(nvml.status()))
        << nvml.status();
    return;
  }
  ASSERT_TRUE(nvml.ok()) << nvml.status();
  const std::vector<GpuSample> samples = (*nvml)->Sample();
  ASSERT_FALSE(samples.empty());
  for (const GpuSample& s : samples) {
    EXPECT_GE(s.utilization_ratio, 0);
    EXPECT_LE(s.utilization_ratio, 1);
    EXPECT_GT(s.memory_total_bytes, 0);
    EXPECT_LE(s.memory_used_bytes, s.memory_total_bytes);
  }
}

}  // namespace
}  // namespace trainyard
