#include "worker/agent/reconciler.h"

#include <signal.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/backoff.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/agent/fake_process_launcher.h"
#include "tests/common/fake_clock.h"

namespace trainyard {
namespace {

using ::testing::ElementsAre;
using testing::FakeProcessLauncher;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;

v1::Task MakeTask(const std::string& id, int slots = 1, int gpus = 0) {
  v1::Task task;
  task.set_task_id(id);
  task.set_job_id(id.substr(0, id.find('.')));
  task.set_generation(1);
  task.set_rank(0);
  task.set_world_size(1);
  task.set_slots(slots);
  task.set_gpus(gpus);
  return task;
}

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

class ReconcilerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/reconciler-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  ReconcilerOptions Options(int gpus = 0) {
    ReconcilerOptions options;
    options.work_dir = dir_;
    options.trainer_path = "/opt/trainyard/bin/trainyard-trainer";
    options.coordinator = "10.1.2.3:7070";
    options.gpus = gpus;
    options.stop_grace_period = absl::Seconds(10);
    options.before_exit_reported = [this](const std::string& id) { flushed_.push_back(id); };
    return options;
  }

  std::string dir_;
  FakeClock clock_;
  FakeProcessLauncher launcher_;
  std::vector<std::string> flushed_;
};

TEST_F(ReconcilerTest, StartsDesiredTasksWithTheirFolderArgumentsAndEnvironment) {
  Reconciler reconciler(Options(), launcher_, clock_);
  const v1::Task task = MakeTask("j1.g1.r0", /*slots=*/4);
  std::vector<v1::TaskStatus> changes = reconciler.Apply({task});
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].task_id(), "j1.g1.r0");
  EXPECT_EQ(changes[0].state(), v1::TASK_RUNNING);
  EXPECT_EQ(changes[0].pid(), 1000);

  ASSERT_EQ(launcher_.launched().size(), 1u);
  const SubprocessOptions launched = launcher_.launched()[0].options;
  const std::string task_dir = dir_ + "/tasks/j1.g1.r0";
  EXPECT_THAT(launched.argv,
              ElementsAre("/opt/trainyard/bin/trainyard-trainer",
                          "--task_file=" + task_dir + "/task.pb", "--coordinator=10.1.2.3:7070"));
  EXPECT_EQ(launched.working_dir, task_dir);
  EXPECT_EQ(launched.output_file, task_dir + "/output.log");
  EXPECT_THAT(
      launched.env,
      UnorderedElementsAre(Pair("OMP_NUM_THREADS", "4"), Pair("CUDA_VISIBLE_DEVICES", ""),
                           Pair("CUDA_DEVICE_ORDER", "PCI_BUS_ID"),
                           Pair("TRAINYARD_CACHE_DIR", dir_ + "/cache"), Pair("TMPDIR", task_dir)));
  v1::Task written;
  ASSERT_TRUE(written.ParseFromString(Read(task_dir + "/task.pb")));
  EXPECT_EQ(written.task_id(), "j1.g1.r0");
  EXPECT_EQ(written.slots(), 4);
  EXPECT_EQ(Read(task_dir + "/pid"), "1000\n");
  EXPECT_EQ(reconciler.RunningCount(), 1);

  // Applying the same desired state again starts nothing new.
  EXPECT_THAT(reconciler.Apply({task}), IsEmpty());
  EXPECT_EQ(launcher_.launched().size(), 1u);
}

TEST_F(ReconcilerTest, AssignsDistinctGpusAndFreesThemOnExit) {
  Reconciler reconciler(Options(/*gpus=*/3), launcher_, clock_);
  reconciler.Apply({MakeTask("a.g1.r0", 1, 2), MakeTask("b.g1.r0", 1, 1)});
  ASSERT_EQ(launcher_.launched().size(), 2u);
  EXPECT_THAT(launcher_.launched()[0].options.env,
              ::testing::Contains(Pair("CUDA_VISIBLE_DEVICES", "0,1")));
  EXPECT_THAT(launcher_.launched()[1].options.env,
              ::testing::Contains(Pair("CUDA_VISIBLE_DEVICES", "2")));
  EXPECT_EQ(reconciler.FreeGpus(), 0);
  // Which task each GPU serves, for the GPU metrics.
  std::map<int, v1::TaskStatus> gpu_tasks = reconciler.GpuTasks();
  ASSERT_EQ(gpu_tasks.size(), 3u);
  EXPECT_EQ(gpu_tasks[0].task_id(), "a.g1.r0");
  EXPECT_EQ(gpu_tasks[1].task_id(), "a.g1.r0");
  EXPECT_EQ(gpu_tasks[2].task_id(), "b.g1.r0");

  // No GPU left: the third task fails to start instead of sharing one.
  std::vector<v1::TaskStatus> changes = reconciler.Apply(
      {MakeTask("a.g1.r0", 1, 2), MakeTask("b.g1.r0", 1, 1), MakeTask("c.g1.r0", 1, 1)});
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].state(), v1::TASK_FAILED_TO_START);
  EXPECT_THAT(changes[0].message(), HasSubstr("GPUs"));

  launcher_.Exit(1000, ExitInfo{0, 0});
  reconciler.Tick();
  EXPECT_EQ(reconciler.FreeGpus(), 2);
  gpu_tasks = reconciler.GpuTasks();
  ASSERT_EQ(gpu_tasks.size(), 1u);
  EXPECT_EQ(gpu_tasks[2].task_id(), "b.g1.r0");
}

