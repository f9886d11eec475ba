// What the coordinator's memory estimate makes of each strategy (the built-ins' parameter counts
// are checked against the models the trainer builds in trainer_test.cc).

#include "common/spec/memory_estimate.h"

#include <string>

#include "absl/status/statusor.h"
#include "common/spec/job_spec.h"
#include "gtest/gtest.h"

namespace trainyard {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

v1::JobSpec Parse(const std::string& yaml) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(yaml + "max_steps: 10\n");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : v1::JobSpec();
}

// 16 -> 1024 -> 4: 21,508 parameters, 86,032 bytes.
constexpr char kMlp[] = R"(name: t
model: {builtin: mlp, args: {inputs: 16, hidden: [1024], classes: 4}}
data: {synthetic: {samples: 64, features: 16, classes: 4}}
batch_size: 64
)";
constexpr int64_t kMlpBytes = (16 * 1024 + 1024 + 1024 * 4 + 4) * 4;

TEST(MemoryEstimateTest, ARankHoldsParametersGradientsAndItsOptimizersState) {
  JobMemory sgd =
      EstimateJobMemory(Parse(std::string(kMlp) + "optimizer: {name: sgd, lr: 0.1}\n"), nullptr);
  EXPECT_EQ(sgd.rank.parameters, kMlpBytes);
  EXPECT_EQ(sgd.rank.gradients, kMlpBytes);
  EXPECT_EQ(sgd.rank.optimizer, 0);
  // 64 samples: 16 inputs, 1024 twice (linear and ReLU), 4 outputs.
  EXPECT_EQ(sgd.rank.activations, 64 * (16 + 2 * 1024 + 4) * 4);
  EXPECT_EQ(sgd.rank.runtime, kTrainerRuntimeBytes);
  EXPECT_FALSE(sgd.has_shard);
  JobMemory momentum = EstimateJobMemory(
      Parse(std::string(kMlp) + "optimizer: {name: sgd, lr: 0.1, momentum: 0.9}\n"), nullptr);
  EXPECT_EQ(momentum.rank.optimizer, kMlpBytes);
  JobMemory adamw =
      EstimateJobMemory(Parse(std::string(kMlp) + "optimizer: {name: adamw, lr: 0.1}\n"), nullptr);
  EXPECT_EQ(adamw.rank.optimizer, 2 * kMlpBytes);
  EXPECT_EQ(adamw.rank.Total(), 4 * kMlpBytes + adamw.rank.activations + kTrainerRuntimeBytes);
  EXPECT_EQ(adamw.rank.Detail(),
            "parameters 84.0 KiB, gradients 84.0 KiB, adamw state 168.0 KiB, activations 517.0 "
            "KiB, runtime 80.0 MiB");
}

TEST(MemoryEstimateTest, DataParallelRanksSplitTheBatch) {
  JobMemory four = EstimateJobMemory(
      Parse(std::string(kMlp) + "strategy: data_parallel\nworkers: 4\n"), nullptr);
  EXPECT_EQ(four.rank.parameters, kMlpBytes);
  EXPECT_EQ(four.rank.activations, 16 * (16 + 2 * 1024 + 4) * 4);
}

// A parameter-server rank leaves the optimizer to the shards; a shard holds its share with the
// optimizer's state and the sum of a step's pushes.
TEST(MemoryEstimateTest, ParameterServerShardsHoldTheirShare) {
  JobMemory ps = EstimateJobMemory(
      Parse(std::string(kMlp) + "strategy: parameter_server\nworkers: 2\nparameter_servers: 2\n"
                                "optimizer: {name: adam, lr: 0.01}\n"),
      nullptr);
  EXPECT_EQ(ps.rank.parameters, kMlpBytes);
  EXPECT_EQ(ps.rank.optimizer, 0);
  ASSERT_TRUE(ps.has_shard);
  EXPECT_EQ(ps.shard.parameters, kMlpBytes / 2);
  EXPECT_EQ(ps.shard.gradients, kMlpBytes / 2);
  EXPECT_EQ(ps.shard.optimizer, kMlpBytes);
}

