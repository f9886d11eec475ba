// One parameter-server shard without transport: synchronous aggregation equal to the optimizer
// on the whole model with the mean gradient, the agreement on loss and stop, asynchronous updates
// with bounded staleness, and fencing by generation.

#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/trainer/data/schedule.h"
#include "worker/trainer/model/model.h"
#include "worker/trainer/model/optimizer.h"
#include "worker/trainer/ps/partition.h"
#include "worker/trainer/ps/shard.h"

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

// An embedding table of 10 rows of 3 over 2 shards and 2 workers, 5 updates of AdamW (and of SGD
// with Nesterov momentum) in which the workers touch rows 1, 4 and 7 only, row 4 from both: the
// touched rows end exactly where the dense optimizer over the whole table takes them, and the
// others keep their values and get no state (lazy updates; the dense optimizer would have
// decayed them).
TEST_P(SyncShardTest, TablesUpdateTheRowsTouchedLikeTheDenseOptimizerAndLeaveTheRest) {
  const v1::OptimizerSpec spec = GetParam() ? AdamW() : Sgd();
  constexpr int kWorkers = 2, kShards = 2, kSteps = 5, kRows = 10, kDim = 3;
  torch::manual_seed(3);
  const torch::Tensor initial = torch::randn({kRows, kDim});
  std::vector<std::unique_ptr<ParameterShard>> shards;
  for (int s = 0; s < kShards; ++s) {
    ShardConfig config;
    config.generation = 1;
    config.shard = s;
    config.shards = kShards;
    config.workers = kWorkers;
    config.optimizer = spec;
    config.total_steps = kSteps;
    auto shard = ParameterShard::Create(
        config, {}, {}, {initial.slice(0, s, kRows, kShards).contiguous()}, {kRows});
    ASSERT_TRUE(shard.ok()) << shard.status();
    shards.push_back(std::move(*shard));
  }
  torch::Tensor dense = initial.clone().set_requires_grad(true);
  auto optimizer = BuildOptimizer(spec, {dense});
  ASSERT_TRUE(optimizer.ok());
  const std::vector<std::vector<int64_t>> touched = {{1, 4}, {4, 7}};  // by worker
  for (int step = 0; step < kSteps; ++step) {
    std::vector<torch::Tensor> grads;
    torch::Tensor mean = torch::zeros({kRows, kDim});
    for (int w = 0; w < kWorkers; ++w) {
      grads.push_back(torch::randn({2, kDim}));
      for (int k = 0; k < 2; ++k) mean[touched[w][k]] += grads[w][k] / kWorkers;
    }
    for (int w = kWorkers - 1; w >= 0; --w) {
      const torch::Tensor ids = torch::tensor(touched[w], torch::kInt64);
      for (int s = 0; s < kShards; ++s) {
        const torch::Tensor mine = ids.remainder(kShards).eq(s).nonzero().squeeze(1);
        ASSERT_TRUE(
            shards[s]
                ->Push(1, w, step, {}, 0, false,
                       {RowGradients{ids.index_select(0, mine), grads[w].index_select(0, mine)}})
                .ok());
      }
    }
    dense.mutable_grad() = mean;
    SetLearningRate(**optimizer, LearningRateAt(spec, step, kSteps));
    (*optimizer)->step();
  }
  const torch::Tensor all = torch::arange(kRows);
  for (int s = 0; s < kShards; ++s) {
    const torch::Tensor mine = all.slice(0, s, kRows, kShards);
    std::vector<torch::Tensor> rows;
    ASSERT_TRUE(shards[s]->PullRows(1, kSteps, {mine}, &rows, absl::InfiniteFuture()).ok());
    for (int64_t k = 0; k < mine.size(0); ++k) {
      const int64_t row = mine[k].item<int64_t>();
      const bool was_touched = row == 1 || row == 4 || row == 7;
      const torch::Tensor expected = was_touched ? dense[row].detach() : initial[row];
      EXPECT_TRUE(torch::allclose(rows[0][k], expected, 1e-6, 1e-6))
          << "row " << row << ": " << rows[0][k] << " vs " << expected;
    }
    // The state has the table's shape; untouched rows have none.
    auto state = shards[s]->OptimizerState(1, kSteps);
    ASSERT_TRUE(state.ok());
    bool found = false;
    for (const auto& [name, tensor] : *state) {
      if (name == "t0.step") {
        EXPECT_EQ(tensor.item<int64_t>(), kSteps);
        continue;
      }
      found = true;
      ASSERT_EQ(tensor.size(0), mine.size(0)) << name;
      for (int64_t k = 0; k < mine.size(0); ++k) {
        const int64_t row = mine[k].item<int64_t>();
        if (row != 1 && row != 4 && row != 7) {
          EXPECT_EQ(tensor[k].abs().sum().item<double>(), 0) << name << " row " << row;
        }
      }
    }
    EXPECT_TRUE(found) << "shard " << s;
  }
}

