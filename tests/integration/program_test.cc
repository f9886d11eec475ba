// A job's own program on the real coordinator, worker agents and trainers (its hosts), run by
// Debian's python3-torch: torchrun's environment, Trainyard's module, preemption with no step
// lost, a lost worker, and the ends a program can come to.

#include <signal.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/inherited_signals.h"
#include "tests/integration/cluster.h"

namespace trainyard::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using trainyard::v1::Job;

constexpr char kPython[] = "/usr/bin/python3";

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
  // The agents start with signals ignored and blocked, as under a shell's background job: the
  // program must not inherit them.
  InheritedSignals inherited({SIGQUIT, SIGUSR1, SIGINT}, {SIGUSR2});
  Cluster cluster(QuickRestarts(2));
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
    // They met at the store that rank 0's host served before they started, not rank 0's own.
    EXPECT_EQ(seen["TORCHELASTIC_USE_AGENT_STORE"], "True");
    EXPECT_EQ(seen["serves_store"], false);
    EXPECT_EQ(seen["signals_not_default"], nlohmann::json::array()) << seen["signals_not_default"];
    EXPECT_EQ(seen["signals_blocked"], nlohmann::json::array()) << seen["signals_blocked"];
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
  const Cluster::CliResult described = cluster.Cli({"describe", done->id()});
  EXPECT_THAT(described.output, HasSubstr("Program:          /usr/bin/python3 plain_ddp.py"));
  EXPECT_THAT(described.output, HasSubstr("Step:             unknown (the program reports no"));
}

// The store's protocol is the one of PyTorch's release: for a program whose torch is another
// release than the trainer's LibTorch (a virtual environment's, say), rank 0's program serves
// the store itself, as it would without Trainyard.
TEST(ProgramTest, AProgramWhoseTorchIsAnotherReleaseServesItsOwnStore) {
  Cluster cluster(QuickRestarts(2));
  TempDir out;
  std::filesystem::create_directories(out.path() + "/venv/torch");
  std::ofstream(out.path() + "/venv/torch/__init__.py") << "raise ImportError('not this one')\n";
  std::ofstream(out.path() + "/venv/torch/version.py") << "__version__ = '0.4.1'\n";
  const std::string spec =
      absl::StrCat("name: other-torch\nworkers: 2\nprogram:\n  command: [", kPython,
                   ", store_place.py]\n  workdir: file://", ProgramsDir(), "\n  env: {OUT: \"",
                   out.path(), "\", PYTHONPATH: \"", out.path(), "/venv\"}\n");
  auto submitted = cluster.Submit(spec);
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  auto done = cluster.WaitForFinal(submitted->id(), absl::Seconds(120));
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->state(), v1::SUCCEEDED) << done->reason() << "\n" << *cluster.Logs(done->id());
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(ReadFile(absl::StrCat(out.path(), "/", done->id(), "-rank", rank, ".txt")), "unset")
        << "rank " << rank;
  }
  EXPECT_THAT(*cluster.Logs(done->id()),
              HasSubstr("rank 0's program serves the ranks' store: its torch is 0.4.1"));
}

// The module's program (module_ddp.py) for `steps` steps, a checkpoint every 20.
std::string ModuleJob(const std::string& name, const std::string& out, int64_t steps) {
  return ProgramJob(name, "module_ddp.py", 2, out, absl::StrCat("\"", steps, "\""),
                    "checkpoint: {every_steps: 20, keep_last: 2}\n");
}

constexpr int64_t kHeldAfter = 30;

// Waits until attempt `generation` of job `id` is held kHeldAfter steps past its start.
absl::StatusOr<Job> WaitUntilHeld(Cluster& cluster, const std::string& id, int64_t generation) {
  return cluster.WaitFor(id, [generation](const Job& job) {
    return job.state() == v1::RUNNING && job.generation() == generation &&
           job.progress().step() == job.progress().attempt_start_step() + kHeldAfter &&
           job.committed_step() >= 20;
  });
}