// With dense: allreduce the shards keep only the tables, and the ranks the rest with its
// optimizer.
TEST(MemoryEstimateTest, EmbeddingTablesStayOnTheShards) {
  JobMemory ps = EstimateJobMemory(Parse(R"(name: t
strategy: parameter_server
workers: 2
parameter_servers: {shards: 2, dense: allreduce}
model: {builtin: embedding_mlp, args: {vocab: [1000000, 1000], dim: 16, hidden: [32], classes: 2}}
data: {synthetic: {samples: 64, features: 4, classes: 2, vocab: [1000000, 1000]}}
optimizer: {name: adam, lr: 0.01}
batch_size: 64
)"),
                                   nullptr);
  const int64_t tables = (1000000 + 1000) * 16;
  const int64_t dense = (32 + 4) * 32 + 32 + 32 * 2 + 2;
  EXPECT_EQ(ps.rank.parameters, dense * 4);
  EXPECT_EQ(ps.rank.optimizer, 2 * dense * 4);
  EXPECT_EQ(ps.shard.parameters, tables / 2 * 4);
  EXPECT_EQ(ps.shard.optimizer, 2 * tables / 2 * 4);
}

// A pipeline stage holds its layers: the largest stage of the split the trainer makes.
TEST(MemoryEstimateTest, APipelineStageHoldsItsLayers) {
  const std::string transformer = R"(name: t
strategy: pipeline
workers: 2
model: {builtin: transformer, args: {vocab: [256], context: 32, layers: 4, dim: 64, heads: 4}}
data: {tokens: /data/t-*.safetensors}
batch_size: 16
optimizer: {name: sgd, lr: 0.1}
)";
  const int64_t d = 64, h = 256;
  const int64_t embeddings = (256 + 32) * d;
  const int64_t block =
      2 * d + (d * 3 * d + 3 * d) + (d * d + d) + 2 * d + (d * h + h) + (h * d + d);
  const int64_t head = 2 * d;
  JobMemory counts =
      EstimateJobMemory(Parse(transformer + "pipeline: {stages: 2, partition: [2, 4]}\n"), nullptr);
  // The last stage keeps its own copy of the tied token embedding.
  const int64_t tied_copy = 256 * d;
  EXPECT_EQ(counts.rank.parameters, (3 * block + head + tied_copy) * 4);
  // Balanced: the embeddings and two blocks, then two blocks and the head (118,400 against
  // 116,480 parameters; any other cut makes one stage larger).
  JobMemory balanced = EstimateJobMemory(Parse(transformer + "pipeline: {stages: 2}\n"), nullptr);
  EXPECT_EQ(balanced.rank.parameters, (embeddings + 2 * block) * 4);
  EXPECT_GT(embeddings + 2 * block, 2 * block + head + tied_copy);
  // Uniform: three layers each, here the same split.
  JobMemory uniform = EstimateJobMemory(
      Parse(transformer + "pipeline: {stages: 2, partition: uniform}\n"), nullptr);
  EXPECT_EQ(uniform.rank.parameters, (embeddings + 2 * block) * 4);
  JobMemory single = EstimateJobMemory(
      Parse(std::string(transformer)
                .replace(transformer.find("strategy: pipeline\nworkers: 2\n"), 30, "")),
      nullptr);
  EXPECT_EQ(single.rank.parameters, (embeddings + 4 * block + head) * 4);
  // 1F1B keeps at most a micro-batch per stage in flight, GPipe all of them.
  JobMemory gpipe = EstimateJobMemory(
      Parse(transformer + "pipeline: {stages: 2, microbatches: 8, schedule: gpipe}\n"), nullptr);
  JobMemory one_f_one_b = EstimateJobMemory(
      Parse(transformer + "pipeline: {stages: 2, microbatches: 8, schedule: 1f1b}\n"), nullptr);
  EXPECT_EQ(gpipe.rank.activations, 4 * one_f_one_b.rank.activations);
  // Each stage's own estimate, for memory per stage: the rank's is the largest of them.
  ASSERT_EQ(counts.stages.size(), 2u);
  EXPECT_EQ(counts.stages[0].parameters, (embeddings + block) * 4);
  EXPECT_EQ(counts.stages[1].parameters, (3 * block + head + tied_copy) * 4);
  EXPECT_EQ(counts.stages[1].Total(), counts.rank.Total());
  EXPECT_LT(counts.stages[0].Total(), counts.stages[1].Total());
  EXPECT_TRUE(single.stages.empty());
}

