#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/byte_size.h"
#include "common/cgroup.h"
#include "common/log.h"
#include "common/spec/memory_estimate.h"
#include "common/storage/checkpoint_layout.h"
#include "common/storage/object_store.h"
#include "common/storage/uri.h"
#include "worker/trainer/checkpoint/checkpoint.h"
#include "worker/trainer/data/data.h"
#include "worker/trainer/loop/make_strategy.h"
#include "worker/trainer/loop/run.h"
#include "worker/trainer/model/distill.h"
#include "worker/trainer/model/model.h"
#include "worker/trainer/model/optimizer.h"
#include "worker/trainer/model/precision.h"
#include "worker/trainer/model/transformer.h"
#include "worker/trainer/strategy/strategy.h"

namespace trainyard::trainer::internal {
namespace {

// What the model gets right on validation samples: correct predictions, predictions made (a
// language model makes one per position) and the sum of their cross-entropies.
struct Measured {
  double correct = 0;
  double predictions = 0;
  double loss = 0;
};

// Adds what `out` (the model's outputs) gets right of `labels` to `measured`.
void AddMeasured(torch::Tensor out, torch::Tensor labels, Measured& measured) {
  if (out.dim() == 3) {
    out = out.reshape({-1, out.size(2)});
    labels = labels.reshape({-1});
  }
  measured.correct += static_cast<double>(out.argmax(1).eq(labels).sum().item<int64_t>());
  measured.predictions += static_cast<double>(labels.size(0));
  measured.loss += torch::nn::functional::cross_entropy(
                       out.to(torch::kFloat32), labels,
                       torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                       .item<double>();
}

// Validation samples [first, first + count) (global indices), chunk by chunk: at most 1024
// samples, and few enough that a chunk's outputs stay near 16 M values. On a pipeline, every
// stage of a replica calls it with the same samples and the last stage measures.
absl::StatusOr<Measured> Measure(Model& model, TrainingData& data, Strategy& strategy,
                                 int64_t first, int64_t count, const torch::Device& device,
                                 pipeline::PipelineStrategy* stages) {
  torch::NoGradGuard no_grad;
  model.SetTraining(false);
  Measured measured;
  int64_t positions = 1;
  for (int64_t d : data.sample_shape()) positions *= d;
  const bool tokens = data.tokens();
  const int64_t per_sample = tokens ? positions * std::max<int64_t>(1, data.outputs()) : 1;
  const int64_t chunk = std::clamp<int64_t>((int64_t{1} << 24) / per_sample, 1, 1024);
  std::vector<int64_t> indices;
  for (int64_t begin = 0; begin < count; begin += chunk) {
    const int64_t n = std::min(chunk, count - begin);
    indices.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) indices[static_cast<size_t>(i)] = first + begin + i;
    absl::StatusOr<Batch> batch = data.Gather(indices);
    if (!batch.ok()) return batch.status();
    if (absl::Status s = strategy.BeforeEvaluate(batch->categorical); !s.ok()) return s;
    try {
      if (stages != nullptr) {
        absl::StatusOr<torch::Tensor> out = stages->Evaluate(model, batch->features);
        if (!out.ok()) return out.status();
        if (out->defined()) AddMeasured(*out, batch->labels.to(out->device()), measured);
        continue;
      }
      torch::Tensor out = model.Forward(
          batch->features.to(device),
          batch->categorical.defined() ? batch->categorical.to(device) : torch::Tensor());
      AddMeasured(out, batch->labels.to(device), measured);
    } catch (const std::exception& e) {
      return absl::InvalidArgumentError(
          absl::StrCat("model: validation failed: ", DescribeTorchError(e)));
    }
  }
  model.SetTraining(true);
  return measured;
}

// Checks a loaded checkpoint against the live model and optimizer without changing either.
absl::Status CheckCompatible(const LoadedCheckpoint& ckpt, Model& model,
                             torch::optim::Optimizer& optimizer, const NamedTensors& params,
                             const trainyard::v1::JobSpec& spec, const StepPlan& plan) {
  NamedTensors expected = params;
  for (auto& buffer : model.NamedBuffers()) expected.push_back(std::move(buffer));
  for (const auto& [name, tensor] : expected) {
    auto it = ckpt.model.find(name);
    if (it == ckpt.model.end()) {
      return absl::InvalidArgumentError(absl::StrCat("model.safetensors: no tensor '", name, "'"));
    }
    if (it->second.sizes() != tensor.sizes() || it->second.scalar_type() != tensor.scalar_type()) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.safetensors: tensor '", name, "' differs in shape or dtype"));
    }
  }
  const std::string optimizer_name =
      spec.optimizer().name().empty() ? "sgd" : spec.optimizer().name();
  if (ckpt.optimizer_name != optimizer_name) {
    return absl::InvalidArgumentError(absl::StrCat("optimizer.safetensors: state of '",
                                                   ckpt.optimizer_name, "', the job uses '",
                                                   optimizer_name, "'"));
  }
  absl::Status status = CheckOptimizerState(optimizer, params, ckpt.optimizer);
  if (!status.ok()) return status;
  const TrainerState& s = ckpt.state;
  if (s.step < 0 || s.step > plan.total_steps) {
    return absl::InvalidArgumentError(
        absl::StrCat("trainer_state.json: step ", s.step, " outside [0, ", plan.total_steps, "]"));
  }
  if (s.data_cursor != s.step * plan.global_batch_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("trainer_state.json: data cursor ", s.data_cursor, " is not step ", s.step,
                     " times the batch size ", plan.global_batch_size));
  }
  if (s.seed != spec.seed()) {
    return absl::InvalidArgumentError(
        absl::StrCat("trainer_state.json: seed ", s.seed, ", the job uses ", spec.seed()));
  }
  return absl::OkStatus();
}