TEST(ProgramTest, APreemptedProgramSavesAtTheAgreedStepAndEndsBitForBitLikeAnUninterruptedOne) {
  Cluster cluster(QuickRestarts(4));
  TempDir out;
  RunToSuccess(cluster, ModuleJob("reference", out.path(), 120));
  const std::string reference = ReadFile(out.path() + "/reference.bin");
  ASSERT_EQ(reference.size(), (16 * 32 + 32 + 32 * 4 + 4) * sizeof(float));

  // A notice: SIGTERM to the agent of rank 0, while the ranks are held at step 30.
  cluster.Hold("preempted", kHeldAfter);
  auto submitted = cluster.Submit(ModuleJob("preempted", out.path(), 120));
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  auto held = WaitUntilHeld(cluster, submitted->id(), 1);
  ASSERT_TRUE(held.ok()) << held.status();
  const int victim = WorkerOfRank(*held, 0);
  cluster.worker(victim).Signal(SIGTERM);
  std::optional<int> exit = cluster.worker(victim).Wait(absl::Seconds(30));
  EXPECT_TRUE(exit.has_value() && WIFEXITED(*exit) && WEXITSTATUS(*exit) == 0);
  auto recovered = cluster.WaitFor(submitted->id(), [](const Job& job) {
    return job.restarts_size() >= 1 && job.restarts(0).recovered();
  });
  ASSERT_TRUE(recovered.ok()) << recovered.status();
  const v1::Restart& r = recovered->restarts(0);
  EXPECT_EQ(r.reason(), v1::PREEMPTED) << r.message();
  // The ranks compare their stop requests every few steps (the module keeps that under 0.5 % of
  // the step time): they stop at the first such step from the hold on, saved there.
  const int64_t stopped = StoppedAtStep(*recovered, 1);
  EXPECT_GE(stopped, kHeldAfter);
  EXPECT_LT(stopped, 120);
  EXPECT_EQ(r.resumed_step(), stopped);  // saved at the agreed step, not at the last 20
  EXPECT_EQ(r.steps_lost(), 0) << r.message();
  cluster.Release("preempted");
  auto done = cluster.WaitForFinal(submitted->id(), absl::Seconds(180));
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->state(), v1::SUCCEEDED) << done->reason();
  EXPECT_EQ(done->progress().step(), 120);
  EXPECT_EQ(done->progress().total_steps(), 120);
  EXPECT_EQ(done->progress().metrics().at("lr"), 0.05);
  const Cluster::CliResult described = cluster.Cli({"describe", done->id()});
  EXPECT_THAT(described.output, HasSubstr("Metrics:          lr=0.05"));
  EXPECT_THAT(described.output, HasSubstr("Step:             120/120 (100%)"));
  const std::string resumed = ReadFile(out.path() + "/preempted.bin");
  EXPECT_TRUE(resumed == reference) << "the resumed run's parameters differ from the reference's";

  // A lost machine: kill -9 of the agent of rank 1 and of its program's host; the program dies
  // with it. The job resumes from the checkpoint of step 20, and says it lost exactly 10 steps.
  cluster.Hold("lost", kHeldAfter);
  submitted = cluster.Submit(ModuleJob("lost", out.path(), 120));
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  held = WaitUntilHeld(cluster, submitted->id(), 1);
  ASSERT_TRUE(held.ok()) << held.status();
  ASSERT_EQ(held->committed_step(), 20);
  const int lost = WorkerOfRank(*held, 1);
  std::optional<pid_t> host = cluster.TrainerPid(lost, TaskId(*held, 1));
  ASSERT_TRUE(host.has_value());
  cluster.worker(lost).Signal(SIGKILL);
  kill(*host, SIGKILL);
  cluster.Release("lost");
  done = cluster.WaitForFinal(submitted->id(), absl::Seconds(240));
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->state(), v1::SUCCEEDED) << done->reason();
  ASSERT_EQ(done->restarts_size(), 1);
  EXPECT_EQ(done->restarts(0).reason(), v1::WORKER_LOST) << done->restarts(0).message();
  EXPECT_EQ(done->restarts(0).resumed_step(), 20);
  EXPECT_EQ(done->restarts(0).steps_lost(), kHeldAfter - 20);
  EXPECT_TRUE(ReadFile(out.path() + "/lost.bin") == reference);
}