// A TorchScript model counts the tensors of its archive; unread, the estimate says it is a lower
// bound.
TEST(MemoryEstimateTest, TorchScriptCountsItsTensorsOrIsALowerBound) {
  const std::string yaml = R"(name: t
model: {torchscript: /models/m.pt}
data: {synthetic: {samples: 64, features: 16, classes: 4}}
batch_size: 64
optimizer: {name: adamw, lr: 0.01}
)";
  JobMemory unread = EstimateJobMemory(Parse(yaml), nullptr);
  EXPECT_TRUE(unread.rank.lower_bound);
  EXPECT_EQ(unread.rank.parameters, 0);
  v1::ModelNeeds needs;
  needs.set_model_tensor_bytes(320 * kMiB);
  JobMemory read = EstimateJobMemory(Parse(yaml), &needs);
  EXPECT_EQ(read.rank.parameters, 320 * kMiB);
  EXPECT_EQ(read.rank.optimizer, 640 * kMiB);
  EXPECT_TRUE(read.rank.lower_bound);  // its activations are unknown
  EXPECT_EQ(DescribeEstimate(read.rank.ToProto()).substr(0, 17), "at least 1.3 GiB ");
}

// A model in TorchScript files: each file a layer of the pipeline's partition, weighed by its
// archive's tensors; a file unread leaves the stages even shares of what is known.
TEST(MemoryEstimateTest, AModelInFilesSplitsByItsFilesTensors) {
  const std::string yaml = R"(name: t
strategy: pipeline
workers: 2
model: {stages: [/models/a.pt, /models/b.pt, /models/c.pt]}
data: {synthetic: {samples: 64, features: 16, classes: 4}}
batch_size: 64
optimizer: {name: sgd, lr: 0.01}
)";
  v1::ModelNeeds needs;
  needs.set_model_tensor_bytes(700 * kMiB);
  for (int64_t mib : {100, 400, 200}) needs.add_stage_tensor_bytes(mib * kMiB);
  // Balanced: [a, b] and [c] would hold 500 MiB; [a] and [b, c] 600: the first is chosen.
  JobMemory balanced = EstimateJobMemory(Parse(yaml + "pipeline: {stages: 2}\n"), &needs);
  ASSERT_EQ(balanced.stages.size(), 2u);
  EXPECT_EQ(balanced.stages[0].parameters, 500 * kMiB);
  EXPECT_EQ(balanced.stages[1].parameters, 200 * kMiB);
  EXPECT_TRUE(balanced.rank.lower_bound);
  JobMemory counts =
      EstimateJobMemory(Parse(yaml + "pipeline: {stages: 2, partition: [1, 2]}\n"), &needs);
  EXPECT_EQ(counts.stages[0].parameters, 100 * kMiB);
  EXPECT_EQ(counts.stages[1].parameters, 600 * kMiB);
  needs.clear_stage_tensor_bytes();
  JobMemory even = EstimateJobMemory(Parse(yaml + "pipeline: {stages: 2}\n"), &needs);
  EXPECT_EQ(even.stages[0].parameters, 350 * kMiB);
}

}  // namespace
}  // namespace trainyard
