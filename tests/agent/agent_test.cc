// The agent's own logic (registration, lease renewal, backoff while the coordinator is away,
// re-registration, preemption) against a scripted coordinator and fake trainers, on a clock the
// test moves from one of the agent's waits to the next.

#include "worker/agent/agent.h"

#include <signal.h>
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/backoff.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/agent/fake_coordinator_link.h"
#include "tests/agent/fake_process_launcher.h"
#include "tests/common/fake_clock.h"

namespace trainyard {
namespace {

using testing::CountCalls;
using testing::FakeCoordinatorLink;
using testing::FakeProcessLauncher;
using Calls = std::vector<FakeCoordinatorLink::Call>;

constexpr absl::Duration kSyncWait = absl::Seconds(1);

v1::Task MakeTask(const std::string& id) {
  v1::Task task;
  task.set_task_id(id);
  task.set_job_id(id.substr(0, id.find('.')));
  task.set_generation(1);
  task.set_world_size(1);
  task.set_slots(1);
  return task;
}

// Whether `calls` hold a report of `task_id` in `state`.
bool Reported(const Calls& calls, const std::string& task_id, v1::TaskState state) {
  return std::any_of(calls.begin(), calls.end(), [&](const FakeCoordinatorLink::Call& call) {
    return call.rpc == "ReportTaskStatus" && call.report.status().task_id() == task_id &&
           call.report.status().state() == state;
  });
}

int FailedCalls(const Calls& calls) {
  return static_cast<int>(std::count_if(calls.begin(), calls.end(),
                                        [](const FakeCoordinatorLink::Call& c) { return !c.ok; }));
}

// A signal a fake trainer received, when, and how many preemption reports had reached the
// coordinator by then.
struct Signalled {
  int signal;
  absl::Time at;
  int preemption_reports;
};

class AgentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/agent-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    auto link = std::make_unique<FakeCoordinatorLink>(clock_);
    auto launcher = std::make_unique<FakeProcessLauncher>();
    link_ = link.get();
    launcher_ = launcher.get();
    launcher_->OnSignal([this](int64_t, int signal) {
      const int reports = CountCalls(link_->calls(), "ReportPreemption");
      absl::MutexLock lock(&mu_);
      signals_.push_back({signal, clock_.Now(), reports});
    });
    options_.coordinator = "10.0.0.1:7070";
    options_.name = "w1";
    options_.address = "10.0.0.2";
    options_.slots = 2;
    options_.work_dir = dir_;
    options_.trainer_path = "/opt/trainyard/bin/trainyard-trainer";
    options_.stop_grace_period = absl::Seconds(10);
    options_.sync_wait = kSyncWait;
    link_owned_ = std::move(link);
    launcher_owned_ = std::move(launcher);
    MakeAgent();
  }

  // The agent of options_, before Start: tests may change the options first.
  void MakeAgent() {
    agent_ = std::make_unique<Agent>(options_, std::move(link_owned_), std::move(launcher_owned_),
                                     clock_);
  }

  void TearDown() override {
    if (run_.valid()) {
      agent_->RequestStop();
      RunUntil([this] { return Ended(); });
      // One that never stops holds the test here until its time limit.
      EXPECT_EQ(run_.get(), 0);
    }
    agent_.reset();
    std::filesystem::remove_all(dir_);
  }

  void Start() {
    run_ = std::async(std::launch::async, [this] { return agent_->Run(); });
  }
  bool Ended() { return run_.wait_for(std::chrono::seconds(0)) == std::future_status::ready; }

  // Starts the agent with one desired task and waits until it reports the trainer running.
  void StartWithATrainer() {
    link_->SetDesired({MakeTask("j1.g1.r0")});
    Start();
    ASSERT_TRUE(link_->WaitFor(
        [](const Calls& calls) { return Reported(calls, "j1.g1.r0", v1::TASK_RUNNING); }));
    ASSERT_EQ(launcher_->launched().size(), 1u);
  }

