// A synchronous parameter_server job trains like the same data_parallel job: two ranks as
// threads, two shards served over gRPC on loopback, 20 updates of SGD with momentum or AdamW,
// with and without gradient accumulation; the exported models agree within 1e-5.

#include <torch/torch.h>

#include <atomic>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/common/fake_clock.h"
#include "tests/trainer/fake_rendezvous.h"
#include "tests/trainer/test_files.h"
#include "tests/trainer/trainer_test_util.h"
#include "worker/trainer/loop/shard_task.h"
#include "worker/trainer/ps/server.h"
#include "worker/trainer/ps/strategy.h"

namespace trainyard::trainer {
namespace {

using ::trainyard::trainer::test_files::MakeTempDir;
using ::trainyard::trainer::test_util::ReadTensors;
using ::trainyard::trainer::test_util::RunRanks;

constexpr int kRanks = 2;
constexpr int kShards = 2;
constexpr int64_t kSteps = 20;

struct Case {
  bool adamw;
  int accumulate;
};

trainyard::v1::Task JobTask(const std::string& dir, const Case& c,
                            trainyard::v1::Strategy strategy) {
  trainyard::v1::Task task;
  task.set_job_id("ps1");
  task.set_generation(1);
  task.set_slots(1);
  task.set_checkpoint_uri("file://" + dir);
  auto& spec = *task.mutable_spec();
  spec.set_strategy(strategy);
  if (strategy == trainyard::v1::PARAMETER_SERVER) {
    spec.mutable_parameter_servers()->set_shards(kShards);
    spec.mutable_parameter_servers()->set_mode("sync");
    spec.mutable_parameter_servers()->set_dense("shards");
  }
  spec.mutable_model()->set_builtin("mlp");
  spec.mutable_model()->mutable_args()->add_hidden(32);
  spec.mutable_model()->mutable_args()->add_hidden(16);
  auto& synthetic = *spec.mutable_data()->mutable_synthetic();
  synthetic.set_samples(256);
  synthetic.set_features(8);
  synthetic.set_classes(3);
  synthetic.set_noise(1.0f);
  spec.mutable_data()->set_shuffle(true);
  spec.set_batch_size(16);
  spec.set_accumulate_steps(c.accumulate);
  auto& optimizer = *spec.mutable_optimizer();
  if (c.adamw) {
    optimizer.set_name("adamw");
    optimizer.set_lr(0.01);
    optimizer.set_beta1(0.9);
    optimizer.set_beta2(0.999);
    optimizer.set_eps(1e-8);
    optimizer.set_weight_decay(0.01);
  } else {
    optimizer.set_name("sgd");
    optimizer.set_lr(0.05);
    optimizer.set_momentum(0.9);
    optimizer.set_weight_decay(0.001);
  }
  optimizer.mutable_schedule()->set_name("cosine");
  optimizer.mutable_schedule()->set_warmup_steps(3);
  spec.set_loss("cross_entropy");
  spec.set_max_steps(kSteps);
  spec.set_seed(5);
  spec.set_log_every_steps(kSteps);
  spec.set_collective_timeout_seconds(30);
  return task;
}

// `shards` empty shard servers for `task`'s attempt with `ranks` workers, published in
// `rendezvous` as the trainers look for them.
std::vector<std::unique_ptr<PsServer>> StartShards(const trainyard::v1::Task& task, int ranks,
                                                   int shards, FakeRendezvous& rendezvous) {
  std::vector<std::unique_ptr<PsServer>> servers;
  for (int s = 0; s < shards; ++s) {
    ShardConfig config;
    config.generation = task.generation();
    config.shard = s;
    config.shards = shards;
    config.workers = ranks;
    config.optimizer = task.spec().optimizer();
    config.synchronous = task.spec().parameter_servers().mode() != "async";
    config.max_staleness = task.spec().parameter_servers().max_staleness();
    auto server = PsServer::StartEmpty(config, "127.0.0.1:0");
    EXPECT_TRUE(server.ok()) << server.status();
    if (!server.ok()) break;
    EXPECT_TRUE(
        rendezvous.Set(ParameterServerKey(s), absl::StrCat("127.0.0.1:", (*server)->port())).ok());
    servers.push_back(std::move(*server));
  }
  return servers;
}

// Runs the job of `task` on `ranks` ranks and `shards` shards; the ranks' results.
std::vector<absl::StatusOr<TrainResult>> RunPs(
    trainyard::v1::Task task, int ranks, int shards,
    const std::function<void(int, TrainerOptions&)>& customize = {}) {
  task.mutable_spec()->mutable_parameter_servers()->set_shards(shards);
  FakeRendezvous rendezvous;
  const auto servers = StartShards(task, ranks, shards, rendezvous);
  return RunRanks(task, ranks, customize, &rendezvous);
}

// Rank 0 is asked to stop (SIGTERM's code in `stop`) once it has made `step` updates; every rank
// then stops after the next one.
std::function<void(int, TrainerOptions&)> StopAfter(int64_t step, std::atomic<int>& stop) {
  return [step, &stop](int rank, TrainerOptions& options) {
    if (rank != 0) return;
    options.stop_signal = &stop;
    options.after_step = [step, &stop](int64_t done) {
      if (done == step) stop = 15;
    };
  };
}

void ExpectClose(const std::map<std::string, torch::Tensor>& a,
                 const std::map<std::string, torch::Tensor>& b) {
  ASSERT_FALSE(a.empty());
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, tensor] : a) {
    ASSERT_TRUE(b.count(name)) << name;
    EXPECT_LE((tensor - b.at(name)).abs().max().item<double>(), 1e-5) << name;
  }
}