// A pipeline stage resumes its own layers of a checkpoint (of any stage count, or of a job that
// held the whole model): the optimizer state of parameters it does not hold is dropped.
// The tensors of a checkpoint that a model holding `params` (and its buffers) restores: its
// parameters and buffers by name, and the optimizer state of its parameters ("<param>.<field>").
CheckpointFilter StageFilter(Model& model, const NamedTensors& params) {
  auto params_set = std::make_shared<std::set<std::string>>();
  for (const auto& [name, p] : params) params_set->insert(name);
  auto model_set = std::make_shared<std::set<std::string>>(*params_set);
  for (const auto& [name, b] : model.NamedBuffers()) model_set->insert(name);
  CheckpointFilter filter;
  filter.model = [model_set](const std::string& name) { return model_set->count(name) > 0; };
  filter.optimizer = [params_set](const std::string& name) {
    const size_t dot = name.rfind('.');
    return params_set->count(dot == std::string::npos ? name : name.substr(0, dot)) > 0;
  };
  return filter;
}

void ApplyCheckpoint(const LoadedCheckpoint& ckpt, Model& model, torch::optim::Optimizer& optimizer,
                     const NamedTensors& params) {
  torch::NoGradGuard no_grad;
  NamedTensors targets = params;
  for (auto& buffer : model.NamedBuffers()) targets.push_back(std::move(buffer));
  for (auto& [name, tensor] : targets) tensor.copy_(ckpt.model.at(name));
  LoadOptimizerState(optimizer, params, ckpt.optimizer);
}

}  // namespace