// Rows that are not the shard's, a wrong dtype, gradients of the wrong shape and a table that
// does not exist are refused, naming the problem.
TEST(ShardTest, BadRowsAreRefused) {
  ShardConfig config;
  config.generation = 1;
  config.shard = 1;
  config.shards = 2;
  config.workers = 1;
  config.optimizer.set_name("sgd");
  config.optimizer.set_lr(0.1);
  config.total_steps = 10;
  // Rows 1, 3, 5 of a 6-row table.
  auto shard = ParameterShard::Create(config, {}, {}, {torch::zeros({3, 2})}, {6});
  ASSERT_TRUE(shard.ok()) << shard.status();
  auto push = [&](torch::Tensor ids, torch::Tensor grads) {
    return (*shard)->Push(1, 0, 0, {}, 0, false, {RowGradients{ids, grads}}).status();
  };
  absl::Status s = push(torch::tensor({2}, torch::kInt64), torch::ones({1, 2}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("row 2 is not held by shard 1 of 2"));
  s = push(torch::tensor({7}, torch::kInt64), torch::ones({1, 2}));
  EXPECT_THAT(s.message(), HasSubstr("row 7 is not held"));
  s = push(torch::tensor({1}, torch::kInt32), torch::ones({1, 2}));
  EXPECT_THAT(s.message(), HasSubstr("1-D int64"));
  s = push(torch::tensor({1}, torch::kInt64), torch::ones({1, 3}));
  EXPECT_THAT(s.message(), HasSubstr("must be [1, 2]"));
  s = (*shard)
          ->Push(1, 0, 0, {}, 0, false,
                 {RowGradients{},
                  RowGradients{torch::tensor({1}, torch::kInt64), torch::ones({1, 2})}})
          .status();
  EXPECT_THAT(s.message(), HasSubstr("row gradients for 2 tables; the shard has 1"));
  EXPECT_EQ((*shard)->version(), 0);
  // Repeated rows are summed: lr 0.1 times 1 + 2 at row 3 (local row 1).
  ASSERT_TRUE(
      push(torch::tensor({3, 3}, torch::kInt64), torch::tensor({{1.0f, 1.0f}, {2.0f, 2.0f}})).ok());
  std::vector<torch::Tensor> rows;
  ASSERT_TRUE(
      (*shard)->PullRows(1, 1, {torch::tensor({5, 3}, torch::kInt64)}, &rows, absl::Now()).ok());
  EXPECT_TRUE(torch::allclose(rows[0], torch::tensor({{0.0f, 0.0f}, {-0.3f, -0.3f}})));
  EXPECT_EQ((*shard)
                ->PullRows(2, 1, {torch::tensor({5}, torch::kInt64)}, &rows, absl::Now())
                .status()
                .code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT((*shard)
                  ->PullRows(1, 1, {torch::tensor({4}, torch::kInt64)}, &rows, absl::Now())
                  .status()
                  .message(),
              HasSubstr("row 4 is not held"));
  // A table whose rows do not match the shard's share.
  EXPECT_EQ(ParameterShard::Create(config, {}, {}, {torch::zeros({2, 2})}, {6}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

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
