// The agent with GPUs that fail, through the scripted NVML (loaded as the real one) and a scripted
// compute check, against a scripted coordinator and fake trainers, on a clock the test moves: the
// faults ride on every registration and Sync, a task on a GPU that fails is killed and reported
// with the fault, the GPU is not given out again, a GPU a task freed is checked before it is, and
// an admin's return takes a GPU back only when its check passes, at most once a minute.

#include <signal.h>
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/agent/fake_coordinator_link.h"
#include "tests/agent/fake_process_launcher.h"
#include "tests/common/fake_clock.h"
#include "worker/agent/agent.h"

namespace trainyard {
namespace {

using ::testing::Contains;
using testing::CountCalls;
using testing::FakeCoordinatorLink;
using testing::FakeProcessLauncher;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Pair;
using Calls = std::vector<FakeCoordinatorLink::Call>;

v1::Task GpuTask(const std::string& id, int gpus) {
  v1::Task task;
  task.set_task_id(id);
  task.set_job_id(id.substr(0, id.find('.')));
  task.set_generation(1);
  task.set_world_size(1);
  task.set_slots(1);
  task.set_gpus(gpus);
  return task;
}

// The last report of `task_id`, if any reached the coordinator.
std::optional<v1::TaskStatus> LastReport(const Calls& calls, const std::string& task_id) {
  std::optional<v1::TaskStatus> last;
  for (const FakeCoordinatorLink::Call& call : calls) {
    if (call.rpc == "ReportTaskStatus" && call.report.status().task_id() == task_id) {
      last = call.report.status();
    }
  }
  return last;
}

bool Reported(const Calls& calls, const std::string& task_id, v1::TaskState state) {
  std::optional<v1::TaskStatus> last = LastReport(calls, task_id);
  return last.has_value() && last->state() == state;
}

// The GPU faults of the last Sync answered; nullopt before any.
std::optional<std::vector<v1::GpuFault>> LastSyncFaults(const Calls& calls) {
  std::optional<std::vector<v1::GpuFault>> faults;
  for (const FakeCoordinatorLink::Call& call : calls) {
    if (call.rpc == "Sync" && call.ok) {
      faults.emplace(call.sync.gpu_faults().begin(), call.sync.gpu_faults().end());
    }
  }
  return faults;
}

std::vector<int> Indices(const std::vector<v1::GpuFault>& faults) {
  std::vector<int> out;
  for (const v1::GpuFault& f : faults) out.push_back(f.index());
  return out;
}

class AgentGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/agent-gpu-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    settings_ = dir_ + "/nvml-settings";
    xids_ = dir_ + "/xids";
    Write(xids_, "");
    Settings("");
    setenv("FAKE_NVML_FILE", settings_.c_str(), 1);
    absl::StatusOr<std::unique_ptr<GpuMonitor>> nvml = LoadNvml(FAKE_NVML_PATH);
    ASSERT_TRUE(nvml.ok()) << nvml.status();
    nvml_ = *std::move(nvml);

    auto link = std::make_unique<FakeCoordinatorLink>(clock_);
    auto launcher = std::make_unique<FakeProcessLauncher>();
    link_ = link.get();
    launcher_ = launcher.get();
    launcher_->OnSignal([this](int64_t pid, int signal) {
      absl::MutexLock lock(&mu_);
      signals_.emplace_back(pid, signal);
    });
    options_.coordinator = "10.0.0.1:7070";
    options_.name = "w1";
    options_.address = "10.0.0.2";
    options_.slots = 4;
    options_.gpus = 2;
    options_.work_dir = dir_;
    options_.trainer_path = "/opt/trainyard/bin/trainyard-trainer";
    options_.sync_wait = absl::Seconds(1);
    options_.self_fence_after = absl::ZeroDuration();
    options_.gpu_monitor = nvml_.get();
    options_.gpu_compute_check = [this](int gpu) { return Compute(gpu); };
    agent_ = std::make_unique<Agent>(options_, std::move(link), std::move(launcher), clock_);
  }

  void TearDown() override {
    if (run_.valid()) {
      agent_->RequestStop();
      RunUntil(
          [this] { return run_.wait_for(std::chrono::seconds(0)) == std::future_status::ready; });
      EXPECT_EQ(run_.get(), 0);
    }
    agent_.reset();
    nvml_.reset();
    unsetenv("FAKE_NVML_FILE");
    std::filesystem::remove_all(dir_);
  }

  void Write(const std::string& path, const std::string& text) {
    const std::string tmp = path + ".tmp";
    std::ofstream(tmp) << text;
    std::filesystem::rename(tmp, path);
  }
  // The scripted NVML's faults (fake_nvml.cc), on two GPUs with XID events from xids_.
  void Settings(const std::string& faults) {
    Write(settings_, absl::StrCat("FAKE_NVML_GPUS=2\nFAKE_NVML_XID_FILE=", xids_, "\n", faults));
  }
  void Xids(const std::string& lines) { Write(xids_, lines); }