TEST_F(ReconcilerTest, ReportsExitWithTerminationMessageAfterTheLogHook) {
  Reconciler reconciler(Options(), launcher_, clock_);
  reconciler.Apply({MakeTask("j1.g1.r0")});
  EXPECT_THAT(reconciler.Tick(), IsEmpty());
  std::ofstream(dir_ + "/tasks/j1.g1.r0/output.log") << "one\ntwo\nthree\nfour\n";
  std::ofstream(dir_ + "/tasks/j1.g1.r0/termination-message") << "data.train: no files match\n";
  launcher_.Exit(1000, ExitInfo{2, 0});

  std::vector<v1::TaskStatus> ended = reconciler.Tick();
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(ended[0].state(), v1::TASK_EXITED);
  EXPECT_EQ(ended[0].exit_code(), 2);
  EXPECT_EQ(ended[0].signal(), 0);
  EXPECT_EQ(ended[0].message(), "data.train: no files match");
  EXPECT_THAT(flushed_, ElementsAre("j1.g1.r0"));
  EXPECT_EQ(reconciler.RunningCount(), 0);
  // The final status stays visible until a Sync has carried it.
  ASSERT_EQ(reconciler.Statuses().size(), 1u);
  EXPECT_EQ(reconciler.Statuses()[0].state(), v1::TASK_EXITED);
}

TEST_F(ReconcilerTest, OverlappingTicksReportAnEndOnce) {
  ReconcilerOptions options = Options();
  Reconciler* self = nullptr;
  bool inner_called = false;
  std::vector<v1::TaskStatus> from_inner;
  // A second Tick while the first one ships the log (the agent's main thread at shutdown while
  // its supervisor thread is busy).
  options.before_exit_reported = [&](const std::string&) {
    if (inner_called) return;
    inner_called = true;
    from_inner = self->Tick();
  };
  Reconciler reconciler(options, launcher_, clock_);
  self = &reconciler;
  reconciler.Apply({MakeTask("j1.g1.r0")});
  launcher_.Exit(1000, ExitInfo{143, 0});
  std::vector<v1::TaskStatus> ended = reconciler.Tick();
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(ended[0].exit_code(), 143);
  EXPECT_TRUE(inner_called);
  EXPECT_THAT(from_inner, IsEmpty());
  EXPECT_EQ(reconciler.RunningCount(), 0);
}

TEST_F(ReconcilerTest, MessageIsTheLogTailWithoutATerminationMessage) {
  Reconciler reconciler(Options(), launcher_, clock_);
  reconciler.Apply({MakeTask("j1.g1.r0"), MakeTask("j2.g1.r0")});
  std::ofstream(dir_ + "/tasks/j1.g1.r0/output.log") << "one\ntwo\nthree\nfour\n";
  std::ofstream(dir_ + "/tasks/j2.g1.r0/output.log") << "Segmentation fault\n";
  launcher_.Exit(1000, ExitInfo{1, 0});
  launcher_.Exit(1001, ExitInfo{139, SIGSEGV});
  std::vector<v1::TaskStatus> ended = reconciler.Tick();
  ASSERT_EQ(ended.size(), 2u);
  EXPECT_EQ(ended[0].message(), "two\nthree\nfour");
  EXPECT_EQ(ended[1].signal(), SIGSEGV);
  EXPECT_EQ(ended[1].message(), "Segmentation fault");
}

TEST_F(ReconcilerTest, NeverRestartsATaskThatExited) {
  Reconciler reconciler(Options(), launcher_, clock_);
  const v1::Task task = MakeTask("j1.g1.r0");
  reconciler.Apply({task});
  launcher_.Exit(1000, ExitInfo{1, 0});
  ASSERT_EQ(reconciler.Tick().size(), 1u);
  // The coordinator has not processed the exit yet and still lists the task.
  EXPECT_THAT(reconciler.Apply({task}), IsEmpty());
  reconciler.StatusesForSync();
  reconciler.Apply({});
  EXPECT_THAT(reconciler.Statuses(), IsEmpty());  // forgotten once reported and undesired
  EXPECT_THAT(reconciler.Apply({task}), IsEmpty());
  EXPECT_EQ(launcher_.launched().size(), 1u);
}

TEST_F(ReconcilerTest, EndedTaskIsKeptUntilASyncHasCarriedIt) {
  Reconciler reconciler(Options(), launcher_, clock_);
  reconciler.Apply({MakeTask("j1.g1.r0")});
  reconciler.StatusesForSync();  // sent while running
  launcher_.Exit(1000, ExitInfo{0, 0});
  reconciler.Tick();
  reconciler.Apply({});  // this Sync's request did not include the exit
  ASSERT_EQ(reconciler.Statuses().size(), 1u);
  reconciler.StatusesForSync();
  reconciler.Apply({});
  EXPECT_THAT(reconciler.Statuses(), IsEmpty());
}