// Resumes `task` (whose checkpoint folder is the one it exports to) from the checkpoint of step
// 10 in `stopped` on 1 rank and 3 shards, and expects it to end where the run in `whole` ended.
void ResumeAndCompare(trainyard::v1::Task task, const std::string& stopped,
                      const std::string& whole) {
  task.set_generation(2);
  task.add_resume_checkpoints(absl::StrFormat("file://%s/step-%012d", stopped, 10));
  for (const auto& r : RunPs(task, 1, 3)) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->start_step, 10);
  }
  const std::string resumed = task.checkpoint_uri().substr(std::string("file://").size());
  ExpectClose(ReadTensors(whole + "/final/model.safetensors"),
              ReadTensors(resumed + "/final/model.safetensors"));
}

class PsStrategyTest : public ::testing::TestWithParam<Case> {};

TEST_P(PsStrategyTest, SynchronousJobEndsWhereTheDataParallelJobEnds) {
  const Case c = GetParam();
  const std::string dp_dir = MakeTempDir(), ps_dir = MakeTempDir();
  for (const auto& r : RunRanks(JobTask(dp_dir, c, trainyard::v1::DATA_PARALLEL), kRanks, {})) {
    ASSERT_TRUE(r.ok()) << r.status();
  }

  const trainyard::v1::Task ps_task = JobTask(ps_dir, c, trainyard::v1::PARAMETER_SERVER);
  FakeRendezvous rendezvous;
  const auto servers = StartShards(ps_task, kRanks, kShards, rendezvous);
  std::vector<absl::StatusOr<TrainResult>> results = RunRanks(ps_task, kRanks, {}, &rendezvous);
  for (const auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->step, kSteps);
  }

  ExpectClose(ReadTensors(dp_dir + "/final/model.safetensors"),
              ReadTensors(ps_dir + "/final/model.safetensors"));
}