absl::Status Run::Prepare() {
  if (options_.stores == nullptr) {
    return absl::FailedPreconditionError("TrainerOptions.stores: required");
  }
  if (spec_.loss() == "mse") {
    loss_kind_ = LossKind::kMse;
  } else if (spec_.loss().empty() || spec_.loss() == "cross_entropy") {
    loss_kind_ = LossKind::kCrossEntropy;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("loss: unknown loss '", spec_.loss(), "' (cross_entropy, mse)"));
  }
  StrategyOptions strategy_options;
  strategy_options.ps_tls = options_.ps_tls;
  strategy_options.rendezvous = options_.rendezvous;
  strategy_options.overlap = options_.overlap_communication;
  strategy_options.recorder = options_.recorder;
  strategy_options.recording.before_send = options_.before_send;
  const Steady::time_point meet_start = MonotonicNow();
  absl::StatusOr<std::unique_ptr<Strategy>> strategy = MakeStrategy(task_, strategy_options);
  rendezvous_seconds_ += SecondsSince(meet_start);
  if (!strategy.ok()) return strategy.status();
  strategy_ = *std::move(strategy);
  pipeline_ = dynamic_cast<pipeline::PipelineStrategy*>(strategy_.get());

  device_ = TrainingDevice(task_);
  if (pipeline_ != nullptr) {
    // A pipeline stage's activations and gradients travel through host memory to and from it.
    pipeline_->set_device(device_);
    // Its passes of each micro-batch are the flight record's forward and backward phases.
    pipeline_->set_recorder(options_.recorder);
  }
  absl::StatusOr<std::optional<torch::ScalarType>> autocast =
      AutocastType(spec_.precision(), device_);
  if (!autocast.ok()) return autocast.status();
  autocast_ = *autocast;
  if (spec_.precision() == trainyard::v1::FP16) scaler_.emplace();
  DataOptions data_options = options_.data;
  data_options.pin_memory = !device_.is_cpu();
  data_options.stores = options_.stores;
  data_options.token_context = spec_.model().args().context();
  absl::StatusOr<std::unique_ptr<TrainingData>> data = OpenTrainingData(
      spec_.data(), spec_.seed(), loss_kind_ == LossKind::kCrossEntropy, data_options);
  if (!data.ok()) return data.status();
  data_ = *std::move(data);
  const int64_t outputs = data_->outputs();
  absl::StatusOr<StepPlan> plan = PlanSteps(spec_, data_->train_size(), strategy_->data_world());
  if (!plan.ok()) return plan.status();
  plan_ = *plan;
  shuffle_window_ = spec_.data().shuffle_window();
  if (absl::Status fits = FitDataToMemory(); !fits.ok()) return fits;
  if (absl::Status fits = CheckCacheFits(); !fits.ok()) return fits;
  strategy_->SetTotalSteps(plan_.total_steps, plan_.end_step);

  absl::StatusOr<std::unique_ptr<Model>> model = BuildRankModel(outputs);
  if (!model.ok()) return model.status();
  model_ = *std::move(model);
  if (!device_.is_cpu()) {
    try {
      model_->To(device_);
    } catch (const std::exception& e) {
      return absl::UnavailableError(
          absl::StrCat("moving the model to ", device_.str(), ": ", DescribeTorchError(e)));
    }
    LogInfo("training on ", device_.str());
  }
  if (absl::Status modes = SetUpDeviceModes(); !modes.ok()) return modes;
  params_ = model_->NamedParameters();
  if (params_.empty()) return absl::InvalidArgumentError("model: it has no parameters to train");
  // A quick forward pass turns shape mismatches into a clear error before training starts
  // (a pipeline stage's model is the built-in transformer's layers, checked as they are built).
  absl::StatusOr<Batch> first = data_->Gather({0});
  if (!first.ok()) return first.status();
  int64_t classes = 0;
  if (pipeline_ == nullptr) {
    absl::StatusOr<int64_t> checked = CheckForward(*first, outputs);
    if (!checked.ok()) return checked.status();
    classes = *checked;
  }
  if (spec_.has_distill()) {
    if (loss_kind_ != LossKind::kCrossEntropy) {
      return absl::InvalidArgumentError("distill: only with loss cross_entropy");
    }
    absl::StatusOr<std::unique_ptr<Teacher>> teacher =
        Teacher::Load(spec_.distill(), device_, *options_.stores);
    if (!teacher.ok()) return teacher.status();
    teacher_ = *std::move(teacher);
    if (absl::Status s = teacher_->Check(first->features.to(device_), classes); !s.ok()) return s;
    LogInfo("distilling from ", spec_.distill().teacher(), " at temperature ",
            teacher_->temperature(), " with alpha ", teacher_->alpha());
  }
  std::vector<torch::Tensor> tensors;
  for (const auto& [name, p] : params_) tensors.push_back(p);
  absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>> optimizer =
      BuildOptimizer(spec_.optimizer(), tensors);
  if (!optimizer.ok()) return optimizer.status();
  optimizer_ = *std::move(optimizer);
  strategy_->SetOptimizer(optimizer_.get(), params_);
  if (absl::Status graph = SetUpStepGraph(); !graph.ok()) return graph;

  if (!task_.checkpoint_uri().empty()) {
    absl::StatusOr<std::shared_ptr<ObjectStore>> store =
        options_.stores->Open(task_.checkpoint_uri());
    if (!store.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint.uri: ", store.status().message()));
    }
    store_ = *std::move(store);
  }
  const Steady::time_point setup_start = MonotonicNow();
  absl::Status setup = strategy_->Setup(*model_);
  rendezvous_seconds_ += SecondsSince(setup_start);
  return setup;
}

