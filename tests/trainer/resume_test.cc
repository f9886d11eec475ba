// Exact resume after a stop, on the same and on a different number of ranks, and the checkpoint
// of a stop with a deadline (a preemption notice). Everything runs in-process on tiny models;
// data-parallel ranks are threads meeting through an in-memory rendezvous store.

#include <torch/torch.h>

#include <atomic>
#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/trainer/fake_coordinator.h"
#include "tests/trainer/fake_rendezvous.h"
#include "tests/trainer/test_files.h"
#include "tests/trainer/test_tasks.h"
#include "tests/trainer/trainer_test_util.h"
#include "worker/trainer/data/data.h"
#include "worker/trainer/data/schedule.h"
#include "worker/trainer/loop/trainer.h"
#include "worker/trainer/model/model.h"

namespace trainyard::trainer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::trainyard::trainer::test_files::FileExists;
using ::trainyard::trainer::test_files::MakeTempDir;
using ::trainyard::trainer::test_files::ReadFile;
using ::trainyard::trainer::test_files::StepFile;
using ::trainyard::trainer::test_util::Eventually;
using ::trainyard::trainer::test_util::ExpectSameTensors;
using ::trainyard::trainer::test_util::QuietOptions;
using ::trainyard::trainer::test_util::ReadTensors;
using ::trainyard::trainer::test_util::RunRanks;
using ::trainyard::trainer::test_util::SaveScriptModule;

std::string StepFolder(const std::string& dir, int64_t step) {
  return absl::StrFormat("%s/step-%012d", dir, step);
}

// The largest absolute difference between same-named tensors; infinity when the names differ.
double MaxDifference(const std::map<std::string, torch::Tensor>& a,
                     const std::map<std::string, torch::Tensor>& b) {
  if (a.empty() || a.size() != b.size()) return INFINITY;
  double diff = 0;
  for (const auto& [name, t] : a) {
    auto it = b.find(name);
    if (it == b.end()) return INFINITY;
    diff = std::max(diff, (t - it->second).abs().max().item<double>());
  }
  return diff;
}

// A small job whose every source of state matters on resume: adamw (moments and step counts),
// a cosine schedule with warm-up, shuffled data over several epochs, dropout (the random
// generator). No validation split, so that every sample trains.
trainyard::v1::Task ResumeTask(const std::string& checkpoint_dir, int64_t total_steps) {
  trainyard::v1::Task task = test_tasks::SingleRankTask("job1", checkpoint_dir);
  auto& spec = *task.mutable_spec();
  spec.mutable_model()->set_builtin("mlp");
  spec.mutable_model()->mutable_args()->add_hidden(16);
  spec.mutable_model()->mutable_args()->set_dropout(0.25f);
  auto& synthetic = *spec.mutable_data()->mutable_synthetic();
  synthetic.set_samples(120);
  synthetic.set_features(8);
  synthetic.set_classes(3);
  synthetic.set_noise(1.0f);
  spec.mutable_data()->set_shuffle(true);
  spec.set_batch_size(12);  // 10 steps per epoch
  auto& optimizer = *spec.mutable_optimizer();
  optimizer.set_name("adamw");
  optimizer.set_lr(0.01);
  optimizer.set_weight_decay(0.01);
  optimizer.mutable_schedule()->set_name("cosine");
  optimizer.mutable_schedule()->set_warmup_steps(4);
  optimizer.mutable_schedule()->set_min_lr(0.001);
  spec.mutable_checkpoint()->set_every_steps(5);
  spec.set_loss("cross_entropy");
  spec.set_max_steps(total_steps);
  spec.set_seed(11);
  spec.set_log_every_steps(1000);
  return task;
}

// ---- exact resume, one rank ----

