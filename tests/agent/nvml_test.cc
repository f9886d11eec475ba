// NVML through a scripted stand-in library, loaded with dlopen as the agent loads the real one:
// no library, a driver that fails to start, no GPUs, a GPU that stops answering, a reading a
// board lacks; GPU discovery; and the DCGM-named metrics with the task using each GPU.

#include "worker/agent/nvml.h"

#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/prometheus_text.h"
#include "worker/agent/metrics.h"

namespace trainyard {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class NvmlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v :
         {"FAKE_NVML_INIT_ERROR", "FAKE_NVML_GPUS", "FAKE_NVML_LOST_GPU", "FAKE_NVML_NO_POWER"}) {
      unsetenv(v);
    }
  }
  static std::unique_ptr<GpuMonitor> Load() {
    absl::StatusOr<std::unique_ptr<GpuMonitor>> nvml = LoadNvml(FAKE_NVML_PATH);
    EXPECT_TRUE(nvml.ok()) << nvml.status();
    return nvml.ok() ? *std::move(nvml) : nullptr;
  }
};

TEST_F(NvmlTest, NoLibraryIsNotFound) {
  absl::StatusOr<std::unique_ptr<GpuMonitor>> nvml = LoadNvml("/nonexistent/libnvidia-ml.so.1");
  ASSERT_FALSE(nvml.ok());
  EXPECT_EQ(nvml.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(nvml.status().message(), HasSubstr("/nonexistent/libnvidia-ml.so.1"));
}

TEST_F(NvmlTest, ADriverThatFailsToStartIsUnavailableAndSaysWhy) {
  setenv("FAKE_NVML_INIT_ERROR", "9", 1);
  absl::StatusOr<std::unique_ptr<GpuMonitor>> nvml = LoadNvml(FAKE_NVML_PATH);
  ASSERT_FALSE(nvml.ok());
  EXPECT_EQ(nvml.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(nvml.status().message(), HasSubstr("Driver Not Loaded (9)"));
}

TEST_F(NvmlTest, NoGpusCountsZeroAndSamplesNothing) {
  std::unique_ptr<GpuMonitor> nvml = Load();
  ASSERT_NE(nvml, nullptr);
  absl::StatusOr<int> count = nvml->Count();
  ASSERT_TRUE(count.ok()) << count.status();
  EXPECT_EQ(*count, 0);
  EXPECT_TRUE(nvml->Sample().empty());
}

TEST_F(NvmlTest, EachGpuIsReadAndOneThatStopsAnsweringIsLeftOut) {
  setenv("FAKE_NVML_GPUS", "3", 1);
  setenv("FAKE_NVML_LOST_GPU", "1", 1);
  std::unique_ptr<GpuMonitor> nvml = Load();
  ASSERT_NE(nvml, nullptr);
  EXPECT_EQ(*nvml->Count(), 3);
  const std::vector<GpuSample> samples = nvml->Sample();
  ASSERT_EQ(samples.size(), 2u);
  EXPECT_EQ(samples[0].index, 0);
  EXPECT_EQ(samples[1].index, 2);
  const GpuSample& g = samples[1];
  EXPECT_EQ(g.uuid, "GPU-fake-2");
  EXPECT_EQ(g.name, "Fake GPU 80GB");
  EXPECT_DOUBLE_EQ(g.utilization_ratio, 0.3);
  EXPECT_EQ(g.memory_total_bytes, 3LL << 30);
  EXPECT_EQ(g.memory_used_bytes, 2LL << 28);
  EXPECT_EQ(g.temperature_celsius, 42);
  EXPECT_EQ(g.power_watts, 102);
  // The lost GPU is left out of every later sample too, while the others go on.
  EXPECT_EQ(nvml->Sample().size(), 2u);
}

TEST_F(NvmlTest, AReadingTheBoardLacksIsAbsentNotZero) {
  setenv("FAKE_NVML_GPUS", "1", 1);
  setenv("FAKE_NVML_NO_POWER", "1", 1);
  std::unique_ptr<GpuMonitor> nvml = Load();
  ASSERT_NE(nvml, nullptr);
  const std::vector<GpuSample> samples = nvml->Sample();
  ASSERT_EQ(samples.size(), 1u);
  EXPECT_FALSE(samples[0].power_watts.has_value());
  EXPECT_EQ(samples[0].temperature_celsius, 40);
}

TEST_F(NvmlTest, GpusAreFoundThroughNvmlElseThroughTheDeviceFiles) {
  const std::string dev = absl::StrCat(::testing::TempDir(), "/dev-", getpid());
  std::filesystem::create_directories(dev);
  for (const char* f : {"nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "nvme0"}) {
    std::ofstream(dev + "/" + f).put('\n');
  }
  std::string how;
  EXPECT_EQ(DiscoverGpus(nullptr, dev, &how), 2);
  EXPECT_THAT(how, HasSubstr("no NVML"));

  setenv("FAKE_NVML_GPUS", "4", 1);
  std::unique_ptr<GpuMonitor> nvml = Load();
  ASSERT_NE(nvml, nullptr);
  EXPECT_EQ(DiscoverGpus(nvml.get(), dev, &how), 4);
  EXPECT_EQ(how, "NVML");
  std::filesystem::remove_all(dev);
}

TEST_F(NvmlTest, MetricsCarryDcgmNamesAndTheTaskUsingEachGpu) {
  setenv("FAKE_NVML_GPUS", "2", 1);
  std::unique_ptr<GpuMonitor> nvml = Load();
  ASSERT_NE(nvml, nullptr);
  AgentMetricsSource source;
  source.worker_name = "w1";
  source.hostname = "host-a";
  source.gpus_offered = 2;
  source.gpus_allocated = [] { return 1; };
  source.gpu_tasks = [] {
    v1::TaskStatus t;
    t.set_job_id("job-7");
    t.set_task_id("job-7.g1.r0");
    return std::map<int, v1::TaskStatus>{{1, t}};
  };
  AgentMetrics metrics(source, nvml.get());
  const std::string text = Scrape(metrics);
  const std::string idle =
      R"({gpu="0",UUID="GPU-fake-0",device="nvidia0",modelName="Fake GPU 80GB",Hostname="host-a"})";
  const std::string busy =
      R"({gpu="1",UUID="GPU-fake-1",device="nvidia1",modelName="Fake GPU 80GB",Hostname="host-a",job="job-7",task="job-7.g1.r0"})";
  EXPECT_EQ(Value(text, "DCGM_FI_DEV_GPU_UTIL" + idle), 10);
  EXPECT_EQ(Value(text, "DCGM_FI_DEV_GPU_UTIL" + busy), 20);
  EXPECT_EQ(Value(text, "DCGM_FI_DEV_FB_USED" + busy), 256);
  EXPECT_EQ(Value(text, "DCGM_FI_DEV_FB_FREE" + busy), 2048 - 256);
  EXPECT_EQ(Value(text, "DCGM_FI_DEV_GPU_TEMP" + busy), 41);
  EXPECT_EQ(Value(text, "DCGM_FI_DEV_POWER_USAGE" + busy), 101);
  EXPECT_EQ(Value(text, R"(trainyard_worker_gpu_utilization_ratio{gpu="1"})"), 0.2);
  EXPECT_EQ(Value(text, R"(trainyard_worker_gpu_memory_total_bytes{gpu="1"})"), 2LL << 30);
  EXPECT_EQ(Value(text, "trainyard_worker_gpu_monitoring"), 1);
  EXPECT_THAT(
      text,
      Not(HasSubstr(
          R"(gpu="0",UUID="GPU-fake-0",device="nvidia0",modelName="Fake GPU 80GB",Hostname="host-a",job=)")));
}

}  // namespace
}  // namespace trainyard
