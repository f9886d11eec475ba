#include "client/args.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/local_cluster.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/run_shell.h"

namespace trainyard::cli {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

std::vector<FlagSpec> Globals() { return {{"coordinator", '\0', true, "ADDR", "where"}}; }

std::vector<CommandSpec> Commands() {
  return {{"submit",
           "FILE",
           "Submit.",
           {{"wait", '\0', false, "", "wait"}, {"resume-from", '\0', true, "JOB", "resume"}},
           1,
           1,
           {}},
          {"logs",
           "JOB",
           "Logs.",
           {{"follow", 'f', false, "", "follow"}, {"rank", '\0', true, "N", "rank"}},
           1,
           1,
           {}},
          {"jobs", "", "List.", {{"output", 'o', true, "FORMAT", "table or json"}}, 0, 0, {}}};
}

absl::StatusOr<ParsedArgs> Parse(std::vector<std::string> argv) {
  return ParseArgs(Globals(), Commands(), argv);
}

TEST(ArgsTest, CommandFlagsAndArguments) {
  absl::StatusOr<ParsedArgs> args = Parse({"submit", "job.yaml", "--wait", "--resume-from", "j1"});
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_EQ(args->command, "submit");
  EXPECT_THAT(args->args, ElementsAre("job.yaml"));
  EXPECT_TRUE(args->Has("wait"));
  EXPECT_EQ(args->Get("resume-from"), "j1");
  EXPECT_FALSE(args->help);
}

TEST(ArgsTest, GlobalFlagsAnywhereAndEqualsForm) {
  absl::StatusOr<ParsedArgs> before = Parse({"--coordinator", "h:1", "jobs", "-o", "json"});
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_EQ(before->Get("coordinator"), "h:1");
  EXPECT_EQ(before->Get("output"), "json");
  absl::StatusOr<ParsedArgs> after = Parse({"jobs", "--coordinator=h:2", "--output=table"});
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->Get("coordinator"), "h:2");
  EXPECT_EQ(after->Get("output"), "table");
  EXPECT_EQ(after->Get("missing", "fallback"), "fallback");
}

TEST(ArgsTest, ShortSwitchAndDoubleDash) {
  absl::StatusOr<ParsedArgs> args = Parse({"logs", "-f", "--rank=2", "--", "-weird-id"});
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_TRUE(args->Has("follow"));
  EXPECT_EQ(args->Get("rank"), "2");
  EXPECT_THAT(args->args, ElementsAre("-weird-id"));
}