  // The compute check: passes unless failing_ names the GPU. Records each call, with the tasks
  // whose end had reached the coordinator by then.
  absl::StatusOr<std::string> Compute(int gpu) {
    std::set<std::string> ended;
    for (const FakeCoordinatorLink::Call& call : link_->calls()) {
      if (call.rpc == "ReportTaskStatus" && call.report.status().state() != v1::TASK_RUNNING) {
        ended.insert(call.report.status().task_id());
      }
    }
    absl::MutexLock lock(&mu_);
    ++compute_calls_[gpu];
    compute_log_.emplace_back(gpu, std::move(ended));
    if (failing_.count(gpu) > 0) return absl::FailedPreconditionError(failing_[gpu]);
    return std::string("GPU check passed");
  }
  void FailCompute(int gpu, const std::string& why) {
    absl::MutexLock lock(&mu_);
    failing_[gpu] = why;
  }
  void PassCompute(int gpu) {
    absl::MutexLock lock(&mu_);
    failing_.erase(gpu);
  }
  int ComputeCalls(int gpu) {
    absl::MutexLock lock(&mu_);
    return compute_calls_[gpu];
  }
  std::vector<std::pair<int64_t, int>> signals() {
    absl::MutexLock lock(&mu_);
    return signals_;
  }

  void Start() {
    run_ = std::async(std::launch::async, [this] { return agent_->Run(); });
  }
  // Moves the clock from each of the agent's waits to its end until `done` holds, never past
  // `limit` (as agent_test.cc does).
  // At the limit, with every wait beyond it, only the agent's threads' own work (a GPU check
  // started by a Sync) can still bring `done` about: real time is given to it, up to 60 s.
  void RunUntil(const std::function<bool()>& done, absl::Time limit = absl::InfiniteFuture()) {
    const absl::Time real_deadline = absl::Now() + absl::Seconds(60);
    for (int i = 0; i < 20000 && absl::Now() < real_deadline; ++i) {
      std::optional<absl::Time> wake = clock_.AwaitWaiter(absl::Milliseconds(20));
      if (done()) return;
      if (!wake.has_value()) continue;
      if (*wake > limit && clock_.Now() >= limit) {
        absl::SleepFor(absl::Milliseconds(5));  // polling `done`: the clock may not move on
        --i;
        continue;
      }
      clock_.AdvanceTo(std::min(*wake, limit));
    }
    ADD_FAILURE() << "never came";
  }
  void RunFor(absl::Duration d) {
    const absl::Time until = clock_.Now() + d;
    RunUntil([&] { return clock_.Now() >= until; }, until);
  }
  // The CUDA_VISIBLE_DEVICES of the n-th trainer started.
  std::string VisibleGpus(size_t n) {
    const std::vector<FakeProcessLauncher::Launched> launched = launcher_->launched();
    for (const auto& [name, value] : launched.at(n).options.env) {
      if (name == "CUDA_VISIBLE_DEVICES") return value;
    }
    return "unset";
  }

  std::string dir_, settings_, xids_;
  FakeClock clock_;
  std::unique_ptr<GpuMonitor> nvml_;
  AgentOptions options_;
  FakeCoordinatorLink* link_ = nullptr;
  FakeProcessLauncher* launcher_ = nullptr;
  std::unique_ptr<Agent> agent_;
  std::future<int> run_;
  absl::Mutex mu_;
  std::map<int, int> compute_calls_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<int, std::set<std::string>>> compute_log_ ABSL_GUARDED_BY(mu_);
  std::map<int, std::string> failing_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<int64_t, int>> signals_ ABSL_GUARDED_BY(mu_);
};

