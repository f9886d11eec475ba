// GPU health as logic: the verdict on NVML's readings, the XIDs that take a GPU out, the state of
// each GPU and the rate of return checks; the reconciler's GPUs around a fault; the health series
// of the metrics; and the trainer's compute check as the agent runs and reads it.

#include "worker/agent/gpu_health.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/agent/fake_process_launcher.h"
#include "tests/common/fake_clock.h"
#include "tests/common/prometheus_text.h"
#include "worker/agent/metrics.h"
#include "worker/agent/reconciler.h"
#include "worker/agent/trainer_runtime.h"

namespace trainyard {
namespace {

using ::testing::ElementsAre;
using testing::FakeProcessLauncher;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

GpuHealthReading Clean() {
  GpuHealthReading r;
  r.uncorrectable_ecc_errors = 0;
  r.retired_pages_pending = false;
  r.row_remap_failed = false;
  r.row_remap_pending = false;
  r.pcie_link_width = 16;
  r.pcie_max_link_width = 16;
  r.pcie_link_generation = 5;
  r.pcie_max_link_generation = 5;
  r.clocks_event_reasons = 0;
  return r;
}

TEST(EvaluateGpuHealthTest, ACleanGpuAndOneWithNothingReadablePass) {
  EXPECT_TRUE(EvaluateGpuHealth(Clean()).ok());
  EXPECT_THAT(EvaluateGpuHealth(Clean()).notes, IsEmpty());
  // An old driver or a board without the sensors: nothing known is nothing wrong.
  EXPECT_TRUE(EvaluateGpuHealth(GpuHealthReading()).ok());
}

TEST(EvaluateGpuHealthTest, EachFaultIsNamedAndAllOfThemAreTheReason) {
  GpuHealthReading r = Clean();
  r.uncorrectable_ecc_errors = 1;
  r.retired_pages_pending = true;
  r.row_remap_failed = true;
  r.row_remap_pending = true;
  r.pcie_link_width = 4;
  r.clocks_event_reasons = kClocksHwSlowdown | kClocksHwPowerBrakeSlowdown | kClocksGpuIdle;
  const GpuVerdict v = EvaluateGpuHealth(r);
  EXPECT_THAT(v.faults,
              ElementsAre("1 uncorrectable ECC errors since the driver loaded",
                          "memory pages are pending retirement (a GPU reset retires them)",
                          "a memory row remapping failed",
                          "a memory row remapping is pending (a GPU reset applies it)",
                          "PCIe link at x4 of x16",
                          "clocks held down by the hardware (HW slowdown, HW power brake)"));
  EXPECT_EQ(v.Reason(), absl::StrJoin(v.faults, "; "));
}

TEST(EvaluateGpuHealthTest, ALowerLinkGenerationAndSoftwareClockLimitsAreNotesNotFaults) {
  GpuHealthReading r = Clean();
  r.pcie_link_generation = 1;
  r.clocks_event_reasons = kClocksSwPowerCap | kClocksSwThermalSlowdown | kClocksGpuIdle;
  r.unreadable.push_back("remapped rows: Unknown Error (999)");
  const GpuVerdict v = EvaluateGpuHealth(r);
  EXPECT_TRUE(v.ok()) << v.Reason();
  EXPECT_THAT(v.notes, ElementsAre("PCIe gen 1 of 5 (an idle GPU lowers it to save power)",
                                   "clocks held down by SW power cap, SW thermal slowdown",
                                   "no remapped rows: Unknown Error (999)"));
}

TEST(ClassifyXidTest, HardwareXidsTakeAGpuOutAndTheProgramsOwnDoNot) {
  for (uint64_t xid :
       {48, 57, 58, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 121, 140, 144, 150, 154}) {
    EXPECT_EQ(ClassifyXid(xid).kind, XidKind::kHardware) << xid;
  }
  for (uint64_t xid : {8, 13, 31, 43, 45, 68, 69, 109}) {
    EXPECT_EQ(ClassifyXid(xid).kind, XidKind::kApplication) << xid;
  }
  EXPECT_EQ(ClassifyXid(999).kind, XidKind::kOther);
  EXPECT_EQ(DescribeXid(79), "XID 79 (the GPU fell off the bus)");
  EXPECT_EQ(DescribeXid(48), "XID 48 (a double-bit ECC error)");
  EXPECT_EQ(DescribeXid(999), "XID 999");
  EXPECT_STREQ(XidKindName(ClassifyXid(13).kind), "application");
}

TEST(GpuHealthTest, AGpuTakenOutStaysOutWithItsFirstReasonUntilPutBack) {
  FakeClock clock;
  GpuHealth health(3, clock);
  EXPECT_TRUE(health.InService(2));
  EXPECT_FALSE(health.InService(3));
  EXPECT_FALSE(health.TakeOut(7, "no such GPU"));
  const absl::Time first = clock.Now();
  EXPECT_TRUE(health.TakeOut(1, "XID 79 (the GPU fell off the bus)"));
  clock.Advance(absl::Seconds(5));
  EXPECT_FALSE(health.TakeOut(1, "NVML cannot reach it"));
  ASSERT_EQ(health.Faults().size(), 1u);
  EXPECT_EQ(health.Faults()[0].index(), 1);
  EXPECT_EQ(health.Faults()[0].reason(), "XID 79 (the GPU fell off the bus)");
  EXPECT_EQ(health.Faults()[0].since_unix_ms(), absl::ToUnixMillis(first));
  health.Renew(1, "NVML cannot reach it");
  EXPECT_EQ(health.Faults()[0].reason(), "NVML cannot reach it");
  EXPECT_EQ(health.Faults()[0].since_unix_ms(), absl::ToUnixMillis(clock.Now()));
  health.Renew(0, "in service: nothing to renew");
  EXPECT_TRUE(health.InService(0));
  health.PutBack(1);
  EXPECT_THAT(health.Faults(), IsEmpty());
  EXPECT_EQ(health.Reason(1), "");
}

TEST(GpuHealthTest, AReturnCheckStartsAtMostOncePerIntervalAndOnlyForAGpuOut) {
  FakeClock clock;
  GpuHealth health(2, clock);
  EXPECT_FALSE(health.BeginReturnCheck(0, absl::Minutes(1)));  // in service
  health.TakeOut(0, "a memory row remapping failed");
  EXPECT_TRUE(health.BeginReturnCheck(0, absl::Minutes(1)));
  clock.Advance(absl::Seconds(59));
  EXPECT_FALSE(health.BeginReturnCheck(0, absl::Minutes(1)));
  clock.Advance(absl::Seconds(1));
  EXPECT_TRUE(health.BeginReturnCheck(0, absl::Minutes(1)));
  EXPECT_FALSE(health.BeginReturnCheck(0, absl::Minutes(1)));
}

TEST(GpuHealthTest, XidsAreCountedByGpuAndCode) {
  FakeClock clock;
  GpuHealth health(2, clock);
  health.CountXid(0, 13);
  health.CountXid(0, 13);
  health.CountXid(1, 79);
  EXPECT_THAT(health.XidCounts(),
              ::testing::UnorderedElementsAre(::testing::Pair(std::make_pair(0, uint64_t{13}), 2),
                                              ::testing::Pair(std::make_pair(1, uint64_t{79}), 1)));
}

class ReconcilerGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/reconciler-gpu-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    ReconcilerOptions options;
    options.work_dir = dir_;
    options.trainer_path = "/opt/trainyard/bin/trainyard-trainer";
    options.gpus = 3;
    options.gpu_in_service = [this](int gpu) { return health_.InService(gpu); };
    options.before_exit_reported = [this](const std::string& id) {
      if (hook_) hook_(id);
    };
    reconciler_ = std::make_unique<Reconciler>(options, launcher_, clock_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  static v1::Task Task(const std::string& id, int gpus) {
    v1::Task task;
    task.set_task_id(id);
    task.set_job_id(id.substr(0, id.find('.')));
    task.set_world_size(1);
    task.set_gpus(gpus);
    return task;
  }

  std::string dir_;
  FakeClock clock_;
  GpuHealth health_{3, clock_};
  FakeProcessLauncher launcher_;
  std::function<void(const std::string&)> hook_;
  std::unique_ptr<Reconciler> reconciler_;
};

TEST_F(ReconcilerGpuTest, AGpuOutOfServiceIsNeverGivenAndTheRefusalSaysSo) {
  health_.TakeOut(0, "PCIe link at x8 of x16");
  EXPECT_EQ(reconciler_->FreeGpus(), 2);
  std::vector<v1::TaskStatus> changes =
      reconciler_->Apply({Task("a.g1.r0", 1), Task("b.g1.r0", 2)});
  ASSERT_EQ(changes.size(), 2u);
  EXPECT_EQ(changes[0].state(), v1::TASK_RUNNING);
  EXPECT_THAT(launcher_.launched()[0].options.env,
              ::testing::Contains(::testing::Pair("CUDA_VISIBLE_DEVICES", "1")));
  EXPECT_EQ(changes[1].state(), v1::TASK_FAILED_TO_START);
  EXPECT_EQ(changes[1].message(),
            "needs 2 GPUs but only 1 of 3 are free on this worker (GPU 0 is out of service after "
            "a failed health check or a GPU error)");
  EXPECT_EQ(reconciler_->GpusInUse(), 1);
  EXPECT_EQ(reconciler_->FreeGpus(), 1);
  EXPECT_THAT(reconciler_->TaskGpus("a.g1.r0"), ElementsAre(1));
}

TEST_F(ReconcilerGpuTest, TasksOnAFailedGpuAreKilledAtOnceAndReportedStoppedWithTheFault) {
  reconciler_->Apply({Task("a.g1.r0", 2), Task("b.g1.r0", 1)});
  ASSERT_EQ(launcher_.launched().size(), 2u);
  EXPECT_EQ(reconciler_->StopForGpuFault(1, "XID 94 (a contained ECC error)"), 1);
  EXPECT_EQ(reconciler_->StopForGpuFault(1, "again"), 0);  // already killed
  EXPECT_THAT(launcher_.launched()[0].signals, ElementsAre(SIGKILL));
  EXPECT_THAT(launcher_.launched()[1].signals, IsEmpty());
  std::vector<v1::TaskStatus> ended = reconciler_->Tick();
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(ended[0].task_id(), "a.g1.r0");
  EXPECT_EQ(ended[0].state(), v1::TASK_STOPPED);
  EXPECT_EQ(ended[0].gpu_fault(), "XID 94 (a contained ECC error)");
  EXPECT_EQ(ended[0].message(),
            "stopped by its agent: GPU 1 failed: XID 94 (a contained ECC error)");
  EXPECT_EQ(reconciler_->GpusInUse(), 1);
}

TEST_F(ReconcilerGpuTest, AFailedEndIsPutOnAGpuFoundFailingAfterItAndACleanOneIsNot) {
  reconciler_->Apply({Task("ok.g1.r0", 1), Task("bad.g1.r0", 1), Task("cut.g1.r0", 1)});
  ASSERT_EQ(launcher_.launched().size(), 3u);
  hook_ = [this](const std::string& id) {
    const std::vector<int> gpus = reconciler_->TaskGpus(id);
    ASSERT_EQ(gpus.size(), 1u);
    reconciler_->AttributeEndToGpuFault(id, gpus[0], "the compute check failed: no");
  };
  launcher_.Exit(launcher_.launched()[0].pid, {0, 0});
  launcher_.Exit(launcher_.launched()[1].pid, {0, SIGSEGV});
  launcher_.Exit(launcher_.launched()[2].pid, {3, 0});
  std::map<std::string, v1::TaskStatus> ended;
  for (const v1::TaskStatus& s : reconciler_->Tick()) ended[s.task_id()] = s;
  ASSERT_EQ(ended.size(), 3u);
  EXPECT_EQ(ended["ok.g1.r0"].state(), v1::TASK_EXITED);
  EXPECT_EQ(ended["ok.g1.r0"].gpu_fault(), "");
  for (const char* id : {"bad.g1.r0", "cut.g1.r0"}) {
    EXPECT_EQ(ended[id].state(), v1::TASK_STOPPED) << id;
    EXPECT_EQ(ended[id].gpu_fault(), "the compute check failed: no") << id;
  }
  EXPECT_EQ(ended["bad.g1.r0"].signal(), SIGSEGV);
}

TEST(GpuHealthMetricsTest, EachGpuIsHealthyOrNotWithWhyAndXidsAreCountedByKind) {
  AgentMetricsSource source;
  source.worker_name = "w1";
  source.gpus_offered = 3;
  source.gpu_faults = [] {
    v1::GpuFault f;
    f.set_index(2);
    f.set_reason("XID 79 (the GPU fell off the bus)");
    return std::vector<v1::GpuFault>{f};
  };
  source.xid_counts = [] {
    return std::map<std::pair<int, uint64_t>, int64_t>{{{0, 13}, 4}, {{2, 79}, 1}};
  };
  AgentMetrics metrics(source, nullptr, "/nonexistent");
  const std::string text = Scrape(metrics);
  EXPECT_EQ(Value(text, R"(trainyard_worker_gpu_healthy{gpu="0"})"), 1);
  EXPECT_EQ(Value(text, R"(trainyard_worker_gpu_healthy{gpu="1"})"), 1);
  EXPECT_EQ(Value(text, R"(trainyard_worker_gpu_healthy{gpu="2"})"), 0);
  EXPECT_EQ(
      Value(
          text,
          R"x(trainyard_worker_gpu_fault_info{gpu="2",reason="XID 79 (the GPU fell off the bus)"})x"),
      1);
  EXPECT_THAT(text, Not(HasSubstr(R"(trainyard_worker_gpu_fault_info{gpu="0")")));
  EXPECT_EQ(
      Value(text, R"(trainyard_worker_gpu_xid_errors_total{gpu="0",xid="13",kind="application"})"),
      4);
  EXPECT_EQ(
      Value(text, R"(trainyard_worker_gpu_xid_errors_total{gpu="2",xid="79",kind="hardware"})"), 1);
}

// The trainer's compute check as the agent runs it, with scripts in the trainer's place.
class TrainerGpuCheckTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/gpu-check-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Trainer(const std::string& body) {
    const std::string path = absl::StrCat(dir_, "/trainer-", ++scripts_);
    std::ofstream(path) << "#!/bin/sh\n" << body;
    chmod(path.c_str(), 0755);
    return path;
  }
  absl::StatusOr<std::string> Run(const std::string& trainer,
                                  absl::Duration timeout = absl::Seconds(30)) {
    return RunTrainerGpuCheck(trainer, {{"TRAINYARD_CA_FILE", "/etc/ca.pem"}}, 3, dir_ + "/scratch",
                              RealClock::Get(), timeout);
  }

