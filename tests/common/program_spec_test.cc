// A job spec with the user's own program: what it may say, what it may not, and the defaults it
// gets (common/spec/job_spec_program.cc).

#include <string>

#include "absl/strings/str_cat.h"
#include "common/spec/job_spec.h"
#include "common/spec/program_env.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainyard {
namespace {

using ::testing::HasSubstr;

constexpr char kProgram[] =
    "name: resnet-ddp\n"
    "workers: 2\n"
    "resources: {gpus_per_worker: 1, cpus: 4, memory: 16GiB}\n"
    "program:\n"
    "  command: [python3, train.py, --epochs, \"10\"]\n"
    "  workdir: s3://bucket/code/\n"
    "  env: {OMP_NUM_THREADS: \"4\"}\n"
    "checkpoint: {every_steps: 500, keep_last: 3}\n";

TEST(ProgramSpecTest, TheIssuesExampleReadsWithTheDefaultsOfAProgram) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(kProgram);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->strategy(), v1::PROGRAM);
  EXPECT_EQ(spec->workers().min(), 2);
  EXPECT_EQ(spec->workers().max(), 2);
  ASSERT_EQ(spec->program().command_size(), 4);
  EXPECT_EQ(spec->program().command(3), "10");
  EXPECT_EQ(spec->program().workdir(), "s3://bucket/code/");
  EXPECT_EQ(spec->program().env().at("OMP_NUM_THREADS"), "4");
  EXPECT_EQ(spec->checkpoint().keep_last(), 3);
  EXPECT_GT(spec->stall_timeout_seconds(), 0);
  // None of the trainer loop's defaults: a program has no optimizer, batch or loss.
  EXPECT_FALSE(spec->has_optimizer());
  EXPECT_FALSE(spec->has_data());
  EXPECT_EQ(spec->batch_size(), 0);
  EXPECT_TRUE(spec->loss().empty());
  EXPECT_EQ(spec->precision(), v1::PRECISION_UNSPECIFIED);
}

TEST(ProgramSpecTest, AOneWordCommandIsOneWord) {
  absl::StatusOr<v1::JobSpec> spec =
      ParseJobSpecYaml("name: t\nprogram: {command: \"python3 train.py\"}\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_EQ(spec->program().command_size(), 1);  // not split: quoting differs between shells
  EXPECT_EQ(spec->program().command(0), "python3 train.py");
}

struct Refused {
  std::string yaml;
  std::string message;
};

class RefusedProgramTest : public ::testing::TestWithParam<Refused> {};

TEST_P(RefusedProgramTest, NamesTheField) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(GetParam().yaml);
  ASSERT_FALSE(spec.ok()) << GetParam().yaml;
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spec.status().message(), HasSubstr(GetParam().message)) << GetParam().yaml;
}

const std::string kCommand = "program: {command: [python3, t.py]}\n";

INSTANTIATE_TEST_SUITE_P(
    Table, RefusedProgramTest,
    ::testing::Values(
        // Mixed with the trainer's loop: the first field of the loop named.
        Refused{"name: t\nmodel: {builtin: mlp, args: {inputs: 4, classes: 2}}\n" + kCommand,
                "model: a job with a program sets no model"},
        Refused{"name: t\nbatch_size: 32\n" + kCommand, "batch_size: a job with a program"},
        Refused{"name: t\noptimizer: {name: adam}\n" + kCommand, "optimizer: a job with"},
        Refused{"name: t\nmax_steps: 10\n" + kCommand, "max_steps: a job with a program"},
        Refused{"name: t\nprecision: bf16\n" + kCommand, "precision: a job with a program"},
        Refused{"name: t\ncuda_graph: true\n" + kCommand, "cuda_graph: a job with a program"},
        Refused{"name: t\nstrategy: data_parallel\n" + kCommand,
                "strategy: a job with a program runs its own strategy"},
        // The program itself.
        Refused{"name: t\nprogram: {workdir: /code}\n", "program.command: required"},
        Refused{"name: t\nprogram: {command: []}\n", "program.command: required"},
        Refused{"name: t\nprogram: {command: [python3, {a: 1}]}\n",
                "program.command[1]: expected a string"},
        Refused{"name: t\nprogram: {command: [python3], workdir: code}\n",
                "program.workdir: 'code' is not an absolute path or URI"},
        Refused{"name: t\nprogram: {command: [python3], workdir: \"file:///a/../b\"}\n",
                "program.workdir"},
        Refused{"name: t\nprogram: {command: [python3], entrypoint: x}\n",
                "program.entrypoint: unknown key"},
        Refused{"name: t\nprogram: {command: [python3], env: {RANK: \"3\"}}\n",
                "program.env.RANK: set by Trainyard for every rank"},
        Refused{"name: t\nprogram: {command: [python3], env: {TORCHELASTIC_USE_AGENT_STORE: "
                "\"False\"}}\n",
                "program.env.TORCHELASTIC_USE_AGENT_STORE: set by Trainyard for every rank"},
        Refused{"name: t\nprogram: {command: [python3], env: {TRAINYARD_SOCKET: x}}\n",
                "program.env.TRAINYARD_SOCKET: set by Trainyard"},
        Refused{"name: t\nprogram: {command: [python3], env: {AWS_SECRET_ACCESS_KEY: x}}\n",
                "program.env.AWS_SECRET_ACCESS_KEY: set by Trainyard"},
        Refused{"name: t\nprogram: {command: [python3], env: {\"1X\": x}}\n",
                "program.env.1X: a variable name"},
        Refused{"name: t\nprogram: {command: [python3], env: {A: {b: 1}}}\n",
                "program.env.A: expected a string"}));

TEST(ProgramSpecTest, BoundsHoldInOnePlace) {
  std::string words;
  for (int i = 0; i <= kMaxProgramArgs; ++i) absl::StrAppend(&words, i == 0 ? "" : ", ", "x");
  absl::StatusOr<v1::JobSpec> spec =
      ParseJobSpecYaml(absl::StrCat("name: t\nprogram: {command: [", words, "]}\n"));
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(spec.status().message(), HasSubstr("at most 1024 words"));

  v1::JobSpec big;
  big.set_name("t");
  big.mutable_program()->add_command("python3");
  (*big.mutable_program()->mutable_env())["BIG"] = std::string(kMaxProgramEnvValueBytes + 1, 'x');
  ApplyJobSpecDefaults(big);
  EXPECT_THAT(ValidateJobSpec(big).message(), HasSubstr("program.env.BIG: a value of at most"));
  big.mutable_program()->mutable_env()->erase("BIG");
  EXPECT_TRUE(ValidateJobSpec(big).ok()) << ValidateJobSpec(big);
  // A spec sent over gRPC as strategy program without one is refused as well.
  big.clear_program();
  EXPECT_THAT(ValidateJobSpec(big).message(), HasSubstr("program: required by strategy program"));
}

}  // namespace
}  // namespace trainyard