TEST_F(ReconcilerTest, StopsUndesiredTasksWithSigtermThenSigkillAfterTheGracePeriod) {
  Reconciler reconciler(Options(), launcher_, clock_);
  reconciler.Apply({MakeTask("keep.g1.r0"), MakeTask("drop.g1.r0")});
  reconciler.Apply({MakeTask("keep.g1.r0")});
  EXPECT_THAT(launcher_.launched()[0].signals, IsEmpty());
  EXPECT_THAT(launcher_.launched()[1].signals, ElementsAre(SIGTERM));

  clock_.Advance(absl::Seconds(9));
  EXPECT_THAT(reconciler.Tick(), IsEmpty());
  EXPECT_THAT(launcher_.launched()[1].signals, ElementsAre(SIGTERM));

  clock_.Advance(absl::Seconds(1));
  reconciler.Tick();  // past the grace period: SIGKILL
  EXPECT_THAT(launcher_.launched()[1].signals, ElementsAre(SIGTERM, SIGKILL));
  std::vector<v1::TaskStatus> ended = reconciler.Tick();
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(ended[0].task_id(), "drop.g1.r0");
  EXPECT_EQ(ended[0].state(), v1::TASK_STOPPED);
  EXPECT_EQ(ended[0].signal(), SIGKILL);
  EXPECT_EQ(reconciler.RunningCount(), 1);
}

TEST_F(ReconcilerTest, KillsTasksOfAFailedAttemptAtOnceAndReportsTheirLastStep) {
  Reconciler reconciler(Options(), launcher_, clock_);
  reconciler.Apply({MakeTask("keep.g1.r0"), MakeTask("drop.g1.r0"), MakeTask("drop.g1.r1")});
  // What the trainer keeps in its folder after each update.
  {
    std::ofstream out(reconciler.TaskDir("drop.g1.r0") + "/" + kLastStepFile);
    out << "42                  \n";
  }
  reconciler.Apply({MakeTask("keep.g1.r0")}, {"drop.g1.r0", "drop.g1.r1"});
  EXPECT_THAT(launcher_.launched()[0].signals, IsEmpty());
  EXPECT_THAT(launcher_.launched()[1].signals, ElementsAre(SIGKILL));
  EXPECT_THAT(launcher_.launched()[2].signals, ElementsAre(SIGKILL));
  // Said again in the next Sync: no second signal.
  reconciler.Apply({MakeTask("keep.g1.r0")}, {"drop.g1.r0", "drop.g1.r1"});
  EXPECT_THAT(launcher_.launched()[1].signals, ElementsAre(SIGKILL));
  std::vector<v1::TaskStatus> ended = reconciler.Tick();
  ASSERT_EQ(ended.size(), 2u);
  std::map<std::string, v1::TaskStatus> by_id;
  for (const v1::TaskStatus& status : ended) by_id[status.task_id()] = status;
  EXPECT_EQ(by_id["drop.g1.r0"].state(), v1::TASK_STOPPED);
  EXPECT_EQ(by_id["drop.g1.r0"].signal(), SIGKILL);
  EXPECT_EQ(by_id["drop.g1.r0"].last_step(), 42);
  EXPECT_EQ(by_id["drop.g1.r1"].last_step(), -1);  // no file: unknown
  EXPECT_EQ(reconciler.RunningCount(), 1);
}

// A task asked to stop that dies of a signal this agent did not send (here a SIGKILL from
// elsewhere, before the grace period ran out) died on its own: an exit, not a stop, so that the
// coordinator sees the cause rather than the stop it asked for because of a peer's error.
TEST_F(ReconcilerTest, ADeathByAnotherSignalDuringAStopIsTheTasksOwn) {
  Reconciler reconciler(Options(), launcher_, clock_);
  reconciler.Apply({MakeTask("j1.g1.r0"), MakeTask("j1.g1.r1")});
  reconciler.Apply({});
  launcher_.Exit(1000, ExitInfo{0, SIGKILL});
  launcher_.Exit(1001, ExitInfo{0, SIGTERM});
  std::vector<v1::TaskStatus> ended = reconciler.Tick();
  ASSERT_EQ(ended.size(), 2u);
  EXPECT_EQ(ended[0].state(), v1::TASK_EXITED);
  EXPECT_EQ(ended[0].signal(), SIGKILL);
  EXPECT_THAT(ended[0].message(), Not(HasSubstr("stopped on request")));
  EXPECT_EQ(ended[1].state(), v1::TASK_STOPPED);  // ended by the SIGTERM sent for the stop
  EXPECT_EQ(ended[1].message(), "stopped on request");
  EXPECT_THAT(launcher_.launched()[0].signals, ElementsAre(SIGTERM));
}