// Stopped after 10 of 20 updates on 2 ranks and 2 shards, resumed from that checkpoint on other
// counts: the parameters and the optimizer's state carry over (the checkpoint holds them as a
// data_parallel job's does), and the run ends where the uninterrupted one ends.
TEST_P(PsStrategyTest, StoppedAndResumedOnOtherCountsEndsLikeTheUninterruptedRun) {
  const Case c = GetParam();
  const std::string whole = MakeTempDir(), stopped = MakeTempDir();
  for (const auto& r : RunPs(JobTask(whole, c, trainyard::v1::PARAMETER_SERVER), kRanks, kShards)) {
    ASSERT_TRUE(r.ok()) << r.status();
  }
  std::atomic<int> stop{0};
  for (const auto& r : RunPs(JobTask(stopped, c, trainyard::v1::PARAMETER_SERVER), kRanks, kShards,
                             StopAfter(9, stop))) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->stopped);
    EXPECT_EQ(r->step, 10);
  }
  const std::string checkpoint = absl::StrFormat("file://%s/step-%012d", stopped, 10);
  const auto saved =
      ReadTensors(test_files::StepFile(absl::StrFormat("%s/step-%012d", stopped, 10), "optimizer"));
  ASSERT_FALSE(saved.empty()) << "the checkpoint of a stop holds the shards' optimizer state";

  for (const auto& [ranks, shards] : {std::pair{1, 3}, std::pair{2, 1}}) {
    const std::string resumed = MakeTempDir();
    trainyard::v1::Task task = JobTask(resumed, c, trainyard::v1::PARAMETER_SERVER);
    task.set_generation(2);
    task.add_resume_checkpoints(checkpoint);
    for (const auto& r : RunPs(task, ranks, shards)) {
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->start_step, 10);
    }
    SCOPED_TRACE(absl::StrCat(ranks, " ranks, ", shards, " shards"));
    ExpectClose(ReadTensors(whole + "/final/model.safetensors"),
                ReadTensors(resumed + "/final/model.safetensors"));
  }
}

// Shards run as tasks of the job (RunShardTask) publish themselves in the rendezvous store, serve
// the ranks, and end on their own once every rank has finished.
TEST(PsShardTaskTest, ShardTasksServeTheRanksUntilTheyFinish) {
  const Case c{false, 1};
  const std::string dp_dir = MakeTempDir(), ps_dir = MakeTempDir();
  for (const auto& r : RunRanks(JobTask(dp_dir, c, trainyard::v1::DATA_PARALLEL), kRanks, {})) {
    ASSERT_TRUE(r.ok()) << r.status();
  }
  const trainyard::v1::Task ps_task = JobTask(ps_dir, c, trainyard::v1::PARAMETER_SERVER);
  FakeRendezvous rendezvous;
  std::atomic<int> stop{0};
  const std::string metrics_dir = MakeTempDir();
  std::vector<absl::Status> shard_results(kShards, absl::UnknownError("not run"));
  std::vector<std::thread> shards;
  for (int s = 0; s < kShards; ++s) {
    shards.emplace_back([&, s] {
      trainyard::v1::Task task = ps_task;
      task.set_role(trainyard::v1::TASK_ROLE_SHARD);
      task.set_shard(s);
      task.set_world_size(kRanks);
      ShardTaskOptions options;
      options.rendezvous = &rendezvous;
      options.listen = "127.0.0.1:0";
      options.stop_signal = &stop;
      options.metrics_file = absl::StrCat(metrics_dir, "/shard-", s);
      shard_results[s] = RunShardTask(task, options);
    });
  }
  for (const auto& r : RunRanks(ps_task, kRanks, {}, &rendezvous))
    ASSERT_TRUE(r.ok()) << r.status();
  stop = 15;
  for (std::thread& t : shards) t.join();
  for (const absl::Status& s : shard_results) EXPECT_TRUE(s.ok()) << s;
  // Each wrote its counters on the way out: a push and a pull per rank and update.
  for (int s = 0; s < kShards; ++s) {
    std::ifstream in(absl::StrCat(metrics_dir, "/shard-", s));
    std::map<std::string, double> counters;
    std::string name;
    double value = 0;
    while (in >> name >> value) counters[name] = value;
    EXPECT_EQ(counters["pushes"], kRanks * kSteps) << "shard " << s;
    EXPECT_EQ(counters["pulls"], counters["pushes"] + kRanks) << "shard " << s;
    EXPECT_EQ(counters["version"], kSteps) << "shard " << s;
    EXPECT_GT(counters["bytes_received"], 0) << "shard " << s;
  }
  ExpectClose(ReadTensors(dp_dir + "/final/model.safetensors"),
              ReadTensors(ps_dir + "/final/model.safetensors"));

  // Asked to stop before the ranks are done, a shard serves on until its stop's deadline.
  std::atomic<int> stopped{15};
  const absl::Time start = absl::Now();  // before the deadline is set: it ends >= 500 ms later
  const std::string deadline_file = MakeTempDir() + "/stop-deadline";
  std::ofstream(deadline_file) << absl::ToUnixMillis(absl::Now() + absl::Milliseconds(700)) << "\n";
  trainyard::v1::Task lone = ps_task;
  lone.set_role(trainyard::v1::TASK_ROLE_SHARD);
  lone.set_generation(5);
  lone.set_world_size(kRanks);
  FakeRendezvous other;
  ShardTaskOptions until_deadline;
  until_deadline.rendezvous = &other;
  until_deadline.listen = "127.0.0.1:0";
  until_deadline.stop_signal = &stopped;
  until_deadline.stop_deadline_file = deadline_file;
  EXPECT_TRUE(RunShardTask(lone, until_deadline).ok());
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(400));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));

  // A plain stop (no deadline: the attempt ended) ends a shard whose ranks have gone quiet,
  // rather than wait for ranks that may never finish.
  trainyard::v1::Task orphan = lone;
  orphan.set_generation(6);
  FakeRendezvous third;
  ShardTaskOptions plain;
  plain.rendezvous = &third;
  plain.listen = "127.0.0.1:0";
  plain.stop_signal = &stopped;
  plain.quiet_after_plain_stop = absl::Milliseconds(300);
  const absl::Time plain_start = absl::Now();
  EXPECT_TRUE(RunShardTask(orphan, plain).ok());
  EXPECT_GE(absl::Now() - plain_start, absl::Milliseconds(300));
  EXPECT_LT(absl::Now() - plain_start, absl::Seconds(10));

  // A rank's task is not a shard.
  ShardTaskOptions options;
  options.rendezvous = &rendezvous;
  options.stop_signal = &stop;
  EXPECT_EQ(RunShardTask(ps_task, options).code(), absl::StatusCode::kInvalidArgument);
}