absl::StatusOr<int64_t> Run::CheckForward(const Batch& first, int64_t outputs) {
  try {
    torch::NoGradGuard no_grad;
    model_->SetTraining(false);
    torch::Tensor out = model_->Forward(
        first.features.to(device_),
        first.categorical.defined() ? first.categorical.to(device_) : torch::Tensor());
    model_->SetTraining(true);
    // A language model predicts every position's next token: [N, T, vocab].
    const int64_t dims = data_->tokens() ? 3 : 2;
    if (out.dim() != dims) {
      return absl::InvalidArgumentError(
          absl::StrCat("model: forward() returns shape [", absl::StrJoin(out.sizes(), ","),
                       "], expected ", dims == 2 ? "[N, outputs]" : "[N, T, vocab]"));
    }
    if (loss_kind_ == LossKind::kCrossEntropy && out.size(-1) < outputs) {
      return absl::InvalidArgumentError(
          absl::StrCat(dims == 2 ? "data.labels: class id " : "data.tokens: token id ", outputs - 1,
                       " is out of range for the model's ", out.size(-1), " outputs"));
    }
    return out.size(-1);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("model: forward() fails on the data: ", DescribeTorchError(e)));
  }
}

absl::StatusOr<std::unique_ptr<Model>> Run::BuildRankModel(int64_t outputs) {
  if (pipeline_ == nullptr) {
    return BuildModel(spec_.model(), spec_.seed(), data_->FeatureWidth(), outputs, data_->max_ids(),
                      options_.stores);
  }
  // A TorchScript Sequential is loaded whole, measured, and cut down to this stage's layers;
  // model.stages' files are measured in their archives, and each stage loads its own.
  std::unique_ptr<Model> whole;
  std::vector<int64_t> layer_bytes;
  const int files = spec_.model().stages_size();
  if (files > 0) {
    if (options_.stores == nullptr) {
      return absl::FailedPreconditionError("model.stages: no object stores to read them from");
    }
    // One file per stage whatever their sizes: no need to read them here.
    layer_bytes.assign(static_cast<size_t>(files), 1);
    if (spec_.pipeline().stages() < files && spec_.pipeline().partition_counts_size() == 0 &&
        spec_.pipeline().partition() == "balanced") {
      absl::StatusOr<std::vector<int64_t>> bytes =
          ScriptStageBytes(*options_.stores, spec_.model());
      if (!bytes.ok()) return bytes.status();
      layer_bytes = *std::move(bytes);
    }
  } else if (!spec_.model().torchscript().empty()) {
    absl::StatusOr<std::unique_ptr<Model>> loaded =
        BuildModel(spec_.model(), spec_.seed(), data_->FeatureWidth(), outputs, data_->max_ids(),
                   options_.stores);
    if (!loaded.ok()) return loaded.status();
    absl::StatusOr<std::vector<int64_t>> bytes = SequentialLayerBytes(**loaded);
    if (!bytes.ok()) return bytes.status();
    layer_bytes = *std::move(bytes);
    whole = *std::move(loaded);
  }
  absl::StatusOr<std::vector<pipeline::LayerRange>> ranges = PipelineStages(spec_, layer_bytes);
  if (!ranges.ok()) return ranges.status();
  pipeline_->set_ranges(*ranges);
  const pipeline::LayerRange& mine = (*ranges)[static_cast<size_t>(pipeline_->topology().stage)];
  LogInfo("pipeline: stage ", pipeline_->topology().stage, " of ", pipeline_->topology().stages,
          " (replica ", pipeline_->topology().replica, " of ", pipeline_->topology().replicas,
          ") holds ", files > 0 ? "model.stages files " : "layers ", mine.first, " to ",
          mine.end - 1);
  if (whole != nullptr) {
    absl::StatusOr<std::vector<std::string>> tied = SequentialTies(*whole, *ranges);
    if (!tied.ok()) return tied.status();
    pipeline_->set_tied(*std::move(tied));
    return SequentialStage(std::move(whole), mine.first, mine.end);
  }
  if (files > 0) return LoadScriptStages(*options_.stores, spec_.model(), mine.first, mine.end);
  absl::MutexLock lock(&ModelBuildMutex());
  return BuildTransformerLayers(spec_.model().args(), spec_.seed(), outputs - 1, mine.first,
                                mine.end);
}

