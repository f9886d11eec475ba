// What the agent reads of a rank from outside: its flight record and process state, and the
// answers to `trainyard debug` (DebugResponder), stacks by the real gdb.

#include "worker/agent/rank_record.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "common/flight_record.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/fake_clock.h"
#include "tests/server/test_util.h"
#include "worker/agent/debug_responder.h"

namespace trainyard {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;

// A child that sleeps until killed; reaped by the destructor.
class Sleeper {
 public:
  Sleeper() : pid_(fork()) {
    if (pid_ == 0) {
      execlp("sleep", "sleep", "600", static_cast<char*>(nullptr));
      _exit(127);
    }
  }
  ~Sleeper() { End(); }
  void End() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_;
};

TEST(RankRecordTest, TheRecordAndTheProcessStateAreReadFromOutside) {
  TempDir dir;
  FakeClock clock;
  auto recorder = FlightRecorder::Create(dir.path() + "/" + kFlightRecordFile, clock);
  ASSERT_TRUE(recorder.ok()) << recorder.status();
  clock.Advance(absl::Seconds(3));
  (*recorder)->SetPhase(RankPhase::kData);
  (*recorder)->SetStep(41);
  const uint64_t token = (*recorder)->Begin(CollectiveKind::kAllReduce, 4096);
  (*recorder)->End(token, true);
  (*recorder)->Begin(CollectiveKind::kSend, 512, 2);
  clock.Advance(absl::Seconds(61));

  Sleeper child;
  std::optional<v1::RankRecord> record = ReadRankRecord(dir.path(), child.pid(), clock);
  ASSERT_TRUE(record.has_value());
  EXPECT_EQ(record->error(), "");
  EXPECT_EQ(record->phase(), "data loading");
  EXPECT_EQ(record->phase_code(), static_cast<int>(RankPhase::kData));
  EXPECT_EQ(record->read_unix_ms() - record->phase_since_unix_ms(), 61000);
  EXPECT_EQ(record->step(), 41);
  ASSERT_EQ(record->recent_size(), 2);
  EXPECT_EQ(record->recent(0).kind(), "all-reduce");
  EXPECT_EQ(record->recent(0).seq(), 1);
  EXPECT_EQ(record->recent(0).peer(), -1);
  EXPECT_EQ(record->recent(0).bytes(), 4096);
  EXPECT_GT(record->recent(0).ended_unix_ms(), 0);
  EXPECT_EQ(record->recent(1).kind(), "send");
  EXPECT_EQ(record->recent(1).peer(), 2);
  EXPECT_EQ(record->recent(1).ended_unix_ms(), 0);
  // Running or asleep in its sleep, depending on how far it got: never stopped.
  EXPECT_THAT(record->process_state(), AnyOf("running", "sleeping"));

  // Stopped: as a SIGSTOP or a debugger leaves it.
  ASSERT_EQ(kill(child.pid(), SIGSTOP), 0);
  int status = 0;
  ASSERT_EQ(waitpid(child.pid(), &status, WUNTRACED), child.pid());
  ASSERT_TRUE(WIFSTOPPED(status));
  EXPECT_EQ(ProcessStateOf(child.pid()), "stopped");
  const pid_t gone = child.pid();
  child.End();
  EXPECT_EQ(ProcessStateOf(gone), "exited");
  // The writer gone too: the file still says what it did last.
  recorder->reset();
  record = ReadRankRecord(dir.path(), 0, clock);
  ASSERT_TRUE(record.has_value());
  EXPECT_EQ(record->process_state(), "exited");
  EXPECT_EQ(record->phase(), "data loading");
}

TEST(RankRecordTest, NoRecordIsNoneAndABrokenOneSaysWhy) {
  TempDir dir;
  FakeClock clock;
  EXPECT_FALSE(ReadRankRecord(dir.path(), 0, clock).has_value());
  std::ofstream(dir.path() + "/" + kFlightRecordFile) << "not a record";
  std::optional<v1::RankRecord> record = ReadRankRecord(dir.path(), 0, clock);
  ASSERT_TRUE(record.has_value());
  EXPECT_THAT(record->error(), HasSubstr("not a flight record"));
}

TEST(DebugResponderTest, AnAnswerHoldsTheRunningTasksRecordsAndStacks) {
  TempDir dir;
  FakeClock clock;
  auto recorder = FlightRecorder::Create(dir.path() + "/" + kFlightRecordFile, clock);
  ASSERT_TRUE(recorder.ok()) << recorder.status();
  (*recorder)->SetPhase(RankPhase::kForward);
  Sleeper child;
  DebugResponder::Options options;
  options.task_dir = [&](const std::string&) { return dir.path(); };
  options.pid_of = [&](const std::string& id) -> int64_t {
    return id == "j.g1.r0" ? child.pid() : 0;
  };
  options.report = [](const v1::ReportDebugRequest&) { return absl::OkStatus(); };
  options.stacks = [](int64_t pid) -> absl::StatusOr<std::string> {
    return absl::UnavailableError("no stacks: gdb could not attach");
  };
  DebugResponder responder(options, clock);
  v1::DebugAsk ask;
  ask.set_ask_id("debug-7");
  ask.add_task_ids("j.g1.r0");
  ask.add_task_ids("j.g1.r1");  // ended meanwhile: left out
  ask.set_stacks(true);
  const v1::ReportDebugRequest answer = responder.Answer("w1", ask);
  EXPECT_EQ(answer.worker_id(), "w1");
  EXPECT_EQ(answer.ask_id(), "debug-7");
  ASSERT_EQ(answer.tasks_size(), 1);
  EXPECT_EQ(answer.tasks(0).task_id(), "j.g1.r0");
  EXPECT_EQ(answer.tasks(0).record().phase(), "the forward pass");
  EXPECT_EQ(answer.tasks(0).record().error(), "no stacks: gdb could not attach");
}

TEST(DebugResponderTest, GdbPrintsEveryThreadsStack) {
  Sleeper child;
  absl::StatusOr<std::string> stacks = ThreadStacks(child.pid(), absl::Seconds(60));
  ASSERT_TRUE(stacks.ok()) << stacks.status();
  EXPECT_THAT(*stacks, HasSubstr("Thread 1"));
  EXPECT_THAT(*stacks, HasSubstr("#0"));
  // The process goes on after the debugger left it.
  EXPECT_THAT(ProcessStateOf(child.pid()), AnyOf("running", "sleeping"));
  const pid_t gone = child.pid();
  child.End();
  EXPECT_EQ(ThreadStacks(gone, absl::Seconds(60)).status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace trainyard
