// Unit tests of the training runtime: tensors <-> safetensors, data, schedules, optimizers,
// checkpoints and exact resume. Everything runs in-process on tiny models.

#include "worker/trainer/loop/trainer.h"

#include <stdlib.h>
#include <torch/torch.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/formats/safetensors.h"
#include "common/spec/memory_estimate.h"
#include "common/storage/checkpoint_layout.h"
#include "common/storage/object_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/fake_clock.h"
#include "tests/trainer/fake_coordinator.h"
#include "tests/trainer/test_files.h"
#include "tests/trainer/test_tasks.h"
#include "tests/trainer/trainer_test_util.h"
#include "worker/trainer/checkpoint/checkpoint.h"
#include "worker/trainer/coordinator/coordinator_client.h"
#include "worker/trainer/data/data.h"
#include "worker/trainer/data/device_feed.h"
#include "worker/trainer/data/schedule.h"
#include "worker/trainer/loop/errors.h"
#include "worker/trainer/model/device_modes.h"
#include "worker/trainer/model/distill.h"
#include "worker/trainer/model/model.h"
#include "worker/trainer/model/optimizer.h"
#include "worker/trainer/model/precision.h"
#include "worker/trainer/strategy/strategy.h"

namespace trainyard::trainer {
namespace {

using ::testing::HasSubstr;

using ::trainyard::trainer::test_files::FileExists;
using ::trainyard::trainer::test_files::MakeTempDir;
using ::trainyard::trainer::test_files::ReadFile;
using ::trainyard::trainer::test_files::StepFile;

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

// A small synthetic classification task for the in-process runs.
trainyard::v1::Task SyntheticTask(const std::string& checkpoint_dir, int64_t max_steps) {
  trainyard::v1::Task task = test_tasks::SingleRankTask("job1", checkpoint_dir);
  auto& spec = *task.mutable_spec();
  spec.mutable_model()->set_builtin("mlp");
  spec.mutable_model()->mutable_args()->add_hidden(16);
  auto& synthetic = *spec.mutable_data()->mutable_synthetic();
  synthetic.set_samples(240);
  synthetic.set_features(8);
  synthetic.set_classes(3);
  synthetic.set_noise(0.5);
  spec.mutable_data()->set_validation_split(0.25);
  spec.set_batch_size(16);
  spec.mutable_optimizer()->set_name("adam");
  spec.mutable_optimizer()->set_lr(0.01);
  spec.set_loss("cross_entropy");
  spec.set_max_steps(max_steps);
  spec.set_seed(7);
  spec.set_log_every_steps(1000);
  return task;
}

using test_util::Eventually;
using test_util::ExpectSameTensors;
using test_util::QuietOptions;
using test_util::ReadTensors;
using test_util::SaveScriptModule;
using test_util::TestDataOptions;

// ---- safetensors <-> torch ----

TEST(TensorsTest, RoundTripKeepsDtypeShapeAndBytes) {
  NamedTensors tensors = {
      {"f32", torch::randn({3, 4})},
      {"f64", torch::randn({2}, torch::kFloat64)},
      {"i64", torch::arange(6, torch::kInt64).reshape({2, 3})},
      {"i32", torch::arange(5, torch::kInt32)},
      {"u8", torch::arange(4, torch::kUInt8)},
      {"bf16", torch::randn({5}).to(torch::kBFloat16)},
      {"strided", torch::randn({4, 4}).t()},  // not contiguous
  };
  absl::StatusOr<std::string> bytes = EncodeTensors(tensors, {{"k", "v"}});
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  std::map<std::string, std::string> metadata;
  absl::StatusOr<std::map<std::string, torch::Tensor>> decoded = DecodeTensors(*bytes, &metadata);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(metadata["k"], "v");
  ASSERT_EQ(decoded->size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    const torch::Tensor& d = decoded->at(name);
    EXPECT_EQ(d.scalar_type(), t.scalar_type()) << name;
    EXPECT_TRUE(torch::equal(d, t)) << name;
  }
}

TEST(TensorsTest, UnknownDtypeIsInvalidArgument) {
  TensorView view{"t", "C64", {1}, absl::string_view("12345678", 8)};
  EXPECT_EQ(TensorFromView(view).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EncodeTensors({{"c", torch::zeros({2}, torch::kComplexFloat)}}, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// ---- data ----

TEST(DataTest, SyntheticIsDeterministicPerSeed) {
  trainyard::v1::SyntheticData spec;
  spec.set_samples(50);
  spec.set_features(6);
  spec.set_classes(4);
  spec.set_noise(0.3f);
  absl::StatusOr<Dataset> a = MakeSyntheticDataset(spec, 11);
  absl::StatusOr<Dataset> b = MakeSyntheticDataset(spec, 11);
  absl::StatusOr<Dataset> c = MakeSyntheticDataset(spec, 12);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  ASSERT_EQ(a->features.sizes(), (std::vector<int64_t>{50, 6}));
  EXPECT_EQ(std::memcmp(a->features.data_ptr(), b->features.data_ptr(), a->features.nbytes()), 0);
  EXPECT_TRUE(torch::equal(a->labels, b->labels));
  EXPECT_FALSE(torch::equal(a->features, c->features));
  EXPECT_EQ(a->OutputWidth(), 4);
  EXPECT_EQ(a->labels.max().item<int64_t>(), 3);

  spec.set_classes(1);
  absl::StatusOr<Dataset> bad = MakeSyntheticDataset(spec, 1);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("data.synthetic.classes"));
}

TEST(DataTest, StepPlanDropsTheLastPartialBatch) {
  trainyard::v1::JobSpec spec;
  spec.set_batch_size(8);
  spec.set_epochs(3);
  absl::StatusOr<StepPlan> plan = PlanSteps(spec, 30, 1);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->steps_per_epoch, 3);
  EXPECT_EQ(plan->total_steps, 9);
  spec.set_max_steps(5);
  EXPECT_EQ(PlanSteps(spec, 30, 1)->total_steps, 5);
  spec.set_max_steps(100);
  EXPECT_EQ(PlanSteps(spec, 30, 1)->total_steps, 9);
  spec.set_batch_size(31);
  EXPECT_EQ(PlanSteps(spec, 30, 1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(DataTest, OrderIsDeterministicAndCoversEachEpoch) {
  trainyard::v1::JobSpec spec;
  spec.set_batch_size(4);
  spec.set_epochs(2);
  const StepPlan plan = *PlanSteps(spec, 10, 1);  // 2 steps per epoch, samples 8..9 dropped
  DataOrder a(plan, 5, /*shuffle=*/true);
  DataOrder b(plan, 5, /*shuffle=*/true);
  std::vector<int64_t> epoch0, epoch1;
  for (int64_t step = 0; step < 4; ++step) {
    std::vector<int64_t> batch = a.GlobalBatch(step);
    EXPECT_EQ(batch, b.GlobalBatch(step));
    ASSERT_EQ(batch.size(), 4u);
    auto& epoch = step < 2 ? epoch0 : epoch1;
    epoch.insert(epoch.end(), batch.begin(), batch.end());
  }
  // Each epoch takes 8 distinct samples of its own permutation.
  EXPECT_EQ(std::set<int64_t>(epoch0.begin(), epoch0.end()).size(), 8u);
  EXPECT_NE(epoch0, epoch1);
  const std::vector<int64_t> perm = EpochOrder(10, 5, 1, true);
  EXPECT_EQ(std::vector<int64_t>(perm.begin(), perm.begin() + 8), epoch1);
  // Out-of-order access gives the same batches (resume from any step).
  DataOrder c(plan, 5, true);
  EXPECT_EQ(c.GlobalBatch(3), b.GlobalBatch(3));
  EXPECT_EQ(c.GlobalBatch(0), a.GlobalBatch(0));

  DataOrder plain(plan, 5, /*shuffle=*/false);
  EXPECT_EQ(plain.GlobalBatch(1), (std::vector<int64_t>{4, 5, 6, 7}));
  EXPECT_EQ(plain.GlobalBatch(2), (std::vector<int64_t>{0, 1, 2, 3}));
  // Ranks take contiguous slices of the global batch.
  EXPECT_EQ(plain.RankBatch(1, 0, 2), (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(plain.RankBatch(1, 1, 2), (std::vector<int64_t>{6, 7}));
}

TEST(DataTest, PrefetcherYieldsTheBatchesOfEachStepInOrder) {
  const auto [data, plan] = test_util::MakeSyntheticSteps(40, 3, 8, 12);
  DataOrder order(plan, 9, true);
  BatchPrefetcher prefetcher(data, plan, 9, true, 0, 1, /*first_step=*/4, /*end_step=*/12, 2);
  for (int64_t step = 4; step < 12; ++step) {
    std::optional<Batch> batch = prefetcher.Next();
    ASSERT_TRUE(batch.has_value());
    EXPECT_EQ(batch->step, step);
    std::vector<int64_t> idx = order.GlobalBatch(step);
    torch::Tensor index = torch::tensor(idx, torch::kInt64);
    EXPECT_TRUE(torch::equal(batch->features, data.features.index_select(0, index)));
    EXPECT_TRUE(torch::equal(batch->labels, data.labels.index_select(0, index)));
  }
  EXPECT_FALSE(prefetcher.Next().has_value());
}

// The feed hands over the source's batches in order, whether or not the step asked for the next
// one ahead (Prefetch), and ends where the source ends.
TEST(DataTest, DeviceFeedHandsOverTheSourcesBatchesInOrder) {
  const auto [data, plan] = test_util::MakeSyntheticSteps(40, 3, 8, 10);
  BatchPrefetcher expected(data, plan, 9, true, 0, 1, 0, 10, 2);
  BatchPrefetcher source(data, plan, 9, true, 0, 1, 0, 10, 2);
  const std::unique_ptr<DeviceFeed> feed = MakeDeviceFeed(source, torch::kCPU);
  for (int64_t step = 0; step < 10; ++step) {
    std::optional<Batch> batch = feed->Next();
    std::optional<Batch> want = expected.Next();
    ASSERT_TRUE(batch.has_value() && want.has_value());
    EXPECT_EQ(batch->step, step);
    EXPECT_TRUE(torch::equal(batch->features, want->features));
    EXPECT_TRUE(torch::equal(batch->labels, want->labels));
    if (step % 3 != 0) feed->Prefetch();
  }
  EXPECT_FALSE(feed->Next().has_value());
}

TEST(DataTest, CategoricalIdsTravelWithTheirSamples) {
  trainyard::v1::SyntheticData synthetic;
  synthetic.set_samples(400);
  synthetic.set_features(3);
  synthetic.set_classes(4);
  for (int64_t v : {10, 1000}) synthetic.add_vocab(v);
  Dataset data = *MakeSyntheticDataset(synthetic, 3);
  ASSERT_EQ(data.categorical.sizes(), (std::vector<int64_t>{400, 2}));
  EXPECT_GE(data.categorical.min().item<int64_t>(), 0);
  EXPECT_LT(data.categorical.select(1, 0).max().item<int64_t>(), 10);
  EXPECT_LT(data.categorical.select(1, 1).max().item<int64_t>(), 1000);
  EXPECT_TRUE(torch::equal(data.categorical, MakeSyntheticDataset(synthetic, 3)->categorical));
  // About half of each field's ids are the class's own.
  const torch::Tensor field1 = data.categorical.select(1, 1);
  int64_t most_common = 0;  // summed over the classes: the count of each class's commonest id
  for (int64_t k = 0; k < 4; ++k) {
    most_common += torch::bincount(field1.masked_select(data.labels.eq(k))).max().item<int64_t>();
  }
  EXPECT_GT(most_common, 150);
  EXPECT_LT(most_common, 250);

  absl::StatusOr<SplitDataset> split = SplitValidation(data, 0.25);
  ASSERT_TRUE(split.ok());
  EXPECT_TRUE(torch::equal(split->validation.categorical, data.categorical.narrow(0, 300, 100)));
  trainyard::v1::JobSpec spec;
  spec.set_batch_size(8);
  spec.set_max_steps(3);
  const StepPlan plan = *PlanSteps(spec, 300, 1);
  DataOrder order(plan, 9, true);
  BatchPrefetcher prefetcher(split->train, plan, 9, true, 0, 1, 0, 3, 2);
  for (int64_t step = 0; step < 3; ++step) {
    std::optional<Batch> batch = prefetcher.Next();
    ASSERT_TRUE(batch.has_value());
    torch::Tensor index = torch::tensor(order.GlobalBatch(step), torch::kInt64);
    EXPECT_TRUE(torch::equal(batch->categorical, split->train.categorical.index_select(0, index)));
  }

  // From files: int32 or int64 ids [N, fields], checked.
  const std::string dir = MakeTempDir();
  NamedTensors t = {{"x", torch::zeros({3, 2})},
                    {"y", torch::tensor({0, 1, 0}, torch::kInt64)},
                    {"ids", torch::tensor({1, 2, 3, 4, 5, 6}, torch::kInt32).reshape({3, 2})},
                    {"flat", torch::tensor({1, 2, 3}, torch::kInt64)}};
  WriteFile(dir + "/a.safetensors", *EncodeTensors(t, {}));
  trainyard::v1::DataSpec files;
  files.set_train(dir + "/*.safetensors");
  files.set_features("x");
  files.set_labels("y");
  files.set_categorical("ids");
  absl::StatusOr<Dataset> loaded = LoadDataset(files, 0, true, TestDataOptions());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->categorical.scalar_type(), torch::kInt64);
  EXPECT_TRUE(torch::equal(loaded->categorical,
                           torch::tensor({1, 2, 3, 4, 5, 6}, torch::kInt64).reshape({3, 2})));
  files.set_categorical("flat");
  absl::Status status = LoadDataset(files, 0, true, TestDataOptions()).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("data.categorical: 'flat' in "));
  files.set_categorical("missing");
  EXPECT_THAT(LoadDataset(files, 0, true, TestDataOptions()).status().message(),
              HasSubstr("data.categorical: tensor 'missing' not in"));
}

TEST(DataTest, LoadsFilesInSortedOrderAndNamesBadFields) {
  const std::string dir = MakeTempDir();
  auto write = [&](const std::string& name, int64_t first, int64_t n) {
    NamedTensors t = {
        {"feat", torch::arange(first * 2, (first + n) * 2, torch::kInt32).reshape({n, 2})},
        {"lab", torch::arange(first, first + n, torch::kInt64).remainder(3)}};
    WriteFile(dir + "/" + name, *EncodeTensors(t, {}));
  };
  write("part-b.safetensors", 3, 2);
  write("part-a.safetensors", 0, 3);
  trainyard::v1::DataSpec spec;
  spec.set_train("file://" + dir + "/part-*.safetensors");
  spec.set_features("feat");
  spec.set_labels("lab");
  absl::StatusOr<Dataset> data = LoadDataset(spec, 0, true, TestDataOptions());
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->features.scalar_type(), torch::kFloat32);
  EXPECT_TRUE(torch::equal(data->features, torch::arange(0, 10, torch::kFloat32).reshape({5, 2})));
  EXPECT_EQ(data->labels.scalar_type(), torch::kInt64);

  spec.set_features("nope");
  absl::Status status = LoadDataset(spec, 0, true, TestDataOptions()).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              HasSubstr("data.features: tensor 'nope' not in " + dir + "/part-a.safetensors"));

  spec.set_train(dir + "/missing-*.safetensors");
  status = LoadDataset(spec, 0, true, TestDataOptions()).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(status.message(), "data.train: no files match '" + dir + "/missing-*.safetensors'");
  EXPECT_EQ(ExitCodeForStatus(status), 2);

  absl::StatusOr<SplitDataset> split = SplitValidation(*data, 0.4);
  ASSERT_TRUE(split.ok());
  EXPECT_EQ(split->train.size(), 3);
  EXPECT_EQ(split->validation.size(), 2);
  EXPECT_TRUE(torch::equal(split->validation.features, data->features.narrow(0, 3, 2)));
}

TEST(DataTest, ShardWindowsMakeEachEpochAPermutationDrawnFromAFewShards) {
  const std::vector<int64_t> shards = {5, 7, 3, 9, 6};  // 30 samples
  trainyard::v1::JobSpec spec;
  spec.set_batch_size(4);
  spec.set_epochs(3);
  const StepPlan plan = *PlanSteps(spec, 30, 1);  // 7 steps per epoch, 2 samples dropped
  std::vector<int64_t> first;                     // shard of each global sample
  for (size_t k = 0; k < shards.size(); ++k) first.insert(first.end(), shards[k], int64_t(k));
  DataOrder a(plan, 5, /*shuffle=*/true, shards, /*window=*/6);
  DataOrder b(plan, 5, /*shuffle=*/true, shards, /*window=*/6);
  std::vector<std::vector<int64_t>> epochs(3);
  for (int64_t step = 0; step < plan.total_steps; ++step) {
    const std::vector<int64_t> batch = a.GlobalBatch(step);
    ASSERT_EQ(batch.size(), 4u);
    epochs[static_cast<size_t>(step / 7)].insert(epochs[step / 7].end(), batch.begin(),
                                                 batch.end());
    // Every sample comes from a shard in flight; a 6-sample window spans at most 3 shards of 3+
    // samples, two windows (a batch straddling them) at most 5.
    const std::vector<int> in_flight = a.ShardsInFlight(step);
    EXPECT_LE(in_flight.size(), 5u);
    for (int64_t i : batch) {
      EXPECT_NE(std::find(in_flight.begin(), in_flight.end(), first[i]), in_flight.end())
          << "step " << step << " sample " << i;
    }
    // At an epoch's start, the shards fetched ahead are the epoch's next ones (later, the next
    // epoch's first shards may be some of those in flight now).
    if (step % 7 == 0) {
      const std::vector<int> ahead = a.ShardsAfter(step, 2);
      EXPECT_EQ(ahead.size(), 2u);
      std::set<int> all(in_flight.begin(), in_flight.end());
      all.insert(ahead.begin(), ahead.end());
      EXPECT_EQ(all.size(), in_flight.size() + 2) << "step " << step;
    }
    // Ranks take slices of the same global order, whatever their number: resume on another
    // number of ranks continues the same sequence.
    for (int world : {2, 4}) {
      std::vector<int64_t> joined;
      for (int r = 0; r < world; ++r) {
        std::vector<int64_t> part = b.RankBatch(step, r, world);
        joined.insert(joined.end(), part.begin(), part.end());
      }
      EXPECT_EQ(joined, batch);
    }
  }
  for (const std::vector<int64_t>& epoch : epochs) {
    EXPECT_EQ(std::set<int64_t>(epoch.begin(), epoch.end()).size(), 28u);  // no sample twice
  }
  EXPECT_NE(epochs[0], epochs[1]);
  // The shard order changes between epochs too.
  EXPECT_NE(a.ShardsInFlight(0), a.ShardsInFlight(7));
  // Any step, in any order, gives the same batch (resume from any step).
  DataOrder c(plan, 5, true, shards, 6);
  EXPECT_EQ(c.GlobalBatch(16), a.GlobalBatch(16));
  EXPECT_EQ(c.GlobalBatch(3), a.GlobalBatch(3));
  EXPECT_NE(DataOrder(plan, 6, true, shards, 6).GlobalBatch(3), a.GlobalBatch(3));

  // Without shuffle: file order, shard by shard, the next shards ahead.
  DataOrder plain(plan, 5, /*shuffle=*/false, shards, 6);
  EXPECT_EQ(plain.GlobalBatch(1), (std::vector<int64_t>{4, 5, 6, 7}));
  EXPECT_EQ(plain.ShardsInFlight(1), (std::vector<int>{0, 1}));
  EXPECT_EQ(plain.ShardsAfter(1, 2), (std::vector<int>{2, 3}));
  // No window: one permutation of everything, every shard in flight, nothing ahead.
  DataOrder whole(plan, 5, true, shards, 0);
  EXPECT_EQ(whole.GlobalBatch(2), DataOrder(plan, 5, true).GlobalBatch(2));
  EXPECT_EQ(whole.ShardsInFlight(2).size(), 5u);
  EXPECT_TRUE(whole.ShardsAfter(2, 2).empty());
}

// Shard `i` with `n` samples: "x" uint8 [n, 2, 3] holding (i * 10 + row) % 256 in every byte,
// "y" int32 labels row % 5, "big" an unused float32 column.
std::string CompactShard(int i, int64_t n, std::map<std::string, std::string> metadata = {}) {
  torch::Tensor row = torch::arange(n, torch::kInt64);
  NamedTensors t = {{"x", (row + i * 10)
                              .remainder(256)
                              .to(torch::kUInt8)
                              .reshape({n, 1, 1})
                              .expand({n, 2, 3})
                              .contiguous()},
                    {"y", row.remainder(5).to(torch::kInt32)},
                    {"big", torch::zeros({n, 16})}};
  return *EncodeTensors(t, metadata);
}

TEST(DataTest, ShardsAreReadPerBatchInTheirCompactDtypeAndScaled) {
  const std::string dir = MakeTempDir();
  for (int i = 0; i < 3; ++i) {
    WriteFile(absl::StrCat(dir, "/part-", i, ".safetensors"), CompactShard(i, 10 + i));
  }
  trainyard::v1::DataSpec spec;
  spec.set_train(dir + "/part-*.safetensors");
  spec.set_features("x");
  spec.set_labels("y");
  spec.set_feature_scale(0.5f);
  spec.set_feature_offset(-1.0f);
  spec.set_validation_split(0.1f);  // 33 samples: 3 held out
  absl::StatusOr<std::unique_ptr<TrainingData>> data =
      OpenTrainingData(spec, 0, true, TestDataOptions());
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ((*data)->train_size(), 30);
  EXPECT_EQ((*data)->validation_size(), 3);
  EXPECT_EQ((*data)->sample_shape(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ((*data)->outputs(), 5);  // read from the labels: max 4
  EXPECT_EQ((*data)->shard_train_samples(), (std::vector<int64_t>{10, 11, 9}));
  // Sample 12 is row 2 of shard 1, byte 12; sample 32 row 11 of shard 2 (validation).
  absl::StatusOr<Batch> batch = (*data)->Gather({12, 0, 32});
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_EQ(batch->features.scalar_type(), torch::kFloat32);
  EXPECT_EQ(batch->features.sizes(), (std::vector<int64_t>{3, 2, 3}));
  EXPECT_TRUE(torch::equal(batch->features.select(1, 0).select(1, 0),
                           torch::tensor({12 * 0.5f - 1, -1.0f, 31 * 0.5f - 1})));
  EXPECT_EQ(batch->labels.scalar_type(), torch::kInt64);
  EXPECT_TRUE(torch::equal(batch->labels, torch::tensor({2, 0, 1}, torch::kInt64)));
  // The whole set through LoadDataset agrees sample for sample (scale and offset included).
  absl::StatusOr<Dataset> whole = LoadDataset(spec, 0, true, TestDataOptions());
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_TRUE(
      torch::equal(whole->features.index_select(0, torch::tensor({12, 0, 32})), batch->features));

  // The prefetcher over shards and windows gives each rank Gather of its slice of the order.
  trainyard::v1::JobSpec job;
  job.set_batch_size(6);
  job.set_max_steps(12);
  const StepPlan plan = *PlanSteps(job, 30, 2);
  BatchPrefetcher::Order order;
  order.seed = 3;
  order.window = 8;
  BatchPrefetcher prefetcher(**data, plan, order, /*rank=*/1, /*world_size=*/2, 2, 12, 2);
  DataOrder expected(plan, 3, true, (*data)->shard_train_samples(), 8);
  for (int64_t step = 2; step < 12; ++step) {
    std::optional<Batch> got = prefetcher.Next();
    ASSERT_TRUE(got.has_value()) << prefetcher.status();
    absl::StatusOr<Batch> want = (*data)->Gather(expected.RankBatch(step, 1, 2));
    EXPECT_TRUE(torch::equal(got->features, want->features)) << "step " << step;
    EXPECT_TRUE(torch::equal(got->labels, want->labels));
  }
  EXPECT_FALSE(prefetcher.Next().has_value());
  EXPECT_TRUE(prefetcher.status().ok());

  // Extremes that `trainyard data pack` records are used instead of reading the labels.
  for (int i = 0; i < 3; ++i) {
    WriteFile(absl::StrCat(dir, "/part-", i, ".safetensors"),
              CompactShard(i, 10 + i, {{"trainyard.min.y", "0"}, {"trainyard.max.y", "41"}}));
  }
  EXPECT_EQ((*OpenTrainingData(spec, 0, true, TestDataOptions()))->outputs(), 42);
  // Shards that disagree on the features' dtype are refused, naming the shard.
  NamedTensors odd = {{"x", torch::zeros({4, 2, 3})}, {"y", torch::zeros({4}, torch::kInt32)}};
  WriteFile(dir + "/part-3.safetensors", *EncodeTensors(odd, {}));
  absl::Status status = OpenTrainingData(spec, 0, true, TestDataOptions()).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("data.features: " + dir + "/part-3.safetensors has F32"));
}

// Token shards (data.tokens): windows of context + 1 tokens every context tokens within each
// shard, inputs and next tokens as int64, the last windows held out; U16 ids as a BPE
// vocabulary writes them, extremes read when the shards do not record them.
TEST(TrainingDataTest, TokenShardsGiveWindowsOfContextPlusOneTokens) {
  const std::string dir = MakeTempDir();
  // Shard k holds ids 1000 k + 0, 1, ..., n - 1: 23 and 10 tokens, 5 and 2 windows of 4 + 1.
  auto shard = [&](int k, int n, std::map<std::string, std::string> meta) {
    std::vector<uint16_t> ids(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = static_cast<uint16_t>(1000 * k + i);
    const std::string bytes(reinterpret_cast<const char*>(ids.data()), ids.size() * 2);
    absl::StatusOr<std::string> header =
        EncodeSafetensorsHeader({TensorView{"tokens", "U16", {n}, bytes}}, meta);
    ASSERT_TRUE(header.ok()) << header.status();
    WriteFile(absl::StrCat(dir, "/text-", k, ".safetensors"), *header + bytes);
  };
  ASSERT_NO_FATAL_FAILURE(shard(0, 23, {}));
  ASSERT_NO_FATAL_FAILURE(shard(1, 10, {}));
  trainyard::v1::DataSpec spec;
  spec.set_tokens(dir + "/text-*.safetensors");
  spec.set_validation_split(0.3f);  // 7 windows: 2 held out
  DataOptions options = TestDataOptions();
  options.token_context = 4;
  absl::StatusOr<std::unique_ptr<TrainingData>> data = OpenTrainingData(spec, 0, true, options);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_TRUE((*data)->tokens());
  EXPECT_EQ((*data)->train_size(), 5);
  EXPECT_EQ((*data)->validation_size(), 2);
  EXPECT_EQ((*data)->shard_train_samples(), (std::vector<int64_t>{5, 0}));
  EXPECT_EQ((*data)->sample_shape(), (std::vector<int64_t>{4}));
  EXPECT_EQ((*data)->outputs(), 1010);  // read from the tokens: largest 1009
  // Window 4 is tokens 16..20 of shard 0; window 6 is tokens 4..8 of shard 1.
  absl::StatusOr<Batch> batch = (*data)->Gather({4, 0, 6});
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_EQ(batch->features.scalar_type(), torch::kInt64);
  EXPECT_TRUE(torch::equal(
      batch->features, torch::tensor({{16, 17, 18, 19}, {0, 1, 2, 3}, {1004, 1005, 1006, 1007}})));
  EXPECT_TRUE(torch::equal(
      batch->labels, torch::tensor({{17, 18, 19, 20}, {1, 2, 3, 4}, {1005, 1006, 1007, 1008}})));
  // Recorded extremes are used instead of reading the tokens.
  data->reset();  // its mappings of the shards, rewritten below
  ASSERT_NO_FATAL_FAILURE(
      shard(1, 10, {{"trainyard.min.tokens", "0"}, {"trainyard.max.tokens", "4095"}}));
  ASSERT_NO_FATAL_FAILURE(
      shard(0, 23, {{"trainyard.min.tokens", "0"}, {"trainyard.max.tokens", "22"}}));
  EXPECT_EQ((*OpenTrainingData(spec, 0, true, options))->outputs(), 4096);
  // Too short a text for one window, and tokens that are not 1-D, are refused naming the field.
  options.token_context = 40;
  absl::Status status = OpenTrainingData(spec, 0, true, options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("hold no window of 41 tokens"));
  options.token_context = 4;
  NamedTensors flat = {{"tokens", torch::zeros({4, 2}, torch::kInt32)}};
  WriteFile(dir + "/text-2.safetensors", *EncodeTensors(flat, {}));
  status = OpenTrainingData(spec, 0, true, options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("must be 1-D token ids of U8, U16, I32 or I64, got I32 "
                                          "[4,2]"));
}

// The coordinator's memory estimate (common/spec/memory_estimate.h) counts a built-in model's
// parameters exactly: as many bytes as the model the trainer builds holds.
TEST(MemoryEstimateTest, BuiltinParametersAreExact) {
  auto bytes_of = [](Model& model) {
    int64_t bytes = 0;
    for (const auto& [name, p] : model.NamedParameters()) bytes += p.numel() * p.element_size();
    return bytes;
  };
  auto check = [&](trainyard::v1::JobSpec spec, int64_t inputs, int64_t outputs,
                   std::vector<int64_t> max_ids = {}) {
    absl::StatusOr<std::unique_ptr<Model>> model =
        BuildModel(spec.model(), 1, inputs, outputs, max_ids);
    ASSERT_TRUE(model.ok()) << model.status();
    const JobMemory estimate = EstimateJobMemory(spec, nullptr);
    EXPECT_EQ(estimate.rank.parameters, bytes_of(**model)) << spec.model().DebugString();
    EXPECT_FALSE(estimate.rank.lower_bound) << spec.model().DebugString();
  };
  trainyard::v1::JobSpec mlp;
  mlp.mutable_model()->set_builtin("mlp");
  mlp.mutable_model()->mutable_args()->add_hidden(32);
  mlp.mutable_model()->mutable_args()->add_hidden(8);
  mlp.mutable_data()->mutable_synthetic()->set_features(16);
  mlp.mutable_data()->mutable_synthetic()->set_classes(4);
  check(mlp, 16, 4);

  trainyard::v1::JobSpec cnn;
  cnn.mutable_model()->set_builtin("cnn");
  trainyard::v1::ModelArgs& c = *cnn.mutable_model()->mutable_args();
  c.set_channels(1);
  c.set_height(8);
  c.set_width(8);
  c.add_hidden(4);
  c.add_hidden(6);
  c.set_classes(3);
  cnn.mutable_data()->mutable_synthetic()->set_features(64);
  check(cnn, 64, 3);

  trainyard::v1::JobSpec embedding;
  embedding.mutable_model()->set_builtin("embedding_mlp");
  trainyard::v1::ModelArgs& e = *embedding.mutable_model()->mutable_args();
  e.add_vocab(10);
  e.add_vocab(20);
  e.set_dim(4);
  e.add_hidden(8);
  e.set_classes(2);
  e.set_inputs(3);
  check(embedding, 3, 2, {9, 19});

  for (bool tied : {true, false}) {
    trainyard::v1::JobSpec transformer;
    transformer.mutable_model()->set_builtin("transformer");
    trainyard::v1::ModelArgs& t = *transformer.mutable_model()->mutable_args();
    t.add_vocab(50);
    t.set_context(8);
    t.set_layers(2);
    t.set_dim(16);
    t.set_heads(4);
    t.set_tie_embeddings(tied);
    check(transformer, 8, 50);
  }
}

// The built-in transformer: PyTorch's names (the tied head listed once, as wte.weight), the
// logits of every position's next token, tokens beyond the vocabulary refused, and each layer
// initialised from its own seed: the embeddings and the first block do not depend on how many
// layers follow them.
TEST(TransformerTest, NamesShapesAndLayerByLayerInitialisation) {
  trainyard::v1::ModelSpec spec;
  spec.set_builtin("transformer");
  trainyard::v1::ModelArgs& args = *spec.mutable_args();
  args.add_vocab(50);
  args.set_context(8);
  args.set_layers(2);
  args.set_dim(16);
  args.set_heads(4);
  absl::StatusOr<std::unique_ptr<Model>> two = BuildModel(spec, 5, 8, 50);
  ASSERT_TRUE(two.ok()) << two.status();
  std::vector<std::string> names;
  for (const auto& [name, p] : (*two)->NamedParameters()) names.push_back(name);
  EXPECT_THAT(
      names,
      ::testing::ElementsAre(
          "wte.weight", "wpe.weight", "h.0.ln_1.weight", "h.0.ln_1.bias", "h.0.attn.weight",
          "h.0.attn.bias", "h.0.proj.weight", "h.0.proj.bias", "h.0.ln_2.weight", "h.0.ln_2.bias",
          "h.0.fc.weight", "h.0.fc.bias", "h.0.fc_proj.weight", "h.0.fc_proj.bias",
          "h.1.ln_1.weight", "h.1.ln_1.bias", "h.1.attn.weight", "h.1.attn.bias", "h.1.proj.weight",
          "h.1.proj.bias", "h.1.ln_2.weight", "h.1.ln_2.bias", "h.1.fc.weight", "h.1.fc.bias",
          "h.1.fc_proj.weight", "h.1.fc_proj.bias", "ln_f.weight", "ln_f.bias"));
  EXPECT_EQ((*two)->Kind(), "transformer");
  const torch::Tensor out = (*two)->Forward(torch::randint(0, 50, {3, 5}, torch::kInt64));
  EXPECT_EQ(out.sizes(), (std::vector<int64_t>{3, 5, 50}));
  // Causal: changing the last token leaves the earlier positions' logits as they were.
  (*two)->SetTraining(false);
  torch::Tensor tokens = torch::randint(0, 50, {1, 6}, torch::kInt64);
  const torch::Tensor before = (*two)->Forward(tokens);
  tokens[0][5] = (tokens[0][5].item<int64_t>() + 1) % 50;
  const torch::Tensor after = (*two)->Forward(tokens);
  EXPECT_TRUE(torch::allclose(before.narrow(1, 0, 5), after.narrow(1, 0, 5)));
  EXPECT_FALSE(torch::allclose(before.narrow(1, 5, 1), after.narrow(1, 5, 1)));

  args.set_layers(3);
  args.set_tie_embeddings(false);
  std::unique_ptr<Model> three = *BuildModel(spec, 5, 8, 50);
  std::map<std::string, torch::Tensor> a, b;
  for (const auto& [name, p] : (*two)->NamedParameters()) a[name] = p;
  for (const auto& [name, p] : three->NamedParameters()) b[name] = p;
  EXPECT_EQ(b.count("lm_head.weight"), 1u);
  EXPECT_TRUE(torch::equal(a["wte.weight"], b["wte.weight"]));
  EXPECT_TRUE(torch::equal(a["h.0.attn.weight"], b["h.0.attn.weight"]));
  EXPECT_TRUE(torch::equal(a["h.1.fc.weight"], b["h.1.fc.weight"]));
  EXPECT_FALSE(torch::equal(a["h.0.attn.weight"], a["h.1.attn.weight"]));
  EXPECT_NEAR(a["wte.weight"].std().item<double>(), 0.02, 0.002);

  absl::Status status = BuildModel(spec, 5, 8, 51).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              HasSubstr("data.tokens: token id 50 is outside the 50 tokens of model.args.vocab"));
  args.set_heads(5);
  EXPECT_THAT(BuildModel(spec, 5, 8, 50).status().message(),
              HasSubstr("model.args.heads: 5 heads do not divide dim 16"));
}

// ---- schedules and optimizers ----

TEST(ScheduleTest, CosineWarmsUpLinearlyThenDecaysToMinLr) {
  trainyard::v1::OptimizerSpec spec;
  spec.set_lr(0.1);
  spec.mutable_schedule()->set_name("cosine");
  spec.mutable_schedule()->set_warmup_steps(10);
  spec.mutable_schedule()->set_min_lr(0.001);
  EXPECT_DOUBLE_EQ(LearningRateAt(spec, 0, 110), 0.01);
  EXPECT_DOUBLE_EQ(LearningRateAt(spec, 4, 110), 0.05);
  EXPECT_DOUBLE_EQ(LearningRateAt(spec, 9, 110), 0.1);
  EXPECT_DOUBLE_EQ(LearningRateAt(spec, 10, 110), 0.1);
  EXPECT_NEAR(LearningRateAt(spec, 60, 110), (0.1 + 0.001) / 2, 1e-12);
  EXPECT_NEAR(LearningRateAt(spec, 110, 110), 0.001, 1e-12);
  EXPECT_GT(LearningRateAt(spec, 109, 110), 0.001);
  spec.mutable_schedule()->set_name("constant");
  EXPECT_DOUBLE_EQ(LearningRateAt(spec, 60, 110), 0.1);
}

TEST(OptimizerTest, EachOptimizerStepsAndKeepsItsState) {
  struct Case {
    std::string name;
    double momentum;
    bool nesterov;
    std::vector<std::string> fields;
  };
  const std::vector<Case> cases = {
      {"sgd", 0, false, {}},
      {"sgd", 0.9, true, {"momentum_buffer"}},
      {"adam", 0, false, {"exp_avg", "exp_avg_sq", "step"}},
      {"adamw", 0, false, {"exp_avg", "exp_avg_sq", "step"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    trainyard::v1::ModelSpec model_spec;
    model_spec.set_builtin("mlp");
    std::unique_ptr<Model> model = *BuildModel(model_spec, 1, 4, 2);
    NamedTensors params = model->NamedParameters();
    std::vector<torch::Tensor> tensors;
    for (auto& [n, p] : params) tensors.push_back(p);
    trainyard::v1::OptimizerSpec spec;
    spec.set_name(c.name);
    spec.set_lr(0.1);
    spec.set_momentum(c.momentum);
    spec.set_nesterov(c.nesterov);
    spec.set_weight_decay(0.01);
    absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>> optimizer =
        BuildOptimizer(spec, tensors);
    ASSERT_TRUE(optimizer.ok()) << optimizer.status();
    const torch::Tensor before = params[0].second.detach().clone();
    (*optimizer)->zero_grad();
    torch::Tensor loss = torch::nn::functional::cross_entropy(
        model->Forward(torch::randn({5, 4})), torch::tensor({0, 1, 0, 1, 1}, torch::kInt64));
    loss.backward();
    (*optimizer)->step();
    EXPECT_FALSE(torch::equal(before, params[0].second));
    NamedTensors state = OptimizerStateTensors(**optimizer, params);
    EXPECT_EQ(state.size(), params.size() * c.fields.size());
    for (const std::string& field : c.fields) {
      bool found = false;
      for (auto& [key, t] : state) found |= key == params[0].first + "." + field;
      EXPECT_TRUE(found) << field;
    }
  }
  trainyard::v1::OptimizerSpec bad;
  bad.set_name("lion");
  bad.set_lr(0.1);
  EXPECT_EQ(BuildOptimizer(bad, {}).status().code(), absl::StatusCode::kInvalidArgument);
}

// ---- checkpoints ----

TEST(CheckpointTest, SaveAndReadRestoresModelOptimizerAndStepExactly) {
  const std::string dir = MakeTempDir();
  trainyard::v1::ModelSpec model_spec;
  model_spec.set_builtin("mlp");
  model_spec.mutable_args()->add_hidden(5);
  std::unique_ptr<Model> model = *BuildModel(model_spec, 3, 4, 3);
  NamedTensors params = model->NamedParameters();
  std::vector<torch::Tensor> tensors;
  for (auto& [n, p] : params) tensors.push_back(p);
  trainyard::v1::OptimizerSpec spec;
  spec.set_name("adamw");
  spec.set_lr(0.01);
  std::unique_ptr<torch::optim::Optimizer> optimizer = *BuildOptimizer(spec, tensors);
  for (int i = 0; i < 3; ++i) {
    optimizer->zero_grad();
    model->Forward(torch::randn({6, 4})).pow(2).sum().backward();
    optimizer->step();
  }
  CheckpointData data;
  for (auto& [n, p] : params) data.model.emplace_back(n, p.detach().clone());
  data.optimizer = OptimizerStateTensors(*optimizer, params);
  data.optimizer_name = "adamw";
  data.state.job_id = "j";
  data.state.generation = 2;
  data.state.step = 3;
  data.state.data_cursor = 24;
  data.state.torch_rng_state = TorchRngState();
  std::shared_ptr<ObjectStore> store = *OpenObjectStore("file://" + dir);
  FakeCoordinator coordinator(/*keep_last=*/5, "file://" + dir);
  {
    Checkpointer checkpointer(store.get(), &coordinator, RealClock::Get(),
                              {"file://" + dir, 2, absl::Milliseconds(1)});
    checkpointer.SaveAsync(data);
    ASSERT_TRUE(checkpointer.Wait().ok());
    EXPECT_EQ(checkpointer.last_saved_step(), 3);
  }
  const std::string step_uri = CheckpointStepUri("file://" + dir, 3);
  EXPECT_EQ(step_uri, "file://" + dir + "/step-000000000003");
  ASSERT_EQ(coordinator.committed().size(), 1u);
  EXPECT_EQ(coordinator.committed()[0].second, step_uri);

  absl::StatusOr<LoadedCheckpoint> loaded = ReadCheckpoint(*store, step_uri);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->state.step, 3);
  EXPECT_EQ(loaded->state.generation, 2);
  EXPECT_EQ(loaded->state.data_cursor, 24);
  EXPECT_EQ(loaded->optimizer_name, "adamw");
  std::map<std::string, torch::Tensor> expected(data.model.begin(), data.model.end());
  ExpectSameTensors(loaded->model, expected);

  // Into a fresh optimizer over fresh parameters: identical state tensors and step count.
  std::unique_ptr<Model> model2 = *BuildModel(model_spec, 99, 4, 3);
  NamedTensors params2 = model2->NamedParameters();
  std::vector<torch::Tensor> tensors2;
  for (auto& [n, p] : params2) tensors2.push_back(p);
  std::unique_ptr<torch::optim::Optimizer> optimizer2 = *BuildOptimizer(spec, tensors2);
  ASSERT_TRUE(CheckOptimizerState(*optimizer2, params2, loaded->optimizer).ok());
  LoadOptimizerState(*optimizer2, params2, loaded->optimizer);
  NamedTensors state1 = OptimizerStateTensors(*optimizer, params);
  NamedTensors state2 = OptimizerStateTensors(*optimizer2, params2);
  ASSERT_EQ(state1.size(), state2.size());
  for (size_t i = 0; i < state1.size(); ++i) {
    EXPECT_EQ(state1[i].first, state2[i].first);
    EXPECT_TRUE(torch::equal(state1[i].second, state2[i].second)) << state1[i].first;
  }

  // A flipped byte is caught by the hash check.
  const std::string model_path = StepFile(dir + "/step-000000000003", "model");
  std::string bytes = ReadFile(model_path);
  bytes[bytes.size() - 1] ^= 0x01;
  WriteFile(model_path, bytes);
  EXPECT_EQ(ReadCheckpoint(*store, step_uri).status().code(), absl::StatusCode::kDataLoss);
}

// Data, checkpoints and the exported model go where the stores handed to the trainer say. Here
// every URI is served from memory: a trainer that opened a store of its own would find no S3.
TEST(CheckpointTest, TheTrainerReadsAndWritesOnlyThroughTheStoresItIsGiven) {
  MemoryStores memory;
  torch::manual_seed(1);
  NamedTensors shard = {{"x", torch::randn({64, 8})},
                        {"y", torch::randint(0, 3, {64}, torch::kInt64)}};
  ASSERT_TRUE(memory.store().Put("s3://data/train-0.safetensors", *EncodeTensors(shard, {})).ok());
  trainyard::v1::Task task = SyntheticTask("", 20);
  auto& data = *task.mutable_spec()->mutable_data();
  data.clear_synthetic();
  data.set_train("s3://data/train-*.safetensors");
  data.set_features("x");
  data.set_labels("y");
  task.set_checkpoint_uri("s3://ckpt/job1");
  task.mutable_spec()->mutable_checkpoint()->set_every_steps(10);
  TrainerOptions options = QuietOptions();
  options.stores = &memory;
  options.data.cache_dir = MakeTempDir();
  absl::StatusOr<TrainResult> result = RunTrainer(task, options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->step, 20);
  EXPECT_TRUE(NewestManifestUri(memory.store(), "s3://ckpt/job1/step-000000000010").ok());
  EXPECT_TRUE(memory.store().Head("s3://ckpt/job1/final/model.safetensors").ok());
  EXPECT_FALSE(memory.store().reads().empty());

  // Without stores, nothing starts.
  options.stores = nullptr;
  EXPECT_EQ(RunTrainer(task, options).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(CheckpointTest, CommitRetiresOldCheckpoints) {
  const std::string dir = MakeTempDir();
  FakeCoordinator coordinator(/*keep_last=*/2, "file://" + dir);
  trainyard::v1::Task task = SyntheticTask(dir, 40);
  task.mutable_spec()->mutable_checkpoint()->set_every_steps(10);
  TrainerOptions options = QuietOptions();
  options.coordinator = &coordinator;
  options.report_interval = absl::ZeroDuration();
  absl::StatusOr<TrainResult> result = RunTrainer(task, options);
  ASSERT_TRUE(result.ok()) << result.status();
  const auto committed = coordinator.committed();
  ASSERT_EQ(committed.size(), 4u);
  EXPECT_EQ(committed.back().first, 40);
  // Steps 10 and 20 were retired and their objects deleted, folders and all; 30 and 40 remain.
  EXPECT_FALSE(FileExists(StepFile(dir + "/step-000000000010", "MANIFEST")));
  EXPECT_FALSE(FileExists(StepFile(dir + "/step-000000000020", "model")));
  EXPECT_FALSE(std::filesystem::exists(dir + "/step-000000000010"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/step-000000000020"));
  EXPECT_TRUE(FileExists(StepFile(dir + "/step-000000000030", "MANIFEST")));
  EXPECT_TRUE(FileExists(StepFile(dir + "/step-000000000040", "MANIFEST")));
  EXPECT_EQ(coordinator.model_uri(), "file://" + dir + "/final/model.safetensors");
  EXPECT_TRUE(FileExists(dir + "/final/model.safetensors"));
  ASSERT_FALSE(coordinator.progress().empty());
  EXPECT_EQ(coordinator.progress().back().step(), 40);
  EXPECT_EQ(coordinator.progress().back().total_steps(), 40);
  EXPECT_TRUE(coordinator.progress().back().has_val_accuracy());
}

// ---- coordinator outages ----

CheckpointData TinyCheckpoint(int64_t step) {
  CheckpointData data;
  data.model.emplace_back("w", torch::arange(6, torch::kFloat32));
  data.optimizer_name = "sgd";
  data.state.job_id = "j";
  data.state.step = step;
  data.state.torch_rng_state = TorchRngState();
  return data;
}

Checkpointer::Options FastRetries(const std::string& base_uri) {
  Checkpointer::Options options;
  options.base_uri = base_uri;
  options.backoff = absl::Milliseconds(1);
  options.max_backoff = absl::Milliseconds(4);
  return options;
}

TEST(CheckpointTest, CommitRidesOutACoordinatorRestart) {
  const std::string dir = MakeTempDir();
  std::shared_ptr<ObjectStore> store = *OpenObjectStore("file://" + dir);
  FakeCoordinator coordinator(/*keep_last=*/5, "file://" + dir);
  coordinator.set_commit_hook([](int call) {
    return call <= 5 ? absl::UnavailableError("connection refused") : absl::OkStatus();
  });
  Checkpointer checkpointer(store.get(), &coordinator, RealClock::Get(),
                            FastRetries("file://" + dir));
  EXPECT_TRUE(checkpointer.RecentSaveDurations().empty());
  ASSERT_TRUE(checkpointer.SaveAsync(TinyCheckpoint(3)));
  ASSERT_TRUE(checkpointer.Wait().ok());
  EXPECT_EQ(coordinator.commit_calls(), 6);
  EXPECT_EQ(coordinator.committed_steps(), std::vector<int64_t>{3});
  EXPECT_EQ(checkpointer.last_committed_step(), 3);
  ASSERT_EQ(checkpointer.RecentSaveDurations().size(), 1u);
  EXPECT_GT(checkpointer.RecentSaveDurations()[0], absl::ZeroDuration());
}

TEST(CheckpointTest, CommitGivesUpAfterItsRetryTimeAndNeverRetriesARefusal) {
  const std::string dir = MakeTempDir();
  std::shared_ptr<ObjectStore> store = *OpenObjectStore("file://" + dir);
  FakeClock clock;
  FakeCoordinator coordinator(/*keep_last=*/5, "file://" + dir);
  // Every attempt takes 10 s of the fake clock: 60 s allow six of them.
  coordinator.set_commit_hook([&clock](int) {
    clock.Advance(absl::Seconds(10));
    return absl::UnavailableError("connection refused");
  });
  Checkpointer::Options options = FastRetries("file://" + dir);
  options.commit_retry_for = absl::Seconds(60);
  {
    Checkpointer checkpointer(store.get(), &coordinator, clock, options);
    checkpointer.SaveAsync(TinyCheckpoint(4));
    absl::Status status = checkpointer.Wait();
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
    EXPECT_THAT(status.message(), HasSubstr("checkpoint commit of step 4"));
    EXPECT_EQ(coordinator.commit_calls(), 6);
    EXPECT_EQ(checkpointer.last_committed_step(), -1);
    EXPECT_TRUE(checkpointer.RecentSaveDurations().empty());  // failed saves do not count
  }
  // A save's own give-up time comes first when it is sooner.
  FakeCoordinator slow(/*keep_last=*/5, "file://" + dir);
  slow.set_commit_hook([&clock](int) {
    clock.Advance(absl::Seconds(10));
    return absl::UnavailableError("connection refused");
  });
  {
    Checkpointer checkpointer(store.get(), &slow, clock, options);
    checkpointer.SaveAsync(TinyCheckpoint(5), /*final_save=*/true, clock.Now() + absl::Seconds(15));
    EXPECT_EQ(checkpointer.Wait().code(), absl::StatusCode::kUnavailable);
    EXPECT_EQ(slow.commit_calls(), 2);
  }
  // Refusals (a newer attempt fenced this one off) end it at once, as the gRPC client or the
  // coordinator itself words them.
  for (const absl::Status& refusal : {absl::AbortedError("CommitCheckpoint: stale generation"),
                                      absl::FailedPreconditionError("stale generation")}) {
    FakeCoordinator fenced(/*keep_last=*/5, "file://" + dir);
    fenced.set_commit_hook([refusal](int) { return refusal; });
    Checkpointer checkpointer(store.get(), &fenced, RealClock::Get(), options);
    checkpointer.SaveAsync(TinyCheckpoint(6));
    EXPECT_EQ(checkpointer.Wait().code(), refusal.code());
    EXPECT_EQ(fenced.commit_calls(), 1);
  }
}

TEST(CheckpointTest, ADueCheckpointDoesNotWaitForACommitBeingRetried) {
  const std::string dir = MakeTempDir();
  std::shared_ptr<ObjectStore> store = *OpenObjectStore("file://" + dir);
  FakeCoordinator coordinator(/*keep_last=*/5, "file://" + dir);
  std::atomic<bool> down{true};
  coordinator.set_commit_hook([&down](int) {
    return down ? absl::UnavailableError("connection refused") : absl::OkStatus();
  });
  Checkpointer::Options options = FastRetries("file://" + dir);
  options.max_wait = absl::Hours(1);  // would stall training if the skip waited for it
  Checkpointer checkpointer(store.get(), &coordinator, RealClock::Get(), options);
  ASSERT_TRUE(checkpointer.SaveAsync(TinyCheckpoint(10)));
  ASSERT_TRUE(Eventually([&] { return coordinator.commit_calls() >= 2; }));
  EXPECT_FALSE(checkpointer.SaveAsync(TinyCheckpoint(20)));
  EXPECT_EQ(checkpointer.skipped(), 1);
  down = false;
  ASSERT_TRUE(checkpointer.Wait().ok());
  EXPECT_EQ(coordinator.committed_steps(), std::vector<int64_t>{10});
}

// A store whose writes wait at a gate while it is closed: an object store that stopped answering.
class GatedStore final : public ObjectStore {
 public:
  explicit GatedStore(std::shared_ptr<ObjectStore> inner) : inner_(std::move(inner)) {}
  void Close() {
    absl::MutexLock lock(&mu_);
    open_ = false;
  }
  void Open() {
    absl::MutexLock lock(&mu_);
    open_ = true;
  }
  bool Waiting() {
    absl::MutexLock lock(&mu_);
    return waiting_ > 0;
  }
  absl::Status Put(absl::string_view uri, absl::string_view data) override {
    Gate();
    return inner_->Put(uri, data);
  }
  absl::StatusOr<std::string> PutPieces(absl::string_view uri,
                                        absl::Span<const absl::string_view> pieces) override {
    Gate();
    return inner_->PutPieces(uri, pieces);
  }
  absl::StatusOr<std::string> Get(absl::string_view uri) override { return inner_->Get(uri); }
  absl::StatusOr<std::string> GetRange(absl::string_view uri, int64_t offset,
                                       int64_t length) override {
    return inner_->GetRange(uri, offset, length);
  }
  absl::StatusOr<ObjectInfo> Head(absl::string_view uri) override { return inner_->Head(uri); }
  absl::StatusOr<std::vector<ObjectInfo>> List(absl::string_view prefix) override {
    return inner_->List(prefix);
  }
  absl::Status Delete(absl::string_view uri) override { return inner_->Delete(uri); }

 private:
  void Gate() {
    absl::MutexLock lock(&mu_);
    ++waiting_;
    mu_.Await(absl::Condition(&open_));
    --waiting_;
  }
  std::shared_ptr<ObjectStore> inner_;
  absl::Mutex mu_;
  bool open_ ABSL_GUARDED_BY(mu_) = true;
  int waiting_ ABSL_GUARDED_BY(mu_) = 0;
};

// An upload that has run far longer than saves usually take (the store stopped answering) does
// not hold up training: the next due checkpoint is skipped at once instead of after max_wait.
TEST(CheckpointTest, ADueCheckpointDoesNotWaitForAStoreThatStoppedAnswering) {
  const std::string dir = MakeTempDir();
  auto store = std::make_shared<GatedStore>(*OpenObjectStore("file://" + dir));
  FakeCoordinator coordinator(/*keep_last=*/5, "file://" + dir);
  FakeClock clock;
  Checkpointer::Options options = FastRetries("file://" + dir);
  options.max_wait = absl::Hours(1);  // would stall training if the skip waited for it
  Checkpointer checkpointer(store.get(), &coordinator, clock, options);
  ASSERT_TRUE(checkpointer.SaveAsync(TinyCheckpoint(10)));
  ASSERT_TRUE(checkpointer.Wait().ok());  // a save of the usual length (0 s on this clock)
  store->Close();
  ASSERT_TRUE(checkpointer.SaveAsync(TinyCheckpoint(20)));
  ASSERT_TRUE(Eventually([&] { return store->Waiting(); }));
  clock.Advance(absl::Seconds(2));  // past twice the usual and a second: the store is in trouble
  EXPECT_FALSE(checkpointer.SaveAsync(TinyCheckpoint(30)));
  EXPECT_EQ(checkpointer.skipped(), 1);
  store->Open();
  ASSERT_TRUE(checkpointer.Wait().ok());
  EXPECT_EQ(coordinator.committed_steps(), (std::vector<int64_t>{10, 20}));
}

TEST(ProgressReporterTest, FirstReportGoesOutAtOnceAndFailedOnesAreSentAgain) {
  FakeCoordinator coordinator(/*keep_last=*/1);
  std::atomic<bool> down{false};
  coordinator.set_progress_hook([&down](int) {
    return down ? absl::UnavailableError("connection refused") : absl::OkStatus();
  });
  auto wait_for = [&coordinator](size_t reports) {
    return Eventually([&] { return coordinator.progress().size() >= reports; });
  };
  {
    // An hour between reports: only the first goes out before Finish.
    ProgressReporter reporter(&coordinator, RealClock::Get(), absl::Hours(1));
    trainyard::v1::JobProgress progress;
    progress.set_step(1);
    reporter.Update(progress);
    ASSERT_TRUE(wait_for(1));
    EXPECT_EQ(coordinator.progress()[0].step(), 1);
    progress.set_step(2);
    reporter.Update(progress);
    progress.set_step(3);
    ASSERT_TRUE(reporter.Finish(progress, absl::Now() + absl::Seconds(5)).ok());
    ASSERT_EQ(coordinator.progress().size(), 2u);
    EXPECT_EQ(coordinator.progress()[1].step(), 3);
  }
  {
    ProgressReporter reporter(&coordinator, RealClock::Get(), absl::Milliseconds(1));
    down = true;
    trainyard::v1::JobProgress progress;
    progress.set_step(7);
    reporter.Update(progress);
    ASSERT_TRUE(Eventually([&] { return coordinator.progress_calls() >= 6; }));
    down = false;
    ASSERT_TRUE(wait_for(3));
    EXPECT_EQ(coordinator.progress()[2].step(), 7);
  }
}

// ---- distillation ----

TEST(DistillTest, LossWeighsCrossEntropyAgainstTheSoftenedDivergence) {
  torch::manual_seed(3);
  const torch::Tensor student = torch::randn({5, 4}).requires_grad_();
  const torch::Tensor teacher = 3 * torch::randn({5, 4});
  const torch::Tensor labels = torch::tensor({0, 3, 1, 1, 2}, torch::kInt64);
  const double t = 2.5, alpha = 0.3;
  torch::Tensor loss = DistillationLoss(student, teacher, labels, t, alpha);

  // The definition, term by term, in double precision.
  const torch::Tensor s = student.detach().to(torch::kFloat64);
  const torch::Tensor p = torch::softmax(teacher.to(torch::kFloat64) / t, 1);
  const double ce = -torch::log_softmax(s, 1).gather(1, labels.unsqueeze(1)).mean().item<double>();
  const double kl = (p * (p.log() - torch::log_softmax(s / t, 1))).sum(1).mean().item<double>();
  EXPECT_NEAR(loss.item<double>(), (1 - alpha) * ce + alpha * t * t * kl, 1e-6);
  EXPECT_NEAR(DistillationLoss(student, teacher, labels, t, 0).item<double>(), ce, 1e-6);
  // A student that agrees with its teacher has nothing left to learn from it.
  EXPECT_NEAR(DistillationLoss(teacher, teacher, labels, t, 1).item<double>(), 0, 1e-6);

  // Halves weighted by their share of the samples add up to the whole (micro-batches, ranks).
  auto part = [&](int64_t begin, int64_t size) {
    return DistillationLoss(student.narrow(0, begin, size), teacher.narrow(0, begin, size),
                            labels.narrow(0, begin, size), t, alpha)
               .item<double>() *
           static_cast<double>(size) / 5.0;
  };
  EXPECT_NEAR(part(0, 2) + part(2, 3), loss.item<double>(), 1e-6);
  loss.backward();
  ASSERT_TRUE(student.grad().defined());
  EXPECT_GT(student.grad().abs().sum().item<double>(), 0);
}

// A teacher that ignores the features and, in evaluation mode only, strongly favours class 0.
std::string FavourClassZeroTeacher(const std::string& dir, int64_t classes = 3) {
  const std::string path = dir + "/teacher.pt";
  torch::Tensor favour = torch::zeros({classes});
  favour[0] = 6;
  SaveScriptModule(path, {{"favour", favour}}, R"(
def forward(self, x):
    logits = x[:, :1] * 0.0 + self.favour
    if self.training:
        logits = -logits
    return logits
)");
  return path;
}

void Distill(trainyard::v1::Task& task, const std::string& teacher, double temperature,
             double alpha) {
  auto& distill = *task.mutable_spec()->mutable_distill();
  distill.set_teacher(teacher);
  distill.set_temperature(temperature);
  distill.set_alpha(alpha);
}

// With alpha 1 the student learns what its teacher says, not what the labels say; with alpha 0
// the teacher changes nothing at all.
TEST(DistillTest, TheStudentFollowsItsTeacherInProportionToAlpha) {
  const std::string dir = MakeTempDir();
  const std::string teacher = FavourClassZeroTeacher(dir);
  absl::StatusOr<TrainResult> plain = RunTrainer(SyntheticTask("", 60), QuietOptions());
  ASSERT_TRUE(plain.ok()) << plain.status();
  ASSERT_TRUE(plain->val_accuracy.has_value());
  EXPECT_GT(*plain->val_accuracy, 0.8);

  trainyard::v1::Task task = SyntheticTask("", 60);
  Distill(task, teacher, 1.0, 1.0);
  absl::StatusOr<TrainResult> taught = RunTrainer(task, QuietOptions());
  ASSERT_TRUE(taught.ok()) << taught.status();
  // The student calls every sample class 0, as the teacher in evaluation mode does: it is right
  // exactly on the validation samples of class 0.
  absl::StatusOr<Dataset> data =
      LoadDataset(task.spec().data(), task.spec().seed(), true, TestDataOptions());
  ASSERT_TRUE(data.ok()) << data.status();
  absl::StatusOr<SplitDataset> split =
      SplitValidation(*data, task.spec().data().validation_split());
  ASSERT_TRUE(split.ok()) << split.status();
  const double zeros = split->validation.labels.eq(0).to(torch::kFloat64).mean().item<double>();
  ASSERT_TRUE(taught->val_accuracy.has_value());
  EXPECT_DOUBLE_EQ(*taught->val_accuracy, zeros);
  EXPECT_LT(taught->loss, 0.1 * taught->first_loss);

  trainyard::v1::Task ignored = SyntheticTask("", 60);
  Distill(ignored, teacher, 3.0, 0.0);
  absl::StatusOr<TrainResult> alone = RunTrainer(ignored, QuietOptions());
  ASSERT_TRUE(alone.ok()) << alone.status();
  EXPECT_EQ(alone->loss, plain->loss);
  EXPECT_EQ(alone->val_accuracy, plain->val_accuracy);

  trainyard::v1::Task half = SyntheticTask("", 60);
  Distill(half, teacher, 3.0, 0.5);
  absl::StatusOr<TrainResult> mixed = RunTrainer(half, QuietOptions());
  ASSERT_TRUE(mixed.ok()) << mixed.status();
  EXPECT_NE(mixed->first_loss, plain->first_loss);
}

TEST(DistillTest, ABadTeacherIsRefusedBeforeTraining) {
  const std::string dir = MakeTempDir();
  trainyard::v1::Task task = SyntheticTask("", 5);
  Distill(task, FavourClassZeroTeacher(dir, /*classes=*/4), 2.0, 0.5);
  absl::Status status = RunTrainer(task, QuietOptions()).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "distill.teacher: forward() returns shape [1,4] for 1 samples, the student gives "
            "[1,3]");

  Distill(task, dir + "/missing.pt", 2.0, 0.5);
  status = RunTrainer(task, QuietOptions()).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(status.message()), ::testing::StartsWith("distill.teacher: "));

  Distill(task, FavourClassZeroTeacher(dir), 0.0, 0.5);
  status = RunTrainer(task, QuietOptions()).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "distill.temperature: must be > 0, got 0");

  Distill(task, FavourClassZeroTeacher(dir), 2.0, 0.5);
  task.mutable_spec()->set_loss("mse");
  status = RunTrainer(task, QuietOptions()).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "distill: only with loss cross_entropy");

  // What a job with a built-in model exports holds no code to run.
  const std::string trained = MakeTempDir();
  ASSERT_TRUE(RunTrainer(SyntheticTask(trained, 2), QuietOptions()).ok());
  trainyard::v1::Task student = SyntheticTask("", 5);
  Distill(student, trained + "/final/model.safetensors", 2.0, 0.5);
  status = RunTrainer(student, QuietOptions()).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("only a job with a TorchScript model exports one"));
}

// The teacher sees each rank's share of the batch: two data-parallel ranks end where one rank
// ends, to within float rounding, and the checkpoint holds the student alone.
TEST(DistillTest, TwoDataParallelRanksEndWhereOneEnds) {
  const std::string dir = MakeTempDir();
  torch::manual_seed(5);
  const std::string teacher = dir + "/linear.pt";
  SaveScriptModule(teacher, {{"w", torch::randn({8, 3})}, {"b", torch::randn({3})}}, R"(
def forward(self, x):
    return x @ self.w + self.b
)");
  auto make = [&](const std::string& checkpoint_dir) {
    trainyard::v1::Task task = SyntheticTask(checkpoint_dir, 30);
    task.mutable_spec()->set_strategy(trainyard::v1::DATA_PARALLEL);
    Distill(task, teacher, 2.0, 0.6);
    return task;
  };
  const std::string single_dir = MakeTempDir(), dp_dir = MakeTempDir(), plain_dir = MakeTempDir();
  absl::StatusOr<TrainResult> single = RunTrainer(make(single_dir), QuietOptions());
  ASSERT_TRUE(single.ok()) << single.status();
  for (const auto& r : test_util::RunRanks(make(dp_dir), 2, {})) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_NEAR(r->loss, single->loss, 1e-5);
  }
  const auto model = ReadTensors(single_dir + "/final/model.safetensors");
  const auto dp_model = ReadTensors(dp_dir + "/final/model.safetensors");
  ASSERT_EQ(model.size(), dp_model.size());
  for (const auto& [name, tensor] : model) {
    ASSERT_TRUE(dp_model.count(name)) << name;
    EXPECT_LE((tensor - dp_model.at(name)).abs().max().item<double>(), 1e-5) << name;
  }
  // The same tensors as a job without a teacher saves, and different values.
  ASSERT_TRUE(RunTrainer(SyntheticTask(plain_dir, 30), QuietOptions()).ok());
  const auto plain = ReadTensors(plain_dir + "/final/model.safetensors");
  ASSERT_EQ(plain.size(), model.size());
  double moved = 0;
  for (const auto& [name, tensor] : plain) {
    ASSERT_TRUE(model.count(name)) << name;
    moved = std::max(moved, (tensor - model.at(name)).abs().max().item<double>());
  }
  EXPECT_GT(moved, 1e-3);
}

// ---- whole runs ----

TEST(TrainerTest, MlpLearnsSyntheticData) {
  trainyard::v1::Task task = SyntheticTask("", 100);
  task.mutable_spec()->set_log_every_steps(25);
  std::vector<std::string> lines;
  TrainerOptions options = QuietOptions();
  options.print_line = [&lines](const std::string& line) { lines.push_back(line); };
  absl::StatusOr<TrainResult> result = RunTrainer(task, options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->step, 100);
  EXPECT_LT(result->loss, 0.5 * result->first_loss);
  ASSERT_TRUE(result->val_accuracy.has_value());
  EXPECT_GT(*result->val_accuracy, 0.8);
  // start line, four progress lines, end line
  ASSERT_EQ(lines.size(), 6u);
  EXPECT_THAT(lines[0], HasSubstr("start: model=mlp"));
  EXPECT_THAT(lines[1], ::testing::MatchesRegex(
                            "step=25 total=100 loss=[0-9.]+ lr=0.01 samples_per_s=[0-9.]+ "
                            "epoch=2 val_accuracy=[0-9.]+ val_loss=[0-9.]+"));
  EXPECT_THAT(lines[4], HasSubstr("step=100 total=100"));
  // The validation loss is the split's mean cross-entropy: below the first batch's.
  ASSERT_TRUE(result->val_loss.has_value());
  EXPECT_LT(*result->val_loss, result->first_loss);
  EXPECT_FALSE(result->val_perplexity);
  EXPECT_THAT(lines[5], HasSubstr("done: step=100"));
}

// Validation runs at its own cadence, on at most max_samples of the split.
TEST(TrainerTest, ValidationKeepsItsOwnCadenceAndSampleLimit) {
  // 180 training samples in batches of 16: 11 steps an epoch.
  auto run = [](const trainyard::v1::ValidationSpec& validation, std::vector<int64_t>& steps) {
    trainyard::v1::Task task = SyntheticTask("", 30);
    task.mutable_spec()->mutable_data()->mutable_synthetic()->set_noise(3.0f);  // not learnable
    *task.mutable_spec()->mutable_data()->mutable_validation() = validation;
    TrainerOptions options = QuietOptions();
    const std::regex measured(R"(^step=([0-9]+) val_accuracy=)");
    options.print_line = [&](const std::string& line) {
      std::smatch m;
      if (std::regex_search(line, m, measured)) steps.push_back(std::stoll(m[1]));
    };
    return RunTrainer(task, options);
  };
  trainyard::v1::ValidationSpec every_epoch;
  every_epoch.set_every_epoch(true);
  std::vector<int64_t> steps;
  absl::StatusOr<TrainResult> result = run(every_epoch, steps);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(steps, (std::vector<int64_t>{11, 22}));  // and at step 30, in its progress line
  ASSERT_TRUE(result->val_accuracy.has_value());
  const double all = *result->val_accuracy;
  EXPECT_GT(all, 0.0);
  EXPECT_LT(all, 1.0);

  trainyard::v1::ValidationSpec every_7;
  every_7.set_every_steps(7);
  every_7.set_max_samples(1);
  steps.clear();
  result = run(every_7, steps);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(steps, (std::vector<int64_t>{7, 14, 21, 28}));
  // One sample: right or wrong.
  ASSERT_TRUE(result->val_accuracy.has_value());
  EXPECT_TRUE(*result->val_accuracy == 0.0 || *result->val_accuracy == 1.0)
      << *result->val_accuracy;
}

// The categorical ids alone carry the class (the dense features are pure noise): an
// embedding_mlp learns them, and so does the same job on 2 data-parallel ranks, to within float
// rounding of the single rank's parameters.
TEST(TrainerTest, EmbeddingMlpLearnsFromCategoricalIds) {
  auto make = [](const std::string& dir) {
    trainyard::v1::Task task = SyntheticTask(dir, 60);
    auto& spec = *task.mutable_spec();
    spec.mutable_data()->mutable_synthetic()->set_noise(50.0f);
    for (int64_t v : {50, 7, 300}) spec.mutable_data()->mutable_synthetic()->add_vocab(v);
    auto& model = *spec.mutable_model();
    model.set_builtin("embedding_mlp");
    for (int64_t v : {64, 7, 1000}) model.mutable_args()->add_vocab(v);
    model.mutable_args()->set_dim(4);
    model.mutable_args()->set_classes(3);
    return task;
  };
  const std::string single_dir = MakeTempDir();
  absl::StatusOr<TrainResult> result = RunTrainer(make(single_dir), QuietOptions());
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_LT(result->loss, 0.5 * result->first_loss);
  ASSERT_TRUE(result->val_accuracy.has_value());
  EXPECT_GT(*result->val_accuracy, 0.8);
  const auto model = test_util::ReadTensors(single_dir + "/final/model.safetensors");
  ASSERT_TRUE(model.count("embedding2.weight"));
  EXPECT_EQ(model.at("embedding2.weight").sizes(), (std::vector<int64_t>{1000, 4}));

  const std::string dp_dir = MakeTempDir();
  trainyard::v1::Task dp = make(dp_dir);
  dp.mutable_spec()->set_strategy(trainyard::v1::DATA_PARALLEL);
  for (const auto& r : test_util::RunRanks(dp, 2, {})) ASSERT_TRUE(r.ok()) << r.status();
  const auto dp_model = test_util::ReadTensors(dp_dir + "/final/model.safetensors");
  for (const auto& [name, tensor] : model) {
    ASSERT_TRUE(dp_model.count(name)) << name;
    EXPECT_LE((tensor - dp_model.at(name)).abs().max().item<double>(), 1e-5) << name;
  }

  // Ids outside a table, or a field count the model does not have, are refused up front.
  trainyard::v1::Task small = make("");
  small.mutable_spec()->mutable_model()->mutable_args()->set_vocab(2, 100);
  absl::Status status = RunTrainer(small, QuietOptions()).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("outside the 100 rows of model.args.vocab[2]"));
  trainyard::v1::Task fewer = make("");
  fewer.mutable_spec()->mutable_model()->mutable_args()->mutable_vocab()->RemoveLast();
  status = RunTrainer(fewer, QuietOptions()).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("the data has 3 categorical fields"));
}

TEST(TrainerTest, CnnTrains) {
  trainyard::v1::Task task = SyntheticTask("", 5);
  auto& model = *task.mutable_spec()->mutable_model();
  model.set_builtin("cnn");
  model.mutable_args()->clear_hidden();
  model.mutable_args()->add_hidden(4);
  model.mutable_args()->set_channels(2);
  model.mutable_args()->set_height(2);
  model.mutable_args()->set_width(2);
  absl::StatusOr<TrainResult> result = RunTrainer(task, QuietOptions());
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->step, 5);
}

// model.memory_format: channels_last turns every 4-D weight NHWC (and so the convolutions'
// activations) and trains to what the default layout trains to; its checkpoints hold the same
// tensors in the same (row-major) layout.
TEST(TrainerTest, ChannelsLastTrainsAsTheDefaultLayoutDoes) {
  auto cnn = [](const std::string& dir, const std::string& format) {
    trainyard::v1::Task task = SyntheticTask(dir, 8);
    task.mutable_spec()->mutable_data()->mutable_synthetic()->set_features(3 * 6 * 6);
    auto& model = *task.mutable_spec()->mutable_model();
    model.set_builtin("cnn");
    model.set_memory_format(format);
    model.mutable_args()->clear_hidden();
    model.mutable_args()->add_hidden(4);
    model.mutable_args()->add_hidden(6);
    model.mutable_args()->set_channels(3);
    model.mutable_args()->set_height(6);
    model.mutable_args()->set_width(6);
    return task;
  };
  absl::StatusOr<std::unique_ptr<Model>> model =
      BuildModel(cnn("", "channels_last").spec().model(), 1, 3 * 6 * 6, 3);
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_TRUE(ApplyMemoryFormat(**model, /*channels_last=*/true).ok());
  int nhwc = 0;
  for (const auto& [name, p] : (*model)->NamedParameters()) {
    if (p.dim() == 4) {
      EXPECT_TRUE(p.is_contiguous(torch::MemoryFormat::ChannelsLast)) << name;
      EXPECT_FALSE(p.is_contiguous()) << name;
      ++nhwc;
    }
  }
  EXPECT_EQ(nhwc, 2);
  torch::Tensor out = (*model)->Forward(torch::rand({2, 3 * 6 * 6}));
  EXPECT_EQ(out.sizes(), (std::vector<int64_t>{2, 3}));

  const std::string dir_default = MakeTempDir(), dir_nhwc = MakeTempDir();
  absl::StatusOr<TrainResult> a = RunTrainer(cnn(dir_default, "contiguous"), QuietOptions());
  absl::StatusOr<TrainResult> b = RunTrainer(cnn(dir_nhwc, "channels_last"), QuietOptions());
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_NEAR(a->loss, b->loss, 1e-5 * std::abs(a->loss));
  std::map<std::string, torch::Tensor> ta = ReadTensors(dir_default + "/final/model.safetensors");
  std::map<std::string, torch::Tensor> tb = ReadTensors(dir_nhwc + "/final/model.safetensors");
  ASSERT_EQ(ta.size(), tb.size());
  for (const auto& [name, t] : ta) {
    ASSERT_EQ(tb.count(name), 1u) << name;
    EXPECT_EQ(t.sizes(), tb[name].sizes()) << name;
    EXPECT_TRUE(torch::allclose(t, tb[name], 1e-4, 1e-5)) << name;
  }

  // A model without convolutions is refused, naming the field: by the trainer itself too, so
  // a trainer that never applied the format would fail here.
  absl::StatusOr<std::unique_ptr<Model>> mlp =
      BuildModel(SyntheticTask("", 1).spec().model(), 1, 8, 3);
  ASSERT_TRUE(mlp.ok());
  absl::Status refused = ApplyMemoryFormat(**mlp, /*channels_last=*/true);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr("model.memory_format"));
  trainyard::v1::Task mlp_task = SyntheticTask("", 2);
  mlp_task.mutable_spec()->mutable_model()->set_memory_format("channels_last");
  absl::Status trainer_refused = RunTrainer(mlp_task, QuietOptions()).status();
  EXPECT_EQ(trainer_refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(trainer_refused.message(), HasSubstr("model.memory_format"));
}

TEST(TrainerTest, ParameterServerNeedsTheRendezvousAndShardsForItsDenseLayers) {
  trainyard::v1::Task task = SyntheticTask("", 5);
  task.mutable_spec()->set_strategy(trainyard::v1::PARAMETER_SERVER);
  task.mutable_spec()->mutable_parameter_servers()->set_shards(1);
  for (const char* mode : {"sync", "async"}) {
    task.mutable_spec()->mutable_parameter_servers()->set_mode(mode);
    EXPECT_EQ(RunTrainer(task, QuietOptions()).status().code(), absl::StatusCode::kInvalidArgument)
        << mode;
  }
  task.mutable_spec()->mutable_parameter_servers()->set_dense("allreduce");
  EXPECT_EQ(RunTrainer(task, QuietOptions()).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TrainerTest, DataParallelChecksItsWorld) {
  trainyard::v1::Task task = SyntheticTask("", 5);
  task.mutable_spec()->set_strategy(trainyard::v1::DATA_PARALLEL);
  task.mutable_spec()->set_batch_size(12);
  // One rank trains alone.
  EXPECT_TRUE(RunTrainer(task, QuietOptions()).ok());
  // More need the rendezvous, and a batch that splits evenly.
  task.set_world_size(2);
  absl::Status status = RunTrainer(task, QuietOptions()).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("rendezvous"));
  task.set_world_size(5);
  status = RunTrainer(task, QuietOptions()).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("batch_size: 12 does not divide across 5"));
}