// Told to kill a task of a failed attempt that is already dead (killed by someone, its peer's
// exit reported first): no SIGKILL, and its end is reported as its own, so that the coordinator
// sees the cause rather than its own stop.
TEST_F(ReconcilerTest, ATaskFoundDeadWhenKilledForAFailedAttemptDiedOnItsOwn) {
  Reconciler reconciler(Options(), launcher_, clock_);
  reconciler.Apply({MakeTask("j1.g1.r0"), MakeTask("j1.g1.r1")});
  launcher_.Exit(1001, ExitInfo{0, SIGKILL});  // not yet reaped by a Tick
  reconciler.Apply({}, {"j1.g1.r0", "j1.g1.r1"});
  EXPECT_THAT(launcher_.launched()[0].signals, ElementsAre(SIGKILL));
  EXPECT_THAT(launcher_.launched()[1].signals, IsEmpty());
  std::vector<v1::TaskStatus> ended = reconciler.Tick();
  ASSERT_EQ(ended.size(), 2u);
  std::map<std::string, v1::TaskStatus> by_id;
  for (const v1::TaskStatus& status : ended) by_id[status.task_id()] = status;
  EXPECT_EQ(by_id["j1.g1.r0"].state(), v1::TASK_STOPPED);
  EXPECT_EQ(by_id["j1.g1.r1"].state(), v1::TASK_EXITED);
  EXPECT_EQ(by_id["j1.g1.r1"].signal(), SIGKILL);
  EXPECT_THAT(by_id["j1.g1.r1"].message(), Not(HasSubstr("stopped on request")));
  EXPECT_EQ(reconciler.RunningCount(), 0);
}

TEST_F(ReconcilerTest, TaskThatStopsWithinTheGracePeriodGetsNoSigkill) {
  Reconciler reconciler(Options(), launcher_, clock_);
  reconciler.Apply({MakeTask("j1.g1.r0")});
  reconciler.Apply({});
  launcher_.Exit(1000, ExitInfo{0, 0});
  clock_.Advance(absl::Seconds(30));
  std::vector<v1::TaskStatus> ended = reconciler.Tick();
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(ended[0].state(), v1::TASK_STOPPED);
  EXPECT_EQ(ended[0].exit_code(), 0);
  EXPECT_THAT(launcher_.launched()[0].signals, ElementsAre(SIGTERM));
}

TEST_F(ReconcilerTest, FailedLaunchIsReportedAndNotRetried) {
  Reconciler reconciler(Options(), launcher_, clock_);
  launcher_.FailLaunches(absl::NotFoundError("cannot run the program for /x: No such file"));
  std::vector<v1::TaskStatus> changes = reconciler.Apply({MakeTask("j1.g1.r0")});
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].state(), v1::TASK_FAILED_TO_START);
  EXPECT_THAT(changes[0].message(), HasSubstr("No such file"));
  launcher_.FailLaunches(absl::OkStatus());
  EXPECT_THAT(reconciler.Apply({MakeTask("j1.g1.r0")}), IsEmpty());
  EXPECT_EQ(reconciler.RunningCount(), 0);
}

TEST_F(ReconcilerTest, StopAllStopsEverythingAndRefusesNewTasks) {
  Reconciler reconciler(Options(), launcher_, clock_);
  reconciler.Apply({MakeTask("a.g1.r0"), MakeTask("b.g1.r0")});
  reconciler.StopAll();
  EXPECT_THAT(launcher_.launched()[0].signals, ElementsAre(SIGTERM));
  EXPECT_THAT(launcher_.launched()[1].signals, ElementsAre(SIGTERM));
  EXPECT_THAT(reconciler.Apply({MakeTask("c.g1.r0")}), IsEmpty());
  EXPECT_EQ(launcher_.launched().size(), 2u);
  // Not a stop the coordinator asked for: the trainer's own exit code goes to the coordinator.
  launcher_.Exit(1000, ExitInfo{4, 0});
  std::vector<v1::TaskStatus> ended = reconciler.Tick();
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(ended[0].state(), v1::TASK_EXITED);
  EXPECT_EQ(ended[0].exit_code(), 4);
  EXPECT_THAT(ended[0].message(), HasSubstr("worker agent is shutting down"));
}

v1::Task WithStopDeadline(v1::Task task, absl::Time deadline) {
  task.set_stop_deadline_unix_ms(absl::ToUnixMillis(deadline));
  return task;
}

// What a trainer finds in its stop-deadline file at each signal it gets.
class SignalRecorder {
 public:
  SignalRecorder(FakeProcessLauncher& launcher, std::string work_dir)
      : work_dir_(std::move(work_dir)) {
    launcher.OnSignal([this](int64_t pid, int signal) {
      absl::MutexLock lock(&mu_);
      seen_.push_back(
          absl::StrCat(pid, " ", signal == SIGTERM ? "TERM" : "KILL", " ",
                       Read(absl::StrCat(work_dir_, "/tasks/", ids_[pid], "/stop-deadline"))));
    });
  }
  void Name(int64_t pid, const std::string& task_id) {
    absl::MutexLock lock(&mu_);
    ids_[pid] = task_id;
  }
  std::vector<std::string> seen() const {
    absl::MutexLock lock(&mu_);
    return seen_;
  }

