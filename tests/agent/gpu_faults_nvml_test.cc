// GPU faults through the scripted NVML, loaded with dlopen as the agent loads the real one: each
// kind the pre-flight check finds (and a lower link generation, which it must not), readings a
// board or an old driver lacks, XID events on the event set, the watcher's verdicts on them, and
// ECC errors or a lost GPU while in service.

#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/fake_clock.h"
#include "worker/agent/gpu_guard.h"
#include "worker/agent/gpu_health.h"
#include "worker/agent/nvml.h"

namespace trainyard {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;

class GpuFaultsNvmlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : {"FAKE_NVML_FILE", "FAKE_NVML_INIT_ERROR", "FAKE_NVML_GPUS",
                          "FAKE_NVML_LOST_GPU", "FAKE_NVML_NO_POWER", "FAKE_NVML_ECC",
                          "FAKE_NVML_NO_ECC", "FAKE_NVML_RETIRED_PENDING", "FAKE_NVML_REMAP_FAILED",
                          "FAKE_NVML_REMAP_PENDING", "FAKE_NVML_LINK_WIDTH", "FAKE_NVML_LINK_GEN",
                          "FAKE_NVML_CLOCKS", "FAKE_NVML_NO_XID_EVENTS", "FAKE_NVML_XID_FILE"}) {
      unsetenv(v);
    }
    dir_ = absl::StrCat(::testing::TempDir(), "/gpu-faults-", getpid());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    unsetenv("FAKE_NVML_FILE");
    std::filesystem::remove_all(dir_);
  }

  static std::unique_ptr<GpuMonitor> Load(const char* path = FAKE_NVML_PATH) {
    absl::StatusOr<std::unique_ptr<GpuMonitor>> nvml = LoadNvml(path);
    EXPECT_TRUE(nvml.ok()) << nvml.status();
    return nvml.ok() ? *std::move(nvml) : nullptr;
  }
  // Replaces a file whole, so that the fake never reads half of it.
  void Write(const std::string& path, const std::string& text) {
    const std::string tmp = path + ".tmp";
    std::ofstream(tmp) << text;
    std::filesystem::rename(tmp, path);
  }

  // A guard over `nvml` whose faults are recorded in faults_.
  std::unique_ptr<GpuGuard> Guard(GpuMonitor* nvml, int gpus, GpuHealth& health) {
    GpuGuardOptions options;
    options.gpus = gpus;
    options.nvml = nvml;
    options.xid_wait = absl::Milliseconds(20);
    options.on_fault = [this](int gpu, const std::string& reason) {
      absl::MutexLock lock(&mu_);
      faults_.emplace_back(gpu, reason);
    };
    return std::make_unique<GpuGuard>(options, health, clock_);
  }
  // Waits (real time, up to 30 s) until `n` faults were reported.
  bool AwaitFaults(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return faults_.size() >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(30));
  }
  std::vector<std::pair<int, std::string>> faults() {
    absl::MutexLock lock(&mu_);
    return faults_;
  }

  std::string dir_;
  FakeClock clock_;
  absl::Mutex mu_;
  std::vector<std::pair<int, std::string>> faults_ ABSL_GUARDED_BY(mu_);
};