  // Moves the clock from each wait of the agent's to its end until `done` holds, never past
  // `limit`. `done` is read while the agent waits (or has ended), when what it did before the
  // wait is all there is to see. `each` sees every wait's deadline first.
  void RunUntil(const std::function<bool()>& done, absl::Time limit = absl::InfiniteFuture(),
                const std::function<void(absl::Time)>& each = nullptr) {
    for (int i = 0; i < 20000; ++i) {
      std::optional<absl::Time> wake = clock_.AwaitWaiter(absl::Milliseconds(20));
      if (done()) return;
      if (!wake.has_value()) continue;
      if (each) each(*wake);
      clock_.AdvanceTo(std::min(*wake, limit));
    }
  }

  std::vector<Signalled> signals() {
    absl::MutexLock lock(&mu_);
    return signals_;
  }
  bool SignalledWith(int signal) {
    for (const Signalled& s : signals()) {
      if (s.signal == signal) return true;
    }
    return false;
  }

  std::string dir_;
  FakeClock clock_;
  AgentOptions options_;
  std::unique_ptr<FakeCoordinatorLink> link_owned_;      // until MakeAgent
  std::unique_ptr<FakeProcessLauncher> launcher_owned_;  // until MakeAgent
  FakeCoordinatorLink* link_ = nullptr;
  FakeProcessLauncher* launcher_ = nullptr;
  std::unique_ptr<Agent> agent_;
  std::future<int> run_;
  absl::Mutex mu_;
  std::vector<Signalled> signals_ ABSL_GUARDED_BY(mu_);
};

TEST_F(AgentTest, RegistersStartsTheDesiredTasksAndRenewsItsLeaseWithinTheSyncWait) {
  StartWithATrainer();
  const Calls first = link_->calls();
  ASSERT_EQ(first.front().rpc, "RegisterWorker");
  EXPECT_EQ(first.front().registration.name(), "w1");
  EXPECT_EQ(first.front().registration.slots(), 2);
  EXPECT_FALSE(first.front().registration.has_runtime());  // the trainer was not asked
  EXPECT_EQ(launcher_->launched()[0].options.argv[0], "/opt/trainyard/bin/trainyard-trainer");

  // Twenty rounds of syncs: the agent never waits longer than the sync wait between two, and
  // each asks the coordinator to hold it that long.
  const absl::Time from = clock_.Now();
  RunUntil([&] { return clock_.Now() - from >= 20 * kSyncWait; }, absl::InfiniteFuture(),
           [&](absl::Time wake) { EXPECT_LE(wake - clock_.Now(), kSyncWait); });
  absl::Time last = absl::InfinitePast();
  int syncs = 0;
  for (const FakeCoordinatorLink::Call& call : link_->calls()) {
    if (call.rpc != "Sync") continue;
    ++syncs;
    EXPECT_EQ(call.sync.wait_ms(), absl::ToInt64Milliseconds(kSyncWait));
    EXPECT_EQ(call.sync.worker_id(), "w1");
    if (last != absl::InfinitePast()) {
      EXPECT_LE(call.at - last, kSyncWait);
    }
    last = call.at;
  }
  EXPECT_GE(syncs, 20);
  EXPECT_TRUE(signals().empty());
}

TEST_F(AgentTest, HoldsALeaseStreamAndPollsWithTheLongWaitWhileItHolds) {
  // SetUp's agent is replaced by one with the real default wait.
  auto link = std::make_unique<FakeCoordinatorLink>(clock_);
  auto launcher = std::make_unique<FakeProcessLauncher>();
  link_ = link.get();
  launcher_ = launcher.get();
  link_owned_ = std::move(link);
  launcher_owned_ = std::move(launcher);
  options_.sync_wait = absl::Seconds(30);
  MakeAgent();
  link_->EnableLeases();
  Start();
  RunUntil([&] {
    return link_->OpenLeases() == 1 && CountCalls(link_->calls(), "Sync") >= 3 &&
           link_->calls().back().rpc == "Sync" && link_->calls().back().sync.wait_ms() == 30000;
  });
  Calls calls = link_->calls();
  for (const FakeCoordinatorLink::Call& call : calls) {
    if (call.rpc == "HoldLease") {
      EXPECT_EQ(call.lease.worker_id(), "w1");
    }
    // Short polls renew the lease until the stream holds it; then the long wait.
    if (call.rpc == "Sync") {
      EXPECT_THAT(call.sync.wait_ms(), ::testing::AnyOf(1000, 30000));
    }
  }
  // Registering again ends the stream and opens one for the new registration.
  link_->ForgetWorker();
  auto granted_after_second_registration = [](const Calls& now) {
    int registrations = 0;
    int granted = 0;
    for (const FakeCoordinatorLink::Call& call : now) {
      if (call.rpc == "RegisterWorker") ++registrations;
      if (registrations == 2 && call.rpc == "HoldLease" && call.granted) ++granted;
    }
    return granted;
  };
  // The old stream may still be closing when the new one opens: wait for both.
  RunUntil([&] {
    return granted_after_second_registration(link_->calls()) >= 1 && link_->OpenLeases() == 1;
  });
  calls = link_->calls();
  EXPECT_EQ(CountCalls(calls, "RegisterWorker"), 2);
  EXPECT_GE(granted_after_second_registration(calls), 1);
}