// 2N steps in one go equal N steps, a stop, a resume and N more, bit for bit; and a corrupted
// newest checkpoint is skipped in favour of the previous one.
TEST(TrainerTest, ResumeContinuesExactlyAndSkipsCorruptCheckpoints) {
  constexpr int64_t kN = 12;
  auto make_task = [](const std::string& dir) {
    trainyard::v1::Task task = SyntheticTask(dir, 2 * kN);
    auto& spec = *task.mutable_spec();
    spec.mutable_model()->mutable_args()->set_dropout(0.2f);  // uses the torch generator
    spec.mutable_optimizer()->set_name("adamw");
    spec.mutable_optimizer()->mutable_schedule()->set_name("cosine");
    spec.mutable_optimizer()->mutable_schedule()->set_warmup_steps(3);
    spec.mutable_checkpoint()->set_every_steps(kN);
    spec.set_batch_size(24);  // 7 steps per epoch: the run crosses epochs
    return task;
  };
  const std::string dir_a = MakeTempDir(), dir_b = MakeTempDir(), dir_c = MakeTempDir(),
                    dir_d = MakeTempDir();

  absl::StatusOr<TrainResult> a = RunTrainer(make_task(dir_a), QuietOptions());
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->step, 2 * kN);

  std::atomic<int> stop{0};
  TrainerOptions stop_options = QuietOptions();
  stop_options.stop_signal = &stop;
  stop_options.after_step = [&stop](int64_t step) {
    if (step == kN) stop = 15;
  };
  absl::StatusOr<TrainResult> b = RunTrainer(make_task(dir_b), stop_options);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(b->stopped);
  EXPECT_EQ(b->step, kN);
  EXPECT_TRUE(b->model_uri.empty());
  ExpectSameTensors(ReadTensors(StepFile(dir_a + "/step-000000000012", "model")),
                    ReadTensors(StepFile(dir_b + "/step-000000000012", "model")));

  trainyard::v1::Task task_c = make_task(dir_c);
  task_c.add_resume_checkpoints("file://" + dir_b + "/step-000000000012");
  absl::StatusOr<TrainResult> c = RunTrainer(task_c, QuietOptions());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->start_step, kN);
  EXPECT_EQ(c->step, 2 * kN);
  EXPECT_EQ(c->loss, a->loss);
  EXPECT_EQ(ReadFile(dir_c + "/final/model.safetensors"),
            ReadFile(dir_a + "/final/model.safetensors"));
  EXPECT_EQ(ReadFile(StepFile(dir_c + "/step-000000000024", "optimizer")),
            ReadFile(StepFile(dir_a + "/step-000000000024", "optimizer")));

  // Corrupt A's newest checkpoint: D falls back to step 12 and still ends where A ended.
  const std::string newest = StepFile(dir_a + "/step-000000000024", "model");
  std::string bytes = ReadFile(newest);
  bytes[bytes.size() / 2] ^= 0x20;
  WriteFile(newest, bytes);
  trainyard::v1::Task task_d = make_task(dir_d);
  task_d.add_resume_checkpoints("file://" + dir_a + "/step-000000000024");
  task_d.add_resume_checkpoints("file://" + dir_a + "/step-000000000012");
  absl::StatusOr<TrainResult> d = RunTrainer(task_d, QuietOptions());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->resumed_from, "file://" + dir_a + "/step-000000000012");
  EXPECT_EQ(d->start_step, kN);
  EXPECT_EQ(ReadFile(dir_d + "/final/model.safetensors"),
            ReadFile(dir_c + "/final/model.safetensors"));
}