TEST(ResumeTest, StopBetweenCheckpointsThenResumeEndsBitForBitWhereAnUninterruptedRunEnds) {
  constexpr int64_t kTotal = 26;
  constexpr int64_t kStop = 13;  // between the checkpoints of steps 10 and 15, in epoch 2
  const std::string dir_a = MakeTempDir(), dir_b = MakeTempDir(), dir_c = MakeTempDir();

  absl::StatusOr<TrainResult> a = RunTrainer(ResumeTask(dir_a, kTotal), QuietOptions());
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_EQ(a->step, kTotal);

  std::atomic<int> stop{0};
  TrainerOptions stop_options = QuietOptions();
  stop_options.stop_signal = &stop;
  stop_options.after_step = [&stop](int64_t step) {
    if (step == kStop) stop = 15;
  };
  absl::StatusOr<TrainResult> b = RunTrainer(ResumeTask(dir_b, kTotal), stop_options);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(b->stopped);
  EXPECT_EQ(b->step, kStop);
  EXPECT_FALSE(b->stop_checkpoint_skipped);
  ASSERT_TRUE(FileExists(StepFile(StepFolder(dir_b, kStop), "MANIFEST")));

  FakeCoordinator coordinator(/*keep_last=*/3, "file://" + dir_c);
  TrainerOptions resume_options = QuietOptions();
  resume_options.coordinator = &coordinator;
  trainyard::v1::Task task_c = ResumeTask(dir_c, kTotal);
  task_c.add_resume_checkpoints("file://" + StepFolder(dir_b, kStop));
  absl::StatusOr<TrainResult> c = RunTrainer(task_c, resume_options);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->start_step, kStop);  // zero lost steps
  EXPECT_EQ(c->step, kTotal);
  EXPECT_EQ(c->loss, a->loss);
  const auto final_a = ReadTensors(dir_a + "/final/model.safetensors");
  const auto final_c = ReadTensors(dir_c + "/final/model.safetensors");
  ExpectSameTensors(final_a, final_c);
  // The optimizer's state too, and training did move the parameters after the resume.
  EXPECT_EQ(ReadFile(StepFile(StepFolder(dir_c, kTotal), "optimizer")),
            ReadFile(StepFile(StepFolder(dir_a, kTotal), "optimizer")));
  EXPECT_GT(MaxDifference(final_c, ReadTensors(StepFile(StepFolder(dir_b, kStop), "model"))), 1e-3);

  // Every report of the resumed attempt says how it started.
  const std::vector<trainyard::v1::JobProgress> progress = coordinator.progress();
  ASSERT_FALSE(progress.empty());
  for (const trainyard::v1::JobProgress& p : progress) {
    EXPECT_EQ(p.attempt_start_step(), kStop);
    EXPECT_GT(p.checkpoint_load_seconds(), 0);
    EXPECT_GE(p.rendezvous_seconds(), 0);
  }
}

// A search's rung: the job ends at stop_at_step with a checkpoint while its schedule runs to
// max_steps; the next rung resumes there and ends where a run that never stopped ends.
TEST(ResumeTest, AJobEndingAtStopAtStepIsContinuedBitForBitByTheNextRung) {
  constexpr int64_t kTotal = 26;
  constexpr int64_t kRungEnd = 13;  // between checkpoints, mid-epoch, mid-schedule
  const std::string dir_a = MakeTempDir(), dir_b = MakeTempDir(), dir_c = MakeTempDir();
  absl::StatusOr<TrainResult> a = RunTrainer(ResumeTask(dir_a, kTotal), QuietOptions());
  ASSERT_TRUE(a.ok()) << a.status();

  trainyard::v1::Task rung0 = ResumeTask(dir_b, kTotal);
  rung0.mutable_spec()->set_stop_at_step(kRungEnd);
  absl::StatusOr<TrainResult> b = RunTrainer(rung0, QuietOptions());
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_FALSE(b->stopped);  // it ended, nobody stopped it
  EXPECT_EQ(b->step, kRungEnd);
  ASSERT_TRUE(FileExists(StepFile(StepFolder(dir_b, kRungEnd), "MANIFEST")));
  ASSERT_TRUE(FileExists(dir_b + "/final/model.safetensors"));
  EXPECT_FALSE(FileExists(StepFile(StepFolder(dir_b, kRungEnd + 1), "MANIFEST")));

  trainyard::v1::Task rung1 = ResumeTask(dir_c, kTotal);
  rung1.add_resume_checkpoints("file://" + StepFolder(dir_b, kRungEnd));
  absl::StatusOr<TrainResult> c = RunTrainer(rung1, QuietOptions());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->start_step, kRungEnd);
  EXPECT_EQ(c->step, kTotal);
  EXPECT_EQ(c->loss, a->loss);
  ExpectSameTensors(ReadTensors(dir_a + "/final/model.safetensors"),
                    ReadTensors(dir_c + "/final/model.safetensors"));
}