TEST_F(AgentTest, BeatsOnItsLeaseStreamWhileItHasTasksAndNotWhileIdle) {
  link_->EnableLeases(absl::Milliseconds(20));
  Start();
  RunUntil([&] { return link_->OpenLeases() == 1 && CountCalls(link_->calls(), "Sync") >= 2; });
  for (const FakeCoordinatorLink::Call& call : link_->calls()) {
    if (call.rpc == "HoldLease") {
      EXPECT_TRUE(call.lease.beats());
    }
  }
  // Idle: ten intervals without a beat (the coordinator pings an idle agent's connection only
  // when its long polls stop).
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_EQ(CountCalls(link_->calls(), "Beat"), 0);
  // A task: beats at the asked interval, on the stream.
  link_->SetDesired({MakeTask("j1.g1.r0")});
  RunUntil([&] { return Reported(link_->calls(), "j1.g1.r0", v1::TASK_RUNNING); });
  EXPECT_TRUE(link_->WaitFor([](const Calls& calls) { return CountCalls(calls, "Beat") >= 5; }));
}

TEST_F(AgentTest, KillsTheTasksTheCoordinatorSaysToKillWithoutAskingThemToStop) {
  StartWithATrainer();
  link_->SetDesired({}, {"j1.g1.r0"});
  RunUntil([&] { return Reported(link_->calls(), "j1.g1.r0", v1::TASK_STOPPED); });
  ASSERT_FALSE(signals().empty());
  EXPECT_EQ(signals().front().signal, SIGKILL);
  EXPECT_FALSE(SignalledWith(SIGTERM));
}

TEST_F(AgentTest, RegistersAgainWithItsRunningTasksWhenTheCoordinatorHasForgottenIt) {
  // SetUp's agent is replaced by one that knows what its trainer runs.
  link_owned_ = std::make_unique<FakeCoordinatorLink>(clock_);
  launcher_owned_ = std::make_unique<FakeProcessLauncher>();
  link_ = link_owned_.get();
  launcher_ = launcher_owned_.get();
  options_.runtime.set_libtorch_version("2.6.0");
  options_.runtime.add_ops("aten::scaled_dot_product_attention");
  MakeAgent();
  StartWithATrainer();
  const int64_t pid = launcher_->launched()[0].pid;
  link_->ForgetWorker();
  RunUntil([&] { return CountCalls(link_->calls(), "RegisterWorker") == 2; });

  const Calls calls = link_->calls();
  ASSERT_EQ(CountCalls(calls, "RegisterWorker"), 2);
  const v1::RegisterWorkerRequest* again = nullptr;
  for (const FakeCoordinatorLink::Call& call : calls) {
    if (call.rpc == "RegisterWorker") again = &call.registration;
  }
  // Each registration says what the trainer runs.
  EXPECT_EQ(calls.front().registration.runtime().libtorch_version(), "2.6.0");
  EXPECT_EQ(again->runtime().ops(0), "aten::scaled_dot_product_attention");
  ASSERT_EQ(again->tasks_size(), 1);
  EXPECT_EQ(again->tasks(0).task_id(), "j1.g1.r0");
  EXPECT_EQ(again->tasks(0).state(), v1::TASK_RUNNING);
  EXPECT_EQ(again->tasks(0).pid(), pid);
  // The trainer lives on, and is not started twice.
  EXPECT_TRUE(signals().empty());
  EXPECT_EQ(launcher_->launched().size(), 1u);
}