// A job that asks for GPUs trains on the first visible one when LibTorch has CUDA; without CUDA
// (the Debian LibTorch) it trains on the CPU exactly as a CPU job does, checkpoints included.
TEST(TrainerTest, AGpuJobTrainsOnCudaOnlyWhereLibTorchHasIt) {
  trainyard::v1::Task cpu_task = SyntheticTask("", 5);
  trainyard::v1::Task gpu_task = cpu_task;
  gpu_task.mutable_spec()->mutable_resources()->set_gpus_per_worker(1);
  EXPECT_TRUE(TrainingDevice(cpu_task).is_cpu());
  EXPECT_EQ(TrainingDevice(gpu_task).is_cuda(), torch::cuda::is_available());
  if (torch::cuda::is_available()) GTEST_SKIP() << "the CPU equivalence needs a CPU-only LibTorch";

  const std::string dir_cpu = MakeTempDir(), dir_gpu = MakeTempDir();
  cpu_task = SyntheticTask(dir_cpu, 6);
  cpu_task.mutable_spec()->mutable_checkpoint()->set_every_steps(3);
  gpu_task = cpu_task;
  gpu_task.set_checkpoint_uri("file://" + dir_gpu);
  gpu_task.mutable_spec()->mutable_resources()->set_gpus_per_worker(1);
  absl::StatusOr<TrainResult> cpu = RunTrainer(cpu_task, QuietOptions());
  absl::StatusOr<TrainResult> gpu = RunTrainer(gpu_task, QuietOptions());
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  EXPECT_EQ(gpu->loss, cpu->loss);
  for (const char* base : {"model", "optimizer"}) {
    EXPECT_EQ(ReadFile(StepFile(dir_gpu + "/step-000000000003", base)),
              ReadFile(StepFile(dir_cpu + "/step-000000000003", base)))
        << base;
  }
  EXPECT_EQ(ReadFile(dir_gpu + "/final/model.safetensors"),
            ReadFile(dir_cpu + "/final/model.safetensors"));
}