 private:
  const std::string work_dir_;
  mutable absl::Mutex mu_;
  std::map<int64_t, std::string> ids_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> seen_ ABSL_GUARDED_BY(mu_);
};

TEST_F(ReconcilerTest, StopDeadlineIsWrittenBeforeSigtermAndSigkillComesAtTheDeadline) {
  Reconciler reconciler(Options(), launcher_, clock_);
  SignalRecorder recorder(launcher_, dir_);
  recorder.Name(1000, "j1.g1.r0");
  const v1::Task task = MakeTask("j1.g1.r0");
  reconciler.Apply({task});
  // Later than the stop grace period (10 s), which must not matter here.
  const absl::Time deadline = clock_.Now() + absl::Seconds(20);
  const std::string ms = absl::StrCat(absl::ToUnixMillis(deadline));
  EXPECT_THAT(reconciler.Apply({WithStopDeadline(task, deadline)}), IsEmpty());
  EXPECT_THAT(recorder.seen(), ElementsAre("1000 TERM " + ms + "\n"));
  EXPECT_EQ(Read(dir_ + "/tasks/j1.g1.r0/stop-deadline"), ms + "\n");

  // Every Sync repeats the deadline: one SIGTERM all the same.
  clock_.Advance(absl::Seconds(1));
  reconciler.Apply({WithStopDeadline(task, deadline)});
  clock_.Advance(absl::Seconds(19) - absl::Milliseconds(1));
  EXPECT_THAT(reconciler.Tick(), IsEmpty());
  EXPECT_THAT(launcher_.launched()[0].signals, ElementsAre(SIGTERM));

  clock_.Advance(absl::Milliseconds(1));
  EXPECT_THAT(reconciler.Tick(), IsEmpty());
  EXPECT_THAT(launcher_.launched()[0].signals, ElementsAre(SIGTERM, SIGKILL));
  std::vector<v1::TaskStatus> ended = reconciler.Tick();
  ASSERT_EQ(ended.size(), 1u);
  // For the coordinator to classify: not a stop it asked for without a deadline.
  EXPECT_EQ(ended[0].state(), v1::TASK_EXITED);
  EXPECT_EQ(ended[0].signal(), SIGKILL);
}

TEST_F(ReconcilerTest, TrainerThatSavesByItsDeadlineIsReportedExitedWithItsCode) {
  Reconciler reconciler(Options(), launcher_, clock_);
  const absl::Time deadline = clock_.Now() + absl::Seconds(20);
  reconciler.Apply({MakeTask("j1.g1.r0")});
  reconciler.Apply({WithStopDeadline(MakeTask("j1.g1.r0"), deadline)});
  clock_.Advance(absl::Seconds(5));
  std::ofstream(dir_ + "/tasks/j1.g1.r0/termination-message") << "stopped by SIGTERM at step 41\n";
  launcher_.Exit(1000, ExitInfo{143, 0});
  std::vector<v1::TaskStatus> ended = reconciler.Tick();
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(ended[0].state(), v1::TASK_EXITED);
  EXPECT_EQ(ended[0].exit_code(), 143);
  EXPECT_EQ(ended[0].signal(), 0);
  // The cause, then the trainer's own words; the exit code is the coordinator's to add, once.
  EXPECT_EQ(ended[0].message(),
            "asked to save and exit by 2023-11-14T22:13:40.000Z: stopped by SIGTERM at step 41");
  EXPECT_THAT(flushed_, ElementsAre("j1.g1.r0"));
  EXPECT_THAT(launcher_.launched()[0].signals, ElementsAre(SIGTERM));
}

TEST_F(ReconcilerTest, TaskFirstSeenWithAStopDeadlineStartsAndIsAskedToSaveAtOnce) {
  Reconciler reconciler(Options(), launcher_, clock_);
  SignalRecorder recorder(launcher_, dir_);
  recorder.Name(1000, "j1.g1.r0");
  const absl::Time deadline = clock_.Now() + absl::Seconds(5);
  std::vector<v1::TaskStatus> changes =
      reconciler.Apply({WithStopDeadline(MakeTask("j1.g1.r0"), deadline)});
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].state(), v1::TASK_RUNNING);
  EXPECT_THAT(recorder.seen(),
              ElementsAre(absl::StrCat("1000 TERM ", absl::ToUnixMillis(deadline), "\n")));
}