// Every attempt of a distillation job loads its teacher again and its checkpoints hold the
// student alone, yet the resumed run ends bit for bit where the uninterrupted one ends.
TEST(ResumeTest, ADistillationJobResumesBitForBit) {
  constexpr int64_t kTotal = 26;
  constexpr int64_t kStop = 13;
  const std::string teacher = MakeTempDir() + "/teacher.pt";
  torch::manual_seed(9);
  SaveScriptModule(teacher, {{"w", torch::randn({8, 3})}}, R"(
def forward(self, x):
    return x @ self.w
)");
  auto make = [&](const std::string& dir) {
    trainyard::v1::Task task = ResumeTask(dir, kTotal);
    auto& distill = *task.mutable_spec()->mutable_distill();
    distill.set_teacher(teacher);
    distill.set_temperature(3.0);
    distill.set_alpha(0.7);
    return task;
  };
  const std::string dir_a = MakeTempDir(), dir_b = MakeTempDir(), dir_c = MakeTempDir(),
                    dir_plain = MakeTempDir();
  absl::StatusOr<TrainResult> a = RunTrainer(make(dir_a), QuietOptions());
  ASSERT_TRUE(a.ok()) << a.status();
  absl::StatusOr<TrainResult> plain = RunTrainer(ResumeTask(dir_plain, kTotal), QuietOptions());
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_NE(a->loss, plain->loss);

  std::atomic<int> stop{0};
  TrainerOptions stop_options = QuietOptions();
  stop_options.stop_signal = &stop;
  stop_options.after_step = [&stop](int64_t step) {
    if (step == kStop) stop = 15;
  };
  absl::StatusOr<TrainResult> b = RunTrainer(make(dir_b), stop_options);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_TRUE(b->stopped);
  const auto stopped = ReadTensors(StepFile(StepFolder(dir_b, kStop), "model"));
  const auto plain_final = ReadTensors(dir_plain + "/final/model.safetensors");
  ASSERT_EQ(stopped.size(), plain_final.size());
  for (const auto& [name, tensor] : plain_final) EXPECT_EQ(stopped.count(name), 1u) << name;

  trainyard::v1::Task task_c = make(dir_c);
  task_c.add_resume_checkpoints("file://" + StepFolder(dir_b, kStop));
  absl::StatusOr<TrainResult> c = RunTrainer(task_c, QuietOptions());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->start_step, kStop);
  EXPECT_EQ(c->loss, a->loss);
  ExpectSameTensors(ReadTensors(dir_a + "/final/model.safetensors"),
                    ReadTensors(dir_c + "/final/model.safetensors"));
}