// Asynchronous ranks update the shards at their own pace. Rank 1 is held back until rank 0 has
// finished its last update; rank 0's final checkpoint still holds rank 1's updates, all of them
// (AdamW counts one optimizer step per applied push).
TEST(PsAsyncTest, RanksGoAtTheirOwnPaceAndTheFinalCheckpointHoldsEveryUpdate) {
  const std::string dir = MakeTempDir();
  trainyard::v1::Task task = JobTask(dir, Case{true, 1}, trainyard::v1::PARAMETER_SERVER);
  task.mutable_spec()->mutable_parameter_servers()->set_mode("async");
  task.mutable_spec()->mutable_parameter_servers()->set_max_staleness(1000);  // none dropped
  FakeRendezvous rendezvous;
  const auto servers = StartShards(task, kRanks, kShards, rendezvous);
  absl::Notification rank0_done;
  std::atomic<int64_t> rank1_steps_before{-1};
  std::vector<absl::StatusOr<TrainResult>> results = RunRanks(
      task, kRanks,
      [&](int rank, TrainerOptions& options) {
        if (rank == 0) {
          options.after_step = [&](int64_t step) {
            if (step == kSteps) rank0_done.Notify();
          };
        } else {
          options.before_step = [&](int64_t step, int64_t) {
            if (step == kSteps - 5) {
              rank0_done.WaitForNotification();
              rank1_steps_before = step;
            }
          };
        }
      },
      &rendezvous);
  for (const auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->step, kSteps);
  }
  // Rank 1 was 5 updates behind when rank 0 ended: the shards did not wait for it.
  EXPECT_EQ(rank1_steps_before, kSteps - 5);
  const auto state =
      ReadTensors(test_files::StepFile(absl::StrFormat("%s/step-%012d", dir, kSteps), "optimizer"));
  int steps_seen = 0;
  for (const auto& [name, tensor] : state) {
    if (!absl::EndsWith(name, ".step")) continue;
    EXPECT_EQ(tensor.item<int64_t>(), kRanks * kSteps) << name;
    ++steps_seen;
  }
  EXPECT_GT(steps_seen, 0);
  for (const auto& server : servers) EXPECT_EQ(server->Stats().version, kRanks * kSteps);
}

