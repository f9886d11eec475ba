// The capacity room: when the CapacityAsker asks a provider for nodes and gives them back (on a
// scripted provider and a fake clock), SlurmProvider's commands and how it reads Slurm's answers
// (on scripted answers), and RunCommand on real processes.

#include <cstdlib>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_join.h"
#include "common/run_command.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/capacity/capacity_asker.h"
#include "server/capacity/capacity_loop.h"
#include "server/capacity/slurm_provider.h"
#include "tests/common/fake_clock.h"
#include "tests/server/job_manager_fixture.h"

namespace trainyard {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// A provider that hands out what the test says: allocations it keeps, asks it records.
class ScriptedProvider : public CapacityProvider {
 public:
  std::string Name() const override { return "Slurm"; }
  absl::StatusOr<std::string> Request(const std::string& job_id, int nodes) override {
    asks.push_back(absl::StrCat(job_id, ":", nodes));
    if (!refuse.empty()) return absl::FailedPreconditionError(refuse);
    Allocation a;
    a.id = std::to_string(next_id++);
    a.job_id = job_id;
    a.nodes = nodes;
    a.detail = "PENDING (Resources)";
    held.push_back(a);
    return a.id;
  }
  absl::StatusOr<std::vector<Allocation>> List() override {
    if (!list_error.empty()) return absl::UnavailableError(list_error);
    return held;
  }
  std::string HowItEnded(const std::string& id) override { return "FAILED, exit code 1:0"; }
  absl::Status Release(const std::string& id) override {
    released.push_back(id);
    held.erase(
        std::remove_if(held.begin(), held.end(), [&](const Allocation& a) { return a.id == id; }),
        held.end());
    return absl::OkStatus();
  }
  void Start(const std::string& id, std::vector<std::string> nodes) {
    for (Allocation& a : held) {
      if (a.id != id) continue;
      a.state = AllocationState::kRunning;
      a.node_names = std::move(nodes);
      a.detail = "RUNNING on " + absl::StrJoin(a.node_names, ",");
    }
  }
  std::vector<Allocation> held;
  std::vector<std::string> asks;
  std::vector<std::string> released;
  std::string refuse;
  std::string list_error;
  int next_id = 7;
};

WaitingJob Gang(const std::string& id, int ranks, int slots, int gpus = 0) {
  WaitingJob j;
  j.id = id;
  j.ranks = ranks;
  j.slots_per_rank = slots;
  j.gpus_per_rank = gpus;
  return j;
}

class CapacityAskerTest : public ::testing::Test {
 protected:
  CapacityAskerTest() {
    options_.shape.slots = 8;
    options_.shape.gpus = 4;
    options_.max_nodes = 4;
    options_.idle_timeout = absl::Minutes(5);
    options_.retry_after = absl::Seconds(30);
  }
  CapacityOptions options_;
  ScriptedProvider provider_;
  FakeClock clock_;
};

TEST_F(CapacityAskerTest, NodesForAGangPackRanksByTheScarcestKind) {
  CapacityAsker asker(options_, provider_, clock_);
  std::string why;
  EXPECT_EQ(asker.NodesFor(Gang("a", 2, 8), &why), 2);     // a node's slots per rank
  EXPECT_EQ(asker.NodesFor(Gang("b", 8, 1, 1), &why), 2);  // 4 GPUs per node
  EXPECT_EQ(asker.NodesFor(Gang("c", 3, 2), &why), 1);     // 4 such ranks fit a node
  WaitingJob ps = Gang("d", 2, 4);
  ps.shards = 3;
  ps.slots_per_shard = 8;
  EXPECT_EQ(asker.NodesFor(ps, &why), 1 + 3);
  EXPECT_EQ(asker.NodesFor(Gang("e", 1, 1, 8), &why), 0);
  EXPECT_THAT(why, HasSubstr("8 GPUs"));
  EXPECT_THAT(why, HasSubstr("offers 8 slots, 4 GPUs"));
}

TEST_F(CapacityAskerTest, AsksOncePerWaitingJobAndNamesTheAllocation) {
  CapacityAsker asker(options_, provider_, clock_);
  std::map<std::string, std::string> notes = asker.Round({Gang("j1", 2, 8)}, {});
  EXPECT_THAT(provider_.asks, ElementsAre("j1:2"));
  EXPECT_EQ(notes["j1"], "asked Slurm for 2 nodes (job 7)");
  // The next rounds find the allocation and ask nothing more.
  notes = asker.Round({Gang("j1", 2, 8)}, {});
  EXPECT_THAT(provider_.asks, ElementsAre("j1:2"));
  EXPECT_EQ(notes["j1"], "asked Slurm for 2 nodes (job 7 PENDING (Resources))");
  provider_.Start("7", {"n1", "n2"});
  notes = asker.Round({Gang("j1", 2, 8)}, {});
  EXPECT_EQ(notes["j1"], "asked Slurm for 2 nodes (job 7 RUNNING on n1,n2, its agents starting)");
  EXPECT_THAT(provider_.released, IsEmpty());
}

TEST_F(CapacityAskerTest, NeverHoldsMoreThanMaxNodes) {
  CapacityAsker asker(options_, provider_, clock_);
  std::map<std::string, std::string> notes =
      asker.Round({Gang("j1", 3, 8), Gang("j2", 2, 8), Gang("j3", 1, 8)}, {});
  // j2 would make 5 of 4; j3 still fits behind it.
  EXPECT_THAT(provider_.asks, ElementsAre("j1:3", "j3:1"));
  EXPECT_EQ(notes["j2"], "needs 2 Slurm nodes; 3 of at most 4 are held");
}

TEST_F(CapacityAskerTest, ARefusalIsShownAndAskedAgainAfterABackoffThatDoubles) {
  CapacityAsker asker(options_, provider_, clock_);
  provider_.refuse = "exit 1: sbatch: error: invalid partition specified: nosuch";
  std::map<std::string, std::string> notes = asker.Round({Gang("j1", 1, 8)}, {});
  EXPECT_EQ(notes["j1"],
            "Slurm refused 1 node: exit 1: sbatch: error: invalid partition specified: nosuch; "
            "asking again in 30s");
  clock_.Advance(absl::Seconds(10));
  notes = asker.Round({Gang("j1", 1, 8)}, {});
  EXPECT_EQ(provider_.asks.size(), 1u);
  EXPECT_THAT(notes["j1"], HasSubstr("asking again in 20s"));
  clock_.Advance(absl::Seconds(20));
  notes = asker.Round({Gang("j1", 1, 8)}, {});
  EXPECT_EQ(provider_.asks.size(), 2u);
  EXPECT_THAT(notes["j1"], HasSubstr("asking again in 1m"));
  provider_.refuse.clear();
  clock_.Advance(absl::Minutes(1));
  notes = asker.Round({Gang("j1", 1, 8)}, {});
  EXPECT_EQ(notes["j1"], "asked Slurm for 1 node (job 7)");
}

TEST_F(CapacityAskerTest, GivesBackIdleAllocationsAndPendingOnesNoJobWaitsFor) {
  CapacityAsker asker(options_, provider_, clock_);
  asker.Round({Gang("j1", 2, 8), Gang("j2", 1, 8)}, {});
  provider_.Start("7", {"n1", "n2"});
  // j2 ran elsewhere: its pending allocation goes at once. j1 runs on its allocation's agents.
  asker.Round({}, {{"n1", true}, {"n2", false}});
  EXPECT_THAT(provider_.released, ElementsAre("8"));
  clock_.Advance(absl::Minutes(10));
  asker.Round({}, {{"n1", true}, {"n2", false}});
  EXPECT_THAT(provider_.released, ElementsAre("8"));
  // j1 ended: idle from here, given back after idle_timeout.
  asker.Round({}, {{"n1", false}, {"n2", false}});
  clock_.Advance(absl::Minutes(4));
  asker.Round({}, {{"n1", false}, {"n2", false}});
  EXPECT_THAT(provider_.released, ElementsAre("8"));
  clock_.Advance(absl::Minutes(1));
  asker.Round({}, {{"n1", false}, {"n2", false}});
  EXPECT_THAT(provider_.released, ElementsAre("8", "7"));
}

TEST_F(CapacityAskerTest, AnAllocationItsJobStillWaitsForIsNotIdle) {
  options_.idle_timeout = absl::ZeroDuration();
  CapacityAsker asker(options_, provider_, clock_);
  asker.Round({Gang("j1", 2, 8)}, {});
  provider_.Start("7", {"n1", "n2"});
  clock_.Advance(absl::Minutes(1));
  asker.Round({Gang("j1", 2, 8)}, {});  // agents not registered yet
  EXPECT_THAT(provider_.released, IsEmpty());
}

TEST_F(CapacityAskerTest, AnAllocationThatEndsBeforeItsAgentsRanAnythingIsRetriedLater) {
  CapacityAsker asker(options_, provider_, clock_);
  asker.Round({Gang("j1", 1, 8)}, {});
  provider_.Start("7", {"n1"});
  asker.Round({Gang("j1", 1, 8)}, {{"n1", false}});
  provider_.held.clear();  // its script failed
  std::map<std::string, std::string> notes = asker.Round({Gang("j1", 1, 8)}, {});
  EXPECT_EQ(notes["j1"],
            "Slurm job 7 ended before its agents ran anything: FAILED, exit code 1:0; asking "
            "again in 30s");
  EXPECT_EQ(provider_.asks.size(), 1u);
  clock_.Advance(absl::Seconds(30));
  notes = asker.Round({Gang("j1", 1, 8)}, {});
  EXPECT_EQ(notes["j1"], "asked Slurm for 1 node (job 8)");
  // Taken back after its agents ran the job (a preemption): asked again at once.
  provider_.Start("8", {"n2"});
  asker.Round({}, {{"n2", true}});
  provider_.held.clear();
  notes = asker.Round({Gang("j1", 1, 8)}, {});
  EXPECT_EQ(notes["j1"], "asked Slurm for 1 node (job 9)");
}

TEST_F(CapacityAskerTest, AProviderThatCannotBeReachedAsksNothing) {
  CapacityAsker asker(options_, provider_, clock_);
  provider_.list_error =
      "squeue: exit 1: slurm_load_jobs error: Unable to contact slurm controller";
  std::map<std::string, std::string> notes = asker.Round({Gang("j1", 1, 8)}, {});
  EXPECT_THAT(provider_.asks, IsEmpty());
  EXPECT_THAT(notes["j1"], HasSubstr("cannot ask Slurm for nodes: squeue: exit 1"));
}

TEST(WaitingForCapacityTest, OnlyJobsMoreMachinesWouldLetRunInQueueOrder) {
  std::vector<v1::Job> pending(4);
  pending[0].set_id("quota");
  pending[0].set_reason("queue team-a is at its limit: ...");
  pending[1].set_id("second");
  pending[1].set_reason("queued behind first");
  pending[1].set_position(2);
  pending[2].set_id("first");
  pending[2].set_reason("waiting for capacity: needs 4 slots, 2 free; asked Slurm for 1 node");
  pending[2].set_position(1);
  pending[2].mutable_spec()->set_strategy(v1::DATA_PARALLEL);
  pending[2].mutable_spec()->mutable_workers()->set_min(3);
  pending[3].set_id("none");
  pending[3].set_reason("no ready workers");
  for (v1::Job& j : pending) j.set_state(v1::PENDING);
  std::vector<WaitingJob> waiting = WaitingForCapacity(pending);
  std::vector<std::string> ids;
  for (const WaitingJob& w : waiting) ids.push_back(w.id);
  EXPECT_THAT(ids, ElementsAre("first", "second", "none"));
  EXPECT_EQ(waiting[0].ranks, 3);
}

// ---- the loop beside a real JobManager: asks, and notes in the jobs' reasons ----

class CapacityLoopTest : public JobManagerTest {
 protected:
  // A provider the loop owns; the test keeps a pointer to script it.
  std::unique_ptr<CapacityLoop> Loop(ScriptedProvider** provider) {
    auto owned = std::make_unique<ScriptedProvider>();
    *provider = owned.get();
    CapacityOptions options;
    options.shape.slots = 1;
    options.max_nodes = 4;
    return std::make_unique<CapacityLoop>(*manager_, std::move(owned), options, absl::Seconds(5),
                                          clock_);
  }
};

TEST_F(CapacityLoopTest, AWaitingGangIsAskedForAndItsReasonSaysSo) {
  ScriptedProvider* provider = nullptr;
  std::unique_ptr<CapacityLoop> loop = Loop(&provider);
  const std::string id = Submit(TestSpec("gang", 2, 2));
  manager_->Tick();
  EXPECT_EQ(Get(id).reason(), "no workers registered");
  loop->RoundOnce();
  EXPECT_THAT(provider->asks, ElementsAre(id + ":2"));
  EXPECT_EQ(Get(id).reason(), "no workers registered; asked Slurm for 2 nodes (job 7)");
  // The scheduler's passes keep the note; the next round's replaces it.
  manager_->Tick();
  EXPECT_EQ(Get(id).reason(), "no workers registered; asked Slurm for 2 nodes (job 7)");
  loop->RoundOnce();
  EXPECT_EQ(Get(id).reason(),
            "no workers registered; asked Slurm for 2 nodes (job 7 PENDING (Resources))");
  EXPECT_THAT(provider->asks, ElementsAre(id + ":2"));
  // Its agents come: the job is placed, and nothing more is asked or given back.
  provider->Start("7", {"n1", "n2"});
  Register("n1", 1);
  Register("n2", 1);
  manager_->Tick();
  EXPECT_EQ(Get(id).state(), v1::SCHEDULED);
  loop->RoundOnce();
  EXPECT_THAT(provider->asks, ElementsAre(id + ":2"));
  EXPECT_THAT(provider->released, IsEmpty());
  EXPECT_THAT(Get(id).reason(), ::testing::Not(HasSubstr("Slurm")));
}

TEST_F(CapacityLoopTest, StartsAndStopsOnAClockThatNeverMoves) {
  ScriptedProvider* provider = nullptr;
  std::unique_ptr<CapacityLoop> loop = Loop(&provider);
  Submit(TestSpec("one"));
  manager_->Tick();
  loop->Start();
  ASSERT_TRUE(clock_.AwaitWaiter().has_value());  // its first round done, waiting for the next
  loop->Stop();
  EXPECT_EQ(provider->asks.size(), 1u);
}

// ---- SlurmProvider ----

struct ScriptedCommands {
  std::vector<std::string> calls;
  std::map<std::string, CommandResult> answers;  // by program
  CommandRunner Runner() {
    return [this](const std::vector<std::string>& argv) -> absl::StatusOr<CommandResult> {
      calls.push_back(absl::StrJoin(argv, " "));
      auto it = answers.find(argv[0]);
      if (it == answers.end()) return absl::NotFoundError(argv[0] + ": no such program");
      return it->second;
    };
  }
};

SlurmOptions Options() {
  SlurmOptions o;
  o.script = "/opt/trainyard/trainyard-agents.sbatch";
  o.partition = "gpu";
  o.account = "ml";
  o.qos = "normal";
  o.time_limit = "4:00:00";
  o.gpus_per_node = 8;
  o.env_file = "/etc/trainyard/slurm.env";
  return o;
}

TEST(SlurmProviderTest, SbatchAsksForWholeNodesWithTheSettingsAndNoEnvironment) {
  ScriptedCommands commands;
  commands.answers["sbatch"].out = "1234;cluster\n";
  SlurmProvider slurm(Options(), commands.Runner());
  absl::StatusOr<std::string> id = slurm.Request("train-3", 2);
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(*id, "1234");
  EXPECT_THAT(
      commands.calls,
      ElementsAre("sbatch --parsable --job-name=trainyard-agents --nodes=2 "
                  "--comment=trainyard-job=train-3 --partition=gpu --account=ml "
                  "--qos=normal --time=4:00:00 --gres=gpu:8 "
                  "--export=TRAINYARD_REQUEUE=0,TRAINYARD_SLURM_ENV=/etc/trainyard/slurm.env "
                  "/opt/trainyard/trainyard-agents.sbatch"));
}

TEST(SlurmProviderTest, SlurmsWordsComeBackWhenItRefuses) {
  ScriptedCommands commands;
  CommandResult& refused = commands.answers["sbatch"];
  refused.exit_code = 1;
  refused.err =
      "sbatch: error: invalid partition specified: gpu\n"
      "sbatch: error: Batch job submission failed: Invalid partition name specified\n";
  SlurmProvider slurm(Options(), commands.Runner());
  absl::StatusOr<std::string> id = slurm.Request("j", 1);
  EXPECT_EQ(id.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(id.status().message(),
            "exit 1: sbatch: error: Batch job submission failed: Invalid partition name "
            "specified");
  commands.answers["sbatch"] = CommandResult{0, 0, "Submitted batch job 5\n", ""};
  EXPECT_EQ(slurm.Request("j", 1).status().code(), absl::StatusCode::kInternal);
  ScriptedCommands none;
  SlurmProvider missing(Options(), none.Runner());
  EXPECT_THAT(std::string(missing.Request("j", 1).status().message()),
              HasSubstr("is Slurm's client installed"));
}

TEST(SlurmProviderTest, ListsItsOwnAllocationsWithTheirNodesExpandedBySlurm) {
  ScriptedCommands commands;
  commands.answers["squeue"].out =
      "41|PENDING|2|Resources|trainyard-job=a-1|\n"
      "42|RUNNING|2|None|trainyard-job=b-2|n[2-3]\n"
      "43|COMPLETING|1|None|trainyard-job=c-3|n4\n"
      "garbage line\n"
      "44|CONFIGURING|1|None||n5\n";
  commands.answers["scontrol"].out = "n2\nn3\n";
  commands.answers["scancel"] = CommandResult{};
  SlurmProvider slurm(Options(), commands.Runner());
  absl::StatusOr<std::vector<Allocation>> listed = slurm.List();
  ASSERT_TRUE(listed.ok()) << listed.status();
  // 44 has no comment of ours: agents an operator started under the same name are not ours.
  ASSERT_EQ(listed->size(), 2u);
  EXPECT_EQ((*listed)[0].job_id, "a-1");
  EXPECT_EQ((*listed)[0].detail, "PENDING (Resources)");
  EXPECT_EQ((*listed)[1].state, AllocationState::kRunning);
  EXPECT_THAT((*listed)[1].node_names, ElementsAre("n2", "n3"));
  EXPECT_EQ((*listed)[1].detail, "RUNNING on n2,n3");
  EXPECT_THAT(commands.calls[0], HasSubstr("--name=trainyard-agents"));
  EXPECT_EQ(commands.calls[1], "scontrol show hostnames n[2-3]");
  EXPECT_TRUE(slurm.Release("42").ok());
  EXPECT_EQ(commands.calls.back(), "scancel 42");
}

TEST(SlurmProviderTest, SqueueLinesOfAnotherShapeAreSkipped) {
  EXPECT_FALSE(ParseSqueueLine("").has_value());
  EXPECT_FALSE(ParseSqueueLine("1|RUNNING|1|None|x").has_value());
  EXPECT_FALSE(ParseSqueueLine("1;rm -rf|RUNNING|1|None|x|n1").has_value());
  EXPECT_TRUE(ParseSqueueLine("12_3|PENDING|1|Priority||").has_value());
}

// ---- RunCommand, on real processes ----

TEST(RunCommandTest, KeepsWhatAProgramPrintsAndHowItEnded) {
  absl::StatusOr<CommandResult> r = RunCommand(
      {"sh", "-c", "echo out; echo \"$EXTRA\" >&2; exit 3"}, {"EXTRA=err"}, absl::Seconds(30));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, 3);
  EXPECT_EQ(r->out, "out\n");
  EXPECT_EQ(r->err, "err\n");
  EXPECT_EQ(DescribeCommandEnd(*r), "exit 3: err");
  EXPECT_EQ(RunCommand({"no-such-program-here"}, {}, absl::Seconds(5)).status().code(),
            absl::StatusCode::kNotFound);
}

// A name this process has is replaced, not listed twice: getenv (and so sh) reads the first.
TEST(RunCommandTest, ExtraEnvironmentReplacesThisProcesssOwn) {
  ASSERT_EQ(setenv("TRAINYARD_RUN_COMMAND_TEST", "own", 1), 0);
  absl::StatusOr<CommandResult> r =
      RunCommand({"sh", "-c",
                  "echo \"$TRAINYARD_RUN_COMMAND_TEST\"; env | grep -c "
                  "'^TRAINYARD_RUN_COMMAND_TEST='"},
                 {"TRAINYARD_RUN_COMMAND_TEST=given"}, absl::Seconds(30));
  unsetenv("TRAINYARD_RUN_COMMAND_TEST");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->out, "given\n1\n");
}

TEST(RunCommandTest, AProgramPastItsTimeIsKilled) {
  absl::StatusOr<CommandResult> r =
      RunCommand({"sh", "-c", "echo started; exec sleep 600"}, {}, absl::Milliseconds(300));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->signal, 9);
  EXPECT_EQ(r->out, "started\n");
}

}  // namespace
}  // namespace trainyard
