// Task isolation against the kernel's own cgroups (CI runs as root; a machine where the agent
// could not make them fails here with the reason rather than passing), the watch without them,
// and the cgroup v2 file protocol on a folder laid out as a v2 hierarchy.

#include "worker/agent/task_isolation.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/common/process_cpu.h"
#include "worker/agent/subprocess.h"

namespace trainyard {
namespace {

using trainyard::testing::CpuSeconds;

// Debian's, or the one TRAINYARD_TEST_PYTHON names (the GPU machine keeps its own elsewhere).
std::string Python() {
  const char* python = getenv("TRAINYARD_TEST_PYTHON");
  return python != nullptr && *python != '\0' ? python : "/usr/bin/python3";
}
constexpr int64_t kMiB = int64_t{1} << 20;

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

void Write(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
}

// Polls an observable condition until it holds or `timeout` passes.
bool PollUntil(const std::function<bool()>& condition, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (condition()) return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return condition();
}

// The value of `key` in a "key value" file (cpu.stat).
int64_t Keyed(const std::string& path, const std::string& key) {
  for (absl::string_view line : absl::StrSplit(Read(path), '\n')) {
    std::vector<absl::string_view> f = absl::StrSplit(line, ' ');
    int64_t v;
    if (f.size() == 2 && f[0] == key && absl::SimpleAtoi(f[1], &v)) return v;
  }
  return -1;
}

class TaskIsolationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/isolation-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    for (pid_t pid : pids_) {
      SignalSubprocess(pid, SIGKILL, true).IgnoreError();
      TryWaitSubprocess(pid).IgnoreError();
    }
    std::filesystem::remove_all(dir_);
  }

  // Python running `code` in `join`'s cgroups, output to a file of the test's.
  pid_t StartPython(const std::string& code, const std::vector<std::string>& join) {
    SubprocessOptions options;
    options.argv = {Python(), "-c", code};
    options.output_file = dir_ + "/python.log";
    options.join_cgroups = join;
    absl::StatusOr<pid_t> pid = StartSubprocess(options);
    EXPECT_TRUE(pid.ok()) << pid.status();
    if (!pid.ok()) return -1;
    pids_.push_back(*pid);
    return *pid;
  }

  std::unique_ptr<TaskIsolation> Cgroups() {
    IsolationOptions options;
    options.name = "isolation-test";
    options.total_memory_bytes = 2048 * kMiB;
    std::string notes;
    absl::StatusOr<std::unique_ptr<TaskIsolation>> isolation = NewTaskIsolation(options, &notes);
    EXPECT_TRUE(isolation.ok()) << isolation.status();
    if (!isolation.ok()) return nullptr;
    if ((*isolation)->Name() == "watch") {
      ADD_FAILURE() << "this machine gives the agent no cgroups (run as root with the cgroup v1 "
                       "memory and cpu controllers, or a delegated cgroup v2): "
                    << notes;
      return nullptr;
    }
    std::cout << "task isolation: " << (*isolation)->Name() << " (" << notes << ")\n";
    return *std::move(isolation);
  }

  std::string dir_;
  std::vector<pid_t> pids_;
};

// Grows by 8 MiB every 10 ms, touching every page, and never stops by itself.
constexpr char kHog[] =
    "import time\n"
    "a = []\n"
    "while True:\n"
    "    a.append(bytearray(8 << 20))\n"
    "    time.sleep(0.01)\n";