int64_t Run::WindowSpan(int64_t window, int64_t fewest) {
  return (2 * window + fewest - 1) / fewest + 1;
}

Run::ShardSizes Run::TrainShardSizes() const {
  ShardSizes sizes;
  const std::vector<int64_t>& samples = data_->shard_train_samples();
  for (size_t k = 0; k < samples.size(); ++k) {
    if (samples[k] == 0) continue;
    sizes.largest = std::max(sizes.largest, data_->ShardBytes(static_cast<int>(k)));
    sizes.all += data_->ShardBytes(static_cast<int>(k));
    sizes.fewest = std::min(sizes.fewest, samples[k]);
  }
  return sizes;
}

absl::Status Run::CheckCacheFits() const {
  if (!data_->remote()) return absl::OkStatus();
  const trainyard::v1::DataSpec& spec = spec_.data();
  const bool shuffle = !spec.has_shuffle() || spec.shuffle();
  const auto [largest, all, fewest] = TrainShardSizes();
  const int64_t cache = options_.data.cache_bytes;
  if (shuffle && shuffle_window_ == 0) {
    if (all <= cache) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("data.shuffle_window: a permutation of all samples needs all ", all,
                     " bytes of the remote shards in the worker's data cache of ", cache,
                     " bytes; set data.shuffle_window to read the shards a few at a time"));
  }
  const int64_t window = shuffle ? shuffle_window_ : plan_.global_batch_size;
  const int64_t span = WindowSpan(window, fewest);
  const int64_t ahead = spec.prefetch_shards();
  const int64_t need = std::min(all, (span + ahead) * largest);
  if (need <= cache) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "data.shuffle_window: windows of ", window, " samples span up to ", span, " shards of up to ",
      largest, " bytes; with ", ahead, " fetched ahead (data.prefetch_shards)", " that is ", need,
      " bytes, more than the worker's data cache of ", cache,
      " bytes (trainyard-worker --data_cache_bytes)"));
}