TEST(ProgramTest, ALocalWorkdirIsPackedKeptOnceByContentAndRunFromTheArchive) {
  ClusterOptions options = QuickRestarts(1);
  options.coordinator_args.push_back("--max_workdir_size=64KiB");
  Cluster cluster(options);
  TempDir project, out;
  const std::string dir = project.path();
  std::filesystem::create_directories(dir + "/lib");
  std::ofstream(dir + "/lib/helper.py") << "GREETING = 'from the workdir'\n";
  std::ofstream(dir + "/main.py")
      << "import os, sys\nsys.path.insert(0, 'lib')\nimport helper\n"
         "files = sorted(os.path.join(d, f)[2:] for d, _, fs in os.walk('.') for f in fs\n"
         "               if '__pycache__' not in d)\n"
         "open(os.path.join(os.environ['OUT'], 'seen.txt'), 'w').write(\n"
         "    helper.GREETING + '\\n' + '\\n'.join(files))\n";
  std::ofstream(dir + "/.trainyardignore") << "outputs/\n";
  std::filesystem::create_directories(dir + "/outputs");
  std::ofstream(dir + "/outputs/model.bin") << std::string(200000, 'x');  // left out
  std::ofstream(dir + "/job.yaml")
      << "name: local\nprogram:\n  command: [" << kPython << ", main.py]\n  workdir: .\n"
      << "  env: {OUT: \"" << out.path() << "\"}\n";

  Cluster::CliResult first = cluster.Cli({"submit", "--wait", dir + "/job.yaml"});
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_THAT(first.output, HasSubstr("workdir " + dir + ": 4 files"));
  EXPECT_THAT(first.output, HasSubstr("/programs/sha256-"));
  EXPECT_THAT(ReadFile(out.path() + "/seen.txt"),
              ::testing::StrEq("from the workdir\n.trainyardignore\njob.yaml\nlib/helper.py\n"
                               "main.py"));
  // The same files again: kept once, nothing sent.
  Cluster::CliResult again = cluster.Cli({"submit", dir + "/job.yaml"});
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_THAT(again.output, HasSubstr("(already kept: nothing sent)"));

  // Over the coordinator's limit: refused with the size and the flag, no job made.
  std::ofstream(dir + "/weights.bin") << std::string(100000, 'w');
  Cluster::CliResult big = cluster.Cli({"submit", dir + "/job.yaml"});
  EXPECT_NE(big.exit_code, 0) << big.output;
  EXPECT_THAT(big.output, HasSubstr("over this coordinator's limit of 64.0 KiB"));
  EXPECT_THAT(big.output, HasSubstr("--max_workdir_size"));
}

// Runs ends.py `way` (with `more` arguments) on `workers` ranks to its final state.
Job RunEnd(Cluster& cluster, const std::string& name, const std::string& way, int workers,
           const std::string& extra = "", const std::string& more = "") {
  auto submitted = cluster.Submit(
      ProgramJob(name, "ends.py", workers, "/nonexistent", absl::StrCat(way, more), extra));
  EXPECT_TRUE(submitted.ok()) << submitted.status();
  if (!submitted.ok()) return Job();
  auto done = cluster.WaitForFinal(submitted->id(), absl::Seconds(120));
  EXPECT_TRUE(done.ok()) << done.status();
  return done.ok() ? *done : Job();
}