// An asynchronous job's samples/s counts the updates the ranks made, each of a rank's share of the
// batch, not rank 0's updates as if each were the global batch's. Rank 1 is held before its
// first update until rank 0 has finished, so the shards apply rank 0's updates alone, 8 samples
// each (a share of the batch of 16); rank 0's clock moves 1 s per update: 8 samples/s.
TEST(PsAsyncTest, SamplesPerSecondCountsTheUpdatesTheRanksMade) {
  trainyard::v1::Task task =
      JobTask(MakeTempDir(), Case{false, 1}, trainyard::v1::PARAMETER_SERVER);
  task.mutable_spec()->mutable_parameter_servers()->set_mode("async");
  task.mutable_spec()->mutable_parameter_servers()->set_max_staleness(1000);
  task.mutable_spec()->set_log_every_steps(5);
  FakeClock clock;
  std::vector<double> rates;  // rank 0's thread only
  absl::Notification rank0_done;
  std::vector<absl::StatusOr<TrainResult>> results =
      RunPs(task, kRanks, kShards, [&](int rank, TrainerOptions& options) {
        if (rank == 0) {
          options.clock = &clock;
          options.print_line = [&rates](const std::string& line) {
            const size_t at = line.find(" samples_per_s=");
            if (absl::StartsWith(line, "step=") && at != std::string::npos) {
              rates.push_back(std::stod(line.substr(at + 15)));
            }
          };
          options.after_step = [&](int64_t step) {
            clock.Advance(absl::Seconds(1));
            if (step == kSteps) rank0_done.Notify();
          };
        } else {
          options.before_step = [&](int64_t step, int64_t) {
            if (step == 0) rank0_done.WaitForNotification();
          };
        }
      });
  for (const auto& r : results) ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(rates.size(), static_cast<size_t>(kSteps / 5));
  for (double rate : rates) EXPECT_DOUBLE_EQ(rate, 8.0);
}

// embedding_mlp on tables of `vocab` rows (the data's ids span `data_vocab`), the rest of
// JobTask's job.
trainyard::v1::Task EmbeddingTask(const std::string& dir, const Case& c,
                                  trainyard::v1::Strategy strategy,
                                  const std::vector<int64_t>& vocab,
                                  const std::vector<int64_t>& data_vocab) {
  trainyard::v1::Task task = JobTask(dir, c, strategy);
  auto& spec = *task.mutable_spec();
  spec.mutable_model()->set_builtin("embedding_mlp");
  auto& args = *spec.mutable_model()->mutable_args();
  args.clear_hidden();
  args.add_hidden(16);
  for (int64_t v : vocab) args.add_vocab(v);
  args.set_dim(4);
  args.set_classes(3);
  for (int64_t v : data_vocab) spec.mutable_data()->mutable_synthetic()->add_vocab(v);
  return task;
}

// A parameter_server job keeps embedding_mlp's tables on the shards by rows and moves only the
// rows each batch touches. Plain SGD updates a row only through its gradient, so the lazy update
// is the dense one and the job ends where data_parallel ends; with AdamW and weight decay on
// tables of 2 rows, every update touches every row, and it does too.
TEST(PsSparseTest, TablesOnTheShardsTrainLikeDataParallel) {
  struct Sparse {
    Case c;
    std::vector<int64_t> vocab;
  };
  Case plain_sgd{false, 2};
  for (const Sparse& sparse : {Sparse{plain_sgd, {64, 1000}}, Sparse{Case{true, 1}, {2, 2}}}) {
    const std::string dp_dir = MakeTempDir(), ps_dir = MakeTempDir();
    auto make = [&](const std::string& dir, trainyard::v1::Strategy strategy) {
      trainyard::v1::Task task = EmbeddingTask(dir, sparse.c, strategy, sparse.vocab, sparse.vocab);
      // The dense features are noise: the class is in the ids, so accuracy needs the trained
      // rows.
      task.mutable_spec()->mutable_data()->set_validation_split(0.25f);
      task.mutable_spec()->mutable_data()->mutable_synthetic()->set_noise(50.0f);
      if (!sparse.c.adamw) {
        task.mutable_spec()->mutable_optimizer()->set_lr(0.5);
        task.mutable_spec()->mutable_optimizer()->set_momentum(0);
        task.mutable_spec()->mutable_optimizer()->set_weight_decay(0);
      }
      return task;
    };
    const auto dp = RunRanks(make(dp_dir, trainyard::v1::DATA_PARALLEL), kRanks, {});
    for (const auto& r : dp) ASSERT_TRUE(r.ok()) << r.status();
    const auto ps = RunPs(make(ps_dir, trainyard::v1::PARAMETER_SERVER), kRanks, kShards);
    for (const auto& r : ps) ASSERT_TRUE(r.ok()) << r.status();
    // Rank 0 evaluates with the shards' rows (BeforeEvaluate), not its stale copy of the tables.
    ASSERT_TRUE(dp[0]->val_accuracy.has_value() && ps[0]->val_accuracy.has_value());
    EXPECT_EQ(*ps[0]->val_accuracy, *dp[0]->val_accuracy);
    SCOPED_TRACE(sparse.c.adamw ? "AdamW" : "SGD");
    ExpectClose(ReadTensors(dp_dir + "/final/model.safetensors"),
                ReadTensors(ps_dir + "/final/model.safetensors"));
  }
}