// The task over its limit is killed by the kernel and named out of memory, with its peak; its
// neighbour, in a cgroup of its own on the same agent, runs on untouched.
TEST_F(TaskIsolationTest, OutOfMemoryKillsOnlyTheTaskOverItsLimit) {
  std::unique_ptr<TaskIsolation> isolation = Cgroups();
  ASSERT_NE(isolation, nullptr);
  absl::StatusOr<std::vector<std::string>> neighbour_join =
      isolation->Prepare("neighbour", {256 * kMiB, 0});
  ASSERT_TRUE(neighbour_join.ok()) << neighbour_join.status();
  const pid_t neighbour = StartPython("import time\na = bytearray(48 << 20)\nopen('" + dir_ +
                                          "/held', 'w').close()\n"
                                          "time.sleep(600)\n",
                                      *neighbour_join);
  ASSERT_GT(neighbour, 0);
  isolation->Started("neighbour", neighbour);
  ASSERT_TRUE(
      PollUntil([&] { return std::filesystem::exists(dir_ + "/held"); }, absl::Seconds(60)));

  absl::StatusOr<std::vector<std::string>> hog_join = isolation->Prepare("hog", {96 * kMiB, 0});
  ASSERT_TRUE(hog_join.ok()) << hog_join.status();
  const pid_t hog = StartPython(kHog, *hog_join);
  ASSERT_GT(hog, 0);
  isolation->Started("hog", hog);
  absl::StatusOr<ExitInfo> hog_exit = WaitSubprocess(hog);
  ASSERT_TRUE(hog_exit.ok()) << hog_exit.status();
  EXPECT_EQ(hog_exit->signal, SIGKILL) << DescribeExit(*hog_exit);
  const TaskMemoryEnd hog_end = isolation->Finish("hog", hog_exit->exit_code, hog_exit->signal);
  EXPECT_TRUE(hog_end.out_of_memory);
  EXPECT_EQ(hog_end.limit_bytes, 96 * kMiB);
  EXPECT_GE(hog_end.peak_bytes, 80 * kMiB);
  EXPECT_LE(hog_end.peak_bytes, 96 * kMiB);
  EXPECT_NE(hog_end.how.find("OOM killer"), std::string::npos) << hog_end.how;

  // The neighbour never noticed.
  absl::StatusOr<std::optional<ExitInfo>> still = TryWaitSubprocess(neighbour);
  ASSERT_TRUE(still.ok()) << still.status();
  EXPECT_FALSE(still->has_value()) << DescribeExit(**still);
  ASSERT_TRUE(SignalSubprocess(neighbour, SIGKILL, true).ok());
  absl::StatusOr<ExitInfo> neighbour_exit = WaitSubprocess(neighbour);
  ASSERT_TRUE(neighbour_exit.ok());
  const TaskMemoryEnd neighbour_end =
      isolation->Finish("neighbour", neighbour_exit->exit_code, neighbour_exit->signal);
  EXPECT_FALSE(neighbour_end.out_of_memory);
  EXPECT_GE(neighbour_end.peak_bytes, 48 * kMiB);
  EXPECT_LT(neighbour_end.peak_bytes, 256 * kMiB);
}

// A task limited to a fifth of a CPU that would use a whole one gets a fifth, and is throttled.
TEST_F(TaskIsolationTest, CpuQuotaHoldsTheTaskToItsShare) {
  std::unique_ptr<TaskIsolation> isolation = Cgroups();
  ASSERT_NE(isolation, nullptr);
  if (isolation->Name() == "cgroup v2 (memory only)") {
    // CI's machines have the cpu controller (v1); a sandbox that delegates memory alone is told
    // apart here, and the agent says so at start-up.
    GTEST_SKIP() << "this machine's cgroup v2 delegates no cpu controller to this process";
  }
  absl::StatusOr<std::vector<std::string>> join = isolation->Prepare("spinner", {0, 0.2});
  ASSERT_TRUE(join.ok()) << join.status();
  if (isolation->Name() == "cgroup v1") {
    // A CPU group of its own only with a quota: without one the task stays in the agent's.
    EXPECT_EQ(join->size(), 2u);
    absl::StatusOr<std::vector<std::string>> plain = isolation->Prepare("plain", {0, 0});
    ASSERT_TRUE(plain.ok()) << plain.status();
    ASSERT_EQ(plain->size(), 1u);
    EXPECT_NE(plain->front().find("memory"), std::string::npos) << plain->front();
    EXPECT_FALSE(isolation->Finish("plain", 0, 0).out_of_memory);
  }
  const pid_t spinner = StartPython("while True:\n    pass\n", *join);
  ASSERT_GT(spinner, 0);
  // The cgroup with the quota: v2's only one, v1's cpu one (the second).
  const std::string cpu_dir = std::filesystem::path(join->back()).parent_path().string();
  const double cpu0 = CpuSeconds(spinner);
  const absl::Time t0 = absl::Now();
  absl::SleepFor(absl::Seconds(2));  // the interval measured, not a wait for an event
  const double cpu1 = CpuSeconds(spinner);
  const double wall = absl::ToDoubleSeconds(absl::Now() - t0);
  ASSERT_GE(cpu0, 0);
  const double share = (cpu1 - cpu0) / wall;
  EXPECT_LE(share, 0.3) << "CPU time " << cpu1 - cpu0 << " s in " << wall << " s";
  EXPECT_GT(share, 0.02) << "it barely ran: " << cpu1 - cpu0 << " s in " << wall << " s";
  EXPECT_GT(Keyed(cpu_dir + "/cpu.stat", "nr_throttled"), 0) << Read(cpu_dir + "/cpu.stat");
  ASSERT_TRUE(SignalSubprocess(spinner, SIGKILL, true).ok());
  absl::StatusOr<ExitInfo> exit = WaitSubprocess(spinner);
  ASSERT_TRUE(exit.ok());
  EXPECT_FALSE(isolation->Finish("spinner", exit->exit_code, exit->signal).out_of_memory);
}