TEST_F(AgentTest, BacksOffUpToTwoSecondsWhileTheCoordinatorIsAwayAndKeepsItsTrainers) {
  StartWithATrainer();
  link_->SetAvailable(false);
  RunUntil([&] { return FailedCalls(link_->calls()) == 1; });
  ASSERT_EQ(FailedCalls(link_->calls()), 1);

  // The n-th wait after a failure is drawn from [bound/2, bound], bound = 100 ms * 2^n up to 2 s.
  for (int n = 0; n < 8; ++n) {
    std::optional<absl::Time> wake = clock_.AwaitWaiter();
    ASSERT_TRUE(wake.has_value());
    const absl::Duration bound = BackoffBound(absl::Milliseconds(100), absl::Seconds(2), n);
    EXPECT_GE(*wake - clock_.Now(), bound / 2) << "after failure " << n + 1;
    EXPECT_LE(*wake - clock_.Now(), bound) << "after failure " << n + 1;
    clock_.AdvanceTo(*wake);
    ASSERT_TRUE(link_->WaitFor([&](const Calls& calls) { return FailedCalls(calls) == n + 2; }));
  }
  EXPECT_TRUE(signals().empty()) << "a trainer was signalled while the coordinator was away";

  // Back: the next call goes through and carries the trainer's status.
  link_->SetAvailable(true);
  const size_t before = link_->calls().size();
  RunUntil([&] { return link_->calls().size() > before && link_->calls().back().ok; });
  const FakeCoordinatorLink::Call back = link_->calls().back();
  ASSERT_EQ(back.rpc, "Sync");
  ASSERT_EQ(back.sync.tasks_size(), 1);
  EXPECT_EQ(back.sync.tasks(0).state(), v1::TASK_RUNNING);
}

// Cut off from the coordinator for longer than self_fence_after, the agent kills its trainers
// (the coordinator has presumably restarted their jobs elsewhere), reports them stopped, saying
// why, once it is back, and takes new work again.
TEST_F(AgentTest, KillsItsTrainersAfterTooLongWithoutALeaseAndTakesWorkAgainWhenBack) {
  link_owned_ = std::make_unique<FakeCoordinatorLink>(clock_);
  launcher_owned_ = std::make_unique<FakeProcessLauncher>();
  link_ = link_owned_.get();
  launcher_ = launcher_owned_.get();
  launcher_->OnSignal([this](int64_t, int signal) {
    absl::MutexLock lock(&mu_);
    signals_.push_back({signal, clock_.Now(), 0});
  });
  options_.self_fence_after = absl::Seconds(30);
  MakeAgent();
  StartWithATrainer();
  link_->SetAvailable(false);
  const absl::Time away = clock_.Now();
  // Within self_fence_after the trainer lives on.
  RunUntil([&] { return clock_.Now() >= away + absl::Seconds(29); }, away + absl::Seconds(29));
  EXPECT_TRUE(signals().empty()) << "killed after " << signals().front().at - away;
  RunUntil([&] { return SignalledWith(SIGKILL); });
  ASSERT_FALSE(signals().empty());
  EXPECT_EQ(signals().front().signal, SIGKILL);
  EXPECT_GE(signals().front().at - away, absl::Seconds(30));

  link_->SetAvailable(true);
  RunUntil([&] { return Reported(link_->calls(), "j1.g1.r0", v1::TASK_STOPPED); });
  std::string message;
  for (const FakeCoordinatorLink::Call& call : link_->calls()) {
    if (call.rpc == "ReportTaskStatus" && call.report.status().state() == v1::TASK_STOPPED) {
      message = call.report.status().message();
    }
  }
  EXPECT_THAT(message, ::testing::HasSubstr("no lease from the coordinator for"));
  EXPECT_THAT(message, ::testing::HasSubstr("(self-fencing)"));
  // Back in touch: new work is taken.
  link_->SetDesired({MakeTask("j2.g1.r0")});
  RunUntil([&] { return Reported(link_->calls(), "j2.g1.r0", v1::TASK_RUNNING); });
  EXPECT_EQ(launcher_->launched().size(), 2u);
}

