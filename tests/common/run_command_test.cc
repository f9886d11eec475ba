#include "common/run_command.h"

#include <signal.h>

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

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
  struct sigaction ignore = {}, quit = {};
  ignore.sa_handler = SIG_IGN;
  sigaction(SIGQUIT, &ignore, &quit);
  sigset_t usr2, mask;
  sigemptyset(&usr2);
  sigaddset(&usr2, SIGUSR2);
  pthread_sigmask(SIG_BLOCK, &usr2, &mask);
  absl::StatusOr<CommandResult> r = RunCommand({"cat", "/proc/self/status"}, {}, absl::Seconds(30));
  sigaction(SIGQUIT, &quit, nullptr);
  pthread_sigmask(SIG_SETMASK, &mask, nullptr);
  ASSERT_TRUE(r.ok()) << r.status();
  // glibc's posix_spawn leaves its own two real-time signals (32 and 33) ignored in the child
  // when this process has handlers for them; the command's C library takes them back. The
  // standard ones and every other real-time signal are at their default.
  auto mask_of = [&](absl::string_view field) {
    const size_t at = r->out.find(absl::StrCat(field, ":\t"));
    EXPECT_NE(at, std::string::npos) << field;
    return std::stoull(r->out.substr(at + field.size() + 2, 16), nullptr, 16);
  };
  constexpr uint64_t kGlibcInternal = (1ULL << 31) | (1ULL << 32);
  EXPECT_EQ(mask_of("SigIgn") & ~kGlibcInternal, 0u) << r->out;
  EXPECT_EQ(mask_of("SigBlk"), 0u) << r->out;
}

}  // namespace
}  // namespace trainyard