// With a table of 200,000 rows (3.2 MB), what a push carries follows the at most 8 rows a rank's
// batch touches; and a stop and a resume on other rank and shard counts carry every row's lazy
// optimizer state, so the resumed run ends where the uninterrupted one ends.
TEST(PsSparseTest, PushesCarryTheRowsTouchedAndResumeCarriesTheirState) {
  const Case c{true, 1};
  const std::vector<int64_t> vocab = {200000}, data_vocab = {5000};
  const std::string whole = MakeTempDir(), stopped = MakeTempDir();
  {
    trainyard::v1::Task task =
        EmbeddingTask(whole, c, trainyard::v1::PARAMETER_SERVER, vocab, data_vocab);
    task.mutable_spec()->mutable_parameter_servers()->set_shards(kShards);
    FakeRendezvous rendezvous;
    const auto servers = StartShards(task, kRanks, kShards, rendezvous);
    for (const auto& r : RunRanks(task, kRanks, {}, &rendezvous)) ASSERT_TRUE(r.ok()) << r.status();
    const int64_t table_bytes = vocab[0] * 4 * 4;
    for (const auto& server : servers) {
      const ShardStats stats = server->Stats();
      ASSERT_EQ(stats.pushes, kRanks * kSteps);
      // 8 rows of 4 floats and their ids, the shard's dense pieces (under 2 KB) and framing.
      EXPECT_LT(stats.bytes_received / stats.pushes, 4096)
          << "of a " << table_bytes << "-byte table";
    }
  }
  std::atomic<int> stop{0};
  for (const auto& r :
       RunPs(EmbeddingTask(stopped, c, trainyard::v1::PARAMETER_SERVER, vocab, data_vocab), kRanks,
             kShards, StopAfter(9, stop))) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->step, 10);
  }
  const auto saved =
      ReadTensors(test_files::StepFile(absl::StrFormat("%s/step-%012d", stopped, 10), "optimizer"));
  ASSERT_TRUE(saved.count("embedding0.weight.exp_avg"));
  EXPECT_EQ(saved.at("embedding0.weight.exp_avg").sizes(), (std::vector<int64_t>{vocab[0], 4}));
  EXPECT_EQ(saved.at("embedding0.weight.step").item<int64_t>(), 10);
  // The checkpoint records the layout it was trained with.
  std::ifstream state_file(
      test_files::StepFile(absl::StrFormat("%s/step-%012d", stopped, 10), "trainer_state"));
  const nlohmann::json state = nlohmann::json::parse(state_file, nullptr, false);
  ASSERT_TRUE(state.contains("parameter_servers")) << state.dump();
  const nlohmann::json& layout = state["parameter_servers"];
  EXPECT_EQ(layout["shards"], kShards);
  EXPECT_EQ(layout["mode"], "sync");
  EXPECT_EQ(layout["tables"][0]["parameter"], "embedding0.weight");
  EXPECT_EQ(layout["tables"][0]["rows"], vocab[0]);
  EXPECT_FALSE(layout["partition"]["pieces"].empty());
  for (const nlohmann::json& piece : layout["partition"]["pieces"]) {
    EXPECT_NE(layout["partition"]["parameters"][piece[0].get<int>()]["name"], "embedding0.weight");
  }
  const std::string resumed = MakeTempDir();
  ResumeAndCompare(EmbeddingTask(resumed, c, trainyard::v1::PARAMETER_SERVER, vocab, data_vocab),
                   stopped, whole);
}