TEST(ResumeTest, TheFirstProgressReportFollowsTheFirstStep) {
  const std::string dir = MakeTempDir();
  FakeCoordinator coordinator(/*keep_last=*/3, "file://" + dir);
  TrainerOptions options = QuietOptions();
  options.coordinator = &coordinator;
  options.report_interval = absl::Hours(1);  // only the first report may go out before the end
  bool first_report_seen = false;
  options.after_step = [&](int64_t step) {
    // The report of step 1 leaves while step 2 is held here.
    if (step == 2) first_report_seen = Eventually([&] { return !coordinator.progress().empty(); });
  };
  absl::StatusOr<TrainResult> result = RunTrainer(ResumeTask(dir, 4), options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(first_report_seen);
  const std::vector<trainyard::v1::JobProgress> progress = coordinator.progress();
  ASSERT_EQ(progress.size(), 2u);  // the first step's and the final one
  EXPECT_EQ(progress[0].step(), 1);
  EXPECT_EQ(progress[0].attempt_start_step(), 0);
  EXPECT_EQ(progress[0].checkpoint_load_seconds(), 0);
  EXPECT_EQ(progress[1].step(), 4);
}

// ---- data order across world sizes ----

TEST(ResumeTest, GlobalBatchesAreTheSameForEveryWorldSizeAndAcrossAResize) {
  trainyard::v1::SyntheticData synthetic;
  synthetic.set_samples(60);
  synthetic.set_features(3);
  synthetic.set_classes(2);
  const Dataset data = *MakeSyntheticDataset(synthetic, 4);
  trainyard::v1::JobSpec spec;
  spec.set_batch_size(12);
  spec.set_max_steps(15);  // 5 steps per epoch: three epochs, each in its own order
  const StepPlan plan = *PlanSteps(spec, data.size(), 1);
  DataOrder reference(plan, /*seed=*/9, /*shuffle=*/true);
  for (int world = 1; world <= 4; ++world) {
    DataOrder order(plan, 9, true);
    for (int64_t step = 0; step < plan.total_steps; ++step) {
      std::vector<int64_t> joined;
      for (int r = 0; r < world; ++r) {
        std::vector<int64_t> part = order.RankBatch(step, r, world);
        EXPECT_EQ(part.size(), static_cast<size_t>(12 / world));
        joined.insert(joined.end(), part.begin(), part.end());
      }
      EXPECT_EQ(joined, reference.GlobalBatch(step)) << "world " << world << " step " << step;
    }
  }

  // 2 ranks up to step 7 (the data cursor of a checkpoint there is 7 * 12), then 3 ranks: the
  // batches the ranks build are the uninterrupted single-rank run's, split.
  constexpr int64_t kResize = 7;
  auto check_ranks = [&](int world, int64_t first, int64_t end) {
    std::vector<std::unique_ptr<BatchPrefetcher>> ranks;
    for (int r = 0; r < world; ++r) {
      ranks.push_back(
          std::make_unique<BatchPrefetcher>(data, plan, 9, true, r, world, first, end, 2));
    }
    for (int64_t step = first; step < end; ++step) {
      std::vector<torch::Tensor> features, labels;
      for (auto& rank : ranks) {
        std::optional<Batch> batch = rank->Next();
        ASSERT_TRUE(batch.has_value());
        EXPECT_EQ(batch->step, step);
        features.push_back(batch->features);
        labels.push_back(batch->labels);
      }
      const torch::Tensor index = torch::tensor(reference.GlobalBatch(step), torch::kInt64);
      EXPECT_TRUE(torch::equal(torch::cat(features), data.features.index_select(0, index)))
          << "world " << world << " step " << step;
      EXPECT_TRUE(torch::equal(torch::cat(labels), data.labels.index_select(0, index)));
    }
    for (auto& rank : ranks) EXPECT_FALSE(rank->Next().has_value());
  };
  check_ranks(2, 0, kResize);
  check_ranks(3, kResize, plan.total_steps);
}

// ---- exact resume, several ranks ----

// Data-parallel: ranks that run as threads share LibTorch's random generator, so this job has
// no dropout (with dropout the run would depend on the threads' timing here; in real trainer
// processes each rank has its own generator).
trainyard::v1::Task DataParallelTask(const std::string& checkpoint_dir, int64_t total_steps) {
  trainyard::v1::Task task = ResumeTask(checkpoint_dir, total_steps);
  auto& spec = *task.mutable_spec();
  spec.set_strategy(trainyard::v1::DATA_PARALLEL);
  spec.mutable_model()->mutable_args()->set_dropout(0);
  spec.set_collective_timeout_seconds(30);
  return task;
}

// The task's synthetic samples written to 5 shards of 24 and read from there, shuffled by shard
// and within windows of 30 samples.
void ReadFromShardWindows(trainyard::v1::Task& task) {
  static const std::string* const dir = [] {
    auto* made = new std::string(MakeTempDir());
    trainyard::v1::SyntheticData synthetic = ResumeTask("", 1).spec().data().synthetic();
    const Dataset data = *MakeSyntheticDataset(synthetic, 11);
    for (int64_t k = 0; k < 5; ++k) {
      NamedTensors shard = {{"x", data.features.narrow(0, k * 24, 24).contiguous()},
                            {"y", data.labels.narrow(0, k * 24, 24).contiguous()}};
      std::ofstream(absl::StrCat(*made, "/part-", k, ".safetensors"), std::ios::binary)
          << *EncodeTensors(shard, {});
    }
    return made;
  }();
  auto& data = *task.mutable_spec()->mutable_data();
  data.clear_synthetic();
  data.set_train(*dir + "/part-*.safetensors");
  data.set_features("x");
  data.set_labels("y");
  data.set_shuffle_window(30);
}

class ResumeAcrossWorldsTest : public ::testing::TestWithParam<bool> {
 protected:
  trainyard::v1::Task Task(const std::string& checkpoint_dir, int64_t total_steps) {
    trainyard::v1::Task task = DataParallelTask(checkpoint_dir, total_steps);
    if (GetParam()) ReadFromShardWindows(task);
    return task;
  }
};

// Synthetic data in memory, and shards read through shuffle windows: the order is the same on
// any number of ranks, so a resume on three ranks continues what two began.
TEST_P(ResumeAcrossWorldsTest, TwoRanksStoppedAndResumedOnThreeOrTwoEndWhereTwoRanksEnd) {
  constexpr int64_t kTotal = 26;
  constexpr int64_t kStop = 13;
  const std::string dir_a = MakeTempDir(), dir_b = MakeTempDir(), dir_c = MakeTempDir();

  std::vector<absl::StatusOr<TrainResult>> a = RunRanks(Task(dir_a, kTotal), 2, {});
  for (const auto& r : a) ASSERT_TRUE(r.ok()) << r.status();

  // Rank 0 alone is asked to stop, during step 13 (after 12): the ranks agree to stop after 13.
  std::atomic<int> stop{0};
  std::vector<absl::StatusOr<TrainResult>> b =
      RunRanks(Task(dir_b, kTotal), 2, [&stop](int rank, TrainerOptions& options) {
        if (rank != 0) return;
        options.stop_signal = &stop;
        options.after_step = [&stop](int64_t step) {
          if (step == kStop - 1) stop = 15;
        };
      });
  for (const auto& r : b) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->stopped);
    EXPECT_EQ(r->step, kStop);
  }
  ASSERT_TRUE(FileExists(StepFile(StepFolder(dir_b, kStop), "MANIFEST")));
  EXPECT_THAT(ReadFile(StepFile(StepFolder(dir_b, kStop), "trainer_state")),
              HasSubstr("\"world_size\": 2"));

  FakeCoordinator coordinator(/*keep_last=*/3, "file://" + dir_c);
  trainyard::v1::Task task_c = Task(dir_c, kTotal);
  task_c.add_resume_checkpoints("file://" + StepFolder(dir_b, kStop));
  std::vector<absl::StatusOr<TrainResult>> c =
      RunRanks(task_c, 3, [&coordinator](int rank, TrainerOptions& options) {
        if (rank == 0) options.coordinator = &coordinator;
      });
  for (const auto& r : c) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->start_step, kStop);
    EXPECT_EQ(r->step, kTotal);
  }
  const auto final_a = ReadTensors(dir_a + "/final/model.safetensors");
  const auto final_c = ReadTensors(dir_c + "/final/model.safetensors");
  EXPECT_LE(MaxDifference(final_a, final_c), 1e-5);
  EXPECT_GT(MaxDifference(final_c, ReadTensors(StepFile(StepFolder(dir_b, kStop), "model"))), 1e-3);
  // On as many ranks as before, the all-reduces add up in the same order: bit for bit.
  const std::string dir_d = MakeTempDir();
  trainyard::v1::Task task_d = Task(dir_d, kTotal);
  task_d.add_resume_checkpoints("file://" + StepFolder(dir_b, kStop));
  for (const auto& r : RunRanks(task_d, 2, {})) ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(ReadFile(dir_d + "/final/model.safetensors"),
            ReadFile(dir_a + "/final/model.safetensors"));

  const std::vector<trainyard::v1::JobProgress> progress = coordinator.progress();
  ASSERT_FALSE(progress.empty());
  EXPECT_EQ(progress.front().attempt_start_step(), kStop);
  EXPECT_EQ(progress.front().world_size(), 3);
  EXPECT_GT(progress.front().rendezvous_seconds(), 0);
  EXPECT_GT(progress.front().checkpoint_load_seconds(), 0);
}

