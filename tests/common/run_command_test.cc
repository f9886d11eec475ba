#include "common/run_command.h"

#include <signal.h>

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/inherited_signals.h"

namespace trainyard {
namespace {

TEST(RunCommandTest, KeepsWhatItPrintedAndHowItEnded) {
  absl::StatusOr<CommandResult> r =
      RunCommand({"sh", "-c", "echo out; echo err >&2; exit 3"}, {}, absl::Seconds(30));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, 3);
  EXPECT_EQ(r->signal, 0);
  EXPECT_EQ(r->out, "out\n");
  EXPECT_EQ(r->err, "err\n");
  EXPECT_EQ(DescribeCommandEnd(*r), "exit 3: err");
}

TEST(RunCommandTest, ExtraEnvironmentReplacesThisProcesssOwn) {
  setenv("TRAINYARD_RUN_COMMAND_TEST", "mine", 1);
  absl::StatusOr<CommandResult> r =
      RunCommand({"sh", "-c", "echo $TRAINYARD_RUN_COMMAND_TEST"},
                 {"TRAINYARD_RUN_COMMAND_TEST=theirs"}, absl::Seconds(30));
  unsetenv("TRAINYARD_RUN_COMMAND_TEST");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->out, "theirs\n");
}

TEST(RunCommandTest, AMissingProgramIsNotFoundAndOneOverItsTimeIsKilled) {
  EXPECT_EQ(RunCommand({"trainyard-no-such-program"}, {}, absl::Seconds(30)).status().code(),
            absl::StatusCode::kNotFound);
  absl::StatusOr<CommandResult> r = RunCommand({"sleep", "60"}, {}, absl::Milliseconds(200));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->signal, SIGKILL);
}

// What this process ignores or blocks does not reach the command.
TEST(RunCommandTest, TheCommandStartsWithEverySignalAtItsDefaultAndNoneBlocked) {
  absl::StatusOr<CommandResult> r;
  {
    testing::InheritedSignals inherited({SIGQUIT}, {SIGUSR2});
    r = RunCommand({"cat", "/proc/self/status"}, {}, absl::Seconds(30));
  }
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(testing::StatusSignalMask(r->out, "SigIgn") & ~testing::kGlibcInternalSignals, 0u)
      << r->out;
  EXPECT_EQ(testing::StatusSignalMask(r->out, "SigBlk"), 0u) << r->out;
}

}  // namespace
}  // namespace trainyard