TEST_F(GpuFaultsNvmlTest, ThePreflightFindsEveryFaultKindAndNotALowerLinkGeneration) {
  setenv("FAKE_NVML_GPUS", "13", 1);
  setenv("FAKE_NVML_ECC", "0=2", 1);
  setenv("FAKE_NVML_RETIRED_PENDING", "1", 1);
  setenv("FAKE_NVML_REMAP_FAILED", "2", 1);
  setenv("FAKE_NVML_REMAP_PENDING", "3", 1);
  setenv("FAKE_NVML_LINK_WIDTH", "4=8", 1);
  setenv("FAKE_NVML_LINK_GEN", "5=1", 1);
  // HW slowdown, HW thermal slowdown, HW power brake; then SW power cap with an idle GPU.
  setenv("FAKE_NVML_CLOCKS", "6=0x8,7=0x40,8=0x80,9=0x5", 1);
  setenv("FAKE_NVML_LOST_GPU", "10", 1);
  setenv("FAKE_NVML_NO_ECC", "11", 1);
  std::unique_ptr<GpuMonitor> nvml = Load();
  ASSERT_NE(nvml, nullptr);
  GpuHealth health(13, clock_);
  Guard(nvml.get(), 13, health)->Preflight();

  std::map<int, std::string> out;
  for (const v1::GpuFault& f : health.Faults()) {
    out[f.index()] = f.reason();
    EXPECT_EQ(f.since_unix_ms(), absl::ToUnixMillis(clock_.Now()));
  }
  EXPECT_THAT(out[0], HasSubstr("2 uncorrectable ECC errors since the driver loaded"));
  EXPECT_THAT(out[1], HasSubstr("memory pages are pending retirement"));
  EXPECT_THAT(out[2], HasSubstr("a memory row remapping failed"));
  EXPECT_THAT(out[3], HasSubstr("a memory row remapping is pending"));
  EXPECT_EQ(out[4], "PCIe link at x8 of x16");
  EXPECT_EQ(out[6], "clocks held down by the hardware (HW slowdown)");
  EXPECT_EQ(out[7], "clocks held down by the hardware (HW thermal slowdown)");
  EXPECT_EQ(out[8], "clocks held down by the hardware (HW power brake)");
  EXPECT_EQ(out[10], "NVML cannot reach it: GPU is lost (15)");
  // A link at a lower generation (an idle GPU's power saving), software clock limits and a board
  // without ECC are no faults; nor is a GPU with nothing wrong.
  for (int gpu : {5, 9, 11, 12}) {
    EXPECT_TRUE(health.InService(gpu)) << "GPU " << gpu << ": " << health.Reason(gpu);
  }
  EXPECT_EQ(out.size(), 9u);
  EXPECT_EQ(faults().size(), 9u);  // each said once
}