absl::Status Run::FitDataToMemory() {
  const trainyard::v1::DataSpec& spec = spec_.data();
  const bool shuffle = !spec.has_shuffle() || spec.shuffle();
  const std::vector<int64_t>& samples = data_->shard_train_samples();
  if (!shuffle || shuffle_window_ > 0 || samples.empty()) return absl::OkStatus();
  // The rank's own limit; else the memory the coordinator fixed for the job's data order at its
  // first placement (the same on every attempt, wherever it runs); else, only to warn, the
  // container's limit (the order must not depend on where a rank runs).
  const bool own = task_.memory_limit_bytes() > 0;
  const bool decided = !own && task_.data_memory_bytes() > 0;
  const int64_t limit = own       ? task_.memory_limit_bytes()
                        : decided ? task_.data_memory_bytes()
                                  : OwnCgroupMemoryLimit();
  if (limit <= 0) return absl::OkStatus();
  const auto [largest, all, fewest] = TrainShardSizes();
  // A pipeline rank holds its stage's layers (rank r runs stage r % stages).
  const JobMemory estimate = EstimateJobMemory(spec_, nullptr);
  const int64_t model =
      estimate.stages.empty() || task_.role() != trainyard::v1::TASK_ROLE_RANK
          ? estimate.rank.Total()
          : estimate.stages[static_cast<size_t>(task_.rank()) % estimate.stages.size()].Total();
  const int64_t share = static_cast<int64_t>(
      static_cast<double>(std::max<int64_t>(limit - model, 0)) * kDataShareOfMemory);
  if (all <= share || largest <= 0) return absl::OkStatus();
  const bool reporter = task_.role() == trainyard::v1::TASK_ROLE_RANK && task_.rank() == 0;
  auto report = [&](const std::string& message) {
    LogWarning(message);
    if (!reporter || options_.coordinator == nullptr) return;
    if (absl::Status s = options_.coordinator->ReportEvent(message); !s.ok()) {
      LogWarning("cannot report it: ", s.ToString());
    }
  };
  const std::string over =
      absl::StrCat("data: ", HumanBytes(all), " of shards is more than the ", HumanBytes(share),
                   " the data may hold of ",
                   own       ? "the task's "
                   : decided ? "the job's data memory (its first workers' smallest task memory) of "
                             : "this container's ",
                   HumanBytes(limit), decided ? "" : " memory limit", " (",
                   static_cast<int>(kDataShareOfMemory * 100), " % of what the model's ",
                   HumanBytes(model), " leaves)");
  if (!own && !decided) {
    report(absl::StrCat(over,
                        "; the default order (one permutation of all samples) reads at "
                        "random across all of it and will be slow: set "
                        "data.shuffle_window, or resources.memory for a window chosen to "
                        "fit"));
    return absl::OkStatus();
  }
  // The largest window whose shards (WindowSpan), with those fetched ahead, fit the share: the
  // inverse of WindowSpan for `span` shards.
  const int64_t ahead = spec.prefetch_shards();
  const int64_t span = share / largest - ahead;
  const int64_t window = span >= 2 ? (span - 1) * fewest / 2 : 0;
  if (window < plan_.global_batch_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.shuffle_window: ", over, ", and not even windows of one batch (",
        plan_.global_batch_size, " samples) fit: they span ",
        WindowSpan(plan_.global_batch_size, fewest), " shards of up to ", HumanBytes(largest),
        " with ", ahead,
        " fetched ahead (data.prefetch_shards); pack smaller shards (trainyard data pack "
        "--shard-size), fetch fewer ahead, or raise resources.memory"));
  }
  shuffle_window_ = window;
  report(absl::StrCat(over,
                      ": the default order would read at random across all of it, so "
                      "data.shuffle_window is ",
                      window, " samples (windows of about ", span - 1,
                      " shards); set data.shuffle_window to choose another"));
  return absl::OkStatus();
}

absl::Status Run::Validate(TrainResult& result) {
  const int64_t limit = spec_.data().validation().max_samples();
  const int64_t count =
      limit > 0 ? std::min(limit, data_->validation_size()) : data_->validation_size();
  const bool shared = strategy_->sums_over_ranks();
  // Each share is measured once: by a rank, or by a pipeline replica's stages together.
  const int rank = strategy_->data_rank();
  const int world = strategy_->data_world();
  if (!shared && rank != 0) return absl::OkStatus();
  const int64_t begin = shared ? count * rank / world : 0;
  const int64_t end = shared ? count * (rank + 1) / world : count;
  absl::StatusOr<Measured> mine = Measure(*model_, *data_, *strategy_, data_->train_size() + begin,
                                          end - begin, device_, pipeline_);
  if (!mine.ok()) return mine.status();
  std::vector<double> sums = {mine->correct, mine->predictions, mine->loss};
  if (shared) {
    absl::StatusOr<std::vector<double>> all = strategy_->SumOverRanks(sums);
    if (!all.ok()) return all.status();
    sums = *std::move(all);
  }
  if (sums[1] > 0) {
    result.val_accuracy = sums[0] / sums[1];
    result.val_loss = sums[2] / sums[1];
    result.val_perplexity = data_->tokens();
  }
  return absl::OkStatus();
}