// Without cgroups: the watch finds the task over its limit from /proc, and the kill it asks for
// is reported out of memory with the resident peak it saw.
TEST_F(TaskIsolationTest, WatchStopsATaskOverItsLimitWithoutCgroups) {
  IsolationOptions options;
  options.mode = "watch";
  options.watch_interval = absl::Milliseconds(20);
  std::string notes;
  absl::StatusOr<std::unique_ptr<TaskIsolation>> isolation = NewTaskIsolation(options, &notes);
  ASSERT_TRUE(isolation.ok()) << isolation.status();
  EXPECT_EQ((*isolation)->Name(), "watch");
  absl::StatusOr<std::vector<std::string>> join = (*isolation)->Prepare("hog", {96 * kMiB, 0});
  ASSERT_TRUE(join.ok());
  EXPECT_TRUE(join->empty());
  const pid_t hog = StartPython(kHog, {});
  ASSERT_GT(hog, 0);
  (*isolation)->Started("hog", hog);
  ASSERT_TRUE(PollUntil(
      [&] {
        const std::vector<std::string> over = (*isolation)->OverLimit();
        return !over.empty() && over[0] == "hog";
      },
      absl::Seconds(60)));
  ASSERT_TRUE(SignalSubprocess(hog, SIGKILL, true).ok());
  absl::StatusOr<ExitInfo> exit = WaitSubprocess(hog);
  ASSERT_TRUE(exit.ok());
  const TaskMemoryEnd end = (*isolation)->Finish("hog", exit->exit_code, exit->signal);
  EXPECT_TRUE(end.out_of_memory);
  EXPECT_EQ(end.limit_bytes, 96 * kMiB);
  EXPECT_GT(end.peak_bytes, 96 * kMiB);
  EXPECT_NE(end.how.find("watch"), std::string::npos) << end.how;
}

TEST_F(TaskIsolationTest, UnknownModeIsRefused) {
  IsolationOptions options;
  options.mode = "rlimit";
  absl::StatusOr<std::unique_ptr<TaskIsolation>> isolation = NewTaskIsolation(options, nullptr);
  ASSERT_FALSE(isolation.ok());
  EXPECT_NE(isolation.status().message().find("auto, cgroup-v2, cgroup-v1 or watch"),
            std::string::npos);
}

// A folder laid out as a delegated cgroup v2 hierarchy (what a container gives): the files the
// agent writes for a task's limits and reads for its end.
class FakeCgroupV2Test : public TaskIsolationTest {
 protected:
  void SetUp() override {
    TaskIsolationTest::SetUp();
    root_ = dir_ + "/cgroup";
    std::filesystem::create_directories(root_ + "/pod");
    Write(dir_ + "/mountinfo",
          absl::StrCat("29 23 0:26 / /proc rw - proc proc rw\n", "30 23 0:27 / ", root_,
                       " rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"));
    Write(dir_ + "/self-cgroup", "0::/pod\n");
    Write(root_ + "/pod/cgroup.controllers", "cpuset cpu io memory pids\n");
    Write(root_ + "/pod/cgroup.subtree_control", "");
    Write(root_ + "/pod/memory.max", "1073741824\n");
    Write(root_ + "/pod/cpu.max", "150000 100000\n");
    std::filesystem::create_directories(dir_ + "/proc");
    Write(dir_ + "/proc/meminfo", "MemTotal:       8000000 kB\nMemFree:  1 kB\n");
    std::filesystem::create_directories(dir_ + "/proc/self/ns");
    std::filesystem::create_directory_symlink("pid:[4026531836]", dir_ + "/proc/self/ns/pid");
    options_.name = "fake";
    options_.mode = "cgroup-v2";
    options_.mountinfo = dir_ + "/mountinfo";
    options_.self_cgroup = dir_ + "/self-cgroup";
    options_.proc = dir_ + "/proc";
    options_.total_memory_bytes = 512 * kMiB;
    // What the kernel would make with each new cgroup.
    base_ = absl::StrCat(root_, "/pod/", AgentCgroupName(options_));
    for (const std::string& dir : {base_, base_ + "/task-1"}) {
      std::filesystem::create_directories(dir);
      for (const char* file : {"memory.max", "memory.swap.max", "memory.oom.group", "cpu.max",
                               "cgroup.subtree_control", "cgroup.procs"}) {
        Write(dir + "/" + file, "");
      }
    }
  }