// ---- precision ----

TEST(PrecisionTest, AutocastTypes) {
  EXPECT_EQ(*AutocastType(trainyard::v1::FP32, torch::kCPU), std::nullopt);
  EXPECT_EQ(*AutocastType(trainyard::v1::PRECISION_UNSPECIFIED, torch::kCPU), std::nullopt);
  EXPECT_EQ(*AutocastType(trainyard::v1::TF32, torch::Device(torch::kCUDA, 0)), std::nullopt);
  EXPECT_EQ(*AutocastType(trainyard::v1::BF16, torch::kCPU), torch::kBFloat16);
  EXPECT_EQ(*AutocastType(trainyard::v1::FP16, torch::Device(torch::kCUDA, 0)), torch::kHalf);
  absl::StatusOr<std::optional<torch::ScalarType>> cpu_fp16 =
      AutocastType(trainyard::v1::FP16, torch::kCPU);
  EXPECT_EQ(cpu_fp16.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(cpu_fp16.status().message(), HasSubstr("precision: fp16 needs a GPU"));
}

TEST(PrecisionTest, TheGuardCastsMatrixProductsInsideAndRestoresAutocastAfter) {
  torch::Tensor a = torch::randn({4, 8}), b = torch::randn({8, 3});
  {
    AutocastGuard guard(torch::kCPU, torch::kBFloat16);
    EXPECT_EQ(torch::mm(a, b).scalar_type(), torch::kBFloat16);
    {
      AutocastGuard off(torch::kCPU, std::nullopt);  // fp32 changes nothing
      EXPECT_EQ(torch::mm(a, b).scalar_type(), torch::kBFloat16);
    }
  }
  EXPECT_EQ(torch::mm(a, b).scalar_type(), torch::kFloat32);
}

TEST(PrecisionTest, Bf16TrainsOnTheCpuNearButNotAtFloat32AndResumesExactly) {
  const std::string dir_fp32 = MakeTempDir(), dir_bf16 = MakeTempDir();
  trainyard::v1::Task fp32 = SyntheticTask(dir_fp32, 12);
  trainyard::v1::Task bf16 = SyntheticTask(dir_bf16, 12);
  bf16.mutable_spec()->set_precision(trainyard::v1::BF16);
  bf16.mutable_spec()->mutable_checkpoint()->set_every_steps(6);
  absl::StatusOr<TrainResult> a = RunTrainer(fp32, QuietOptions());
  absl::StatusOr<TrainResult> b = RunTrainer(bf16, QuietOptions());
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_NE(a->loss, b->loss) << "bf16 computed exactly what fp32 did: autocast did not run";
  EXPECT_NEAR(a->loss, b->loss, 0.05 * std::abs(a->loss));
  // Parameters stay float32.
  for (const auto& [name, t] : ReadTensors(dir_bf16 + "/final/model.safetensors")) {
    EXPECT_EQ(t.scalar_type(), torch::kFloat32) << name;
  }
  // Resumed from step 6 it ends exactly where the uninterrupted bf16 run did.
  trainyard::v1::Task resumed = SyntheticTask(MakeTempDir(), 12);
  resumed.mutable_spec()->set_precision(trainyard::v1::BF16);
  resumed.add_resume_checkpoints("file://" + dir_bf16 + "/step-000000000006");
  absl::StatusOr<TrainResult> c = RunTrainer(resumed, QuietOptions());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->start_step, 6);
  EXPECT_EQ(c->loss, b->loss);
}

