// A job's own program on the real coordinator, worker agents and trainers (its hosts), run by
// Debian's python3-torch: torchrun's environment, Trainyard's module, preemption with no step
// lost, a lost worker, and the ends a program can come to.

#include <signal.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster.h"

namespace trainyard::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using trainyard::v1::Job;

constexpr char kPython[] = "/usr/bin/python3";

ClusterOptions Workers(int n) {
  ClusterOptions options;
  options.workers = n;
  options.slots_per_worker = 1;
  options.worker_timeout = absl::Seconds(2);
  options.coordinator_args = {"--restart_backoff=200ms"};
  options.worker_args = {"--sync_wait=500ms"};
  return options;
}

std::string ProgramsDir() { return SourceDir() + "/tests/integration/programs"; }

// A job spec running `script` of tests/integration/programs with `args` on `workers` ranks,
// writing its results into `out`.
std::string ProgramJob(const std::string& name, const std::string& script, int workers,
                       const std::string& out, const std::string& args = "",
                       const std::string& extra = "") {
  return absl::StrCat("name: ", name, "\nworkers: ", workers, "\nprogram:\n  command: [", kPython,
                      ", ", script, args.empty() ? "" : ", ", args, "]\n  workdir: file://",
                      ProgramsDir(), "\n  env: {OUT: \"", out, "\", NAME: ", name,
                      ", MY_SETTING: \"a b\"}\n", extra);
}

nlohmann::json ReadJson(const std::string& path) {
  return nlohmann::json::parse(ReadFile(path), nullptr, /*allow_exceptions=*/false);
}

TEST(ProgramTest, APlainDdpScriptRunsOnTwoWorkersWithTorchrunsEnvironment) {
  Cluster cluster(Workers(2));
  TempDir out;
  auto submitted = cluster.Submit(ProgramJob("plain", "plain_ddp.py", 2, out.path()));
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  EXPECT_EQ(submitted->spec().strategy(), v1::PROGRAM);
  auto done = cluster.WaitForFinal(submitted->id(), absl::Seconds(180));
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->state(), v1::SUCCEEDED) << done->reason() << "\n" << *cluster.Logs(done->id());

  std::string master;
  std::vector<double> weights;
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE(absl::StrCat("rank ", rank));
    const nlohmann::json seen =
        ReadJson(absl::StrCat(out.path(), "/", done->id(), "-rank", rank, ".json"));
    ASSERT_TRUE(seen.is_object());
    EXPECT_EQ(seen["RANK"], std::to_string(rank));
    EXPECT_EQ(seen["WORLD_SIZE"], "2");
    // Both workers of the test share one machine (127.0.0.1): one group, two local ranks.
    EXPECT_EQ(seen["LOCAL_RANK"], std::to_string(rank));
    EXPECT_EQ(seen["LOCAL_WORLD_SIZE"], "2");
    EXPECT_EQ(seen["GROUP_RANK"], "0");
    EXPECT_EQ(seen["TRAINYARD_JOB_ID"], done->id());
    EXPECT_EQ(seen["TRAINYARD_ATTEMPT"], "1");
    EXPECT_EQ(seen["MY_SETTING"], "a b");
    EXPECT_TRUE(seen["TRAINYARD_RESTORE_DIR"].is_null());  // a first start restores nothing
    EXPECT_TRUE(seen["TRAINYARD_TASK_CREDENTIAL"].is_null());
    EXPECT_THAT(seen["PYTHONPATH"].get<std::string>(), HasSubstr("share/trainyard/python"));
    EXPECT_THAT(seen["TRAINYARD_SOCKET"].get<std::string>(), HasSubstr(done->id()));
    // Its working directory is its own copy of the workdir.
    EXPECT_TRUE(std::filesystem::exists(seen["cwd"].get<std::string>() + "/plain_ddp.py"));
    EXPECT_NE(seen["cwd"].get<std::string>(), ProgramsDir());
    EXPECT_EQ(seen["all_reduce"], 3.0);  // 1 + 2: the two ranks met
    if (rank == 0) {
      master = absl::StrCat(seen["MASTER_ADDR"].get<std::string>(), ":",
                            seen["MASTER_PORT"].get<std::string>());
      weights = seen["weights"].get<std::vector<double>>();
    } else {
      EXPECT_EQ(absl::StrCat(seen["MASTER_ADDR"].get<std::string>(), ":",
                             seen["MASTER_PORT"].get<std::string>()),
                master);
      EXPECT_EQ(seen["weights"].get<std::vector<double>>(), weights);  // DDP kept them equal
    }
  }
  EXPECT_THAT(master, StartsWith("127.0.0.1:"));
}

}  // namespace
}  // namespace trainyard::testing