TEST_F(AgentTest, APreemptionIsReportedFirstAndTrainersAreKilledAtTheDeadlineLessAMargin) {
  StartWithATrainer();
  const absl::Time deadline = clock_.Now() + absl::Seconds(30);
  const absl::Time kill_at = deadline - absl::Seconds(2);
  agent_->RequestPreemption({"test", deadline, "spot capacity reclaimed"});

  ASSERT_TRUE(link_->WaitFor(
      [](const Calls& calls) { return CountCalls(calls, "ReportPreemption") == 1; }));
  RunUntil([&] { return SignalledWith(SIGTERM); }, kill_at);
  std::vector<Signalled> seen = signals();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].signal, SIGTERM);
  EXPECT_EQ(seen[0].preemption_reports, 1) << "the trainers heard of it before the coordinator";
  const v1::ReportPreemptionRequest report = [&] {
    for (const FakeCoordinatorLink::Call& call : link_->calls()) {
      if (call.rpc == "ReportPreemption") return call.preemption;
    }
    return v1::ReportPreemptionRequest();
  }();
  EXPECT_EQ(report.worker_id(), "w1");
  EXPECT_EQ(report.deadline_unix_ms(), absl::ToUnixMillis(deadline));
  std::ifstream file(agent_->TaskDir("j1.g1.r0") + "/" + kStopDeadlineFile);
  int64_t written = 0;
  file >> written;
  EXPECT_EQ(written, absl::ToUnixMillis(kill_at));

  // The trainer does not exit: it is killed when the clock reaches kill_at, not before.
  RunUntil([&] { return SignalledWith(SIGKILL); }, kill_at);
  ASSERT_TRUE(run_.wait_for(std::chrono::seconds(30)) == std::future_status::ready);
  EXPECT_EQ(run_.get(), 0);
  seen = signals();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[1].signal, SIGKILL);
  EXPECT_EQ(seen[1].at, kill_at);
  EXPECT_TRUE(Reported(link_->calls(), "j1.g1.r0", v1::TASK_EXITED));
  EXPECT_LT(clock_.Now(), deadline);
}

TEST_F(AgentTest, LeavesBeforeTheDeadlineWhenNeitherTheCoordinatorNorATrainerAnswers) {
  StartWithATrainer();
  link_->SetAvailable(false);
  launcher_->MakeUnkillable();
  const absl::Time deadline = clock_.Now() + absl::Seconds(30);
  agent_->RequestPreemption({"test", deadline, "spot capacity reclaimed"});

  absl::Time latest_wait = absl::InfinitePast();
  RunUntil([&] { return Ended(); }, deadline,
           [&](absl::Time wake) { latest_wait = std::max(latest_wait, wake); });
  ASSERT_TRUE(Ended());
  EXPECT_EQ(run_.get(), 0);
  EXPECT_LT(clock_.Now(), deadline);
  EXPECT_LT(latest_wait, deadline) << "the agent waited past the machine's end";
  EXPECT_TRUE(SignalledWith(SIGKILL));
  // A few quick tries, not one per loop.
  EXPECT_EQ(CountCalls(link_->calls(), "ReportPreemption"), 3);
}

TEST(CallCancellerTest, ACancelReachesTheCallWhetherItCameBeforeOrDuringItAndNeverAfter) {
  int cancels = 0;
  CallCanceller early;
  early.Cancel();
  early.SetCancel([&] { ++cancels; });  // the call starts after the cancel: ended at once
  EXPECT_EQ(cancels, 1);
  early.SetCancel(nullptr);
  CallCanceller during;
  during.SetCancel([&] { ++cancels; });
  during.Cancel();
  EXPECT_EQ(cancels, 2);
  during.SetCancel(nullptr);  // the call has ended: a later cancel reaches nothing
  during.Cancel();
  EXPECT_EQ(cancels, 2);
  EXPECT_TRUE(during.cancelled());
}

}  // namespace
}  // namespace trainyard
