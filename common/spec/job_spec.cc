#include "common/spec/job_spec.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <initializer_list>
#include <limits>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/byte_size.h"
#include "common/restart_reason.h"
#include "common/spec/job_spec_internal.h"
#include "common/spec/yaml_fields.h"
#include "common/storage/file_object_store.h"
#include "common/storage/object_cache.h"
#include "common/storage/uri.h"
#include "yaml-cpp/yaml.h"

namespace trainyard {
namespace {

using job_spec_internal::CheckAbsolute;
using job_spec_internal::ValidateModel;
using trainyard::v1::JobSpec;

constexpr int kMaxNameLength = 63;

// A task's memory below what a trainer needs to start.
absl::Status TooLittleMemory(const std::string& field, int64_t bytes) {
  return FieldError(
      field, absl::StrCat("must be at least ", HumanBytes(kMinTaskMemoryBytes),
                          " (a trainer needs about that to start), got ", HumanBytes(bytes)));
}
constexpr int kMaxShareWith = 64;  // users of checkpoint.share_with

absl::Status ValidateData(const v1::DataSpec& data) {
  const bool has_train = !data.train().empty();
  const bool has_tokens = !data.tokens().empty();
  if (has_train + has_tokens + data.has_synthetic() == 0) {
    return FieldError("data", "set train, tokens or synthetic");
  }
  if (has_train + has_tokens + data.has_synthetic() > 1) {
    return FieldError("data", "set only one of train, tokens or synthetic");
  }
  if (has_train) {
    if (absl::Status s = CheckAbsolute("data.train", data.train()); !s.ok()) return s;
  }
  if (has_tokens) {
    if (absl::Status s = CheckAbsolute("data.tokens", data.tokens()); !s.ok()) return s;
    if (!data.categorical().empty()) {
      return FieldError("data.categorical", "token data has no categorical ids");
    }
    if (data.has_feature_scale() || data.feature_offset() != 0) {
      return FieldError(data.has_feature_scale() ? "data.feature_scale" : "data.feature_offset",
                        "token ids are not scaled");
    }
  }
  if (data.has_synthetic()) {
    const v1::SyntheticData& s = data.synthetic();
    if (s.samples() <= 0) return FieldError("data.synthetic.samples", "must be > 0");
    if (s.features() <= 0) return FieldError("data.synthetic.features", "must be > 0");
    if (s.classes() <= 0) return FieldError("data.synthetic.classes", "must be > 0");
    if (!(s.noise() >= 0)) return FieldError("data.synthetic.noise", "must be >= 0");
    for (int i = 0; i < s.vocab_size(); ++i) {
      if (s.vocab(i) <= 0) {
        return FieldError(absl::StrCat("data.synthetic.vocab[", i, "]"), "must be > 0");
      }
    }
    if (!data.categorical().empty()) {
      return FieldError("data.categorical",
                        "names a tensor of data.train's files; data.synthetic has vocab instead");
    }
  }
  if (data.features().empty()) return FieldError("data.features", "must not be empty");
  if (data.labels().empty()) return FieldError("data.labels", "must not be empty");
  if (!(data.validation_split() >= 0 && data.validation_split() < 1)) {
    return FieldError("data.validation_split", "must be in [0, 1)");
  }
  if (data.shuffle_window() < 0) return FieldError("data.shuffle_window", "must be >= 0");
  if (data.shuffle_window() > 0 && !has_train && !has_tokens) {
    return FieldError("data.shuffle_window", "windows of shards need data.train or data.tokens");
  }
  if (data.has_feature_scale() && !std::isfinite(data.feature_scale())) {
    return FieldError("data.feature_scale", "must be a finite number");
  }
  if (!std::isfinite(data.feature_offset())) {
    return FieldError("data.feature_offset", "must be a finite number");
  }
  if (data.prefetch_shards() < 0 || data.prefetch_shards() > 64) {
    return FieldError("data.prefetch_shards", "must be in [0, 64]");
  }
  if (data.fetch_threads() < 0 || data.fetch_threads() > 64) {
    return FieldError("data.fetch_threads", "must be in [0, 64]");
  }
  const v1::ValidationSpec& validation = data.validation();
  if (validation.every_steps() < 0) {
    return FieldError("data.validation.every_steps", "must be >= 0");
  }
  if (validation.max_samples() < 0) {
    return FieldError("data.validation.max_samples", "must be >= 0");
  }
  if (data.has_validation() && data.validation_split() == 0) {
    return FieldError("data.validation", "needs data.validation_split > 0");
  }
  return absl::OkStatus();
}

// embedding_mlp reads categorical ids, and only it does.
absl::Status ValidateCategorical(const v1::ModelSpec& model, const v1::DataSpec& data) {
  const bool embedding =
      model.source_case() == v1::ModelSpec::kBuiltin && model.builtin() == "embedding_mlp";
  const v1::SyntheticData& synthetic = data.synthetic();
  if (!embedding) {
    if (!data.categorical().empty()) {
      return FieldError("data.categorical", "only for model embedding_mlp");
    }
    if (synthetic.vocab_size() > 0) {
      return FieldError("data.synthetic.vocab", "only for model embedding_mlp");
    }
    return absl::OkStatus();
  }
  const v1::ModelArgs& args = model.args();
  if (data.has_synthetic()) {
    if (synthetic.vocab_size() != args.vocab_size()) {
      return FieldError("data.synthetic.vocab",
                        absl::StrCat("has ", synthetic.vocab_size(), " fields; model.args.vocab ",
                                     args.vocab_size()));
    }
    for (int i = 0; i < synthetic.vocab_size(); ++i) {
      if (synthetic.vocab(i) > args.vocab(i)) {
        return FieldError(absl::StrCat("data.synthetic.vocab[", i, "]"),
                          absl::StrCat(synthetic.vocab(i), " ids do not fit the ", args.vocab(i),
                                       " rows of model.args.vocab[", i, "]"));
      }
    }
  } else if (data.categorical().empty()) {
    return FieldError("data.categorical",
                      "embedding_mlp needs the name of the tensor of categorical ids");
  }
  return absl::OkStatus();
}

// Token data and the language model that reads it go together.
absl::Status ValidateTokens(const v1::JobSpec& spec) {
  const bool transformer = spec.model().source_case() == v1::ModelSpec::kBuiltin &&
                           spec.model().builtin() == "transformer";
  const bool tokens = !spec.data().tokens().empty();
  if (transformer && !tokens) {
    return FieldError("data.tokens", "model transformer trains on token shards (data.tokens)");
  }
  if (!tokens) return absl::OkStatus();
  if (!transformer) {
    return FieldError("data.tokens", "token shards train model transformer (builtin)");
  }
  if (spec.loss() != "cross_entropy") {
    return FieldError("loss", "a language model on data.tokens trains with cross_entropy");
  }
  if (spec.has_distill()) {
    return FieldError("distill", "distillation into a language model is not supported");
  }
  if (spec.strategy() == v1::PARAMETER_SERVER) {
    return FieldError("strategy",
                      "parameter_server does not train language models on data.tokens; use "
                      "data_parallel");
  }
  return absl::OkStatus();
}

// strategy pipeline: its stages, micro-batches, schedule and partition against the workers and the
// model (whose layers it splits: the built-in transformer's embeddings, blocks and head).
absl::Status ValidatePipeline(const v1::JobSpec& spec) {
  const v1::PipelineSpec& pipeline = spec.pipeline();
  const int32_t stages = pipeline.stages();
  if (stages < 1) return FieldError("pipeline.stages", "must be >= 1");
  const v1::WorkerRange& workers = spec.workers();
  if (workers.min() != workers.max()) {
    return FieldError("workers", "a pipeline runs a fixed number of workers: stages x replicas");
  }
  if (workers.max() % stages != 0) {
    return FieldError("workers", absl::StrCat(workers.max(), " workers are not a multiple of the ",
                                              stages, " pipeline.stages (stages x replicas)"));
  }
  if (pipeline.microbatches() < 1) return FieldError("pipeline.microbatches", "must be >= 1");
  if (pipeline.schedule() != "gpipe" && pipeline.schedule() != "1f1b") {
    return FieldError("pipeline.schedule", absl::StrCat("unknown schedule '", pipeline.schedule(),
                                                        "', expected gpipe or 1f1b"));
  }
  if (pipeline.partition_counts_size() == 0 && pipeline.partition() != "balanced" &&
      pipeline.partition() != "uniform") {
    return FieldError("pipeline.partition",
                      absl::StrCat("unknown partition '", pipeline.partition(),
                                   "', expected balanced, uniform or a list of layer counts"));
  }
  const bool script = spec.model().source_case() == v1::ModelSpec::kTorchscript;
  const bool files = spec.model().stages_size() > 0;
  if (!script && !files &&
      (spec.model().source_case() != v1::ModelSpec::kBuiltin ||
       spec.model().builtin() != "transformer")) {
    return FieldError("strategy",
                      "pipeline splits the layers of model builtin transformer, of a "
                      "TorchScript torch.nn.Sequential (model.torchscript) or a model in "
                      "TorchScript files (model.stages); other models train with data_parallel");
  }
  if (pipeline.partition_counts_size() > 0 && pipeline.partition_counts_size() != stages) {
    return FieldError("pipeline.partition", absl::StrCat(pipeline.partition_counts_size(),
                                                         " layer counts for ", stages, " stages"));
  }
  for (int32_t count : pipeline.partition_counts()) {
    if (count < 1) return FieldError("pipeline.partition", "every stage needs >= 1 layer");
  }
  // A TorchScript Sequential's layers are counted when the trainer loads it; model.stages are
  // its files; the transformer's are the embeddings, each block, the final norm and head.
  const int64_t layers = files    ? spec.model().stages_size()
                         : script ? 0
                                  : int64_t{spec.model().args().layers()} + 2;
  const char* what = files ? " files (model.stages)" : " layers (model.args.layers + 2)";
  if (!script && stages > layers) {
    return FieldError("pipeline.stages",
                      absl::StrCat(stages, " stages exceed the model's ", layers, what));
  }
  if (!script && pipeline.partition_counts_size() > 0) {
    int64_t sum = 0;
    for (int32_t count : pipeline.partition_counts()) sum += count;
    if (sum != layers) {
      return FieldError("pipeline.partition", absl::StrCat("layer counts add up to ", sum,
                                                           ", the model has ", layers, what));
    }
  }
  if (spec.accumulate_steps() > 1) {
    return FieldError("accumulate_steps",
                      "a pipeline accumulates over its pipeline.microbatches; leave it 1");
  }
  if (spec.precision() != v1::FP32 && spec.precision() != v1::TF32) {
    return FieldError("precision", "pipeline trains in fp32 (or tf32) only");
  }
  if (spec.has_distill()) return FieldError("distill", "not supported with strategy pipeline");
  if (pipeline.memory_bytes_size() > 0) {
    if (pipeline.memory_bytes_size() != stages) {
      return FieldError("pipeline.memory", absl::StrCat(pipeline.memory_bytes_size(), " sizes for ",
                                                        stages, " stages"));
    }
    if (spec.resources().memory_bytes() > 0) {
      return FieldError("pipeline.memory",
                        "give memory per stage here or per rank in resources.memory, not both");
    }
    for (int s = 0; s < stages; ++s) {
      if (pipeline.memory_bytes(s) < kMinTaskMemoryBytes) {
        return TooLittleMemory(absl::StrCat("pipeline.memory[", s, "]"), pipeline.memory_bytes(s));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateDistill(const v1::JobSpec& spec) {
  if (!spec.has_distill()) return absl::OkStatus();
  const v1::DistillSpec& distill = spec.distill();
  if (distill.teacher().empty()) return FieldError("distill.teacher", "must not be empty");
  if (absl::Status s = CheckAbsolute("distill.teacher", distill.teacher()); !s.ok()) return s;
  if (!(distill.temperature() > 0) || !std::isfinite(distill.temperature())) {
    return FieldError("distill.temperature", "must be > 0");
  }
  if (!(distill.alpha() >= 0 && distill.alpha() <= 1)) {
    return FieldError("distill.alpha", "must be in [0, 1]");
  }
  // The teacher's targets are a distribution over classes.
  if (spec.loss() != "cross_entropy") {
    return FieldError("distill",
                      absl::StrCat("only with loss cross_entropy, not '", spec.loss(), "'"));
  }
  return absl::OkStatus();
}

absl::Status ValidateOptimizer(const v1::OptimizerSpec& opt) {
  if (opt.name() != "sgd" && opt.name() != "adam" && opt.name() != "adamw") {
    return FieldError("optimizer.name", absl::StrCat("unknown optimizer '", opt.name(),
                                                     "', expected sgd, adam or adamw"));
  }
  if (!(opt.lr() > 0)) return FieldError("optimizer.lr", "must be > 0");
  if (!(opt.momentum() >= 0)) return FieldError("optimizer.momentum", "must be >= 0");
  if (opt.nesterov() && (opt.name() != "sgd" || opt.momentum() <= 0)) {
    return FieldError("optimizer.nesterov", "needs optimizer sgd with momentum > 0");
  }
  if (!(opt.weight_decay() >= 0)) return FieldError("optimizer.weight_decay", "must be >= 0");
  if (!(opt.beta1() >= 0 && opt.beta1() < 1)) {
    return FieldError("optimizer.betas[0]", "must be in [0, 1)");
  }
  if (!(opt.beta2() >= 0 && opt.beta2() < 1)) {
    return FieldError("optimizer.betas[1]", "must be in [0, 1)");
  }
  if (!(opt.eps() >= 0)) return FieldError("optimizer.eps", "must be >= 0");
  const v1::LrSchedule& schedule = opt.schedule();
  if (schedule.name() != "constant" && schedule.name() != "cosine") {
    return FieldError("optimizer.schedule.name", absl::StrCat("unknown schedule '", schedule.name(),
                                                              "', expected constant or cosine"));
  }
  if (schedule.warmup_steps() < 0) {
    return FieldError("optimizer.schedule.warmup_steps", "must be >= 0");
  }
  if (!(schedule.min_lr() >= 0)) return FieldError("optimizer.schedule.min_lr", "must be >= 0");
  if (schedule.min_lr() > opt.lr()) {
    return FieldError("optimizer.schedule.min_lr", "must be <= optimizer.lr");
  }
  return absl::OkStatus();
}

}  // namespace

namespace {

// A task's cpus (0 = unset) and memory (0 = unset) under `path`.
absl::Status ValidateTaskResources(double cpus, int64_t memory_bytes, const std::string& path) {
  if (!(cpus >= 0) || cpus > kMaxTaskCpus) {
    return FieldError(path + ".cpus", absl::StrCat("must be > 0 and <= ", kMaxTaskCpus));
  }
  if (memory_bytes < 0 || (memory_bytes > 0 && memory_bytes < kMinTaskMemoryBytes)) {
    return TooLittleMemory(path + ".memory", memory_bytes);
  }
  return absl::OkStatus();
}

absl::Status ValidateParameterServers(const v1::ParameterServerSpec& ps) {
  const std::string path = "parameter_servers";
  if (ps.shards() < 1 || ps.shards() > kMaxParameterServerShards) {
    return FieldError(path + ".shards",
                      absl::StrCat("must be between 1 and ", kMaxParameterServerShards));
  }
  if (ps.mode() != "sync" && ps.mode() != "async") {
    return FieldError(path + ".mode", absl::StrCat("must be sync or async, got '", ps.mode(), "'"));
  }
  if (ps.mode() == "sync" && ps.max_staleness() != 0) {
    return FieldError(path + ".max_staleness", "only with mode async");
  }
  if (ps.mode() == "async" && ps.max_staleness() < 1) {
    return FieldError(path + ".max_staleness", "must be >= 1");
  }
  if (ps.dense() != "shards" && ps.dense() != "allreduce") {
    return FieldError(path + ".dense",
                      absl::StrCat("must be shards or allreduce, got '", ps.dense(), "'"));
  }
  if (ps.slots() < 1) return FieldError(path + ".slots", "must be >= 1");
  if (absl::Status s = ValidateTaskResources(0, ps.memory_bytes(), path); !s.ok()) return s;
  return absl::OkStatus();
}

}  // namespace

namespace {

// A pipeline's replicas split the batch (its stages all see their replica's share); the other
// strategies' workers do.
int32_t BatchSplits(const JobSpec& spec) {
  return spec.strategy() == v1::PIPELINE
             ? spec.workers().max() / std::max(1, spec.pipeline().stages())
             : spec.workers().max();
}

// The job's name, strategy, workers and resources, and the strategy's own section.
absl::Status ValidateShape(const JobSpec& spec) {
  if (spec.name().empty()) return FieldError("name", "required");
  if (!IsValidName(spec.name())) return FieldError("name", absl::StrCat("must match ", kNameRule));

  const v1::Strategy strategy = spec.strategy();
  if (strategy != v1::SINGLE && strategy != v1::DATA_PARALLEL && strategy != v1::PARAMETER_SERVER &&
      strategy != v1::PIPELINE) {
    return FieldError("strategy", "set single, data_parallel, parameter_server or pipeline");
  }
  const v1::WorkerRange& workers = spec.workers();
  if (workers.min() < 1) return FieldError("workers.min", "must be >= 1");
  if (workers.min() > workers.max()) return FieldError("workers", "min must be <= max");
  if (strategy == v1::SINGLE && workers.max() != 1) {
    return FieldError("workers", "strategy single runs exactly 1 worker");
  }
  if (spec.resources().gpus_per_worker() < 0) {
    return FieldError("resources.gpus_per_worker", "must be >= 0");
  }
  if (absl::Status s = ValidateTaskResources(spec.resources().cpus(),
                                             spec.resources().memory_bytes(), "resources");
      !s.ok()) {
    return s;
  }
  if (spec.has_parameter_servers() && strategy != v1::PARAMETER_SERVER) {
    return FieldError("parameter_servers", "only with strategy parameter_server");
  }
  if (strategy == v1::PARAMETER_SERVER) {
    absl::Status status = ValidateParameterServers(spec.parameter_servers());
    if (!status.ok()) return status;
    if (spec.parameter_servers().dense() == "allreduce" &&
        spec.model().builtin() != "embedding_mlp") {
      return FieldError("parameter_servers.dense",
                        "allreduce keeps only embedding tables on the shards, and only model "
                        "embedding_mlp has them; use strategy: data_parallel");
    }
  }

  if (spec.has_pipeline() && strategy != v1::PIPELINE) {
    return FieldError("pipeline", "only with strategy pipeline");
  }
  return absl::OkStatus();
}

// The batch: that it divides across the workers (a pipeline's replicas) and its micro-batches.
absl::Status ValidateBatch(const JobSpec& spec) {
  if (spec.batch_size() <= 0) return FieldError("batch_size", "must be > 0");
  const v1::Strategy strategy = spec.strategy();
  const int32_t splits = BatchSplits(spec);
  const char* split_unit =
      strategy == v1::PIPELINE ? " replicas (workers / pipeline.stages)" : " workers";
  if (strategy != v1::SINGLE && spec.batch_size() % splits != 0) {
    return FieldError("batch_size", absl::StrCat(spec.batch_size(), " does not divide across ",
                                                 splits, split_unit));
  }
  if (strategy == v1::PIPELINE) {
    const int32_t share = spec.batch_size() / splits;
    if (share % spec.pipeline().microbatches() != 0) {
      return FieldError("pipeline.microbatches",
                        absl::StrCat(spec.pipeline().microbatches(),
                                     " micro-batches do not divide a replica's batch of ", share,
                                     " samples (batch_size / replicas)"));
    }
  }
  return absl::OkStatus();
}

// cuda_graph: a step a graph can repeat. What it captures runs again unchanged, so the step
// must take the same shapes every time and leave no decision to the host: one rank on a GPU, no
// loss scale (fp16 skips an update on the host's word), micro-batches of one size.
absl::Status ValidateCudaGraph(const JobSpec& spec) {
  if (!spec.cuda_graph()) return absl::OkStatus();
  if (spec.resources().gpus_per_worker() <= 0) {
    return FieldError("cuda_graph", "needs GPUs (resources.gpus_per_worker > 0)");
  }
  if (spec.strategy() != v1::SINGLE) {
    return FieldError("cuda_graph",
                      "only with strategy single: the collectives of data_parallel and pipeline, "
                      "and the calls of parameter_server, are issued and waited for by the host "
                      "every step");
  }
  if (spec.precision() == v1::FP16) {
    return FieldError("cuda_graph",
                      "not with precision fp16: its loss scale decides on the host, every step, "
                      "whether the update applies; use bf16");
  }
  if (spec.accumulate_steps() > 1 && spec.batch_size() % spec.accumulate_steps() != 0) {
    return FieldError("cuda_graph", absl::StrCat("accumulate_steps ", spec.accumulate_steps(),
                                                 " must divide batch_size ", spec.batch_size(),
                                                 ": a graph takes micro-batches of one size"));
  }
  return absl::OkStatus();
}

// The optimizer, loss, distillation, precision and length of training.
absl::Status ValidateTraining(const JobSpec& spec) {
  absl::Status status = ValidateOptimizer(spec.optimizer());
  if (!status.ok()) return status;
  if (spec.loss() != "cross_entropy" && spec.loss() != "mse") {
    return FieldError(
        "loss", absl::StrCat("unknown loss '", spec.loss(), "', expected cross_entropy or mse"));
  }
  status = ValidateDistill(spec);
  if (!status.ok()) return status;
  if (spec.precision() == v1::FP16) {
    // float16 on a CPU is emulated and slow, and a job that asked for it must not quietly train
    // in another precision: refused here rather than failed on a worker.
    if (spec.resources().gpus_per_worker() <= 0) {
      return FieldError("precision",
                        "fp16 needs GPUs (resources.gpus_per_worker > 0); on CPUs use bf16");
    }
    if (spec.strategy() == v1::PARAMETER_SERVER) {
      return FieldError(
          "precision", "fp16 (with loss scaling) is not supported with parameter_server; use bf16");
    }
  }

  if (spec.max_steps() < 0) return FieldError("max_steps", "must be >= 0");
  if (spec.epochs() < 0) return FieldError("epochs", "must be >= 0");
  if (spec.max_steps() == 0 && spec.epochs() == 0) {
    return FieldError("max_steps", "set max_steps or epochs");
  }
  if (spec.stop_at_step() < 0) return FieldError("stop_at_step", "must be >= 0");
  if (spec.max_steps() > 0 && spec.stop_at_step() > spec.max_steps()) {
    return FieldError("stop_at_step",
                      absl::StrCat("must be <= max_steps (", spec.max_steps(), ")"));
  }

  return absl::OkStatus();
}

// Where checkpoints go, who they are shared with, how often and how many are kept.
absl::Status ValidateCheckpoint(const JobSpec& spec) {
  const v1::CheckpointSpec& ckpt = spec.checkpoint();
  if (!ckpt.uri().empty()) {
    absl::StatusOr<Uri> uri = ParseUri(ckpt.uri());
    if (!uri.ok()) return FieldError("checkpoint.uri", uri.status().message());
  }
  if (ckpt.share_with_size() > kMaxShareWith) {
    return FieldError("checkpoint.share_with", absl::StrCat("at most ", kMaxShareWith, " users"));
  }
  for (int i = 0; i < ckpt.share_with_size(); ++i) {
    const std::string& user = ckpt.share_with(i);
    if (user.empty() || user.size() > 128 ||
        std::any_of(user.begin(), user.end(), [](char c) { return c >= 0 && c < 0x20; })) {
      return FieldError(absl::StrCat("checkpoint.share_with[", i, "]"),
                        "a user name (1 to 128 characters) or \"*\"");
    }
  }
  if (ckpt.every_steps() < 0) return FieldError("checkpoint.every_steps", "must be >= 0");
  if (ckpt.keep_last() < 1) return FieldError("checkpoint.keep_last", "must be >= 1");

  return absl::OkStatus();
}

// Restarts and limits of every job.
absl::Status ValidateLimits(const JobSpec& spec) {
  const v1::RestartPolicy& restart = spec.restart();
  if (restart.max_failures() < 0) return FieldError("restart.max_failures", "must be >= 0");
  if (restart.has_max_preemptions() && restart.max_preemptions() < 0) {
    return FieldError("restart.max_preemptions", "must be >= 0");
  }
  if (restart.max_infrastructure_errors() < 0) {
    return FieldError("restart.max_infrastructure_errors", "must be >= 0");
  }
  if (spec.max_runtime_seconds() < 0) return FieldError("max_runtime", "must be >= 0");
  if (!spec.queue().empty() && !IsValidName(spec.queue())) {
    return FieldError("queue", absl::StrCat("must match ", kNameRule));
  }
  if (spec.stall_timeout_seconds() < 1) return FieldError("stall_timeout", "must be at least 1s");
  return absl::OkStatus();
}

// The trainer loop's own settings.
absl::Status ValidateLoopLimits(const JobSpec& spec) {
  if (spec.log_every_steps() < 1) return FieldError("log_every_steps", "must be > 0");
  if (spec.collective_timeout_seconds() < 1) {
    return FieldError("collective_timeout", "must be at least 1s");
  }
  if (spec.accumulate_steps() < 1) return FieldError("accumulate_steps", "must be > 0");
  // Each rank splits its share of the batch (smallest with the most workers) into micro-batches.
  if (spec.batch_size() / BatchSplits(spec) < spec.accumulate_steps()) {
    return FieldError(
        "accumulate_steps",
        absl::StrCat(spec.accumulate_steps(), " micro-batches do not fit in a rank's ",
                     spec.batch_size() / BatchSplits(spec), " samples"));
  }
  if (spec.bucket_size_mb() < 1) return FieldError("bucket_size_mb", "must be > 0");
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateJobSpec(const JobSpec& spec) {
  if (spec.has_program() || spec.strategy() == v1::PROGRAM) {
    if (spec.name().empty()) return FieldError("name", "required");
    if (!IsValidName(spec.name()))
      return FieldError("name", absl::StrCat("must match ", kNameRule));
    for (auto validate :
         {job_spec_internal::ValidateProgramJob, ValidateCheckpoint, ValidateLimits}) {
      if (absl::Status s = validate(spec); !s.ok()) return s;
    }
    return ValidateTaskResources(spec.resources().cpus(), spec.resources().memory_bytes(),
                                 "resources");
  }
  absl::Status status = ValidateShape(spec);
  if (!status.ok()) return status;
  status = ValidateModel(spec.model());
  if (!status.ok()) return status;
  if (spec.strategy() == v1::PIPELINE) {
    status = ValidatePipeline(spec);
    if (!status.ok()) return status;
  }
  status = ValidateData(spec.data());
  if (!status.ok()) return status;
  status = ValidateCategorical(spec.model(), spec.data());
  if (!status.ok()) return status;
  status = ValidateTokens(spec);
  if (!status.ok()) return status;
  for (auto validate : {ValidateBatch, ValidateTraining, ValidateCudaGraph, ValidateCheckpoint,
                        ValidateLimits, ValidateLoopLimits}) {
    status = validate(spec);
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

bool IsValidName(absl::string_view name) {
  if (name.empty() || name.size() > kMaxNameLength) return false;
  if (name[0] < 'a' || name[0] > 'z') return false;
  for (char c : name) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) return false;
  }
  return true;
}

}  // namespace trainyard
