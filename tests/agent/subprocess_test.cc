#include "worker/agent/subprocess.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <utility>

#include "absl/time/clock.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/inherited_signals.h"
#include "trainyard/v1/agent_service.pb.h"
#include "worker/agent/process_launcher.h"
#include "worker/agent/reconciler.h"
#include "worker/agent/task_user.h"

namespace trainyard {
namespace {

using ::testing::HasSubstr;

class SubprocessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/subprocess-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  static std::string Read(const std::string& path) {
    std::ifstream in(path);
    std::ostringstream out;
    out << in.rdbuf();
    return out.str();
  }
  // Blocks until the process ends (bounded by the test timeout).
  static ExitInfo Wait(pid_t pid) {
    absl::StatusOr<ExitInfo> exit = WaitSubprocess(pid);
    EXPECT_TRUE(exit.ok()) << exit.status();
    return exit.value_or(ExitInfo{-1, -1});
  }

  std::string dir_;
};

TEST_F(SubprocessTest, CapturesStdoutAndStderrInTheFileAndReportsExitCode) {
  SubprocessOptions options;
  options.argv = {"/bin/sh", "-c", "echo out; echo err >&2; exit 7"};
  options.output_file = dir_ + "/output.log";
  absl::StatusOr<pid_t> pid = StartSubprocess(options);
  ASSERT_TRUE(pid.ok()) << pid.status();
  const ExitInfo exit = Wait(*pid);
  EXPECT_EQ(exit.exit_code, 7);
  EXPECT_EQ(exit.signal, 0);
  EXPECT_EQ(Read(options.output_file), "out\nerr\n");
  EXPECT_EQ(DescribeExit(exit), "exited with code 7");
}

TEST_F(SubprocessTest, AppendsToAnExistingOutputFile) {
  const std::string log = dir_ + "/output.log";
  std::ofstream(log) << "before\n";
  SubprocessOptions options;
  options.argv = {"/bin/echo", "after"};
  options.output_file = log;
  absl::StatusOr<pid_t> pid = StartSubprocess(options);
  ASSERT_TRUE(pid.ok());
  Wait(*pid);
  EXPECT_EQ(Read(log), "before\nafter\n");
}

TEST_F(SubprocessTest, SetsEnvironmentAndWorkingDirectory) {
  SubprocessOptions options;
  options.argv = {"/bin/sh", "-c", "echo \"$OMP_NUM_THREADS|$CUDA_VISIBLE_DEVICES|$(pwd)\""};
  options.env = {{"OMP_NUM_THREADS", "3"}, {"CUDA_VISIBLE_DEVICES", ""}};
  options.working_dir = dir_;
  options.output_file = dir_ + "/output.log";
  absl::StatusOr<pid_t> pid = StartSubprocess(options);
  ASSERT_TRUE(pid.ok());
  Wait(*pid);
  EXPECT_EQ(Read(options.output_file), "3||" + std::filesystem::canonical(dir_).string() + "\n");
}

// Only the variables the filter admits pass from the caller; those set for the child do anyway.
TEST_F(SubprocessTest, InheritsOnlyWhatTheFilterAdmits) {
  setenv("TRAINYARD_TOKEN", "agent-secret", 1);
  setenv("OMP_PROC_BIND", "close", 1);
  SubprocessOptions options;
  options.argv = {"/bin/sh", "-c", "echo \"${TRAINYARD_TOKEN:-none}|$OMP_PROC_BIND|$MINE\""};
  options.env = {{"MINE", "set"}};
  options.inherit = [](absl::string_view name) { return PassesToTrainers(name, {}); };
  options.output_file = dir_ + "/output.log";
  absl::StatusOr<pid_t> pid = StartSubprocess(options);
  ASSERT_TRUE(pid.ok()) << pid.status();
  Wait(*pid);
  EXPECT_EQ(Read(options.output_file), "none|close|set\n");
  unsetenv("TRAINYARD_TOKEN");
  unsetenv("OMP_PROC_BIND");
}

// The child runs as the user it is given (no other groups), after its output file is opened as
// the caller: it writes there but cannot read what only the caller may.
TEST_F(SubprocessTest, RunsAsTheUserItIsGiven) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root";
  const std::string secret = dir_ + "/secret";
  std::ofstream(secret) << "s";
  std::filesystem::permissions(secret, std::filesystem::perms::owner_read);
  std::filesystem::permissions(dir_, std::filesystem::perms(0755));
  SubprocessOptions options;
  options.argv = {"/bin/sh", "-c", "echo $(id -u) $(id -g) $(id -G); cat " + secret + " || exit 9"};
  options.output_file = dir_ + "/output.log";
  options.output_mode = 0600;
  options.uid = 61234;
  absl::StatusOr<pid_t> pid = StartSubprocess(options);
  ASSERT_TRUE(pid.ok()) << pid.status();
  EXPECT_EQ(Wait(*pid).exit_code, 9);
  EXPECT_THAT(Read(options.output_file), ::testing::StartsWith("61234 61234 61234\n"));
  struct stat st;
  ASSERT_EQ(stat(options.output_file.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(st.st_uid, 0u);
}

TEST(TaskUserTest, TrainersGetTheRuntimesSettingsAndNoneOfTheAgentsCredentials) {
  for (const char* passed :
       {"PATH", "HOME", "LANG", "LC_ALL", "OMP_NUM_THREADS", "CUDA_HOME", "NCCL_DEBUG",
        "AWS_ACCESS_KEY_ID", "https_proxy", "TRAINYARD_TEST_X"}) {
    EXPECT_TRUE(PassesToTrainers(passed, {})) << passed;
  }
  for (const char* kept :
       {"TRAINYARD_TOKEN", "TRAINYARD_TOKEN_FILE", "TRAINYARD_KEY_FILE", "DATABASE_URL",
        "GOOGLE_APPLICATION_CREDENTIALS", "PATHX", "LD_PRELOAD"}) {
    EXPECT_FALSE(PassesToTrainers(kept, {})) << kept;
  }
  EXPECT_TRUE(PassesToTrainers("DATABASE_URL", {"DATABASE_URL"}));
}

TEST(TaskUserTest, TheRangeIsParsedStrictly) {
  EXPECT_TRUE(ParseTaskUidRange("")->empty());
  absl::StatusOr<TaskUidRange> range = ParseTaskUidRange("60000-60009");
  ASSERT_TRUE(range.ok()) << range.status();
  EXPECT_EQ(range->first, 60000);
  EXPECT_EQ(range->last, 60009);
  for (const char* bad : {"60000", "0-100", "60010-60000", "a-b", "60000-60009-1", "-5-3"}) {
    EXPECT_EQ(ParseTaskUidRange(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(TaskUserTest, AJobHasOneUserOnEveryWorkerUnlessAnotherJobHoldsIt) {
  const TaskUidRange range{60000, 60009};
  const int uid = TaskUid(range, "train-7", {});
  EXPECT_GE(uid, 60000);
  EXPECT_LE(uid, 60009);
  EXPECT_EQ(TaskUid(range, "train-7", {}), uid);
  const int next = TaskUid(range, "train-7", {uid});
  EXPECT_NE(next, uid);
  EXPECT_EQ(next, uid == 60009 ? 60000 : uid + 1);
  std::set<int> all;
  for (int i = 60000; i <= 60009; ++i) all.insert(i);
  EXPECT_EQ(TaskUid(range, "train-7", all), uid);
}

TEST_F(SubprocessTest, ReportsTheSignalThatEndedAProcess) {
  SubprocessOptions options;
  options.argv = {"/bin/sh", "-c", "kill -9 $$"};
  absl::StatusOr<pid_t> pid = StartSubprocess(options);
  ASSERT_TRUE(pid.ok());
  const ExitInfo exit = Wait(*pid);
  EXPECT_EQ(exit.signal, SIGKILL);
  EXPECT_EQ(DescribeExit(exit), "killed by signal 9 (SIGKILL)");
}

// What the agent's own start ignored or blocked (a shell's background job ignores SIGINT and
// SIGQUIT) does not reach a task.
TEST_F(SubprocessTest, AChildStartsWithEverySignalAtItsDefaultAndNoneBlocked) {
  SubprocessOptions options;
  options.argv = {"/bin/cat", "/proc/self/status"};
  options.output_file = dir_ + "/status";
  absl::StatusOr<pid_t> pid;
  {
    testing::InheritedSignals inherited({SIGQUIT, SIGUSR1}, {SIGUSR2});
    pid = StartSubprocess(options);
  }
  ASSERT_TRUE(pid.ok()) << pid.status();
  EXPECT_EQ(Wait(*pid).exit_code, 0);
  const std::string status = Read(dir_ + "/status");
  EXPECT_EQ(testing::StatusSignalMask(status, "SigIgn") & ~testing::kGlibcInternalSignals, 0u)
      << status;
  EXPECT_EQ(testing::StatusSignalMask(status, "SigBlk"), 0u) << status;
}

TEST_F(SubprocessTest, FailedExecIsAnErrorNotAProcess) {
  SubprocessOptions options;
  options.argv = {dir_ + "/no-such-program", "--flag"};
  absl::StatusOr<pid_t> pid = StartSubprocess(options);
  ASSERT_FALSE(pid.ok());
  EXPECT_EQ(pid.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(pid.status().message(), HasSubstr("no-such-program"));

  const std::string not_executable = dir_ + "/script";
  std::ofstream(not_executable) << "#!/bin/sh\n";
  options.argv = {not_executable};
  pid = StartSubprocess(options);
  ASSERT_FALSE(pid.ok());
  EXPECT_EQ(pid.status().code(), absl::StatusCode::kPermissionDenied);
}

TEST_F(SubprocessTest, ChildLeadsItsOwnProcessGroup) {
  SubprocessOptions options;
  options.argv = {"/bin/sh", "-c", "sleep 30"};
  absl::StatusOr<pid_t> pid = StartSubprocess(options);
  ASSERT_TRUE(pid.ok());
  // setsid happens before exec, and StartSubprocess returns after exec.
  EXPECT_EQ(getpgid(*pid), *pid);
  ASSERT_TRUE(SignalSubprocess(*pid, SIGKILL, /*group=*/true).ok());
  EXPECT_EQ(Wait(*pid).signal, SIGKILL);
  // Signalling a process that is gone is not an error.
  EXPECT_TRUE(SignalSubprocess(*pid, SIGTERM, /*group=*/true).ok());
}

TEST_F(SubprocessTest, TryWaitIsNonBlockingAndRefusesUnknownPids) {
  SubprocessOptions options;
  options.argv = {"/bin/sh", "-c", "sleep 30"};
  absl::StatusOr<pid_t> pid = StartSubprocess(options);
  ASSERT_TRUE(pid.ok());
  absl::StatusOr<std::optional<ExitInfo>> exit = TryWaitSubprocess(*pid);
  ASSERT_TRUE(exit.ok());
  EXPECT_FALSE(exit->has_value());
  SignalSubprocess(*pid, SIGKILL, true).IgnoreError();
  Wait(*pid);
  EXPECT_EQ(TryWaitSubprocess(*pid).status().code(), absl::StatusCode::kFailedPrecondition);
}

// The reconciler over real processes: SIGTERM, then SIGKILL after the grace period for a trainer
// that ignores SIGTERM.
TEST_F(SubprocessTest, StopEscalatesToSigkillForAChildThatTrapsSigterm) {
  const std::string trainer = dir_ + "/trainyard-trainer";
  {
    std::ofstream script(trainer);
    script << "#!/bin/sh\ntrap 'echo got TERM' TERM\necho ready\n"
           << "while true; do sleep 0.05; done\n";
  }
  std::filesystem::permissions(trainer, std::filesystem::perms::owner_all);
  std::unique_ptr<ProcessLauncher> launcher = NewRealProcessLauncher();
  ReconcilerOptions options;
  options.work_dir = dir_ + "/work";
  options.trainer_path = trainer;
  options.coordinator = "127.0.0.1:1";
  options.stop_grace_period = absl::Milliseconds(300);
  Reconciler reconciler(options, *launcher, RealClock::Get());

  v1::Task task;
  task.set_task_id("job1.g1.r0");
  std::vector<v1::TaskStatus> started = reconciler.Apply({task});
  ASSERT_EQ(started.size(), 1u);
  ASSERT_EQ(started[0].state(), v1::TASK_RUNNING);
  const pid_t pid = static_cast<pid_t>(started[0].pid());
  // Wait until the trap is installed, so SIGTERM is really ignored.
  const std::string log = reconciler.LogPath(task.task_id());
  for (int i = 0; i < 1000 && Read(log).find("ready") == std::string::npos; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_THAT(Read(log), HasSubstr("ready"));
  EXPECT_EQ(Read(reconciler.TaskDir(task.task_id()) + "/pid"), std::to_string(pid) + "\n");

  const absl::Time stop_at = absl::Now();
  reconciler.Apply({});
  std::vector<v1::TaskStatus> ended;
  while (ended.empty() && absl::Now() - stop_at < absl::Seconds(20)) {
    ended = reconciler.Tick();
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_GE(absl::Now() - stop_at, absl::Milliseconds(300));
  EXPECT_EQ(ended[0].state(), v1::TASK_STOPPED);
  EXPECT_EQ(ended[0].signal(), SIGKILL);
  EXPECT_EQ(ended[0].message(), "stopped on request");  // the signal is in its own field
  EXPECT_THAT(Read(log), HasSubstr("got TERM"));
  EXPECT_NE(kill(pid, 0), 0);  // gone, and reaped
}

TEST_F(SubprocessTest, RealTrainerExitIsReportedWithTheTailOfItsLog) {
  const std::string trainer = dir_ + "/trainer.sh";
  {
    std::ofstream script(trainer);
    script << "#!/bin/sh\necho \"args $*\"\necho \"omp=$OMP_NUM_THREADS\"\n"
           << "test -f task.pb || exit 9\necho line3\necho line4\nexit 3\n";
  }
  std::filesystem::permissions(trainer, std::filesystem::perms::owner_all);
  std::unique_ptr<ProcessLauncher> launcher = NewRealProcessLauncher();
  ReconcilerOptions options;
  options.work_dir = dir_ + "/work";
  options.trainer_path = trainer;
  options.coordinator = "10.0.0.1:7070";
  Reconciler reconciler(options, *launcher, RealClock::Get());
  v1::Task task;
  task.set_task_id("job2.g1.r0");
  task.set_slots(2);
  ASSERT_EQ(reconciler.Apply({task})[0].state(), v1::TASK_RUNNING);
  std::vector<v1::TaskStatus> ended;
  for (int i = 0; i < 1000 && ended.empty(); ++i) {
    ended = reconciler.Tick();
    if (ended.empty()) absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(ended[0].state(), v1::TASK_EXITED);
  EXPECT_EQ(ended[0].exit_code(), 3);
  EXPECT_EQ(ended[0].message(), "omp=2\nline3\nline4");
  const std::string log = Read(reconciler.LogPath(task.task_id()));
  EXPECT_THAT(log, HasSubstr("args --task_file=" + reconciler.TaskDir(task.task_id()) +
                             "/task.pb --coordinator=10.0.0.1:7070"));
}

// Only the trainer its pid file names and that runs that very task: a pid taken since by another
// agent's trainer on this machine (whose task file is elsewhere) lives on.
TEST_F(SubprocessTest, CleanUpLeftoversKillsATrainerOfAnEarlierAgentRunAndNoOther) {
  const std::string trainer = dir_ + "/trainyard-trainer";
  {
    std::ofstream script(trainer);
    script << "#!/bin/sh\nwhile true; do sleep 0.05; done\n";
  }
  std::filesystem::permissions(trainer, std::filesystem::perms::owner_all);
  auto start = [&](const std::string& task_file) {
    SubprocessOptions options;
    options.argv = {trainer, "--task_file=" + task_file};
    absl::StatusOr<pid_t> pid = StartSubprocess(options);
    EXPECT_TRUE(pid.ok()) << pid.status();
    return pid.ok() ? *pid : 0;
  };
  const pid_t mine = start(dir_ + "/work/tasks/j.g1.r0/task.pb");
  const pid_t others = start(dir_ + "/other-work/tasks/k.g1.r0/task.pb");
  ASSERT_GT(mine, 0);
  ASSERT_GT(others, 0);
  for (const auto& [task, pid] : {std::pair<std::string, pid_t>{"j.g1.r0", mine},
                                  std::pair<std::string, pid_t>{"k.g1.r0", others}}) {
    std::filesystem::create_directories(dir_ + "/work/tasks/" + task);
    std::ofstream(dir_ + "/work/tasks/" + task + "/task.pb") << "task";
    std::ofstream(dir_ + "/work/tasks/" + task + "/pid") << pid << "\n";
  }
  std::filesystem::create_directories(dir_ + "/other-work/tasks/k.g1.r0");
  std::ofstream(dir_ + "/other-work/tasks/k.g1.r0/task.pb") << "task";

  std::unique_ptr<ProcessLauncher> launcher = NewRealProcessLauncher();
  ReconcilerOptions reconciler_options;
  reconciler_options.work_dir = dir_ + "/work";
  reconciler_options.trainer_path = trainer;
  Reconciler reconciler(reconciler_options, *launcher, RealClock::Get());
  EXPECT_EQ(reconciler.CleanUpLeftovers(), 1);
  EXPECT_EQ(Wait(mine).signal, SIGKILL);
  EXPECT_EQ(kill(others, 0), 0) << "another agent's trainer was killed";
  kill(others, SIGKILL);
  EXPECT_EQ(Wait(others).signal, SIGKILL);
}

}  // namespace
}  // namespace trainyard