TEST_F(GpuFaultsNvmlTest, ReadingsAreNvmlsAndOnesABoardLacksAreAbsent) {
  setenv("FAKE_NVML_GPUS", "2", 1);
  setenv("FAKE_NVML_LINK_GEN", "1=2", 1);
  setenv("FAKE_NVML_NO_ECC", "1", 1);
  std::unique_ptr<GpuMonitor> nvml = Load();
  ASSERT_NE(nvml, nullptr);
  absl::StatusOr<GpuHealthReading> clean = nvml->ReadHealth(0);
  ASSERT_TRUE(clean.ok()) << clean.status();
  EXPECT_EQ(clean->uncorrectable_ecc_errors, 0u);
  EXPECT_EQ(clean->retired_pages_pending, false);
  EXPECT_EQ(clean->row_remap_failed, false);
  EXPECT_EQ(clean->row_remap_pending, false);
  EXPECT_EQ(clean->pcie_link_width, 16);
  EXPECT_EQ(clean->pcie_max_link_width, 16);
  EXPECT_EQ(clean->pcie_link_generation, 5);
  EXPECT_EQ(clean->pcie_max_link_generation, 5);
  EXPECT_EQ(clean->clocks_event_reasons, 0u);
  EXPECT_THAT(clean->unreadable, IsEmpty());
  EXPECT_TRUE(EvaluateGpuHealth(*clean).ok());
  absl::StatusOr<GpuHealthReading> other = nvml->ReadHealth(1);
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_FALSE(other->uncorrectable_ecc_errors.has_value());
  const GpuVerdict verdict = EvaluateGpuHealth(*other);
  EXPECT_TRUE(verdict.ok()) << verdict.Reason();
  EXPECT_THAT(verdict.notes, ::testing::Contains(HasSubstr("PCIe gen 2 of 5")));
  EXPECT_EQ(nvml->ReadHealth(2).status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(GpuFaultsNvmlTest, AnOldDriverWithoutTheHealthOrEventCallsStillLoadsAndFaultsNothing) {
  setenv("FAKE_NVML_GPUS", "1", 1);
  std::unique_ptr<GpuMonitor> nvml = Load(FAKE_NVML_OLD_PATH);
  ASSERT_NE(nvml, nullptr);
  EXPECT_EQ(nvml->Sample().size(), 1u);
  absl::StatusOr<GpuHealthReading> reading = nvml->ReadHealth(0);
  ASSERT_TRUE(reading.ok()) << reading.status();
  EXPECT_FALSE(reading->uncorrectable_ecc_errors.has_value());
  EXPECT_FALSE(reading->row_remap_pending.has_value());
  EXPECT_FALSE(reading->pcie_link_width.has_value());
  EXPECT_FALSE(reading->clocks_event_reasons.has_value());
  EXPECT_TRUE(EvaluateGpuHealth(*reading).ok());
  EXPECT_EQ(nvml->WatchXids().status().code(), absl::StatusCode::kUnimplemented);
  GpuHealth health(1, clock_);
  std::unique_ptr<GpuGuard> guard = Guard(nvml.get(), 1, health);
  guard->Preflight();
  guard->Start();  // no XID watch: the ECC poll alone
  guard->Stop();
  EXPECT_TRUE(health.InService(0));
}

TEST_F(GpuFaultsNvmlTest, XidEventsArriveOnTheEventSetForTheirGpuOnceEach) {
  setenv("FAKE_NVML_GPUS", "3", 1);
  setenv("FAKE_NVML_NO_XID_EVENTS", "2", 1);
  const std::string xids = dir_ + "/xids";
  Write(xids, "1 79\n2 48\n0 13\n");
  setenv("FAKE_NVML_XID_FILE", xids.c_str(), 1);
  std::unique_ptr<GpuMonitor> nvml = Load();
  ASSERT_NE(nvml, nullptr);
  absl::StatusOr<std::unique_ptr<XidWatch>> watch = nvml->WatchXids();
  ASSERT_TRUE(watch.ok()) << watch.status();
  std::vector<std::pair<int, uint64_t>> seen;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<std::optional<XidEvent>> event = (*watch)->Wait(absl::Milliseconds(10));
    ASSERT_TRUE(event.ok()) << event.status();
    if (event->has_value()) seen.emplace_back((*event)->index, (*event)->xid);
  }
  // GPU 2 registered for no events: its XID never comes.
  EXPECT_THAT(seen, ::testing::ElementsAre(Pair(1, 79u), Pair(0, 13u)));
}

TEST_F(GpuFaultsNvmlTest, TheWatcherTakesAGpuOutOnAHardwareXidAndOnlyCountsAnApplicationOne) {
  setenv("FAKE_NVML_GPUS", "2", 1);
  const std::string xids = dir_ + "/xids";
  Write(xids, "");
  setenv("FAKE_NVML_XID_FILE", xids.c_str(), 1);
  std::unique_ptr<GpuMonitor> nvml = Load();
  ASSERT_NE(nvml, nullptr);
  GpuHealth health(2, clock_);
  std::unique_ptr<GpuGuard> guard = Guard(nvml.get(), 2, health);
  guard->Preflight();
  guard->Start();
  // An illegal address of a program on GPU 0, then GPU 1 falls off the bus.
  Write(xids, "0 31\n1 79\n");
  ASSERT_TRUE(AwaitFaults(1));
  guard->Stop();
  EXPECT_THAT(faults(), ::testing::ElementsAre(Pair(1, "XID 79 (the GPU fell off the bus)")));
  EXPECT_TRUE(health.InService(0));
  EXPECT_FALSE(health.InService(1));
  EXPECT_THAT(health.XidCounts(),
              UnorderedElementsAre(Pair(Pair(0, 31u), 1), Pair(Pair(1, 79u), 1)));
}

TEST_F(GpuFaultsNvmlTest, NewEccErrorsOrALostGpuWhileInServiceTakeItOut) {
  const std::string settings = dir_ + "/nvml";
  Write(settings, "FAKE_NVML_GPUS=3\n");
  setenv("FAKE_NVML_FILE", settings.c_str(), 1);
  std::unique_ptr<GpuMonitor> nvml = Load();
  ASSERT_NE(nvml, nullptr);
  GpuHealth health(3, clock_);
  std::unique_ptr<GpuGuard> guard = Guard(nvml.get(), 3, health);
  guard->Preflight();
  ASSERT_THAT(health.Faults(), IsEmpty());
  guard->Start();
  // Polls come every poll interval of the clock: one passes with nothing new.
  std::optional<absl::Time> poll = clock_.AwaitWaiter();
  ASSERT_TRUE(poll.has_value());
  EXPECT_EQ(*poll - clock_.Now(), absl::Seconds(5));
  clock_.AdvanceTo(*poll);
  Write(settings, "FAKE_NVML_GPUS=3\nFAKE_NVML_ECC=1=3\nFAKE_NVML_LOST_GPU=2\n");
  while (faults().size() < 2) {
    std::optional<absl::Time> next = clock_.AwaitWaiter();
    ASSERT_TRUE(next.has_value());
    clock_.AdvanceTo(*next);
  }
  guard->Stop();
  EXPECT_THAT(faults(), UnorderedElementsAre(
                            Pair(1, "3 new uncorrectable ECC errors (3 since the driver loaded)"),
                            Pair(2, "NVML cannot reach it: GPU is lost (15)")));
  EXPECT_TRUE(health.InService(0));
}

}  // namespace
}  // namespace trainyard