  std::string dir_;
  int scripts_ = 0;
};

TEST_F(TrainerGpuCheckTest, APassIsItsLastLineWithOnlyTheGpuVisible) {
  absl::StatusOr<std::string> passed =
      Run(Trainer("echo 'a warning from LibTorch' >&2\n"
                  "echo \"GPU check passed: $1 on $CUDA_VISIBLE_DEVICES $CUDA_DEVICE_ORDER "
                  "$TRAINYARD_CA_FILE\"\n"));
  ASSERT_TRUE(passed.ok()) << passed.status();
  EXPECT_EQ(*passed, "GPU check passed: --gpu_check=0 on 3 PCI_BUS_ID /etc/ca.pem");
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/scratch"));
}

TEST_F(TrainerGpuCheckTest, TheGpusFailuresAreFailedPreconditionAndTheChecksOwnAreNot) {
  absl::StatusOr<std::string> wrong =
      Run(Trainer("echo 'memory returned 1 of 8 words wrong'\nexit 3\n"));
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(wrong.status().message(), "memory returned 1 of 8 words wrong");
  absl::StatusOr<std::string> crashed = Run(Trainer("echo 'cuInit'\nkill -SEGV $$\n"));
  EXPECT_EQ(crashed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(crashed.status().message(), "it was killed by signal 11 (SIGSEGV): cuInit");
  absl::StatusOr<std::string> hung = Run(Trainer("exec /bin/sleep 60\n"), absl::Milliseconds(300));
  EXPECT_EQ(hung.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(hung.status().message(), HasSubstr("did not end within 300ms"));
  // Not the GPU's doing: the check could not run.
  absl::StatusOr<std::string> no_cuda =
      Run(Trainer("echo \"GPU check not run: this trainer's LibTorch has no CUDA\"\nexit 1\n"));
  EXPECT_EQ(no_cuda.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(no_cuda.status().message(), HasSubstr("has no CUDA"));
  absl::StatusOr<std::string> missing = Run(dir_ + "/no-such-trainer");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace trainyard