TEST(PrecisionTest, Fp16OnACpuRankIsRefusedBeforeAnyStep) {
  trainyard::v1::Task task = SyntheticTask(MakeTempDir(), 5);
  task.mutable_spec()->set_precision(trainyard::v1::FP16);
  int steps = 0;
  TrainerOptions options = QuietOptions();
  options.after_step = [&steps](int64_t) { ++steps; };
  absl::StatusOr<TrainResult> result = RunTrainer(task, options);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(result.status().message(), HasSubstr("precision: fp16 needs a GPU"));
  EXPECT_EQ(steps, 0);
}

TEST(LossScalerTest, ScalesUnscalesAndSkipsAnOverflowLoweringTheScale) {
  LossScaler scaler;
  EXPECT_EQ(scaler.scale(), 65536.0);
  torch::Tensor w = torch::ones({3}, torch::requires_grad());
  torch::Tensor unused = torch::ones({2}, torch::requires_grad());  // no gradient: skipped
  const NamedTensors params = {{"w", w}, {"unused", unused}};
  scaler.Scale((w * 2).sum()).backward();
  EXPECT_TRUE(w.grad().equal(torch::full({3}, 2.0 * 65536)));
  EXPECT_FALSE(scaler.Unscale(params));
  EXPECT_TRUE(w.grad().equal(torch::full({3}, 2.0)));
  scaler.Update(false);
  EXPECT_EQ(scaler.growth_tracker(), 1);

  w.mutable_grad().zero_();
  w.mutable_grad()[1] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(scaler.Unscale(params));
  scaler.Update(true);
  EXPECT_EQ(scaler.scale(), 32768.0);
  EXPECT_EQ(scaler.growth_tracker(), 0);
  w.mutable_grad()[1] = std::nan("");
  EXPECT_TRUE(scaler.Unscale(params)) << "NaN counts as an overflow too";
  w.mutable_grad().zero_();
  EXPECT_FALSE(scaler.Unscale(params));
}

