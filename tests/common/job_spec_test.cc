#include "common/spec/job_spec.h"

#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainyard {
namespace {

using ::testing::HasSubstr;
using trainyard::v1::JobSpec;

// A minimal valid spec as ordered top-level entries; tests replace, add or remove entries.
using Entries = std::vector<std::pair<std::string, std::string>>;
constexpr char kRemove[] = "<remove>";
// A small language model and its token shards, for the pipeline's specs.
constexpr char kLanguageModel[] =
    "{builtin: transformer, args: {vocab: 256, context: 8, layers: 2, dim: 8, heads: 2}}";
constexpr char kTokens[] = "{tokens: /d/t-*.safetensors}";

std::string Spec(const Entries& overrides) {
  Entries entries = {
      {"name", "t"},
      {"model", "{builtin: mlp, args: {inputs: 4, hidden: [8], classes: 2}}"},
      {"data", "{synthetic: {samples: 64, features: 4, classes: 2}}"},
      {"max_steps", "5"},
  };
  for (const auto& [key, value] : overrides) {
    bool replaced = false;
    for (auto& entry : entries) {
      if (entry.first == key) {
        entry.second = value;
        replaced = true;
      }
    }
    if (!replaced) entries.emplace_back(key, value);
  }
  std::string yaml;
  for (const auto& [key, value] : entries) {
    if (value != kRemove) absl::StrAppend(&yaml, key, ": ", value, "\n");
  }
  return yaml;
}

struct BadSpec {
  Entries overrides;
  std::string message;
};

class BadSpecTest : public ::testing::TestWithParam<BadSpec> {};

TEST_P(BadSpecTest, RefusedWithExactMessage) {
  const std::string yaml = Spec(GetParam().overrides);
  absl::StatusOr<JobSpec> spec = ParseJobSpecYaml(yaml);
  ASSERT_FALSE(spec.ok()) << yaml;
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(spec.status().message(), GetParam().message) << yaml;
}

const std::string kModel = "{builtin: mlp, args: {inputs: 4, classes: 2}}";

INSTANTIATE_TEST_SUITE_P(
    Table, BadSpecTest,
    ::testing::Values(
        // Types and keys.
        BadSpec{{{"batch_size", "abc"}}, "batch_size: expected an integer, got 'abc'"},
        BadSpec{{{"epochs", "2.5"}}, "epochs: expected an integer, got '2.5'"},
        BadSpec{{{"name", "{a: 1}"}}, "name: expected a string, got a mapping"},
        BadSpec{{{"optimizer", "{lr: fast}"}}, "optimizer.lr: expected a number, got 'fast'"},
        BadSpec{{{"data", "{synthetic: {samples: 8, features: 2, classes: 2}, shuffle: maybe}"}},
                "data.shuffle: expected true or false, got 'maybe'"},
        BadSpec{{{"model", "{builtin: mlp, args: {inputs: 4, hidden: [64, x], classes: 2}}"}},
                "model.args.hidden[1]: expected an integer, got 'x'"},
        BadSpec{{{"model", "mlp"}}, "model: expected a mapping, got 'mlp'"},
        BadSpec{{{"data", "[1, 2]"}}, "data: expected a mapping, got a list"},
        BadSpec{{{"priority", "99999999999"}}, "priority: 99999999999 is out of range"},
        BadSpec{{{"model", "{builtin: mlp, args: {inputs: 4, hiden: [3], classes: 2}}"}},
                "model.args.hiden: unknown key (did you mean 'hidden'?)"},
        BadSpec{{{"optimzer", "{lr: 0.1}"}}, "optimzer: unknown key (did you mean 'optimizer'?)"},
        BadSpec{{{"colour", "red"}}, "colour: unknown key"},
        BadSpec{{{"checkpoint", "{keep: 2}"}}, "checkpoint.keep: unknown key"},
        BadSpec{{{"workers", "{min: 1, maximum: 2}"}}, "workers.maximum: unknown key"},
        BadSpec{{{"workers", "[1, 2]"}}, "workers: expected a number or {min, max}, got a list"},
        BadSpec{{{"optimizer", "{betas: [0.9]}"}},
                "optimizer.betas: expected a list of 2 numbers, got a list"},
        BadSpec{{{"max_runtime", "soon"}},
                "max_runtime: invalid duration 'soon', expected for example 90s, 15m, 12h, 2d or "
                "1h30m"},
        // Name.
        BadSpec{{{"name", kRemove}}, "name: required"},
        BadSpec{{{"name", "Bad_Name"}}, "name: must match [a-z][a-z0-9-]{0,62}"},
        BadSpec{{{"name", "9lives"}}, "name: must match [a-z][a-z0-9-]{0,62}"},
        BadSpec{{{"name", std::string(64, 'a')}}, "name: must match [a-z][a-z0-9-]{0,62}"},
        // Strategy and workers.
        BadSpec{{{"strategy", "ring"}},
                "strategy: unknown strategy 'ring', expected single, data_parallel, "
                "parameter_server or pipeline"},
        // Memory format.
        BadSpec{{{"model", "{builtin: mlp, args: {inputs: 4, classes: 2}, memory_format: nhwc}"}},
                "model.memory_format: unknown memory format 'nhwc', expected auto, contiguous or "
                "channels_last"},
        BadSpec{{{"model",
                  "{builtin: mlp, args: {inputs: 4, classes: 2}, memory_format: channels_last}"}},
                "model.memory_format: channels_last is for convolutional models (cnn, or a "
                "TorchScript model with 4-D weights)"},
        // Precision.
        BadSpec{{{"precision", "fp8"}},
                "precision: unknown precision 'fp8', expected fp32, tf32, bf16 or fp16"},
        BadSpec{{{"precision", "fp16"}},
                "precision: fp16 needs GPUs (resources.gpus_per_worker > 0); on CPUs use bf16"},
        BadSpec{{{"precision", "fp16"},
                 {"resources", "{gpus_per_worker: 1}"},
                 {"strategy", "parameter_server"}},
                "precision: fp16 (with loss scaling) is not supported with parameter_server; use "
                "bf16"},
        // A whole-step CUDA graph: on GPUs, one rank, no host decision, one shape.
        BadSpec{{{"cuda_graph", "true"}}, "cuda_graph: needs GPUs (resources.gpus_per_worker > 0)"},
        BadSpec{{{"cuda_graph", "maybe"}}, "cuda_graph: expected true or false, got 'maybe'"},
        BadSpec{{{"cuda_graph", "true"},
                 {"resources", "{gpus_per_worker: 1}"},
                 {"strategy", "data_parallel"},
                 {"workers", "2"}},
                "cuda_graph: only with strategy single: the collectives of data_parallel and "
                "pipeline, and the calls of parameter_server, are issued and waited for by the "
                "host every step"},
        BadSpec{
            {{"cuda_graph", "true"}, {"resources", "{gpus_per_worker: 1}"}, {"precision", "fp16"}},
            "cuda_graph: not with precision fp16: its loss scale decides on the host, every step, "
            "whether the update applies; use bf16"},
        BadSpec{{{"cuda_graph", "true"},
                 {"resources", "{gpus_per_worker: 1}"},
                 {"batch_size", "10"},
                 {"accumulate_steps", "4"}},
                "cuda_graph: accumulate_steps 4 must divide batch_size 10: a graph takes "
                "micro-batches of one size"},
        BadSpec{{{"workers", "0"}}, "workers: must be >= 1"},
        BadSpec{{{"workers", "{min: 0, max: 2}"}}, "workers.min: must be >= 1"},
        BadSpec{{{"strategy", "data_parallel"}, {"workers", "{min: 3, max: 2}"}},
                "workers: min must be <= max"},
        BadSpec{{{"workers", "4"}}, "workers: strategy single runs exactly 1 worker"},
        BadSpec{{{"strategy", "data_parallel"}, {"workers", "3"}, {"batch_size", "100"}},
                "batch_size: 100 does not divide across 3 workers"},
        BadSpec{{{"parameter_servers", "2"}},
                "parameter_servers: only with strategy parameter_server"},
        BadSpec{{{"strategy", "data_parallel"}, {"parameter_servers", "{shards: 2}"}},
                "parameter_servers: only with strategy parameter_server"},
        BadSpec{{{"strategy", "parameter_server"}, {"parameter_servers", "0"}},
                "parameter_servers: must be >= 1"},
        BadSpec{{{"strategy", "parameter_server"}, {"parameter_servers", "[2]"}},
                "parameter_servers: expected a number or {shards, mode, max_staleness, dense, "
                "slots, memory}, got a list"},
        BadSpec{{{"strategy", "parameter_server"}, {"parameter_servers", "{shards: 0}"}},
                "parameter_servers.shards: must be >= 1"},
        BadSpec{{{"strategy", "parameter_server"}, {"parameter_servers", "{shards: 300}"}},
                "parameter_servers.shards: must be between 1 and 256"},
        BadSpec{{{"strategy", "parameter_server"}, {"parameter_servers", "{mode: eventual}"}},
                "parameter_servers.mode: must be sync or async, got 'eventual'"},
        BadSpec{{{"strategy", "parameter_server"},
                 {"parameter_servers", "{shards: 2, max_staleness: 4}"}},
                "parameter_servers.max_staleness: only with mode async"},
        BadSpec{{{"strategy", "parameter_server"},
                 {"parameter_servers", "{mode: async, max_staleness: 0}"}},
                "parameter_servers.max_staleness: must be >= 1 (mode sync keeps workers in lock "
                "step)"},
        BadSpec{{{"strategy", "parameter_server"}, {"parameter_servers", "{dense: gossip}"}},
                "parameter_servers.dense: must be shards or allreduce, got 'gossip'"},
        BadSpec{{{"strategy", "parameter_server"}, {"parameter_servers", "{dense: allreduce}"}},
                "parameter_servers.dense: allreduce keeps only embedding tables on the shards, "
                "and only model embedding_mlp has them; use strategy: data_parallel"},
        BadSpec{{{"strategy", "parameter_server"}, {"parameter_servers", "{slots: 0}"}},
                "parameter_servers.slots: must be >= 1"},
        BadSpec{{{"strategy", "parameter_server"}, {"parameter_servers", "{shard: 2}"}},
                "parameter_servers.shard: unknown key (did you mean 'shards'?)"},
        BadSpec{{{"strategy", "parameter_server"}, {"workers", "3"}, {"batch_size", "100"}},
                "batch_size: 100 does not divide across 3 workers"},
        BadSpec{{{"resources", "{gpus_per_worker: -1}"}},
                "resources.gpus_per_worker: must be >= 0"},
        BadSpec{{{"resources", "{cpus: 0}"}}, "resources.cpus: must be > 0"},
        BadSpec{{{"resources", "{cpus: 2000}"}}, "resources.cpus: must be > 0 and <= 1024"},
        BadSpec{{{"resources", "{memory: lots}"}},
                "resources.memory: 'lots' is not a size (256MB, 64MiB, 4Gi)"},
        BadSpec{{{"resources", "{memory: 0}"}},
                "resources.memory: '0' is not a size (256MB, 64MiB, 4Gi)"},
        BadSpec{{{"resources", "{memory: 64MiB}"}},
                "resources.memory: must be at least 128.0 MiB (a trainer needs about that to "
                "start), got 64.0 MiB"},
        BadSpec{{{"resources", "{memroy: 1G}"}},
                "resources.memroy: unknown key (did you mean 'memory'?)"},
        // Model.
        BadSpec{{{"model", "{args: {inputs: 4, classes: 2}}"}},
                "model: set builtin, torchscript or stages"},
        BadSpec{{{"model", "{builtin: mlp, torchscript: /m.pt}"}},
                "model: set only one of builtin, torchscript or stages"},
        BadSpec{{{"model", "{torchscript: /m.pt, stages: [/a.pt]}"}},
                "model: set only one of builtin, torchscript or stages"},
        BadSpec{{{"model", "{stages: /a.pt}"}},
                "model.stages: a list of TorchScript files, one per stage, got '/a.pt'"},
        BadSpec{{{"model", "{stages: [/a.pt, models/b.pt]}"}},
                "model.stages[1]: 'models/b.pt' is not an absolute path or URI (a relative path "
                "means nothing on the workers)"},
        BadSpec{{{"model", "{stages: []}"}}, "model: set builtin, torchscript or stages"},
        BadSpec{{{"model", "{builtin: resnet}"}},
                "model.builtin: unknown model 'resnet', expected mlp, cnn, embedding_mlp or "
                "transformer"},
        BadSpec{{{"model", "{builtin: mlp, args: {classes: 2}}"}},
                "model.args.inputs: must be > 0 for mlp"},
        BadSpec{{{"model", "{builtin: mlp, args: {inputs: 3}}"}},
                "model.args.classes: must be > 0 for mlp"},
        BadSpec{{{"model", "{builtin: cnn, args: {channels: 1, width: 8, classes: 2}}"}},
                "model.args.height: must be > 0 for cnn"},
        BadSpec{{{"model", "{builtin: mlp, args: {inputs: 4, hidden: [64, 0], classes: 2}}"}},
                "model.args.hidden[1]: must be > 0"},
        BadSpec{{{"model", "{builtin: mlp, args: {inputs: 4, classes: 2, dropout: 1.5}}"}},
                "model.args.dropout: must be in [0, 1)"},
        // The transformer and its token data.
        BadSpec{{{"model", "{builtin: mlp, args: {inputs: 4, classes: 2, layers: 2}}"}},
                "model.args.layers: only for model transformer"},
        BadSpec{
            {{"model", "{builtin: transformer, args: {context: 8, layers: 1, dim: 8, heads: 2}}"},
             {"data", "{tokens: /d/t-*.safetensors}"}},
            "model.args.vocab: transformer needs one number: the tokens it knows"},
        BadSpec{{{"model",
                  "{builtin: transformer, args: {vocab: 256, context: 8, layers: 1, dim: 10, "
                  "heads: 4}}"},
                 {"data", "{tokens: /d/t-*.safetensors}"}},
                "model.args.heads: 4 heads do not divide dim 10"},
        BadSpec{{{"model",
                  "{builtin: transformer, args: {vocab: 256, context: 0, layers: 1, dim: 8, "
                  "heads: 2}}"},
                 {"data", "{tokens: /d/t-*.safetensors}"}},
                "model.args.context: must be in [1, 65536] for transformer"},
        BadSpec{{{"model",
                  "{builtin: transformer, args: {vocab: 256, context: 8, layers: 1, dim: 8, "
                  "heads: 2, classes: 3}}"},
                 {"data", "{tokens: /d/t-*.safetensors}"}},
                "model.args: transformer takes vocab, context, layers, dim, heads, mlp_ratio, "
                "dropout and tie_embeddings"},
        BadSpec{{{"model",
                  "{builtin: transformer, args: {vocab: 256, context: 8, layers: 1, dim: 8, "
                  "heads: 2}}"}},
                "data.tokens: model transformer trains on token shards (data.tokens)"},
        BadSpec{{{"data", "{tokens: /d/t-*.safetensors}"}},
                "data.tokens: token shards train model transformer (builtin)"},
        BadSpec{{{"data", "{tokens: t-*.safetensors}"}},
                "data.tokens: 't-*.safetensors' is not an absolute path or URI (a relative path "
                "means nothing on the workers)"},
        BadSpec{{{"data", "{tokens: /d/t-*.safetensors, train: /d/x-*.safetensors}"}},
                "data: set only one of train, tokens or synthetic"},
        BadSpec{{{"model",
                  "{builtin: transformer, args: {vocab: 256, context: 8, layers: 1, dim: 8, "
                  "heads: 2}}"},
                 {"data", "{tokens: /d/t-*.safetensors}"},
                 {"loss", "mse"}},
                "loss: a language model on data.tokens trains with cross_entropy"},
        // Pipelines.
        BadSpec{
            {{"strategy", "pipeline"},
             {"model", kLanguageModel},
             {"data", kTokens},
             {"workers", "3"},
             {"pipeline", "{stages: 2}"}},
            "workers: 3 workers are not a multiple of the 2 pipeline.stages (stages x replicas)"},
        BadSpec{{{"strategy", "pipeline"},
                 {"model", kLanguageModel},
                 {"data", kTokens},
                 {"workers", "{min: 2, max: 4}"},
                 {"pipeline", "{stages: 2}"}},
                "workers: a pipeline runs a fixed number of workers: stages x replicas"},
        BadSpec{{{"strategy", "pipeline"},
                 {"model", kLanguageModel},
                 {"data", kTokens},
                 {"workers", "5"},
                 {"batch_size", "10"},
                 {"pipeline", "{stages: 5}"}},
                "pipeline.stages: 5 stages exceed the model's 4 layers (model.args.layers + 2)"},
        BadSpec{{{"strategy", "pipeline"},
                 {"model", kLanguageModel},
                 {"data", kTokens},
                 {"workers", "2"},
                 {"batch_size", "8"},
                 {"pipeline", "{stages: 2, microbatches: 3}"}},
                "pipeline.microbatches: 3 micro-batches do not divide a replica's batch of 8 "
                "samples (batch_size / replicas)"},
        BadSpec{{{"strategy", "pipeline"},
                 {"model", kLanguageModel},
                 {"data", kTokens},
                 {"workers", "4"},
                 {"batch_size", "9"},
                 {"pipeline", "{stages: 2}"}},
                "batch_size: 9 does not divide across 2 replicas (workers / pipeline.stages)"},
        BadSpec{{{"strategy", "pipeline"},
                 {"model", kLanguageModel},
                 {"data", kTokens},
                 {"workers", "2"},
                 {"pipeline", "{stages: 2, memory: [1GiB]}"}},
                "pipeline.memory: 1 sizes for 2 stages"},
        BadSpec{{{"strategy", "pipeline"},
                 {"model", kLanguageModel},
                 {"data", kTokens},
                 {"workers", "2"},
                 {"resources", "{memory: 1GiB}"},
                 {"pipeline", "{stages: 2, memory: [1GiB, 1GiB]}"}},
                "pipeline.memory: give memory per stage here or per rank in resources.memory, not "
                "both"},
        BadSpec{{{"strategy", "pipeline"},
                 {"model", kLanguageModel},
                 {"data", kTokens},
                 {"workers", "2"},
                 {"pipeline", "{stages: 2, memory: [1GiB, 64MiB]}"}},
                "pipeline.memory[1]: must be at least 128.0 MiB (a trainer needs about that to "
                "start), got 64.0 MiB"},
        BadSpec{{{"strategy", "pipeline"},
                 {"model", kLanguageModel},
                 {"data", kTokens},
                 {"workers", "2"},
                 {"pipeline", "{stages: 2, memory: 1GiB}"}},
                "pipeline.memory: a list: one size per stage, e.g. [6GiB, 4GiB]"},
        BadSpec{{{"strategy", "pipeline"},
                 {"model", kLanguageModel},
                 {"data", kTokens},
                 {"workers", "2"},
                 {"pipeline", "{stages: 2, schedule: zigzag}"}},
                "pipeline.schedule: unknown schedule 'zigzag', expected gpipe or 1f1b"},
        BadSpec{{{"strategy", "pipeline"},
                 {"model", kLanguageModel},
                 {"data", kTokens},
                 {"workers", "2"},
                 {"pipeline", "{stages: 2, partition: zigzag}"}},
                "pipeline.partition: unknown partition 'zigzag', expected balanced, uniform or a "
                "list of layer counts"},
        BadSpec{{{"strategy", "pipeline"},
                 {"model", kLanguageModel},
                 {"data", kTokens},
                 {"workers", "2"},
                 {"pipeline", "{stages: 2, partition: [1, 2]}"}},
                "pipeline.partition: layer counts add up to 3, the model has 4 layers "
                "(model.args.layers + 2)"},
        BadSpec{{{"strategy", "pipeline"},
                 {"model", kLanguageModel},
                 {"data", kTokens},
                 {"workers", "2"},
                 {"pipeline", "{stages: 2, partition: [4]}"}},
                "pipeline.partition: 1 layer counts for 2 stages"},
        BadSpec{{{"strategy", "pipeline"},
                 {"model", kLanguageModel},
                 {"data", kTokens},
                 {"workers", "2"},
                 {"pipeline", "{stages: 2, partition: [4, 0]}"}},
                "pipeline.partition: every stage needs >= 1 layer"},
        BadSpec{{{"strategy", "pipeline"},
                 {"model", kLanguageModel},
                 {"data", kTokens},
                 {"workers", "2"},
                 {"pipeline", "{stage: 2}"}},
                "pipeline.stage: unknown key (did you mean 'stages'?)"},
        BadSpec{{{"strategy", "pipeline"},
                 {"model", kLanguageModel},
                 {"data", kTokens},
                 {"workers", "2"},
                 {"pipeline", "{stages: 0}"}},
                "pipeline.stages: must be >= 1"},
        BadSpec{{{"strategy", "pipeline"},
                 {"model", kLanguageModel},
                 {"data", kTokens},
                 {"workers", "2"},
                 {"pipeline", "{stages: 2}"},
                 {"precision", "bf16"}},
                "precision: pipeline trains in fp32 (or tf32) only"},
        BadSpec{
            {{"strategy", "pipeline"},
             {"model", kLanguageModel},
             {"data", kTokens},
             {"workers", "2"},
             {"pipeline", "{stages: 2}"},
             {"accumulate_steps", "2"}},
            "accumulate_steps: a pipeline accumulates over its pipeline.microbatches; leave it 1"},
        BadSpec{{{"strategy", "pipeline"}, {"workers", "2"}, {"pipeline", "{stages: 2}"}},
                "strategy: pipeline splits the layers of model builtin transformer, of a "
                "TorchScript torch.nn.Sequential (model.torchscript) or a model in TorchScript "
                "files (model.stages); other models train with data_parallel"},
        BadSpec{{{"strategy", "pipeline"},
                 {"model", "{stages: [/m/a.pt, /m/b.pt]}"},
                 {"workers", "3"},
                 {"batch_size", "9"},
                 {"pipeline", "{stages: 3}"}},
                "pipeline.stages: 3 stages exceed the model's 2 files (model.stages)"},
        BadSpec{{{"strategy", "pipeline"},
                 {"model", "{stages: [/m/a.pt, /m/b.pt, /m/c.pt]}"},
                 {"workers", "2"},
                 {"pipeline", "{partition: [1, 1]}"}},
                "pipeline.partition: layer counts add up to 2, the model has 3 files "
                "(model.stages)"},
        BadSpec{{{"strategy", "pipeline"},
                 {"model", "{torchscript: /m/net.pt}"},
                 {"workers", "2"},
                 {"pipeline", "{stages: 2, partition: [2, 0]}"}},
                "pipeline.partition: every stage needs >= 1 layer"},
        BadSpec{{{"strategy", "data_parallel"}, {"workers", "2"}, {"pipeline", "{stages: 2}"}},
                "pipeline: only with strategy pipeline"},
        // Data.
        BadSpec{{{"data", kRemove}}, "data: set train, tokens or synthetic"},
        BadSpec{{{"data", "{features: x}"}}, "data: set train, tokens or synthetic"},
        BadSpec{{{"data", "{train: /d/*.safetensors, synthetic: {samples: 1}}"}},
                "data: set only one of train, tokens or synthetic"},
        BadSpec{{{"data", "{synthetic: {samples: 0, features: 4, classes: 2}}"}},
                "data.synthetic.samples: must be > 0"},
        BadSpec{{{"data", "{synthetic: {samples: 10, classes: 2}}"}},
                "data.synthetic.features: must be > 0"},
        BadSpec{{{"data", "{train: /d/x.safetensors, validation_split: 1}"}},
                "data.validation_split: must be in [0, 1)"},
        BadSpec{{{"data", "{train: /d/x.safetensors, validation_split: -0.1}"}},
                "data.validation_split: must be in [0, 1)"},
        BadSpec{{{"data", "{train: /d/x.safetensors, shuffle_window: -1}"}},
                "data.shuffle_window: must be >= 0"},
        BadSpec{{{"data", "{synthetic: {samples: 9, features: 2, classes: 2}, shuffle_window: 4}"}},
                "data.shuffle_window: windows of shards need data.train or data.tokens"},
        BadSpec{{{"data", "{train: /d/x.safetensors, prefetch_shards: 65}"}},
                "data.prefetch_shards: must be in [0, 64]"},
        BadSpec{{{"data", "{train: /d/x.safetensors, fetch_threads: -1}"}},
                "data.fetch_threads: must be in [0, 64]"},
        BadSpec{{{"data", "{train: /d/x.safetensors, feature_scale: 1e40}"}},
                "data.feature_scale: must be a finite number"},
        BadSpec{{{"data", "{train: /d/x.safetensors, validation: {every_steps: 5}}"}},
                "data.validation: needs data.validation_split > 0"},
        BadSpec{{{"data",
                  "{train: /d/x.safetensors, validation_split: 0.1, "
                  "validation: {max_samples: -2}}"}},
                "data.validation.max_samples: must be >= 0"},
        BadSpec{{{"data",
                  "{train: /d/x.safetensors, validation_split: 0.1, "
                  "validation: {every: 5}}"}},
                "data.validation.every: unknown key"},
        // Batch, steps.
        BadSpec{{{"batch_size", "0"}}, "batch_size: must be > 0"},
        BadSpec{{{"batch_size", "-8"}}, "batch_size: must be > 0"},
        BadSpec{{{"max_steps", "-1"}}, "max_steps: must be >= 0"},
        BadSpec{{{"max_steps", kRemove}}, "max_steps: set max_steps or epochs"},
        BadSpec{{{"max_steps", "0"}, {"epochs", "0"}}, "max_steps: set max_steps or epochs"},
        BadSpec{{{"epochs", "-2"}}, "epochs: must be >= 0"},
        BadSpec{{{"log_every_steps", "0"}}, "log_every_steps: must be > 0"},
        // Optimizer.
        BadSpec{{{"optimizer", "{lr: 0}"}}, "optimizer.lr: must be > 0"},
        BadSpec{{{"optimizer", "{lr: -1e-3}"}}, "optimizer.lr: must be > 0"},
        BadSpec{{{"optimizer", "{name: rmsprop}"}},
                "optimizer.name: unknown optimizer 'rmsprop', expected sgd, adam or adamw"},
        BadSpec{{{"optimizer", "{momentum: -0.5}"}}, "optimizer.momentum: must be >= 0"},
        BadSpec{{{"optimizer", "{nesterov: true}"}},
                "optimizer.nesterov: needs optimizer sgd with momentum > 0"},
        BadSpec{{{"optimizer", "{name: adam, weight_decay: -1}"}},
                "optimizer.weight_decay: must be >= 0"},
        BadSpec{{{"optimizer", "{name: adam, betas: [0.9, 1.0]}"}},
                "optimizer.betas[1]: must be in [0, 1)"},
        BadSpec{{{"optimizer", "{name: adam, eps: 0}"}}, "optimizer.eps: must be > 0"},
        BadSpec{{{"optimizer", "{schedule: linear}"}},
                "optimizer.schedule.name: unknown schedule 'linear', expected constant or cosine"},
        BadSpec{{{"optimizer", "{lr: 0.1, schedule: {name: cosine, min_lr: 0.5}}"}},
                "optimizer.schedule.min_lr: must be <= optimizer.lr"},
        BadSpec{{{"optimizer", "{schedule: {name: cosine, warmup_steps: -3}}"}},
                "optimizer.schedule.warmup_steps: must be >= 0"},
        BadSpec{{{"loss", "hinge"}}, "loss: unknown loss 'hinge', expected cross_entropy or mse"},
        // Checkpoint, restart, runtime.
        BadSpec{{{"checkpoint", "{keep_last: 0}"}}, "checkpoint.keep_last: must be >= 1"},
        BadSpec{{{"checkpoint", "{every_steps: -5}"}}, "checkpoint.every_steps: must be >= 0"},
        BadSpec{{{"checkpoint", "{uri: relative/dir}"}},
                "checkpoint.uri: 'relative/dir' is not a URI (scheme://...) or an absolute path"},
        BadSpec{{{"restart", "{max_failures: -1}"}}, "restart.max_failures: must be >= 0"},
        BadSpec{{{"restart", "{max_preemptions: -1}"}}, "restart.max_preemptions: must be >= 0"},
        BadSpec{{{"max_runtime", "-5"}}, "max_runtime: must be >= 0"},
        // Data-parallel knobs.
        BadSpec{{{"collective_timeout", "soon"}},
                "collective_timeout: invalid duration 'soon', expected for example 90s, 15m, 12h, "
                "2d or 1h30m"},
        BadSpec{{{"collective_timeout", "-1"}}, "collective_timeout: must be at least 1s"},
        BadSpec{{{"accumulate_steps", "0"}}, "accumulate_steps: must be > 0"},
        BadSpec{{{"strategy", "data_parallel"},
                 {"workers", "4"},
                 {"batch_size", "8"},
                 {"accumulate_steps", "3"}},
                "accumulate_steps: 3 micro-batches do not fit in a rank's 2 samples"},
        BadSpec{{{"bucket_size_mb", "0"}}, "bucket_size_mb: must be > 0"},
        // embedding_mlp and categorical ids.
        BadSpec{{{"model", "{builtin: mlp, args: {inputs: 4, classes: 2, vocab: [10]}}"}},
                "model.args.vocab: only for models embedding_mlp and transformer"},
        BadSpec{{{"model", "{builtin: embedding_mlp, args: {dim: 4, classes: 2}}"}},
                "model.args.vocab: embedding_mlp needs the rows of each table, one per "
                "categorical field"},
        BadSpec{{{"model", "{builtin: embedding_mlp, args: {vocab: [10, 0], dim: 4, classes: 2}}"}},
                "model.args.vocab[1]: must be in [1, 4294967296]"},
        BadSpec{{{"model", "{builtin: embedding_mlp, args: {vocab: [10], classes: 2}}"}},
                "model.args.dim: must be > 0 for embedding_mlp"},
        BadSpec{{{"model", "{builtin: embedding_mlp, args: {vocab: [10], dim: 4, classes: 2}}"},
                 {"data", "{synthetic: {samples: 64, features: 4, classes: 2, vocab: [10, 5]}}"}},
                "data.synthetic.vocab: has 2 fields; model.args.vocab 1"},
        BadSpec{{{"model", "{builtin: embedding_mlp, args: {vocab: [10], dim: 4, classes: 2}}"},
                 {"data", "{synthetic: {samples: 64, features: 4, classes: 2, vocab: [11]}}"}},
                "data.synthetic.vocab[0]: 11 ids do not fit the 10 rows of model.args.vocab[0]"},
        BadSpec{{{"model", "{builtin: embedding_mlp, args: {vocab: [10], dim: 4, classes: 2}}"},
                 {"data", "{train: /d/*.safetensors}"}},
                "data.categorical: embedding_mlp needs the name of the tensor of categorical ids"},
        BadSpec{{{"data", "{train: /d/*.safetensors, categorical: ids}"}},
                "data.categorical: only for model embedding_mlp"},
        BadSpec{{{"data", "{synthetic: {samples: 64, features: 4, classes: 2, vocab: [4]}}"}},
                "data.synthetic.vocab: only for model embedding_mlp"},
        // Distillation.
        BadSpec{{{"distill", "/m/teacher.pt"}}, "distill: expected a mapping, got '/m/teacher.pt'"},
        BadSpec{{{"distill", "{teacher: /t.pt, temperature: 2, alpha: 0.5, beta: 1}"}},
                "distill.beta: unknown key"},
        BadSpec{{{"distill", "{teacher: /t.pt, temprature: 2, alpha: 0.5}"}},
                "distill.temprature: unknown key (did you mean 'temperature'?)"},
        BadSpec{{{"distill", "{temperature: 2, alpha: 0.5}"}}, "distill.teacher: required"},
        BadSpec{{{"distill", "{teacher: /t.pt, alpha: 0.5}"}}, "distill.temperature: required"},
        BadSpec{{{"distill", "{teacher: /t.pt, temperature: 2}"}}, "distill.alpha: required"},
        BadSpec{{{"distill", "{teacher: '', temperature: 2, alpha: 0.5}"}},
                "distill.teacher: must not be empty"},
        BadSpec{{{"distill", "{teacher: /t.pt, temperature: 0, alpha: 0.5}"}},
                "distill.temperature: must be > 0"},
        BadSpec{{{"distill", "{teacher: /t.pt, temperature: -1, alpha: 0.5}"}},
                "distill.temperature: must be > 0"},
        BadSpec{{{"distill", "{teacher: /t.pt, temperature: hot, alpha: 0.5}"}},
                "distill.temperature: expected a number, got 'hot'"},
        BadSpec{{{"distill", "{teacher: /t.pt, temperature: 2, alpha: 1.5}"}},
                "distill.alpha: must be in [0, 1]"},
        BadSpec{{{"distill", "{teacher: /t.pt, temperature: 2, alpha: -0.1}"}},
                "distill.alpha: must be in [0, 1]"},
        BadSpec{{{"distill", "{teacher: /t.pt, temperature: 2, alpha: 0.5}"}, {"loss", "mse"}},
                "distill: only with loss cross_entropy, not 'mse'"}));

TEST(JobSpecTest, EmbeddingMlpOverCategoricalIds) {
  absl::StatusOr<JobSpec> spec = ParseJobSpecYaml(
      Spec({{"model",
             "{builtin: embedding_mlp, args: {vocab: [1000000, 50], dim: 16, hidden: [64], "
             "classes: 2, inputs: 4}}"},
            {"data", "{train: /d/*.safetensors, features: x, labels: y, categorical: ids}"}}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->model().builtin(), "embedding_mlp");
  ASSERT_EQ(spec->model().args().vocab_size(), 2);
  EXPECT_EQ(spec->model().args().vocab(0), 1000000);
  EXPECT_EQ(spec->model().args().dim(), 16);
  EXPECT_EQ(spec->data().categorical(), "ids");
  spec = ParseJobSpecYaml(
      Spec({{"model", "{builtin: embedding_mlp, args: {vocab: 100, dim: 8, classes: 2}}"},
            {"data", "{synthetic: {samples: 64, features: 4, classes: 2, vocab: 100}}"}}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->data().synthetic().vocab_size(), 1);
}

TEST(JobSpecTest, ResourcesPerRankAndPerShard) {
  absl::StatusOr<JobSpec> spec =
      ParseJobSpecYaml(Spec({{"resources", "{cpus: 1.5, memory: 4GiB}"}}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_DOUBLE_EQ(spec->resources().cpus(), 1.5);
  EXPECT_EQ(spec->resources().memory_bytes(), int64_t{4} << 30);
  spec = ParseJobSpecYaml(Spec({{"resources", "{memory: 512Mi}"}}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->resources().memory_bytes(), int64_t{512} << 20);
  spec = ParseJobSpecYaml(Spec({{"resources", "{memory: 300000000}"}}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->resources().memory_bytes(), 300000000);
}

TEST(JobSpecTest, DuplicateKeyIsRefused) {
  absl::StatusOr<JobSpec> spec = ParseJobSpecYaml(Spec({}) + "seed: 1\nseed: 2\n");
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(spec.status().message(), "seed: duplicate key");
}

TEST(JobSpecTest, YamlSyntaxErrorHasLineAndColumn) {
  absl::StatusOr<JobSpec> spec = ParseJobSpecYaml("name: t\nmodel: [unclosed\n");
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(spec.status().message().rfind("yaml: line ", 0), 0u) << spec.status();
  EXPECT_NE(spec.status().message().find("column"), absl::string_view::npos) << spec.status();
}

TEST(JobSpecTest, EmptyAndNonMappingDocuments) {
  EXPECT_EQ(ParseJobSpecYaml("").status().message(), "spec: the job spec is empty");
  EXPECT_EQ(ParseJobSpecYaml("# only a comment\n").status().message(),
            "spec: the job spec is empty");
  EXPECT_EQ(ParseJobSpecYaml("- a\n- b\n").status().message(),
            "spec: expected a mapping, got a list");
  EXPECT_EQ(ParseJobSpecYaml("\t\x01garbage: [").status().code(),
            absl::StatusCode::kInvalidArgument);
}

constexpr char kDesignExample[] = R"(
name: mnist-mlp
strategy: data_parallel          # single | data_parallel | parameter_server
workers: {min: 2, max: 4}        # or a number; ranks placed all at once (gang)
resources: {gpus_per_worker: 0}  # 0 = CPU
model:
  builtin: mlp                   # or torchscript: s3://bucket/models/net.pt
  args: {inputs: 784, hidden: [256, 128], classes: 10}
data:
  train: s3://bucket/mnist/train-*.safetensors   # or synthetic: {...}
  features: x
  labels: y
batch_size: 128                  # global batch, split across ranks
optimizer: {name: adamw, lr: 1e-3, weight_decay: 0.01}
loss: cross_entropy
max_steps: 2000                  # or epochs
seed: 42
checkpoint: {uri: s3://bucket/ckpt, every_steps: 200, keep_last: 3}
distill: {teacher: s3://bucket/models/teacher.pt, temperature: 2.0, alpha: 0.5}   # optional
restart: {max_failures: 3}       # preemptions retry without limit by default
priority: 0
max_runtime: 12h
precision: bf16                  # fp32 (default) | bf16 | fp16
)";

TEST(JobSpecTest, DesignExampleParses) {
  absl::StatusOr<JobSpec> parsed = ParseJobSpecYaml(kDesignExample);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const JobSpec& spec = *parsed;
  EXPECT_EQ(spec.name(), "mnist-mlp");
  EXPECT_EQ(spec.strategy(), v1::DATA_PARALLEL);
  EXPECT_EQ(spec.workers().min(), 2);
  EXPECT_EQ(spec.workers().max(), 4);
  EXPECT_EQ(spec.resources().gpus_per_worker(), 0);
  EXPECT_FALSE(spec.has_parameter_servers());
  EXPECT_EQ(spec.model().builtin(), "mlp");
  EXPECT_EQ(spec.model().args().inputs(), 784);
  ASSERT_EQ(spec.model().args().hidden_size(), 2);
  EXPECT_EQ(spec.model().args().hidden(0), 256);
  EXPECT_EQ(spec.model().args().hidden(1), 128);
  EXPECT_EQ(spec.model().args().classes(), 10);
  EXPECT_EQ(spec.data().train(), "s3://bucket/mnist/train-*.safetensors");
  EXPECT_FALSE(spec.data().has_synthetic());
  EXPECT_EQ(spec.data().features(), "x");
  EXPECT_EQ(spec.data().labels(), "y");
  EXPECT_TRUE(spec.data().shuffle());
  EXPECT_EQ(spec.batch_size(), 128);
  EXPECT_EQ(spec.optimizer().name(), "adamw");
  EXPECT_DOUBLE_EQ(spec.optimizer().lr(), 1e-3);
  EXPECT_DOUBLE_EQ(spec.optimizer().weight_decay(), 0.01);
  EXPECT_DOUBLE_EQ(spec.optimizer().beta1(), 0.9);
  EXPECT_DOUBLE_EQ(spec.optimizer().beta2(), 0.999);
  EXPECT_DOUBLE_EQ(spec.optimizer().eps(), 1e-8);
  EXPECT_EQ(spec.optimizer().schedule().name(), "constant");
  EXPECT_EQ(spec.loss(), "cross_entropy");
  EXPECT_EQ(spec.max_steps(), 2000);
  EXPECT_EQ(spec.epochs(), 0);
  EXPECT_EQ(spec.seed(), 42);
  EXPECT_EQ(spec.checkpoint().uri(), "s3://bucket/ckpt");
  EXPECT_EQ(spec.checkpoint().every_steps(), 200);
  EXPECT_EQ(spec.checkpoint().keep_last(), 3);
  EXPECT_EQ(spec.distill().teacher(), "s3://bucket/models/teacher.pt");
  EXPECT_DOUBLE_EQ(spec.distill().temperature(), 2.0);
  EXPECT_DOUBLE_EQ(spec.distill().alpha(), 0.5);
  EXPECT_EQ(spec.restart().max_failures(), 3);
  EXPECT_FALSE(spec.restart().has_max_preemptions());
  EXPECT_EQ(spec.priority(), 0);
  EXPECT_EQ(spec.max_runtime_seconds(), 12 * 3600);
  EXPECT_EQ(spec.log_every_steps(), 10);
  EXPECT_EQ(spec.precision(), v1::BF16);
}

TEST(JobSpecTest, DefaultsForAMinimalSpec) {
  absl::StatusOr<JobSpec> parsed = ParseJobSpecYaml(Spec({}));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const JobSpec& spec = *parsed;
  EXPECT_EQ(spec.strategy(), v1::SINGLE);
  EXPECT_EQ(spec.workers().min(), 1);
  EXPECT_EQ(spec.workers().max(), 1);
  EXPECT_EQ(spec.loss(), "cross_entropy");
  EXPECT_EQ(spec.data().features(), "x");
  EXPECT_EQ(spec.data().labels(), "y");
  EXPECT_TRUE(spec.data().has_shuffle());
  EXPECT_TRUE(spec.data().shuffle());
  EXPECT_EQ(spec.optimizer().name(), "sgd");
  EXPECT_DOUBLE_EQ(spec.optimizer().lr(), 0.01);
  EXPECT_DOUBLE_EQ(spec.optimizer().momentum(), 0);
  EXPECT_DOUBLE_EQ(spec.optimizer().weight_decay(), 0);
  EXPECT_EQ(spec.optimizer().schedule().name(), "constant");
  EXPECT_EQ(spec.checkpoint().every_steps(), 0);
  EXPECT_EQ(spec.checkpoint().keep_last(), 3);
  EXPECT_EQ(spec.restart().max_failures(), 0);
  EXPECT_FALSE(spec.restart().has_max_preemptions());
  EXPECT_EQ(spec.seed(), 0);
  EXPECT_EQ(spec.log_every_steps(), 10);
  EXPECT_EQ(spec.batch_size(), 32);
  EXPECT_EQ(spec.max_runtime_seconds(), 0);
  EXPECT_EQ(spec.collective_timeout_seconds(), 60);
  EXPECT_EQ(spec.accumulate_steps(), 1);
  EXPECT_EQ(spec.bucket_size_mb(), 25);
  EXPECT_EQ(spec.precision(), v1::FP32);
  EXPECT_EQ(spec.model().memory_format(), "auto");
  EXPECT_FALSE(spec.cuda_graph());
}

TEST(JobSpecTest, Tf32AndACudaGraphOnAGpu) {
  absl::StatusOr<JobSpec> parsed = ParseJobSpecYaml(Spec({{"precision", "tf32"},
                                                          {"cuda_graph", "true"},
                                                          {"resources", "{gpus_per_worker: 1}"},
                                                          {"batch_size", "16"},
                                                          {"accumulate_steps", "4"}}));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->precision(), v1::TF32);
  EXPECT_TRUE(parsed->cuda_graph());
  // tf32 on CPUs is fp32 there, not refused; a pipeline may train in it.
  EXPECT_TRUE(ParseJobSpecYaml(Spec({{"precision", "tf32"}})).ok());
  for (const char* format : {"auto", "contiguous"}) {
    absl::StatusOr<JobSpec> layout = ParseJobSpecYaml(Spec(
        {{"model", absl::StrCat("{builtin: mlp, args: {inputs: 4, classes: 2}, memory_format: ",
                                format, "}")}}));
    ASSERT_TRUE(layout.ok()) << layout.status();
    EXPECT_EQ(layout->model().memory_format(), format);
  }
}

TEST(JobSpecTest, Fp16OnGpus) {
  absl::StatusOr<JobSpec> parsed =
      ParseJobSpecYaml(Spec({{"precision", "fp16"}, {"resources", "{gpus_per_worker: 1}"}}));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->precision(), v1::FP16);
}

TEST(JobSpecTest, DataParallelKnobs) {
  absl::StatusOr<JobSpec> spec = ParseJobSpecYaml(Spec({{"strategy", "data_parallel"},
                                                        {"workers", "2"},
                                                        {"batch_size", "16"},
                                                        {"collective_timeout", "90s"},
                                                        {"accumulate_steps", "4"},
                                                        {"bucket_size_mb", "1"}}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->collective_timeout_seconds(), 90);
  EXPECT_EQ(spec->accumulate_steps(), 4);
  EXPECT_EQ(spec->bucket_size_mb(), 1);
  EXPECT_EQ(ParseJobSpecYaml(Spec({{"collective_timeout", "5"}}))->collective_timeout_seconds(), 5);
}

TEST(JobSpecTest, ApplyDefaultsIsIdempotent) {
  JobSpec spec = *ParseJobSpecYaml(Spec({{"optimizer", "{name: adam}"}}));
  const std::string once = spec.SerializeAsString();
  ApplyJobSpecDefaults(spec);
  EXPECT_EQ(spec.SerializeAsString(), once);

  JobSpec empty;
  ApplyJobSpecDefaults(empty);
  const std::string first = empty.SerializeAsString();
  ApplyJobSpecDefaults(empty);
  EXPECT_EQ(empty.SerializeAsString(), first);
  EXPECT_EQ(empty.strategy(), v1::SINGLE);
  EXPECT_EQ(empty.batch_size(), 32);
  EXPECT_EQ(empty.data().prefetch_shards(), 2);
}

TEST(JobSpecTest, ApplyDefaultsOnProtoSpecs) {
  JobSpec spec;
  spec.set_strategy(v1::PARAMETER_SERVER);
  spec.mutable_workers()->set_max(4);
  spec.mutable_optimizer()->set_name("adamw");
  ApplyJobSpecDefaults(spec);
  EXPECT_EQ(spec.workers().min(), 1);
  EXPECT_EQ(spec.workers().max(), 4);
  EXPECT_EQ(spec.parameter_servers().shards(), 1);
  EXPECT_EQ(spec.parameter_servers().mode(), "sync");
  EXPECT_EQ(spec.parameter_servers().max_staleness(), 0);
  EXPECT_EQ(spec.parameter_servers().dense(), "shards");
  EXPECT_EQ(spec.parameter_servers().slots(), 1);
  EXPECT_DOUBLE_EQ(spec.optimizer().beta1(), 0.9);
  EXPECT_DOUBLE_EQ(spec.optimizer().beta2(), 0.999);
  EXPECT_DOUBLE_EQ(spec.optimizer().eps(), 1e-8);
  // Zero weight decay in a proto is taken as written.
  EXPECT_DOUBLE_EQ(spec.optimizer().weight_decay(), 0);
  // A spec with defaults and the required fields validates; without the name it does not.
  spec.mutable_model()->set_builtin("mlp");
  spec.mutable_model()->mutable_args()->set_inputs(4);
  spec.mutable_model()->mutable_args()->set_classes(2);
  spec.mutable_data()->set_train("/data/train-*.safetensors");
  spec.set_epochs(1);
  EXPECT_EQ(ValidateJobSpec(spec).message(), "name: required");
  spec.set_name("ps-job");
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
}

TEST(JobSpecTest, AdamwWeightDecayDefaultsUnlessGiven) {
  JobSpec spec = *ParseJobSpecYaml(Spec({{"optimizer", "{name: adamw}"}}));
  EXPECT_DOUBLE_EQ(spec.optimizer().weight_decay(), 0.01);
  spec = *ParseJobSpecYaml(Spec({{"optimizer", "{name: adamw, weight_decay: 0}"}}));
  EXPECT_DOUBLE_EQ(spec.optimizer().weight_decay(), 0);
  spec = *ParseJobSpecYaml(Spec({{"optimizer", "adamw"}}));
  EXPECT_EQ(spec.optimizer().name(), "adamw");
  EXPECT_DOUBLE_EQ(spec.optimizer().weight_decay(), 0.01);
  spec = *ParseJobSpecYaml(Spec({{"optimizer", "{name: adam}"}}));
  EXPECT_DOUBLE_EQ(spec.optimizer().weight_decay(), 0);
}

TEST(JobSpecTest, ShortForms) {
  absl::StatusOr<JobSpec> spec = ParseJobSpecYaml(Spec({
      {"strategy", "data_parallel"},
      {"workers", "{max: 4}"},
      {"model", "{builtin: mlp, args: {inputs: 4, hidden: 16, classes: 2}}"},
      {"optimizer", "{name: adam, lr: 2e-3, betas: [0, 0.99], schedule: cosine}"},
      {"max_steps", "1e4"},
      {"max_runtime", "5400"},
      {"data",
       "{train: file:///d/*.safetensors, shuffle: no, validation_split: 0.25, "
       "shuffle_window: 4096, prefetch_shards: 3, fetch_threads: 8}"},
  }));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->data().shuffle_window(), 4096);
  EXPECT_EQ(spec->data().prefetch_shards(), 3);
  EXPECT_EQ(spec->data().fetch_threads(), 8);
  EXPECT_EQ(spec->workers().min(), 1);
  EXPECT_EQ(spec->workers().max(), 4);
  ASSERT_EQ(spec->model().args().hidden_size(), 1);
  EXPECT_EQ(spec->model().args().hidden(0), 16);
  EXPECT_DOUBLE_EQ(spec->optimizer().beta1(), 0);
  EXPECT_DOUBLE_EQ(spec->optimizer().beta2(), 0.99);
  EXPECT_EQ(spec->optimizer().schedule().name(), "cosine");
  EXPECT_EQ(spec->max_steps(), 10000);
  EXPECT_EQ(spec->max_runtime_seconds(), 5400);
  EXPECT_FALSE(spec->data().shuffle());
  EXPECT_FLOAT_EQ(spec->data().validation_split(), 0.25f);

  spec = ParseJobSpecYaml(Spec({{"workers", "{min: 2}"}, {"strategy", "data_parallel"}}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->workers().max(), 2);
}

TEST(JobSpecTest, ParameterServerForms) {
  absl::StatusOr<JobSpec> spec = ParseJobSpecYaml(
      Spec({{"strategy", "parameter_server"}, {"workers", "4"}, {"parameter_servers", "3"}}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->parameter_servers().shards(), 3);
  EXPECT_EQ(spec->parameter_servers().mode(), "sync");
  EXPECT_EQ(spec->parameter_servers().max_staleness(), 0);
  EXPECT_EQ(spec->parameter_servers().dense(), "shards");
  EXPECT_EQ(spec->parameter_servers().slots(), 1);

  // Left out entirely, a parameter_server job has one synchronous shard.
  spec = ParseJobSpecYaml(Spec({{"strategy", "parameter_server"}, {"workers", "2"}}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->parameter_servers().shards(), 1);
  EXPECT_EQ(spec->parameter_servers().mode(), "sync");

  spec = ParseJobSpecYaml(Spec({{"strategy", "parameter_server"},
                                {"workers", "{min: 2, max: 4}"},
                                {"parameter_servers", "{shards: 2, mode: async}"}}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->parameter_servers().max_staleness(), kDefaultMaxStaleness);

  spec = ParseJobSpecYaml(
      Spec({{"strategy", "parameter_server"},
            {"parameter_servers",
             "{shards: 4, mode: async, max_staleness: 8, dense: allreduce, slots: 2}"},
            {"model", "{builtin: embedding_mlp, args: {vocab: 100, dim: 8, classes: 2}}"},
            {"data", "{synthetic: {samples: 64, features: 4, classes: 2, vocab: 100}}"}}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->parameter_servers().shards(), 4);
  EXPECT_EQ(spec->parameter_servers().mode(), "async");
  EXPECT_EQ(spec->parameter_servers().max_staleness(), 8);
  EXPECT_EQ(spec->parameter_servers().dense(), "allreduce");
  EXPECT_EQ(spec->parameter_servers().slots(), 2);
}

TEST(JobSpecTest, FullSpecWithEveryField) {
  absl::StatusOr<JobSpec> spec = ParseJobSpecYaml(R"(
name: cnn-ps
strategy: parameter_server
workers: 3
parameter_servers: 2
resources: {gpus_per_worker: 1}
model:
  builtin: cnn
  args: {channels: 1, height: 28, width: 28, hidden: [16, 32], classes: 10, dropout: 0.2}
data:
  synthetic: {samples: 1000, features: 784, classes: 10, noise: 0.3}
  features: image
  labels: label
  validation_split: 0.1
  shuffle: false
  feature_scale: 0.00392
  feature_offset: -0.5
  validation: {every_steps: 20, every_epoch: true, max_samples: 100}
batch_size: 30
optimizer:
  name: sgd
  lr: 0.1
  momentum: 0.9
  nesterov: true
  weight_decay: 5e-4
  schedule: {name: cosine, warmup_steps: 100, min_lr: 0.001}
loss: mse
epochs: 3
max_steps: 500
seed: -7
checkpoint: {uri: /tmp/ckpt, every_steps: 50, keep_last: 5, resume_from: job-123}
restart: {max_failures: 1, max_preemptions: 10}
priority: -3
max_runtime: 1h30m
log_every_steps: 1
)");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->strategy(), v1::PARAMETER_SERVER);
  EXPECT_EQ(spec->workers().min(), 3);
  EXPECT_EQ(spec->parameter_servers().shards(), 2);
  EXPECT_EQ(spec->parameter_servers().mode(), "sync");
  EXPECT_EQ(spec->resources().gpus_per_worker(), 1);
  EXPECT_EQ(spec->model().builtin(), "cnn");
  EXPECT_EQ(spec->model().args().height(), 28);
  EXPECT_FLOAT_EQ(spec->model().args().dropout(), 0.2f);
  EXPECT_EQ(spec->data().synthetic().samples(), 1000);
  EXPECT_FLOAT_EQ(spec->data().synthetic().noise(), 0.3f);
  EXPECT_EQ(spec->data().features(), "image");
  EXPECT_FALSE(spec->data().shuffle());
  EXPECT_FLOAT_EQ(spec->data().feature_scale(), 0.00392f);
  EXPECT_FLOAT_EQ(spec->data().feature_offset(), -0.5f);
  EXPECT_EQ(spec->data().validation().every_steps(), 20);
  EXPECT_TRUE(spec->data().validation().every_epoch());
  EXPECT_EQ(spec->data().validation().max_samples(), 100);
  EXPECT_TRUE(spec->optimizer().nesterov());
  EXPECT_DOUBLE_EQ(spec->optimizer().weight_decay(), 5e-4);
  EXPECT_EQ(spec->optimizer().schedule().warmup_steps(), 100);
  EXPECT_DOUBLE_EQ(spec->optimizer().schedule().min_lr(), 0.001);
  EXPECT_EQ(spec->loss(), "mse");
  EXPECT_EQ(spec->epochs(), 3);
  EXPECT_EQ(spec->max_steps(), 500);
  EXPECT_EQ(spec->seed(), -7);
  EXPECT_EQ(spec->checkpoint().resume_from(), "job-123");
  EXPECT_EQ(spec->checkpoint().keep_last(), 5);
  EXPECT_EQ(spec->restart().max_preemptions(), 10);
  EXPECT_EQ(spec->priority(), -3);
  EXPECT_EQ(spec->max_runtime_seconds(), 5400);
  EXPECT_EQ(spec->log_every_steps(), 1);
}

TEST(JobSpecTest, DistillSection) {
  absl::StatusOr<JobSpec> spec = ParseJobSpecYaml(
      Spec({{"distill", "{teacher: s3://bucket/teacher.pt, temperature: 4, alpha: 0.7}"}}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_TRUE(spec->has_distill());
  EXPECT_EQ(spec->distill().teacher(), "s3://bucket/teacher.pt");
  EXPECT_DOUBLE_EQ(spec->distill().temperature(), 4);
  EXPECT_DOUBLE_EQ(spec->distill().alpha(), 0.7);
  // Both ends of alpha; every strategy.
  for (const char* alpha : {"0", "1"}) {
    spec = ParseJobSpecYaml(Spec({{"strategy", "parameter_server"},
                                  {"workers", "2"},
                                  {"distill", absl::StrCat("{teacher: /t.pt, temperature: 0.5, "
                                                           "alpha: ",
                                                           alpha, "}")}}));
    ASSERT_TRUE(spec.ok()) << alpha << ": " << spec.status();
    EXPECT_DOUBLE_EQ(spec->distill().alpha(), std::stod(alpha));
  }
  // Left out or null: no distillation.
  spec = ParseJobSpecYaml(Spec({{"distill", ""}}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_FALSE(spec->has_distill());
  // A spec built in code is validated the same way.
  JobSpec built = *ParseJobSpecYaml(Spec({}));
  built.mutable_distill()->set_teacher("/t.pt");
  built.mutable_distill()->set_alpha(0.5);
  EXPECT_EQ(ValidateJobSpec(built).message(), "distill.temperature: must be > 0");
}

TEST(JobSpecTest, TorchscriptModel) {
  absl::StatusOr<JobSpec> spec =
      ParseJobSpecYaml(Spec({{"model", "{torchscript: s3://bucket/models/net.pt}"}}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->model().torchscript(), "s3://bucket/models/net.pt");
}

std::string SourceDir() {
  const char* dir = std::getenv("TRAINYARD_SOURCE_DIR");
  return dir != nullptr ? dir : TRAINYARD_SOURCE_DIR_FALLBACK;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

TEST(JobSpecTest, ExampleSyntheticMlpParses) {
  const std::string yaml = ReadFile(SourceDir() + "/examples/synthetic-mlp.yaml");
  ASSERT_FALSE(yaml.empty());
  absl::StatusOr<JobSpec> spec = ParseJobSpecYaml(yaml);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->strategy(), v1::SINGLE);
  EXPECT_EQ(spec->model().builtin(), "mlp");
  EXPECT_EQ(spec->data().synthetic().samples(), 4096);
  EXPECT_EQ(spec->data().synthetic().features(), 32);
  EXPECT_EQ(spec->data().synthetic().classes(), 4);
  EXPECT_FLOAT_EQ(spec->data().validation_split(), 0.1f);
  EXPECT_EQ(spec->optimizer().name(), "adamw");
  EXPECT_EQ(spec->optimizer().schedule().name(), "cosine");
  EXPECT_GT(spec->optimizer().schedule().warmup_steps(), 0);
  EXPECT_EQ(spec->max_steps(), 300);
  EXPECT_EQ(spec->checkpoint().every_steps(), 100);
}

TEST(JobSpecTest, RelativePathsAreRefusedWithTheFieldNamed) {
  const std::string base = R"(
name: rel
model: {builtin: mlp, args: {inputs: 2, hidden: [8], classes: 2}}
batch_size: 8
max_steps: 10
)";
  struct Case {
    std::string yaml;
    std::string field;
  };
  const Case cases[] = {
      {base + "data: {train: 'examples/data/train-*.safetensors'}\n", "data.train"},
      {"name: rel\nmodel: {torchscript: model.pt}\ndata: {synthetic: {samples: 8, features: 2, "
       "classes: 2}}\nmax_steps: 1\n",
       "model.torchscript"},
      {base + "data: {synthetic: {samples: 8, features: 2, classes: 2}}\n"
              "distill: {teacher: teacher.pt, temperature: 2, alpha: 0.5}\n",
       "distill.teacher"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<JobSpec> spec = ParseJobSpecYaml(c.yaml);
    ASSERT_FALSE(spec.ok()) << c.field;
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(spec.status().message()), HasSubstr(c.field + ": '"));
    EXPECT_THAT(std::string(spec.status().message()), HasSubstr("is not an absolute path or URI"));
  }
  // Absolute paths and URIs pass.
  EXPECT_TRUE(ParseJobSpecYaml(base + "data: {train: '/data/train-*.safetensors'}\n").ok());
  EXPECT_TRUE(ParseJobSpecYaml(base + "data: {train: 's3://b/train-*.safetensors'}\n").ok());
}

TEST(JobSpecTest, ExampleSafetensorsMlpParses) {
  const std::string yaml = ReadFile(SourceDir() + "/examples/safetensors-mlp.yaml");
  ASSERT_FALSE(yaml.empty());
  absl::StatusOr<JobSpec> spec = ParseJobSpecYaml(yaml);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->data().train(), "/tmp/trainyard-examples/mlp-data/train-*.safetensors");
  EXPECT_EQ(spec->model().builtin(), "mlp");
}

TEST(JobSpecTest, ExampleParameterServerJobsParse) {
  for (const char* name : {"parameter-server-mlp", "parameter-server-embeddings"}) {
    const std::string yaml = ReadFile(absl::StrCat(SourceDir(), "/examples/", name, ".yaml"));
    ASSERT_FALSE(yaml.empty()) << name;
    absl::StatusOr<JobSpec> spec = ParseJobSpecYaml(yaml);
    ASSERT_TRUE(spec.ok()) << name << ": " << spec.status();
    EXPECT_EQ(spec->strategy(), v1::PARAMETER_SERVER);
    EXPECT_EQ(spec->parameter_servers().shards(), 2);
  }
  absl::StatusOr<JobSpec> spec =
      ParseJobSpecYaml(ReadFile(SourceDir() + "/examples/parameter-server-embeddings.yaml"));
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(spec->parameter_servers().dense(), "allreduce");
  EXPECT_EQ(spec->model().builtin(), "embedding_mlp");
  EXPECT_EQ(spec->data().categorical(), "ids");
}

TEST(JobSpecTest, ExampleDistillationJobsParse) {
  absl::StatusOr<JobSpec> teacher =
      ParseJobSpecYaml(ReadFile(SourceDir() + "/examples/distill/teacher.yaml"));
  ASSERT_TRUE(teacher.ok()) << teacher.status();
  EXPECT_EQ(teacher->model().torchscript(), "/tmp/trainyard-distill/cnn-init.pt");
  EXPECT_FALSE(teacher->has_distill());
  absl::StatusOr<JobSpec> student =
      ParseJobSpecYaml(ReadFile(SourceDir() + "/examples/distill/student.yaml"));
  ASSERT_TRUE(student.ok()) << student.status();
  EXPECT_EQ(student->model().builtin(), "mlp");
  EXPECT_EQ(student->distill().teacher(), "/tmp/trainyard-distill/teacher.pt");
  EXPECT_DOUBLE_EQ(student->distill().temperature(), 4);
  EXPECT_DOUBLE_EQ(student->distill().alpha(), 0.9);
}

// The transformer example: its shape, and the defaults a transformer on tokens gets (the MLP
// 4 times as wide, the head tied, the token tensor named "tokens").
// A pipeline: its defaults (micro-batches one per stage, 1F1B, balanced by bytes), a partition
// given as layer counts, and how `describe` will show it.
TEST(JobSpecTest, PipelineParsesWithItsDefaults) {
  absl::StatusOr<JobSpec> spec = ParseJobSpecYaml(Spec({{"strategy", "pipeline"},
                                                        {"workers", "4"},
                                                        {"batch_size", "8"},
                                                        {"pipeline", "{stages: 2}"},
                                                        {"model", kLanguageModel},
                                                        {"data", kTokens}}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->strategy(), trainyard::v1::PIPELINE);
  EXPECT_EQ(spec->pipeline().stages(), 2);
  EXPECT_EQ(spec->pipeline().microbatches(), 2);
  EXPECT_EQ(spec->pipeline().schedule(), "1f1b");
  EXPECT_EQ(spec->pipeline().partition(), "balanced");
  spec = ParseJobSpecYaml(Spec({{"strategy", "pipeline"},
                                {"workers", "2"},
                                {"batch_size", "8"},
                                {"pipeline",
                                 "{stages: 2, microbatches: 8, schedule: gpipe, "
                                 "partition: [1, 3]}"},
                                {"model", kLanguageModel},
                                {"data", kTokens}}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->pipeline().microbatches(), 8);
  EXPECT_EQ(spec->pipeline().schedule(), "gpipe");
  EXPECT_THAT(spec->pipeline().partition_counts(), ::testing::ElementsAre(1, 3));
  // A TorchScript Sequential: its layers are counted when the trainer loads it.
  spec = ParseJobSpecYaml(Spec({{"strategy", "pipeline"},
                                {"workers", "2"},
                                {"batch_size", "8"},
                                {"pipeline", "{stages: 2, partition: [3, 2]}"},
                                {"model", "{torchscript: /m/net.pt}"}}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_THAT(spec->pipeline().partition_counts(), ::testing::ElementsAre(3, 2));
  // A model in files: one stage per file unless the partition groups them.
  spec = ParseJobSpecYaml(Spec({{"strategy", "pipeline"},
                                {"workers", "3"},
                                {"batch_size", "9"},
                                {"model", "{stages: [/m/a.pt, file:///m/b.pt, s3://b/c.pt]}"}}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_THAT(spec->model().stages(),
              ::testing::ElementsAre("/m/a.pt", "file:///m/b.pt", "s3://b/c.pt"));
  EXPECT_EQ(spec->pipeline().stages(), 3);
  EXPECT_EQ(spec->pipeline().microbatches(), 3);
  spec = ParseJobSpecYaml(Spec({{"strategy", "pipeline"},
                                {"workers", "2"},
                                {"batch_size", "8"},
                                {"pipeline", "{partition: [2, 1]}"},
                                {"model", "{stages: [/m/a.pt, /m/b.pt, /m/c.pt]}"}}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->pipeline().stages(), 2);
  // Or a single job runs them one after the other.
  spec = ParseJobSpecYaml(Spec({{"model", "{stages: [/m/a.pt, /m/b.pt]}"}}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_FALSE(spec->has_pipeline());
}

TEST(JobSpecTest, ExampleTransformerParsesWithItsDefaults) {
  absl::StatusOr<JobSpec> spec =
      ParseJobSpecYaml(ReadFile(SourceDir() + "/examples/transformer/kjv.yaml"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->model().builtin(), "transformer");
  EXPECT_EQ(spec->model().args().context(), 64);
  EXPECT_EQ(spec->data().tokens(), "/tmp/trainyard-examples/transformer/kjv-*.safetensors");
  EXPECT_EQ(spec->data().features(), "tokens");
  spec = ParseJobSpecYaml(
      Spec({{"model",
             "{builtin: transformer, args: {vocab: 256, context: 32, layers: 2, dim: 16, heads: "
             "2}}"},
            {"data", "{tokens: /d/t-*.safetensors}"}}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->model().args().mlp_ratio(), 4);
  EXPECT_TRUE(spec->model().args().has_tie_embeddings());
  EXPECT_TRUE(spec->model().args().tie_embeddings());
  EXPECT_EQ(spec->data().features(), "tokens");
}

TEST(ParseDurationSecondsTest, Valid) {
  EXPECT_EQ(*ParseDurationSeconds("90s"), 90);
  EXPECT_EQ(*ParseDurationSeconds("15m"), 900);
  EXPECT_EQ(*ParseDurationSeconds("12h"), 43200);
  EXPECT_EQ(*ParseDurationSeconds("2d"), 172800);
  EXPECT_EQ(*ParseDurationSeconds("1h30m"), 5400);
  EXPECT_EQ(*ParseDurationSeconds("1d2h3m4s"), 86400 + 7200 + 180 + 4);
  EXPECT_EQ(*ParseDurationSeconds("0s"), 0);
}

TEST(ParseDurationSecondsTest, Invalid) {
  for (const char* bad : {"", "h", "12", "1x", "30m1h", "1h1h", "-5s", "1.5h", "1h 30m", "s1",
                          "99999999999999999d"}) {
    EXPECT_EQ(ParseDurationSeconds(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(JobSpecTest, CheckpointsAreSharedWithUsersByName) {
  const std::string base =
      "name: s\nmodel: {builtin: mlp, args: {inputs: 4, hidden: [8], "
      "classes: 2}}\ndata: {synthetic: {samples: 64, features: 4, "
      "classes: 2}}\nmax_steps: 10\n";
  absl::StatusOr<JobSpec> spec =
      ParseJobSpecYaml(base + "checkpoint: {share_with: [bob, \"*\"]}\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_THAT(spec->checkpoint().share_with(), ::testing::ElementsAre("bob", "*"));
  EXPECT_EQ(ParseJobSpecYaml(base + "checkpoint: {share_with: bob}\n").status().message(),
            "checkpoint.share_with: a list of user names");
  EXPECT_THAT(
      std::string(ParseJobSpecYaml(base + "checkpoint: {share_with: [\"\"]}\n").status().message()),
      HasSubstr("checkpoint.share_with[0]: a user name"));
}

}  // namespace
}  // namespace trainyard