TEST_F(ReconcilerTest, SavingTaskThatLeavesTheDesiredStateIsNotCutShort) {
  Reconciler reconciler(Options(), launcher_, clock_);
  const absl::Time start = clock_.Now();
  // a: its deadline is later than the grace period from when it leaves; b: earlier.
  const v1::Task a = WithStopDeadline(MakeTask("a.g1.r0"), start + absl::Seconds(20));
  const v1::Task b = WithStopDeadline(MakeTask("b.g1.r0"), start + absl::Seconds(3));
  reconciler.Apply({MakeTask("a.g1.r0"), MakeTask("b.g1.r0")});
  reconciler.Apply({a, b});
  clock_.Advance(absl::Seconds(1));
  reconciler.Apply({});  // kill times: a at 20 s (its deadline), b at 11 s (the grace period)
  clock_.Advance(absl::Seconds(1));
  reconciler.Apply({});  // leaving again does not move them
  EXPECT_THAT(launcher_.launched()[0].signals, ElementsAre(SIGTERM));
  EXPECT_THAT(launcher_.launched()[1].signals, ElementsAre(SIGTERM));

  clock_.Advance(absl::Seconds(9) - absl::Milliseconds(1));  // 11 s - 1 ms
  reconciler.Tick();
  EXPECT_THAT(launcher_.launched()[1].signals, ElementsAre(SIGTERM));
  clock_.Advance(absl::Milliseconds(1));
  reconciler.Tick();
  EXPECT_THAT(launcher_.launched()[1].signals, ElementsAre(SIGTERM, SIGKILL));
  EXPECT_THAT(launcher_.launched()[0].signals, ElementsAre(SIGTERM));
  std::vector<v1::TaskStatus> ended = reconciler.Tick();
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(ended[0].task_id(), "b.g1.r0");
  EXPECT_EQ(ended[0].state(), v1::TASK_EXITED);
  EXPECT_EQ(ended[0].signal(), SIGKILL);

  clock_.Advance(absl::Seconds(9) - absl::Milliseconds(1));  // 20 s - 1 ms
  reconciler.Tick();
  EXPECT_THAT(launcher_.launched()[0].signals, ElementsAre(SIGTERM));
  launcher_.Exit(1000, ExitInfo{143, 0});
  ended = reconciler.Tick();
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(ended[0].task_id(), "a.g1.r0");
  EXPECT_EQ(ended[0].state(), v1::TASK_EXITED);
  EXPECT_EQ(ended[0].exit_code(), 143);
}

TEST_F(ReconcilerTest, UndesiredTaskWithoutADeadlineIsStoppedAsBeforeAndGetsNoFile) {
  Reconciler reconciler(Options(), launcher_, clock_);
  reconciler.Apply({MakeTask("j1.g1.r0")});
  reconciler.Apply({});
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/tasks/j1.g1.r0/stop-deadline"));
  launcher_.Exit(1000, ExitInfo{143, 0});
  std::vector<v1::TaskStatus> ended = reconciler.Tick();
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(ended[0].state(), v1::TASK_STOPPED);
}

TEST_F(ReconcilerTest, StopAllByAsksEveryTrainerToSaveAndKillsAtTheGivenTime) {
  Reconciler reconciler(Options(), launcher_, clock_);
  SignalRecorder recorder(launcher_, dir_);
  recorder.Name(1000, "run.g1.r0");
  recorder.Name(1001, "leaving.g1.r0");
  recorder.Name(1002, "saving.g1.r0");
  const absl::Time start = clock_.Now();
  reconciler.Apply({MakeTask("run.g1.r0"), MakeTask("leaving.g1.r0"), MakeTask("saving.g1.r0")});
  // Already leaving (SIGKILL due at 10 s) and already saving for the coordinator (by 60 s).
  reconciler.Apply({MakeTask("run.g1.r0"),
                    WithStopDeadline(MakeTask("saving.g1.r0"), start + absl::Seconds(60))});

  const absl::Time kill_at = start + absl::Seconds(5);
  const std::string ms = absl::StrCat(absl::ToUnixMillis(kill_at));
  reconciler.StopAllBy(kill_at);
  // The two SIGTERMs from before, then one for the trainer not yet asked, its file in place.
  EXPECT_THAT(
      recorder.seen(),
      ElementsAre("1001 TERM ", absl::StrCat("1002 TERM ", absl::ToUnixMillis(start) + 60000, "\n"),
                  "1000 TERM " + ms + "\n"));
  EXPECT_EQ(Read(dir_ + "/tasks/saving.g1.r0/stop-deadline"), ms + "\n");
  EXPECT_EQ(Read(dir_ + "/tasks/leaving.g1.r0/stop-deadline"), ms + "\n");
  // New tasks are refused; a later call never moves the kill times back.
  EXPECT_THAT(reconciler.Apply({MakeTask("new.g1.r0")}), IsEmpty());
  reconciler.StopAllBy(start + absl::Seconds(30));
  EXPECT_EQ(Read(dir_ + "/tasks/run.g1.r0/stop-deadline"), ms + "\n");

  launcher_.Exit(1000, ExitInfo{143, 0});
  clock_.Advance(absl::Seconds(5) - absl::Milliseconds(1));
  std::vector<v1::TaskStatus> ended = reconciler.Tick();
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(ended[0].state(), v1::TASK_EXITED);
  EXPECT_EQ(ended[0].exit_code(), 143);
  EXPECT_THAT(ended[0].message(), HasSubstr("being preempted"));
  EXPECT_THAT(launcher_.launched()[1].signals, ElementsAre(SIGTERM));
  EXPECT_THAT(launcher_.launched()[2].signals, ElementsAre(SIGTERM));

  clock_.Advance(absl::Milliseconds(1));
  reconciler.Tick();
  EXPECT_THAT(launcher_.launched()[1].signals, ElementsAre(SIGTERM, SIGKILL));
  EXPECT_THAT(launcher_.launched()[2].signals, ElementsAre(SIGTERM, SIGKILL));
  ended = reconciler.Tick();
  ASSERT_EQ(ended.size(), 2u);
  EXPECT_EQ(ended[0].task_id(), "leaving.g1.r0");
  EXPECT_EQ(ended[0].state(), v1::TASK_STOPPED);  // the coordinator had asked for that stop
  EXPECT_EQ(ended[1].task_id(), "saving.g1.r0");
  EXPECT_EQ(ended[1].state(), v1::TASK_EXITED);
  EXPECT_EQ(reconciler.RunningCount(), 0);
}