TEST_F(AgentGpuTest, APreflightFaultRidesOnTheRegistrationAndEverySyncAndTheGpuIsNotGiven) {
  Settings("FAKE_NVML_REMAP_PENDING=1\n");
  const absl::Time start = clock_.Now();
  Start();
  RunUntil([&] { return CountCalls(link_->calls(), "Sync") >= 3; });
  const Calls calls = link_->calls();
  ASSERT_EQ(calls.front().rpc, "RegisterWorker");
  ASSERT_EQ(calls.front().registration.gpu_faults_size(), 1);
  const v1::GpuFault& fault = calls.front().registration.gpu_faults(0);
  EXPECT_EQ(fault.index(), 1);
  EXPECT_THAT(fault.reason(), HasSubstr("a memory row remapping is pending"));
  EXPECT_EQ(fault.since_unix_ms(), absl::ToUnixMillis(start));
  for (const FakeCoordinatorLink::Call& call : calls) {
    if (call.rpc != "Sync") continue;
    ASSERT_EQ(call.sync.gpu_faults_size(), 1);
    EXPECT_EQ(call.sync.gpu_faults(0).index(), 1);
  }
  // NVML's readings failed: no compute check of GPU 1 was needed; GPU 0's passed.
  EXPECT_EQ(ComputeCalls(0), 1);
  EXPECT_EQ(ComputeCalls(1), 0);

  // A task that needs both GPUs cannot have them; one that needs one gets GPU 0.
  link_->SetDesired({GpuTask("big.g1.r0", 2), GpuTask("small.g1.r0", 1)});
  RunUntil([&] {
    return Reported(link_->calls(), "big.g1.r0", v1::TASK_FAILED_TO_START) &&
           Reported(link_->calls(), "small.g1.r0", v1::TASK_RUNNING);
  });
  EXPECT_THAT(LastReport(link_->calls(), "big.g1.r0")->message(),
              HasSubstr("GPU 1 is out of service"));
  ASSERT_EQ(launcher_->launched().size(), 1u);
  EXPECT_EQ(VisibleGpus(0), "0");
}

TEST_F(AgentGpuTest, AHardwareXidStopsTheTaskOnItsGpuAndAnApplicationXidStopsNothing) {
  link_->SetDesired({GpuTask("j1.g1.r0", 1)});
  Start();
  RunUntil([&] { return Reported(link_->calls(), "j1.g1.r0", v1::TASK_RUNNING); });
  ASSERT_EQ(VisibleGpus(0), "0");
  const int64_t pid = launcher_->launched()[0].pid;
  // A program's bad address on GPU 1, then GPU 0 falls off the bus.
  Xids("1 31\n0 79\n");
  RunUntil([&] { return Reported(link_->calls(), "j1.g1.r0", v1::TASK_STOPPED); });
  const v1::TaskStatus stopped = *LastReport(link_->calls(), "j1.g1.r0");
  EXPECT_EQ(stopped.gpu_fault(), "XID 79 (the GPU fell off the bus)");
  EXPECT_THAT(stopped.message(), HasSubstr("GPU 0 failed: XID 79"));
  EXPECT_EQ(stopped.signal(), SIGKILL);
  // Killed at once: nothing it could save on a broken GPU is worth the wait.
  EXPECT_THAT(signals(), ::testing::ElementsAre(Pair(pid, SIGKILL)));
  RunUntil([&] {
    std::optional<std::vector<v1::GpuFault>> faults = LastSyncFaults(link_->calls());
    return faults.has_value() && Indices(*faults) == std::vector<int>{0};
  });
  EXPECT_THAT(agent_->XidCounts(),
              ::testing::UnorderedElementsAre(Pair(Pair(1, 31u), 1), Pair(Pair(0, 79u), 1)));

  // The next tasks: one gets GPU 1, still in service; the other finds none.
  link_->SetDesired({GpuTask("j2.g1.r0", 1), GpuTask("j3.g1.r0", 1)});
  RunUntil([&] {
    return Reported(link_->calls(), "j2.g1.r0", v1::TASK_RUNNING) &&
           Reported(link_->calls(), "j3.g1.r0", v1::TASK_FAILED_TO_START);
  });
  EXPECT_EQ(VisibleGpus(1), "1");
  EXPECT_THAT(LastReport(link_->calls(), "j3.g1.r0")->message(),
              HasSubstr("GPU 0 is out of service"));
  EXPECT_EQ(agent_->GpusAllocated(), 1);
}

TEST_F(AgentGpuTest, RisingEccErrorsDuringAJobStopItAndTakeItsGpuOut) {
  link_->SetDesired({GpuTask("j1.g1.r0", 2)});
  Start();
  RunUntil([&] { return Reported(link_->calls(), "j1.g1.r0", v1::TASK_RUNNING); });
  Settings("FAKE_NVML_ECC=1=2\n");
  RunUntil([&] { return Reported(link_->calls(), "j1.g1.r0", v1::TASK_STOPPED); });
  const v1::TaskStatus stopped = *LastReport(link_->calls(), "j1.g1.r0");
  EXPECT_EQ(stopped.gpu_fault(), "2 new uncorrectable ECC errors (2 since the driver loaded)");
  EXPECT_THAT(stopped.message(), HasSubstr("GPU 1 failed"));
  RunUntil([&] {
    std::optional<std::vector<v1::GpuFault>> faults = LastSyncFaults(link_->calls());
    return faults.has_value() && Indices(*faults) == std::vector<int>{1};
  });
}