void Run::Resume() {
  // A pipeline stage reads only its own layers and their optimizer state.
  const CheckpointFilter stage_filter = StageFilter(*model_, params_);
  for (const std::string& uri : task_.resume_checkpoints()) {
    absl::StatusOr<std::shared_ptr<ObjectStore>> store = options_.stores->Open(uri);
    absl::StatusOr<LoadedCheckpoint> ckpt =
        store.ok() ? ReadCheckpoint(**store, uri, pipeline_ != nullptr ? &stage_filter : nullptr)
                   : absl::StatusOr<LoadedCheckpoint>(store.status());
    absl::Status status = ckpt.status();
    if (status.ok()) {
      status = CheckCompatible(*ckpt, *model_, *optimizer_, params_, spec_, plan_);
    }
    if (status.ok()) status = RestoreTorchRngState(ckpt->state.torch_rng_state);
    if (!status.ok()) {
      ReportSkippedCheckpoint(options_.coordinator, uri, status);
      continue;
    }
    if (scaler_.has_value() && ckpt->state.loss_scale > 0) {
      // A checkpoint of an fp32 or bf16 run has none: the scale then starts afresh.
      if (status = scaler_->Restore(ckpt->state.loss_scale, ckpt->state.loss_scale_growth_tracker);
          !status.ok()) {
        ReportSkippedCheckpoint(options_.coordinator, uri, status);
        continue;
      }
    }
    ApplyCheckpoint(*ckpt, *model_, *optimizer_, params_);
    start_step_ = ckpt->state.step;
    resumed_from_ = uri;
    LogInfo("resumed from ", uri, " at step ", start_step_);
    return;
  }
  if (task_.resume_checkpoints_size() > 0) {
    LogWarning("no usable checkpoint among ", task_.resume_checkpoints_size(),
               "; starting from scratch");
  }
}

CheckpointData Run::Snapshot(int64_t step, double lr, bool last) {
  const absl::Time start = clock_.Now();
  torch::NoGradGuard no_grad;
  CheckpointData data;
  // Host copies: the checkpoint thread encodes them while training goes on. The last save of a
  // run shares the host tensors instead: nothing updates them while it is written, and a stage
  // of a large model would otherwise hold its state twice at the end.
  // A pipeline's last stage leaves its copies of tied weights (and their state) to the first
  // stage.
  const std::vector<std::string> left_out =
      pipeline_ != nullptr ? pipeline_->saved_elsewhere() : std::vector<std::string>();
  auto saved_elsewhere = [&left_out](const std::string& name) {
    return std::find(left_out.begin(), left_out.end(), name) != left_out.end();
  };
  for (const auto& [name, p] : params_) {
    if (!saved_elsewhere(name)) data.model.emplace_back(name, ToHost(p, last));
  }
  for (const auto& [name, b] : model_->NamedBuffers()) {
    data.model.emplace_back(name, ToHost(b, last));
  }
  data.optimizer = OptimizerStateTensors(*optimizer_, params_, last);
  if (!left_out.empty()) {
    data.optimizer.erase(std::remove_if(data.optimizer.begin(), data.optimizer.end(),
                                        [&](const auto& entry) {
                                          return std::any_of(left_out.begin(), left_out.end(),
                                                             [&](const std::string& name) {
                                                               return absl::StartsWith(entry.first,
                                                                                       name + ".");
                                                             });
                                        }),
                         data.optimizer.end());
  }
  data.optimizer_name = spec_.optimizer().name().empty() ? "sgd" : spec_.optimizer().name();
  TrainerState& s = data.state;
  s.job_id = task_.job_id();
  s.generation = task_.generation();
  s.step = step;
  s.epoch = step / plan_.steps_per_epoch;
  s.data_cursor = step * plan_.global_batch_size;
  s.world_size = strategy_->world_size();
  s.global_batch_size = plan_.global_batch_size;
  s.total_steps = plan_.total_steps;
  s.seed = spec_.seed();
  s.shuffle = !spec_.data().has_shuffle() || spec_.data().shuffle();
  s.torch_rng_state = TorchRngState();
  s.lr_schedule = spec_.optimizer().schedule().name().empty() ? "constant"
                                                              : spec_.optimizer().schedule().name();
  s.last_lr = lr;
  if (scaler_.has_value()) {
    s.loss_scale = scaler_->scale();
    s.loss_scale_growth_tracker = scaler_->growth_tracker();
  }
  (pipeline_ != nullptr ? s.pipeline : s.parameter_servers) = strategy_->Layout();
  data.snapshot_time = clock_.Now() - start;
  return data;
}