  std::string root_;
  std::string base_;
  IsolationOptions options_;
};

TEST_F(FakeCgroupV2Test, WritesLimitsAndReadsTheEnd) {
  absl::StatusOr<std::unique_ptr<TaskIsolation>> isolation = NewTaskIsolation(options_, nullptr);
  ASSERT_TRUE(isolation.ok()) << isolation.status();
  EXPECT_EQ((*isolation)->Name(), "cgroup v2");
  EXPECT_EQ(Read(root_ + "/pod/cgroup.subtree_control"), "+memory +cpu");
  EXPECT_EQ(Read(base_ + "/memory.max"), "536870912");
  EXPECT_EQ(Read(base_ + "/cgroup.subtree_control"), "+memory +cpu");

  absl::StatusOr<std::vector<std::string>> join =
      (*isolation)->Prepare("task-1", {100 * kMiB, 0.5});
  ASSERT_TRUE(join.ok()) << join.status();
  EXPECT_EQ(*join, std::vector<std::string>{base_ + "/task-1/cgroup.procs"});
  EXPECT_EQ(Read(base_ + "/task-1/memory.max"), "104857600");
  EXPECT_EQ(Read(base_ + "/task-1/memory.swap.max"), "0");
  EXPECT_EQ(Read(base_ + "/task-1/memory.oom.group"), "1");
  EXPECT_EQ(Read(base_ + "/task-1/cpu.max"), "50000 100000");

  // The kernel's account of its end.
  Write(base_ + "/task-1/memory.events", "low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\n");
  Write(base_ + "/task-1/memory.peak", "104853504\n");
  const TaskMemoryEnd end = (*isolation)->Finish("task-1", 137, SIGKILL);
  EXPECT_TRUE(end.out_of_memory);
  EXPECT_EQ(end.limit_bytes, 100 * kMiB);
  EXPECT_EQ(end.peak_bytes, 104853504);
}

TEST_F(FakeCgroupV2Test, TheAgentsCgroupNamesItsPidNamespaceAndPid) {
  EXPECT_EQ(AgentCgroupName(options_), absl::StrCat("trainyard.fake.4026531836.", getpid()));
}

// An agent removes the cgroups of dead agents of its name in its own PID namespace, and leaves
// alone those of another namespace, whose pids mean nothing here (two agents named alike in two
// PID namespaces on one cgroup tree once killed each other's tasks).
TEST_F(FakeCgroupV2Test, OnlyDeadAgentsOfItsOwnPidNamespaceAreRemoved) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(0);
  ASSERT_EQ(waitpid(child, nullptr, 0), child);  // a pid no process has now
  const std::string pod = root_ + "/pod/trainyard.fake.";
  const std::string dead_here = absl::StrCat(pod, "4026531836.", child);
  const std::string dead_before_namespaces = absl::StrCat(pod, child);
  const std::string elsewhere = absl::StrCat(pod, "4026532999.", child);
  const std::string alive_here = absl::StrCat(pod, "4026531836.", getppid());
  for (const std::string& dir : {dead_here, dead_before_namespaces, elsewhere, alive_here}) {
    std::filesystem::create_directories(dir);
  }
  absl::StatusOr<std::unique_ptr<TaskIsolation>> isolation = NewTaskIsolation(options_, nullptr);
  ASSERT_TRUE(isolation.ok()) << isolation.status();
  EXPECT_FALSE(std::filesystem::exists(dead_here));
  EXPECT_FALSE(std::filesystem::exists(dead_before_namespaces));
  EXPECT_TRUE(std::filesystem::exists(elsewhere));
  EXPECT_TRUE(std::filesystem::exists(alive_here));
}