TEST_F(ReconcilerTest, TaskOfAnEarlierAgentRunIsReportedLostNotRestarted) {
  std::filesystem::create_directories(dir_ + "/tasks/old.g1.r0");
  // A pid that is certainly not a trainer: this test process.
  std::ofstream(dir_ + "/tasks/old.g1.r0/pid") << getpid() << "\n";
  Reconciler reconciler(Options(), launcher_, clock_);
  EXPECT_EQ(reconciler.CleanUpLeftovers(), 0);  // and this process is still alive
  std::vector<v1::TaskStatus> changes = reconciler.Apply({MakeTask("old.g1.r0")});
  ASSERT_EQ(changes.size(), 1u);
  // The agent's restart ended it: stopped, which the coordinator counts as infrastructure.
  EXPECT_EQ(changes[0].state(), v1::TASK_STOPPED);
  EXPECT_EQ(changes[0].signal(), SIGKILL);
  EXPECT_THAT(changes[0].message(), HasSubstr("agent restarted"));
  EXPECT_THAT(launcher_.launched(), IsEmpty());
}

TEST_F(ReconcilerTest, FoldersOfForgottenTasksAreRemovedAfterTheRetention) {
  std::filesystem::create_directories(dir_ + "/tasks/old.g1.r0");  // an earlier run's
  ReconcilerOptions options = Options();
  options.task_retention = absl::Hours(1);
  Reconciler reconciler(options, launcher_, clock_);
  reconciler.CleanUpLeftovers();
  reconciler.Apply({MakeTask("done.g1.r0"), MakeTask("runs.g1.r0")});
  launcher_.Exit(1000, ExitInfo{0, 0});
  ASSERT_EQ(reconciler.Tick().size(), 1u);
  reconciler.StatusesForSync();
  reconciler.Apply({MakeTask("runs.g1.r0")});  // done.g1.r0 is forgotten now
  const std::string done = reconciler.TaskDir("done.g1.r0");
  ASSERT_TRUE(std::filesystem::exists(done));

  clock_.Advance(absl::Minutes(59));
  EXPECT_EQ(reconciler.RemoveExpiredTaskDirs(), 0);
  EXPECT_TRUE(std::filesystem::exists(done));
  clock_.Advance(absl::Minutes(2));
  EXPECT_EQ(reconciler.RemoveExpiredTaskDirs(), 2);
  EXPECT_FALSE(std::filesystem::exists(done));
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/tasks/old.g1.r0"));
  EXPECT_TRUE(std::filesystem::exists(reconciler.TaskDir("runs.g1.r0")));
  EXPECT_EQ(reconciler.RunningCount(), 1);
}

TEST(TailLinesTest, LastLines) {
  std::string tmpl = ::testing::TempDir() + "/tail-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
  const std::string path = tmpl + "/log";
  EXPECT_EQ(TailLines(path, 3), "");
  std::ofstream(path) << "a\nb\n";
  EXPECT_EQ(TailLines(path, 3), "a\nb");
  std::ofstream(path) << "a\nb\nc\nd";
  EXPECT_EQ(TailLines(path, 3), "b\nc\nd");
  std::filesystem::remove_all(tmpl);
}

TEST(BackoffTest, GrowsExponentiallyWithJitterUpToTheMaximum) {
  Backoff backoff(absl::Milliseconds(100), absl::Seconds(5));
  absl::Duration base = absl::Milliseconds(100);
  for (int i = 0; i < 12; ++i) {
    const absl::Duration d = backoff.Next();
    EXPECT_GE(d, base / 2) << i;
    EXPECT_LE(d, base) << i;
    base = std::min(base * 2, absl::Seconds(5));
  }
  backoff.Reset();
  EXPECT_LE(backoff.Next(), absl::Milliseconds(100));
}