TEST(ArgsTest, UnknownFlagNamesTheCommand) {
  absl::StatusOr<ParsedArgs> args = Parse({"jobs", "--wait"});
  ASSERT_FALSE(args.ok());
  EXPECT_EQ(args.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(args.status().message(), HasSubstr("unknown flag '--wait' for 'jobs'"));
  EXPECT_THAT(Parse({"--nope"}).status().message(), HasSubstr("unknown flag '--nope'"));
  // A daemon-style '_' where the CLI has '-'.
  EXPECT_THAT(Parse({"submit", "--resume_from", "x-1", "f.yaml"}).status().message(),
              HasSubstr("unknown flag '--resume_from': did you mean '--resume-from'?"));
  EXPECT_THAT(Parse({"jobs", "-wait"}).status().message(), HasSubstr("two dashes"));
}

TEST(ArgsTest, UnknownCommandMissingValueAndArgumentCounts) {
  EXPECT_THAT(Parse({"frobnicate"}).status().message(), HasSubstr("unknown command 'frobnicate'"));
  EXPECT_THAT(Parse({"logs", "j1", "--rank"}).status().message(),
              HasSubstr("--rank needs a value"));
  EXPECT_THAT(Parse({"submit"}).status().message(), HasSubstr("'submit' needs FILE"));
  EXPECT_THAT(Parse({"submit", "a", "b"}).status().message(), HasSubstr("unexpected argument 'b'"));
  EXPECT_THAT(Parse({"submit", "a", "--wait=maybe"}).status().message(),
              HasSubstr("takes no value"));
}

TEST(ArgsTest, HelpForms) {
  absl::StatusOr<ParsedArgs> args = Parse({"help"});
  ASSERT_TRUE(args.ok());
  EXPECT_TRUE(args->help);
  EXPECT_EQ(args->command, "");
  args = Parse({"help", "logs"});
  ASSERT_TRUE(args.ok());
  EXPECT_TRUE(args->help);
  EXPECT_EQ(args->command, "logs");
  args = Parse({"submit", "--help"});  // no FILE needed with --help
  ASSERT_TRUE(args.ok());
  EXPECT_TRUE(args->help);
  EXPECT_EQ(args->command, "submit");
  args = Parse({"-h"});
  ASSERT_TRUE(args.ok());
  EXPECT_TRUE(args->help);
}

TEST(ArgsTest, HelpTextListsCommandsAndFlags) {
  const std::string main_help = MainHelp("trainyard", Globals(), Commands());
  EXPECT_THAT(main_help, HasSubstr("submit FILE"));
  EXPECT_THAT(main_help, HasSubstr("--coordinator ADDR"));
  const std::string logs_help = CommandHelp("trainyard", Globals(), Commands()[1]);
  EXPECT_THAT(logs_help, HasSubstr("Usage: trainyard logs [flags] JOB"));
  EXPECT_THAT(logs_help, HasSubstr("-f, --follow"));
  EXPECT_THAT(logs_help, HasSubstr("--rank N"));
}

// The real CLI's help: short lines in the command list, and only the flags that apply.
TEST(ArgsTest, TheCliHelpIsShortAndListsOnlyFlagsThatApply) {
  auto [code, main_help] = ::trainyard::testing::RunShell(absl::StrCat(TRAINYARD_CLI, " --help"));
  ASSERT_EQ(code, 0) << main_help;
  for (absl::string_view line : absl::StrSplit(main_help, '\n')) {
    EXPECT_LE(line.size(), 120u) << line;
  }
  EXPECT_THAT(main_help, HasSubstr("Inspect a sharded safetensors data set"));
  for (const char* local : {"up", "data"}) {
    auto [status, help] =
        ::trainyard::testing::RunShell(absl::StrCat(TRAINYARD_CLI, " ", local, " --help"));
    EXPECT_EQ(status, 0) << help;
    EXPECT_THAT(help, Not(HasSubstr("--coordinator"))) << local;
    EXPECT_THAT(help, Not(HasSubstr("--token-file"))) << local;
  }
  auto [status, up_help] =
      ::trainyard::testing::RunShell(absl::StrCat(TRAINYARD_CLI, " up --help"));
  EXPECT_THAT(up_help, HasSubstr("--state-dir DIR"));
  auto [submit_status, submit_help] =
      ::trainyard::testing::RunShell(absl::StrCat(TRAINYARD_CLI, " submit --help"));
  EXPECT_THAT(submit_help, HasSubstr("--coordinator"));  // it talks to one
  auto [data_status, data_help] =
      ::trainyard::testing::RunShell(absl::StrCat(TRAINYARD_CLI, " data --help"));
  for (absl::string_view line : absl::StrSplit(data_help, '\n')) {
    EXPECT_LE(line.size(), 120u) << line;
  }
}

// `CMD ACTION --help` (and `help CMD ACTION`) explains that action alone, with only its flags;
// `CMD --help` lists the actions.
TEST(ArgsTest, EachActionHasItsOwnHelp) {
  auto help = [](const std::string& args) {
    auto [code, text] = ::trainyard::testing::RunShell(absl::StrCat(TRAINYARD_CLI, " ", args));
    EXPECT_EQ(code, 0) << args << ": " << text;
    for (absl::string_view line : absl::StrSplit(text, '\n')) {
      EXPECT_LE(line.size(), 100u) << args << ": " << line;
    }
    return text;
  };
  const std::string pack = help("data pack --help");
  EXPECT_THAT(pack, HasSubstr("Usage: trainyard data pack [flags] PREFIX"));
  EXPECT_THAT(pack, HasSubstr("--columns SPEC"));
  EXPECT_THAT(pack, Not(HasSubstr("--output")));       // inspect's
  EXPECT_THAT(pack, Not(HasSubstr("--coordinator")));  // data runs here
  EXPECT_THAT(pack, Not(HasSubstr("print the index")));
  const std::string submit = help("search submit --help");
  EXPECT_THAT(submit, HasSubstr("Usage: trainyard search submit [flags] FILE"));
  EXPECT_THAT(submit, HasSubstr("--wait"));
  EXPECT_THAT(submit, Not(HasSubstr("--max-trials")));
  EXPECT_THAT(submit, HasSubstr("--coordinator"));
  EXPECT_EQ(help("help token create"), help("token create --help"));
  EXPECT_THAT(help("token create --help"), HasSubstr("--role ROLE"));
  const std::string search = help("search --help");
  EXPECT_THAT(search, HasSubstr("Actions (trainyard search ACTION --help for one):"));
  for (const char* action : {"submit FILE", "list", "describe ID", "cancel ID", "extend ID"}) {
    EXPECT_THAT(search, HasSubstr(absl::StrCat("\n  ", action))) << action;
  }
}

TEST(LocalClusterTest, ParsePortFile) {
  EXPECT_EQ(ParsePortFile("7070\n").value_or(0), 7070);
  EXPECT_EQ(ParsePortFile("127.0.0.1:41234").value_or(0), 41234);
  EXPECT_EQ(ParsePortFile("").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParsePortFile("12").value_or(0), 12);
  EXPECT_FALSE(ParsePortFile("99999").ok());
}

}  // namespace
}  // namespace trainyard::cli