void Run::ReportStopSkip(Checkpointer& checkpointer, int64_t step, const std::string& why) {
  // The commits of this run, else the checkpoint it resumed from: what the next attempt gets.
  const int64_t committed = std::max(checkpointer.last_committed_step(),
                                     resumed_from_.empty() ? int64_t{-1} : start_step_);
  const std::string message = absl::StrCat(
      "preemption: checkpoint at step ", step, " skipped: ", why, "; ",
      committed >= 0 ? absl::StrCat("the job resumes from its last committed checkpoint (step ",
                                    committed, ")")
                     : std::string("the job has no committed checkpoint and starts over"));
  LogWarning(message);
  if (options_.coordinator == nullptr) return;
  absl::Status reported = options_.coordinator->ReportEvent(message);
  if (!reported.ok()) LogWarning("cannot report the skipped checkpoint: ", reported.ToString());
}

void Run::SaveAtStop(Checkpointer& checkpointer, int64_t step, double lr, bool due,
                     std::optional<absl::Time> deadline, TrainResult& result) {
  const absl::Time limit = deadline.value_or(absl::InfiniteFuture());
  absl::Status previous = checkpointer.WaitUntil(limit);
  // The previous save's own failure may carry DEADLINE_EXCEEDED too (a commit that timed out):
  // only a save still going means the deadline came.
  if (deadline.has_value() && checkpointer.Uploading()) {
    // Nothing more fits; the process ends at the deadline while that save goes on.
    if (due) {
      result.stop_checkpoint_skipped = true;
      ReportStopSkip(checkpointer, step, absl::StrCat(previous.message(), " at the deadline"));
    } else {
      LogWarning("checkpoint at stop: ", previous.message(), " at the deadline");
    }
    return;
  }
  if (!previous.ok()) LogWarning("checkpoint at stop failed: ", previous.ToString());
  if (!due) return;
  if (deadline.has_value()) {
    const std::vector<absl::Duration> recent = checkpointer.RecentSaveDurations();
    if (!recent.empty()) {
      const absl::Duration longest = *std::max_element(recent.begin(), recent.end());
      const absl::Duration left = *deadline - clock_.Now();
      if (longest + kStopSaveMargin > left) {
        result.stop_checkpoint_skipped = true;
        ReportStopSkip(
            checkpointer, step,
            absl::StrFormat("recent saves took %.1f s, %s", absl::ToDoubleSeconds(longest),
                            left > absl::ZeroDuration()
                                ? absl::StrFormat("%.1f s left before the deadline",
                                                  absl::ToDoubleSeconds(left))
                                : std::string("the deadline has passed")));
        return;
      }
    }
  }
  if (absl::Status gathered = strategy_->GatherOptimizerState(step); !gathered.ok()) {
    result.stop_checkpoint_skipped = true;
    ReportStopSkip(checkpointer, step, std::string(gathered.message()));
    return;
  }
  checkpointer.SaveAsync(Snapshot(step, lr, /*last=*/true), /*final_save=*/true, limit);
  absl::Status saved = checkpointer.WaitUntil(limit);
  if (!saved.ok()) LogWarning("checkpoint at stop failed: ", saved.ToString());
}

void Run::Leave() {
  if (strategy_ == nullptr) return;
  if (absl::Status left = strategy_->Finish(); !left.ok()) {
    LogInfo("leaving the other ranks: ", left.ToString());
  }
}

}  // namespace trainyard::trainer::internal