INSTANTIATE_TEST_SUITE_P(Data, ResumeAcrossWorldsTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "ShardWindows" : "Synthetic";
                         });

// ---- the checkpoint of a stop with a deadline ----

class StopDeadlineTest : public ::testing::Test {
 protected:
  // Runs ResumeTask (checkpoints every 5 steps) and stops it after `stop_step`; just before
  // the stop, the deadline file gets now + `time_left` (none if `time_left` is nullopt), once
  // the checkpoints of `committed_first` are committed (so that their durations are measured).
  absl::StatusOr<TrainResult> RunAndStop(int64_t stop_step, std::optional<absl::Duration> time_left,
                                         std::vector<int64_t> committed_first) {
    dir_ = MakeTempDir();
    const std::string deadline_file = MakeTempDir() + "/stop-deadline";
    std::atomic<int> stop{0};
    TrainerOptions options = QuietOptions();
    options.coordinator = &coordinator_;
    options.stop_signal = &stop;
    options.stop_deadline_file = deadline_file;
    options.after_step = [&](int64_t step) {
      if (step != stop_step) return;
      EXPECT_TRUE(Eventually([&] { return coordinator_.committed_steps() == committed_first; }));
      if (time_left.has_value()) {
        std::ofstream(deadline_file) << absl::ToUnixMillis(absl::Now() + *time_left) << "\n";
      }
      stop = 15;
    };
    return RunTrainer(ResumeTask(dir_, 40), options);
  }