TEST(LossScalerTest, GrowsAfterAnIntervalOfGoodStepsAsGradScalerDoes) {
  LossScaler::Options options;
  options.init_scale = 8;
  options.growth_interval = 3;
  LossScaler scaler(options);
  scaler.Update(false);
  scaler.Update(false);
  EXPECT_EQ(scaler.scale(), 8);
  scaler.Update(false);
  EXPECT_EQ(scaler.scale(), 16);
  EXPECT_EQ(scaler.growth_tracker(), 0);
  scaler.Update(false);
  scaler.Update(true);  // an overflow resets the count
  scaler.Update(false);
  scaler.Update(false);
  EXPECT_EQ(scaler.scale(), 8);
  scaler.Update(false);
  EXPECT_EQ(scaler.scale(), 16);
}

TEST(LossScalerTest, ItsStateTravelsInTheTrainerStateAndIsChecked) {
  TrainerState state;
  state.job_id = "j";
  state.loss_scale = 1024;
  state.loss_scale_growth_tracker = 17;
  absl::StatusOr<TrainerState> back = DecodeTrainerState(EncodeTrainerState(state));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->loss_scale, 1024);
  EXPECT_EQ(back->loss_scale_growth_tracker, 17);
  state.loss_scale = 0;  // not an fp16 job: no loss_scaler at all
  EXPECT_THAT(EncodeTrainerState(state), ::testing::Not(HasSubstr("loss_scaler")));

  LossScaler scaler;
  ASSERT_TRUE(scaler.Restore(1024, 17).ok());
  EXPECT_EQ(scaler.scale(), 1024);
  EXPECT_EQ(scaler.growth_tracker(), 17);
  EXPECT_EQ(scaler.Restore(0, 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(scaler.Restore(std::nan(""), 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(scaler.Restore(8, -1).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace trainyard::trainer