// dense: allreduce: the tables on the shards, the MLP all-reduced among the ranks and updated by
// their own optimizer. With every row touched in every update (tables of 2 rows) AdamW ends
// where data_parallel ends; on a 5,000-row table, a stop and a resume on 1 rank and 3 shards
// carry both halves of the optimizer's state (the ranks' and the shards'), and the resumed run
// ends where the uninterrupted one ends.
TEST(PsHybridTest, DenseLayersAllReducedTablesOnTheShards) {
  const Case c{true, 2};
  auto make = [&](const std::string& dir, trainyard::v1::Strategy strategy,
                  const std::vector<int64_t>& vocab) {
    trainyard::v1::Task task = EmbeddingTask(dir, c, strategy, vocab, vocab);
    if (strategy == trainyard::v1::PARAMETER_SERVER) {
      task.mutable_spec()->mutable_parameter_servers()->set_dense("allreduce");
    }
    return task;
  };
  const std::string dp_dir = MakeTempDir(), hybrid_dir = MakeTempDir();
  for (const auto& r : RunRanks(make(dp_dir, trainyard::v1::DATA_PARALLEL, {2, 2}), kRanks, {})) {
    ASSERT_TRUE(r.ok()) << r.status();
  }
  {
    trainyard::v1::Task task = make(hybrid_dir, trainyard::v1::PARAMETER_SERVER, {2, 2});
    task.mutable_spec()->mutable_parameter_servers()->set_shards(kShards);
    FakeRendezvous rendezvous;
    const auto servers = StartShards(task, kRanks, kShards, rendezvous);
    for (const auto& r : RunRanks(task, kRanks, {}, &rendezvous)) ASSERT_TRUE(r.ok()) << r.status();
    // The shards saw the rows only: 2 rows of 4 floats per table at most, and no MLP.
    for (const auto& server : servers) {
      const ShardStats stats = server->Stats();
      ASSERT_EQ(stats.pushes, kRanks * kSteps);
      EXPECT_LT(stats.bytes_received / stats.pushes, 200);
    }
  }
  ExpectClose(ReadTensors(dp_dir + "/final/model.safetensors"),
              ReadTensors(hybrid_dir + "/final/model.safetensors"));

  const std::vector<int64_t> vocab = {5000};
  const std::string whole = MakeTempDir(), stopped = MakeTempDir(), resumed = MakeTempDir();
  {
    // Every rank's outcome, not only the first failure's.
    const auto results =
        RunPs(make(whole, trainyard::v1::PARAMETER_SERVER, vocab), kRanks, kShards);
    for (size_t i = 0; i < results.size(); ++i) {
      EXPECT_TRUE(results[i].ok()) << "rank " << i << ": " << results[i].status();
    }
    for (const auto& r : results) ASSERT_TRUE(r.ok());
  }
  std::atomic<int> stop{0};
  for (const auto& r : RunPs(make(stopped, trainyard::v1::PARAMETER_SERVER, vocab), kRanks, kShards,
                             StopAfter(9, stop))) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->step, 10);
  }
  const auto saved =
      ReadTensors(test_files::StepFile(absl::StrFormat("%s/step-%012d", stopped, 10), "optimizer"));
  EXPECT_TRUE(saved.count("embedding0.weight.exp_avg"));
  EXPECT_TRUE(saved.count("mlp.0.weight.exp_avg"));
  ResumeAndCompare(make(resumed, trainyard::v1::PARAMETER_SERVER, vocab), stopped, whole);
}

INSTANTIATE_TEST_SUITE_P(Optimizers, PsStrategyTest,
                         ::testing::Values(Case{false, 1}, Case{false, 2}, Case{true, 1},
                                           Case{true, 2}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return absl::StrCat(info.param.adamw ? "AdamW" : "SgdMomentum",
                                               "Accumulate", info.param.accumulate);
                         });

}  // namespace
}  // namespace trainyard::trainer