// An isolation the test scripts: what Prepare returns, which tasks are over their limit, and
// what each one's end says.
class ScriptedIsolation final : public TaskIsolation {
 public:
  std::string Name() const override { return "scripted"; }
  absl::StatusOr<std::vector<std::string>> Prepare(const std::string& task_id,
                                                   const TaskLimits& limits) override {
    absl::MutexLock lock(&mu_);
    prepared[task_id] = limits;
    if (!fail_prepare.ok()) return fail_prepare;
    return std::vector<std::string>{"/cgroup/" + task_id + "/cgroup.procs"};
  }
  void Started(const std::string& task_id, pid_t pid) override {
    absl::MutexLock lock(&mu_);
    started[task_id] = pid;
  }
  std::vector<std::string> OverLimit() override {
    absl::MutexLock lock(&mu_);
    return std::exchange(over, {});
  }
  TaskMemoryEnd Finish(const std::string& task_id, int, int) override {
    absl::MutexLock lock(&mu_);
    finished.push_back(task_id);
    return ends[task_id];
  }

  absl::Mutex mu_;
  std::map<std::string, TaskLimits> prepared;
  std::map<std::string, pid_t> started;
  std::vector<std::string> over;
  std::map<std::string, TaskMemoryEnd> ends;
  std::vector<std::string> finished;
  absl::Status fail_prepare;
};

// The task's limits go to the isolation, the child joins its cgroups, and an end for memory is
// reported as such with the limit and the peak, ahead of the log's own last words.
TEST_F(ReconcilerTest, TasksRunInTheirLimitsAndOutOfMemoryIsReported) {
  ScriptedIsolation isolation;
  ReconcilerOptions options = Options();
  options.isolation = &isolation;
  Reconciler reconciler(options, launcher_, clock_);
  v1::Task task = MakeTask("j1.g1.r0");
  task.set_memory_limit_bytes(256 << 20);
  task.set_cpu_limit(1.5);
  ASSERT_EQ(reconciler.Apply({task}).size(), 1u);
  EXPECT_EQ(isolation.prepared["j1.g1.r0"].memory_bytes, 256 << 20);
  EXPECT_EQ(isolation.prepared["j1.g1.r0"].cpus, 1.5);
  EXPECT_EQ(isolation.started["j1.g1.r0"], 1000);
  ASSERT_EQ(launcher_.launched().size(), 1u);
  EXPECT_THAT(launcher_.launched()[0].options.join_cgroups,
              ElementsAre("/cgroup/j1.g1.r0/cgroup.procs"));

  launcher_.Exit(1000, ExitInfo{137, SIGKILL});
  isolation.ends["j1.g1.r0"] =
      TaskMemoryEnd{true, 256 << 20, 255 << 20, "the kernel's OOM killer in its cgroup"};
  std::vector<v1::TaskStatus> ended = reconciler.Tick();
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(ended[0].state(), v1::TASK_EXITED);
  EXPECT_TRUE(ended[0].out_of_memory());
  EXPECT_EQ(ended[0].memory_limit_bytes(), 256 << 20);
  EXPECT_EQ(ended[0].memory_peak_bytes(), 255 << 20);
  EXPECT_THAT(ended[0].message(),
              HasSubstr("out of memory: killed at its limit of 256.0 MiB, peak 255.0 MiB (the "
                        "kernel's OOM killer in its cgroup)"));
  EXPECT_THAT(isolation.finished, ElementsAre("j1.g1.r0"));
}

// Under the watch, a task the isolation finds over its limit gets SIGKILL at the next Tick, and
// its end is its own even while a stop was asked of it.
TEST_F(ReconcilerTest, ATaskOverItsLimitIsKilled) {
  ScriptedIsolation isolation;
  ReconcilerOptions options = Options();
  options.isolation = &isolation;
  Reconciler reconciler(options, launcher_, clock_);
  v1::Task task = MakeTask("j1.g1.r0");
  task.set_memory_limit_bytes(128 << 20);
  reconciler.Apply({task});
  reconciler.Apply({});  // asked to stop: SIGTERM
  isolation.over = {"j1.g1.r0"};
  isolation.ends["j1.g1.r0"] = TaskMemoryEnd{true, 128 << 20, 300 << 20, "the agent's watch"};
  std::vector<v1::TaskStatus> ended = reconciler.Tick();
  EXPECT_THAT(launcher_.launched()[0].signals, ElementsAre(SIGTERM, SIGKILL));
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(ended[0].state(), v1::TASK_EXITED);
  EXPECT_EQ(ended[0].signal(), SIGKILL);
  EXPECT_TRUE(ended[0].out_of_memory());
}

// A task whose cgroup cannot be made does not start, and says why.
TEST_F(ReconcilerTest, ATaskThatCannotBeConfinedFailsToStart) {
  ScriptedIsolation isolation;
  isolation.fail_prepare = absl::FailedPreconditionError("mkdir /cgroup/x: Permission denied");
  ReconcilerOptions options = Options();
  options.isolation = &isolation;
  Reconciler reconciler(options, launcher_, clock_);
  std::vector<v1::TaskStatus> changes = reconciler.Apply({MakeTask("j1.g1.r0")});
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].state(), v1::TASK_FAILED_TO_START);
  EXPECT_THAT(changes[0].message(),
              HasSubstr("cannot confine it: mkdir /cgroup/x: Permission denied"));
  EXPECT_THAT(launcher_.launched(), IsEmpty());
}

}  // namespace
}  // namespace trainyard