TEST_F(AgentGpuTest, GpusATaskFreedAreCheckedBeforeItsEndIsReportedAndAFailedEndIsPutOnThem) {
  link_->SetDesired({GpuTask("clean.g1.r0", 1), GpuTask("crash.g1.r0", 1)});
  Start();
  RunUntil([&] {
    return Reported(link_->calls(), "clean.g1.r0", v1::TASK_RUNNING) &&
           Reported(link_->calls(), "crash.g1.r0", v1::TASK_RUNNING);
  });
  ASSERT_EQ(ComputeCalls(0), 1);  // the pre-flight's
  FailCompute(0, "the 1024^3 integer product differs from the CPU's at 3 of 1048576 elements");
  FailCompute(1, "memory returned 1 of 67108864 words wrong");
  // One finishes its work; the other crashes on its GPU.
  launcher_->Exit(launcher_->launched()[0].pid, {0, 0});
  launcher_->Exit(launcher_->launched()[1].pid, {1, 0});
  RunUntil([&] {
    return Reported(link_->calls(), "clean.g1.r0", v1::TASK_EXITED) &&
           Reported(link_->calls(), "crash.g1.r0", v1::TASK_STOPPED);
  });
  {
    // Each GPU was checked after its task, before the task's end reached the coordinator.
    absl::MutexLock lock(&mu_);
    ASSERT_EQ(compute_log_.size(), 4u);
    for (size_t i = 2; i < 4; ++i) {
      const auto& [gpu, ended] = compute_log_[i];
      EXPECT_EQ(ended.count(gpu == 0 ? "clean.g1.r0" : "crash.g1.r0"), 0u) << "GPU " << gpu;
    }
  }
  // A task that finished stays finished: its GPU failed after it.
  const v1::TaskStatus clean = *LastReport(link_->calls(), "clean.g1.r0");
  EXPECT_EQ(clean.exit_code(), 0);
  EXPECT_EQ(clean.gpu_fault(), "");
  // One that crashed is put down to its GPU: it runs again elsewhere.
  const v1::TaskStatus crash = *LastReport(link_->calls(), "crash.g1.r0");
  EXPECT_EQ(crash.exit_code(), 1);
  EXPECT_EQ(crash.gpu_fault(),
            "the compute check failed: memory returned 1 of 67108864 words wrong");
  EXPECT_THAT(crash.message(), HasSubstr("GPU 1 failed: the compute check failed"));
  RunUntil([&] {
    std::optional<std::vector<v1::GpuFault>> faults = LastSyncFaults(link_->calls());
    return faults.has_value() && Indices(*faults) == std::vector<int>{0, 1};
  });
  link_->SetDesired({GpuTask("next.g1.r0", 1)});
  RunUntil([&] { return Reported(link_->calls(), "next.g1.r0", v1::TASK_FAILED_TO_START); });
}

TEST_F(AgentGpuTest, AReturnedGpuComesBackOnlyWhenItsCheckPassesAndIsCheckedAtMostOnceAMinute) {
  FailCompute(1, "CUDA sees no GPU");
  Start();
  RunUntil([&] { return CountCalls(link_->calls(), "Sync") >= 1; });
  ASSERT_EQ(Indices(*LastSyncFaults(link_->calls())), std::vector<int>{1});
  const std::string reason = link_->calls().front().registration.gpu_faults(0).reason();
  EXPECT_EQ(reason, "the compute check failed: CUDA sees no GPU");
  ASSERT_EQ(ComputeCalls(1), 1);

  // Returned while it still fails: checked once, kept out, its fault renewed.
  link_->SetReturnGpus({1});
  const absl::Time returned = clock_.Now();
  RunUntil([&] { return ComputeCalls(1) == 2; });
  RunUntil([&] {
    std::optional<std::vector<v1::GpuFault>> faults = LastSyncFaults(link_->calls());
    return faults.has_value() && faults->size() == 1 &&
           (*faults)[0].since_unix_ms() >= absl::ToUnixMillis(returned);
  });
  EXPECT_EQ(LastSyncFaults(link_->calls())->at(0).reason(), reason);
  // The coordinator repeats the return on every Sync: no second check within the minute.
  RunFor(absl::Seconds(50));
  EXPECT_EQ(ComputeCalls(1), 2);
  RunUntil([&] { return ComputeCalls(1) == 3; }, returned + absl::Seconds(70));
  EXPECT_GE(clock_.Now() - returned, absl::Minutes(1));

  // Fixed (the GPU reset): the next check passes and the GPU is back in service.
  PassCompute(1);
  RunUntil([&] {
    std::optional<std::vector<v1::GpuFault>> faults = LastSyncFaults(link_->calls());
    return faults.has_value() && faults->empty();
  });
  EXPECT_EQ(ComputeCalls(1), 4);
  link_->SetReturnGpus({});
  link_->SetDesired({GpuTask("both.g1.r0", 2)});
  RunUntil([&] { return Reported(link_->calls(), "both.g1.r0", v1::TASK_RUNNING); });
  EXPECT_EQ(VisibleGpus(0), "0,1");
}

}  // namespace
}  // namespace trainyard