  std::string dir_;
  FakeCoordinator coordinator_{/*keep_last=*/5};
};

TEST_F(StopDeadlineTest, TooLittleTimeLeftSkipsTheCheckpointAndSaysSo) {
  // Less than the 1 s margin alone: whatever the save of step 5 took, this one cannot fit.
  absl::StatusOr<TrainResult> result = RunAndStop(7, absl::Milliseconds(800), {5});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(result->stopped);
  EXPECT_EQ(result->step, 7);
  EXPECT_TRUE(result->stop_checkpoint_skipped);
  EXPECT_THAT(coordinator_.committed_steps(), ElementsAre(5));
  EXPECT_FALSE(FileExists(StepFile(StepFolder(dir_, 7), "MANIFEST")));
  const std::vector<std::string> events = coordinator_.events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_THAT(events[0], ::testing::MatchesRegex(
                             "preemption: checkpoint at step 7 skipped: recent saves took "
                             "[0-9]+\\.[0-9] s, ([0-9]+\\.[0-9] s left before the deadline|"
                             "the deadline has passed); the job resumes from its last "
                             "committed checkpoint \\(step 5\\)"));
}

TEST_F(StopDeadlineTest, EnoughTimeLeftSavesTheStopStep) {
  absl::StatusOr<TrainResult> result = RunAndStop(7, absl::Hours(1), {5});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(result->stopped);
  EXPECT_FALSE(result->stop_checkpoint_skipped);
  EXPECT_THAT(coordinator_.committed_steps(), ElementsAre(5, 7));
  EXPECT_TRUE(coordinator_.events().empty());
}

TEST_F(StopDeadlineTest, WithoutAMeasuredSaveTheStopStepIsSavedAnyway) {
  absl::StatusOr<TrainResult> result = RunAndStop(3, absl::Milliseconds(800), {});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_FALSE(result->stop_checkpoint_skipped);
  EXPECT_THAT(coordinator_.committed_steps(), ElementsAre(3));
  EXPECT_TRUE(coordinator_.events().empty());
}

TEST_F(StopDeadlineTest, WithoutADeadlineFileTheStopStepIsSaved) {
  absl::StatusOr<TrainResult> result = RunAndStop(7, std::nullopt, {5});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_FALSE(result->stop_checkpoint_skipped);
  EXPECT_THAT(coordinator_.committed_steps(), ElementsAre(5, 7));
}

TEST(StopDeadlineFileTest, ReadsUnixMillisAndIgnoresAnythingElse) {
  const std::string dir = MakeTempDir();
  EXPECT_FALSE(ReadStopDeadline(dir + "/none").has_value());
  std::ofstream(dir + "/good") << "1700000000123\n";
  EXPECT_EQ(ReadStopDeadline(dir + "/good"), absl::FromUnixMillis(1700000000123));
  std::ofstream(dir + "/bad") << "soon\n";
  EXPECT_FALSE(ReadStopDeadline(dir + "/bad").has_value());
}

}  // namespace
}  // namespace trainyard::trainer
