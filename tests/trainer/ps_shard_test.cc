// One parameter-server shard without transport: synchronous aggregation equal to the optimizer
// on the whole model with the mean gradient, the agreement on loss and stop, asynchronous updates
// with bounded staleness, and fencing by generation.

#include "worker/trainer/ps_shard.h"

#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/trainer/model.h"
#include "worker/trainer/ps_partition.h"
#include "worker/trainer/schedule.h"

namespace trainyard::trainer {
namespace {

using ::testing::HasSubstr;

v1::OptimizerSpec Sgd() {
  v1::OptimizerSpec spec;
  spec.set_name("sgd");
  spec.set_lr(0.1);
  spec.set_momentum(0.9);
  spec.set_nesterov(true);
  spec.set_weight_decay(0.01);
  spec.mutable_schedule()->set_name("cosine");
  spec.mutable_schedule()->set_warmup_steps(2);
  return spec;
}

v1::OptimizerSpec AdamW() {
  v1::OptimizerSpec spec;
  spec.set_name("adamw");
  spec.set_lr(0.01);
  spec.set_beta1(0.9);
  spec.set_beta2(0.999);
  spec.set_eps(1e-8);
  spec.set_weight_decay(0.01);
  return spec;
}

// The shard's pieces of `parameters` (flattened), as the workers cut them.
std::vector<torch::Tensor> PiecesOf(const std::vector<torch::Tensor>& parameters,
                                    const Partition& partition, int shard) {
  std::vector<torch::Tensor> pieces;
  for (const Piece& piece : partition.PiecesOf(shard)) {
    pieces.push_back(
        parameters[piece.parameter].reshape(-1).narrow(0, piece.offset, piece.length).clone());
  }
  return pieces;
}

class SyncShardTest : public ::testing::TestWithParam<bool> {};

// Three workers, two shards, six updates: every shard's pieces end where the job's optimizer over
// the whole model with the mean gradient ends, whatever order the pushes arrive in.
TEST_P(SyncShardTest, UpdatesLikeTheOptimizerOnTheWholeModelWithTheMeanGradient) {
  const v1::OptimizerSpec spec = GetParam() ? AdamW() : Sgd();
  constexpr int kWorkers = 3, kShards = 2, kSteps = 6;
  torch::manual_seed(1);
  std::vector<torch::Tensor> model = {torch::randn({40, 30}), torch::randn({30}),
                                      torch::randn({5, 40})};
  std::vector<ParameterShape> shapes;
  for (size_t i = 0; i < model.size(); ++i) shapes.push_back({std::to_string(i), model[i].numel()});
  // Small pieces, so that tensors are cut and spread.
  absl::StatusOr<Partition> partition = PartitionParameters(shapes, kShards, 1000);
  ASSERT_TRUE(partition.ok());

  std::vector<std::unique_ptr<ParameterShard>> shards;
  for (int s = 0; s < kShards; ++s) {
    ShardConfig config;
    config.generation = 3;
    config.workers = kWorkers;
    config.optimizer = spec;
    config.total_steps = kSteps;
    auto shard = ParameterShard::Create(config, PiecesOf(model, *partition, s));
    ASSERT_TRUE(shard.ok()) << shard.status();
    shards.push_back(std::move(*shard));
  }
  std::vector<torch::Tensor> reference;
  for (const torch::Tensor& p : model) reference.push_back(p.clone().set_requires_grad(true));
  auto optimizer = BuildOptimizer(spec, reference);
  ASSERT_TRUE(optimizer.ok());

  for (int step = 0; step < kSteps; ++step) {
    std::vector<std::vector<torch::Tensor>> grads(kWorkers);
    for (int w = 0; w < kWorkers; ++w) {
      for (const torch::Tensor& p : model) grads[w].push_back(torch::randn_like(p));
    }
    for (int w : {2, 0, 1}) {
      for (int s = 0; s < kShards; ++s) {
        auto pushed = shards[s]->Push(3, w, step, PiecesOf(grads[w], *partition, s),
                                      /*loss=*/w + 1.0, /*stop=*/step == 4 && w == 1);
        ASSERT_TRUE(pushed.ok()) << pushed.status();
        EXPECT_EQ(pushed->version, w == 1 ? step + 1 : step);
      }
    }
    for (size_t i = 0; i < reference.size(); ++i) {
      reference[i].mutable_grad() = (grads[0][i] + grads[1][i] + grads[2][i]) / kWorkers;
    }
    SetLearningRate(**optimizer, LearningRateAt(spec, step, kSteps));
    (*optimizer)->step();

    for (int s = 0; s < kShards; ++s) {
      std::vector<torch::Tensor> pulled;
      auto result = shards[s]->Pull(3, step + 1, &pulled, absl::InfiniteFuture());
      ASSERT_TRUE(result.ok()) << result.status();
      EXPECT_EQ(result->version, step + 1);
      EXPECT_DOUBLE_EQ(result->agreement.loss, 2.0);
      EXPECT_EQ(result->agreement.stop, step == 4);
      const std::vector<torch::Tensor> expected = PiecesOf(reference, *partition, s);
      ASSERT_EQ(pulled.size(), expected.size());
      for (size_t i = 0; i < pulled.size(); ++i) {
        EXPECT_LE((pulled[i] - expected[i]).abs().max().item<double>(), 1e-6)
            << "shard " << s << " piece " << i << " after step " << step + 1;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, SyncShardTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "AdamW" : "SgdNesterov");
                         });

std::unique_ptr<ParameterShard> Shard(bool synchronous, int workers, int max_staleness = 0) {
  ShardConfig config;
  config.generation = 1;
  config.workers = workers;
  config.synchronous = synchronous;
  config.max_staleness = max_staleness;
  config.optimizer.set_name("sgd");
  config.optimizer.set_lr(0.5);
  config.optimizer.mutable_schedule()->set_name("constant");
  config.total_steps = 100;
  auto shard = ParameterShard::Create(config, {torch::zeros({4})});
  EXPECT_TRUE(shard.ok()) << shard.status();
  return shard.ok() ? std::move(*shard) : nullptr;
}

// A pull from another thread ends with the mean of every worker's push (that it waits until the
// version exists is BadPushesAreRefusedAndChangeNothing's deadline case).
TEST(ShardTest, APullReturnsTheUpdateOfAllWorkers) {
  std::unique_ptr<ParameterShard> shard = Shard(true, 2);
  std::vector<torch::Tensor> pulled;
  absl::StatusOr<ParameterShard::PullResult> result;
  std::thread puller([&] { result = shard->Pull(1, 1, &pulled, absl::InfiniteFuture()); });
  ASSERT_TRUE(shard->Push(1, 0, 0, {torch::ones({4})}).ok());
  ASSERT_TRUE(shard->Push(1, 1, 0, {torch::full({4}, 3.0)}).ok());
  puller.join();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->version, 1);
  // Mean gradient 2, learning rate 0.5.
  EXPECT_TRUE(torch::allclose(pulled[0], torch::full({4}, -1.0)));
}

TEST(ShardTest, AsynchronousPushesApplyAtOnceAndTooStaleOnesAreRefused) {
  std::unique_ptr<ParameterShard> shard = Shard(false, 2, /*max_staleness=*/2);
  // Four pushes all computed from version 0: staleness 0, 1, 2 are applied, 3 is not.
  for (int i = 0; i < 3; ++i) {
    auto pushed = shard->Push(1, i % 2, 0, {torch::ones({4})});
    ASSERT_TRUE(pushed.ok()) << pushed.status();
    EXPECT_TRUE(pushed->applied);
    EXPECT_EQ(pushed->staleness, i);
    EXPECT_EQ(pushed->version, i + 1);
  }
  auto stale = shard->Push(1, 1, 0, {torch::ones({4})});
  ASSERT_TRUE(stale.ok()) << stale.status();
  EXPECT_FALSE(stale->applied);
  EXPECT_EQ(stale->staleness, 3);
  EXPECT_EQ(stale->version, 3);
  EXPECT_EQ(shard->stale_pushes(), 1);
  std::vector<torch::Tensor> pulled;
  auto result = shard->Pull(1, 0, &pulled, absl::InfiniteFuture());
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result->version, 3);
  // Three pushes of gradient 1, each weighted 1/2, at learning rate 0.5.
  EXPECT_TRUE(torch::allclose(pulled[0], torch::full({4}, -0.75)));
  // A fresh push from the current version goes in.
  auto fresh = shard->Push(1, 1, 3, {torch::ones({4})});
  ASSERT_TRUE(fresh.ok());
  EXPECT_TRUE(fresh->applied);
  // One from the future is a bug in the worker.
  EXPECT_EQ(shard->Push(1, 0, 9, {torch::ones({4})}).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(ShardTest, AnotherGenerationIsFencedOff) {
  std::unique_ptr<ParameterShard> shard = Shard(true, 1);
  auto pushed = shard->Push(2, 0, 0, {torch::ones({4})});
  EXPECT_EQ(pushed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(pushed.status().message()), HasSubstr("generation 2"));
  std::vector<torch::Tensor> pulled;
  EXPECT_EQ(shard->Pull(0, 0, &pulled, absl::InfiniteFuture()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(shard->version(), 0);
}

TEST(ShardTest, BadPushesAreRefusedAndChangeNothing) {
  std::unique_ptr<ParameterShard> shard = Shard(true, 2);
  EXPECT_EQ(shard->Push(1, 2, 0, {torch::ones({4})}).status().code(),
            absl::StatusCode::kInvalidArgument);  // no rank 2
  EXPECT_EQ(shard->Push(1, 0, 0, {torch::ones({5})}).status().code(),
            absl::StatusCode::kInvalidArgument);  // wrong shape
  EXPECT_EQ(shard->Push(1, 0, 0, {torch::ones({4}, torch::kFloat64)}).status().code(),
            absl::StatusCode::kInvalidArgument);  // wrong dtype
  EXPECT_EQ(shard->Push(1, 0, 0, {}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(shard->Push(1, 0, 1, {torch::ones({4})}).status().code(),
            absl::StatusCode::kFailedPrecondition);  // not the current version
  ASSERT_TRUE(shard->Push(1, 0, 0, {torch::ones({4})}).ok());
  EXPECT_EQ(shard->Push(1, 0, 0, {torch::ones({4})}).status().code(),
            absl::StatusCode::kFailedPrecondition);  // twice
  EXPECT_EQ(shard->version(), 0);
  // A pull that the missing worker never lets through ends at its deadline.
  std::vector<torch::Tensor> pulled;
  auto late = shard->Pull(1, 1, &pulled, absl::Now() + absl::Milliseconds(50));
  EXPECT_EQ(late.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(late.status().message()), HasSubstr("version 1"));
}

// A model with fewer pieces than shards leaves some shards empty; they still keep the ranks in
// step and carry the agreement.
TEST(ShardTest, AnEmptyShardStillAgrees) {
  ShardConfig config;
  config.generation = 1;
  config.workers = 2;
  config.optimizer.set_name("adamw");
  config.optimizer.set_lr(0.1);
  auto shard = ParameterShard::Create(config, {});
  ASSERT_TRUE(shard.ok()) << shard.status();
  ASSERT_TRUE((*shard)->Push(1, 0, 0, {}, 1.0, false).ok());
  ASSERT_TRUE((*shard)->Push(1, 1, 0, {}, 3.0, true).ok());
  std::vector<torch::Tensor> pulled;
  auto result = (*shard)->Pull(1, 1, &pulled, absl::InfiniteFuture());
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(pulled.empty());
  EXPECT_DOUBLE_EQ(result->agreement.loss, 2.0);
  EXPECT_TRUE(result->agreement.stop);
  EXPECT_TRUE((*shard)->OptimizerState(1, 1).ok());
}

TEST(ShardTest, BadConfigsAreRefused) {
  ShardConfig config;
  config.workers = 0;
  config.optimizer.set_name("sgd");
  config.optimizer.set_lr(0.1);
  EXPECT_EQ(ParameterShard::Create(config, {torch::zeros({2})}).status().code(),
            absl::StatusCode::kInvalidArgument);
  config.workers = 1;
  EXPECT_EQ(ParameterShard::Create(config, {torch::zeros({2}, torch::kInt64)}).status().code(),
            absl::StatusCode::kInvalidArgument);
  config.optimizer.set_name("lion");
  EXPECT_EQ(ParameterShard::Create(config, {torch::zeros({2})}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace trainyard::trainer