TEST_F(FakeCgroupV2Test, ATaskThatSucceededIsNotOutOfMemory) {
  absl::StatusOr<std::unique_ptr<TaskIsolation>> isolation = NewTaskIsolation(options_, nullptr);
  ASSERT_TRUE(isolation.ok()) << isolation.status();
  ASSERT_TRUE((*isolation)->Prepare("task-1", {0, 0}).ok());
  EXPECT_EQ(Read(base_ + "/task-1/memory.max"), "max");
  EXPECT_EQ(Read(base_ + "/task-1/cpu.max"), "max 100000");
  // A helper it started was killed for memory; the task itself finished.
  Write(base_ + "/task-1/memory.events", "oom_kill 1\n");
  EXPECT_FALSE((*isolation)->Finish("task-1", 0, 0).out_of_memory);
}

TEST_F(FakeCgroupV2Test, NoControllersIsAReason) {
  Write(root_ + "/pod/cgroup.controllers", "pids\n");
  absl::StatusOr<std::unique_ptr<TaskIsolation>> isolation = NewTaskIsolation(options_, nullptr);
  ASSERT_FALSE(isolation.ok());
  EXPECT_NE(isolation.status().message().find("offers no memory controller (it has: pids)"),
            std::string::npos)
      << isolation.status();
  // auto falls back to the watch, saying why.
  options_.mode = "auto";
  options_.mountinfo = dir_ + "/mountinfo";  // no v1 controllers in it either
  std::string notes;
  isolation = NewTaskIsolation(options_, &notes);
  ASSERT_TRUE(isolation.ok());
  EXPECT_EQ((*isolation)->Name(), "watch");
  EXPECT_NE(notes.find("cgroup v2: "), std::string::npos) << notes;
  EXPECT_NE(notes.find("cgroup v1: no cgroup v1 memory controller is mounted"), std::string::npos)
      << notes;
}

// A sandbox that delegates the memory controller alone (a GPU machine's did): memory limits and
// their out-of-memory end as usual, no CPU quota, and the start-up notes say so.
TEST_F(FakeCgroupV2Test, MemoryWithoutTheCpuControllerLimitsMemoryOnly) {
  Write(root_ + "/pod/cgroup.controllers", "memory\n");
  std::string notes;
  absl::StatusOr<std::unique_ptr<TaskIsolation>> isolation = NewTaskIsolation(options_, &notes);
  ASSERT_TRUE(isolation.ok()) << isolation.status();
  EXPECT_EQ((*isolation)->Name(), "cgroup v2 (memory only)");
  EXPECT_NE(notes.find("offers no cpu controller (it has: memory): CPU quotas are not enforced"),
            std::string::npos)
      << notes;
  EXPECT_EQ(Read(root_ + "/pod/cgroup.subtree_control"), "+memory");
  EXPECT_EQ(Read(base_ + "/cgroup.subtree_control"), "+memory");
  ASSERT_TRUE((*isolation)->Prepare("task-1", {100 * kMiB, 0.5}).ok());
  EXPECT_EQ(Read(base_ + "/task-1/memory.max"), "104857600");
  EXPECT_EQ(Read(base_ + "/task-1/cpu.max"), "");  // the kernel would have no such file
  Write(base_ + "/task-1/memory.events", "oom_kill 1\n");
  EXPECT_TRUE((*isolation)->Finish("task-1", 137, SIGKILL).out_of_memory);
}

// In a container: its cgroup's limits, not the machine's, are what the agent may offer.
TEST_F(FakeCgroupV2Test, AvailableResourcesAreTheContainersLimits) {
  EXPECT_EQ(AvailableMemoryBytes(options_.files()), 1073741824);
  EXPECT_LE(AvailableCpus(options_.files()), 1.5);
  EXPECT_GT(AvailableCpus(options_.files()), 0);
  Write(root_ + "/pod/memory.max", "max\n");
  EXPECT_EQ(AvailableMemoryBytes(options_.files()), int64_t{8000000} * 1024);
}

}  // namespace
}  // namespace trainyard