TEST(ProgramTest, EachEndOfAProgramIsReadAsItShouldBe) {
  Cluster cluster(QuickRestarts(2));
  // The restart policy would retry failures: only the program's own verdicts fail at once.
  const std::string retry = "restart: {max_failures: 1, max_infrastructure_errors: 0}\n";
  {
    SCOPED_TRACE("a long name: the task folder's socket path would be too long for a socket");
    const std::string name(60, 'n');
    const Job job = RunEnd(cluster, name, "early", 1, retry);
    EXPECT_EQ(job.state(), v1::SUCCEEDED) << job.reason();
    EXPECT_EQ(job.progress().step(), 3);  // the module reached its host
  }
  {
    SCOPED_TRACE("exit 2: the user's error, not retried");
    const Job job = RunEnd(cluster, "exit2", "exit2", 1, retry);
    EXPECT_EQ(job.state(), v1::FAILED);
    EXPECT_THAT(job.reason(), HasSubstr("the program exited with code 2"));
    EXPECT_THAT(job.reason(), HasSubstr("--lr must be > 0"));  // its last words
    EXPECT_EQ(job.restarts_size(), 0);
  }
  {
    SCOPED_TRACE("an exception: a failure, retried once, then failed");
    const Job job = RunEnd(cluster, "raise", "raise", 1, retry);
    EXPECT_EQ(job.state(), v1::FAILED);
    EXPECT_THAT(job.reason(), HasSubstr("ValueError: the loss diverged"));
    EXPECT_EQ(job.restarts_size(), 1);
  }
  {
    SCOPED_TRACE("a command that does not exist");
    auto submitted = cluster.Submit(
        absl::StrCat("name: missing\nprogram: {command: [no-such-trainer, x.py]}\n", retry));
    ASSERT_TRUE(submitted.ok()) << submitted.status();
    auto job = cluster.WaitForFinal(submitted->id());
    ASSERT_TRUE(job.ok());
    EXPECT_EQ(job->state(), v1::FAILED);
    EXPECT_THAT(job->reason(), HasSubstr("'no-such-trainer' was not found on this worker"));
    EXPECT_EQ(job->restarts_size(), 0);
  }
  {
    SCOPED_TRACE("a Python without torch (-S: no site packages)");
    auto submitted = cluster.Submit(absl::StrCat("name: notorch\nprogram: {command: [", kPython,
                                                 ", -S, plain_ddp.py], workdir: file://",
                                                 ProgramsDir(), "}\n", retry));
    ASSERT_TRUE(submitted.ok()) << submitted.status();
    auto job = cluster.WaitForFinal(submitted->id());
    ASSERT_TRUE(job.ok());
    EXPECT_EQ(job->state(), v1::FAILED);
    EXPECT_THAT(job->reason(), HasSubstr("the program's Python has no torch on this worker"));
    EXPECT_EQ(job->restarts_size(), 0);
  }
  {
    SCOPED_TRACE("over its memory limit");
    const Job job = RunEnd(cluster, "grow", "grow", 1, "resources: {memory: 256MiB}\n" + retry);
    EXPECT_EQ(job.state(), v1::FAILED);
    EXPECT_THAT(job.reason(), HasSubstr("out of memory: killed at its limit of"));
    EXPECT_EQ(job.restarts_size(), 0);
    ASSERT_EQ(job.tasks_size(), 1);
    EXPECT_TRUE(job.tasks(0).out_of_memory());
    EXPECT_GE(job.tasks(0).memory_peak_bytes(), 192 << 20);
  }
  {
    SCOPED_TRACE("no reports for longer than stall_timeout: not a hang, its steps are unknown");
    const Job job = RunEnd(cluster, "quiet", "quiet", 1, "stall_timeout: 1s\n" + retry, ", \"4\"");
    EXPECT_EQ(job.state(), v1::SUCCEEDED) << job.reason();
    EXPECT_EQ(job.restarts_size(), 0);
  }
  {
    SCOPED_TRACE("a report, then none for stall_timeout: a hang");
    const Job job = RunEnd(cluster, "stall", "stall", 1, "stall_timeout: 2s\n" + retry);
    EXPECT_EQ(job.state(), v1::FAILED);
    EXPECT_THAT(job.reason(), HasSubstr("no step progress for 2s"));
  }
  {
    SCOPED_TRACE("ranks that commit different steps: the program's mistake, named");
    const Job job = RunEnd(cluster, "mismatch", "mismatch", 2, retry);
    EXPECT_EQ(job.state(), v1::FAILED);
    EXPECT_THAT(job.reason(), HasSubstr("rank 1 committed step 6 where rank 0 committed step 5"));
    EXPECT_EQ(job.restarts_size(), 0);
  }
  {
    SCOPED_TRACE("a rank that ends early while the other goes on: the job waits for both");
    cluster.Hold("early", 1);
    auto submitted = cluster.Submit(ProgramJob("early", "ends.py", 2, "/nonexistent", "early"));
    ASSERT_TRUE(submitted.ok()) << submitted.status();
    auto one_done = cluster.WaitFor(submitted->id(), [](const Job& job) {
      bool rank1_exited = false;
      for (const v1::TaskInfo& t : job.tasks()) {
        rank1_exited |= t.rank() == 1 && t.state() == v1::TASK_EXITED && t.exit_code() == 0;
      }
      return rank1_exited && job.progress().step() == 1;
    });
    ASSERT_TRUE(one_done.ok()) << one_done.status();
    EXPECT_EQ(one_done->state(), v1::RUNNING);
    cluster.Release("early");
    auto job = cluster.WaitForFinal(submitted->id());
    ASSERT_TRUE(job.ok());
    EXPECT_EQ(job->state(), v1::SUCCEEDED) << job->reason();
    EXPECT_EQ(job->progress().step(), 3);
  }
  {
    SCOPED_TRACE("rank 0's program ends first: the store its host serves stays for rank 1");
    TempDir out;
    auto submitted = cluster.Submit(ProgramJob("late-store", "late_store.py", 2, out.path()));
    ASSERT_TRUE(submitted.ok()) << submitted.status();
    auto job = cluster.WaitForFinal(submitted->id());
    ASSERT_TRUE(job.ok());
    EXPECT_EQ(job->state(), v1::SUCCEEDED) << job->reason() << "\n" << *cluster.Logs(job->id());
    EXPECT_EQ(ReadFile(absl::StrCat(out.path(), "/", job->id(), "-rank1.txt")),
              "written after rank 0's program ended");
  }
  {
    SCOPED_TRACE("a program without the module restarted: recovered once up, steps lost unknown");
    // Silent for its stall_timeout (1 s): taken for a program that reports no steps. Last in
    // this test: it loses a worker.
    auto submitted = cluster.Submit(ProgramJob("quiet-lost", "ends.py", 1, "/nonexistent",
                                               "quiet, \"600\"", "stall_timeout: 1s\n"));
    ASSERT_TRUE(submitted.ok()) << submitted.status();
    auto up = cluster.WaitFor(submitted->id(), [](const Job& job) {
      return job.state() == v1::RUNNING && job.progress().steps_unknown();
    });
    ASSERT_TRUE(up.ok()) << up.status();
    const int lost = WorkerOfRank(*up, 0);
    std::optional<pid_t> host = cluster.TrainerPid(lost, TaskId(*up, 0));
    ASSERT_TRUE(host.has_value());
    cluster.worker(lost).Signal(SIGKILL);
    kill(*host, SIGKILL);
    auto recovered = cluster.WaitFor(submitted->id(), [](const Job& job) {
      return job.restarts_size() == 1 && job.restarts(0).recovered();
    });
    ASSERT_TRUE(recovered.ok()) << recovered.status();
    const v1::Restart& r = recovered->restarts(0);
    EXPECT_EQ(r.reason(), v1::WORKER_LOST) << r.message();
    EXPECT_TRUE(r.steps_lost_unknown());
    EXPECT_EQ(recovered->state(), v1::RUNNING);  // not a stall: its steps are unknown
    const Cluster::CliResult described = cluster.Cli({"describe", submitted->id()});
    EXPECT_THAT(described.output, HasSubstr("steps lost unknown (the program reports no steps)"));
    EXPECT_EQ(cluster.Cli({"cancel", submitted->id()}).exit_code, 0);
  }
}

}  // namespace
}  // namespace trainyard::testing
