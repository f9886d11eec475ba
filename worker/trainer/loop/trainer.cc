#include "worker/trainer/loop/trainer.h"

#include <torch/torch.h>

#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/checkpoint_layout.h"
#include "common/job_spec.h"
#include "common/log.h"
#include "common/object_store.h"
#include "common/uri.h"
#include "worker/trainer/checkpoint/checkpoint.h"
#include "worker/trainer/data/data.h"
#include "worker/trainer/data/device_feed.h"
#include "worker/trainer/data/schedule.h"
#include "worker/trainer/loop/make_strategy.h"
#include "worker/trainer/model/distill.h"
#include "worker/trainer/model/model.h"
#include "worker/trainer/model/optimizer.h"
#include "worker/trainer/model/precision.h"
#include "worker/trainer/strategy/strategy.h"

namespace trainyard::trainer {
namespace {

enum class LossKind { kCrossEntropy, kMse };

// How long the final progress report of a stop without a deadline keeps trying.
constexpr absl::Duration kStopReportTime = absl::Seconds(5);

using Steady = std::chrono::steady_clock;

torch::Tensor ComputeLoss(LossKind kind, const torch::Tensor& out, const torch::Tensor& labels) {
  if (kind == LossKind::kCrossEntropy) {
    return torch::nn::functional::cross_entropy(out, labels);
  }
  return torch::mse_loss(out, labels.reshape_as(out));
}

// Correct predictions and samples among validation samples [first, first + count) (global
// indices), chunk by chunk.
absl::StatusOr<std::pair<int64_t, int64_t>> CountCorrect(Model& model, TrainingData& data,
                                                         Strategy& strategy, int64_t first,
                                                         int64_t count,
                                                         const torch::Device& device) {
  torch::NoGradGuard no_grad;
  model.SetTraining(false);
  int64_t correct = 0;
  constexpr int64_t kChunk = 1024;
  std::vector<int64_t> indices;
  for (int64_t begin = 0; begin < count; begin += kChunk) {
    const int64_t n = std::min(kChunk, count - begin);
    indices.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) indices[static_cast<size_t>(i)] = first + begin + i;
    absl::StatusOr<Batch> batch = data.Gather(indices);
    if (!batch.ok()) return batch.status();
    if (absl::Status s = strategy.BeforeEvaluate(batch->categorical); !s.ok()) return s;
    try {
      torch::Tensor out = model.Forward(
          batch->features.to(device),
          batch->categorical.defined() ? batch->categorical.to(device) : torch::Tensor());
      correct += out.argmax(1).eq(batch->labels.to(device)).sum().item<int64_t>();
    } catch (const std::exception& e) {
      return absl::InvalidArgumentError(
          absl::StrCat("model: validation failed: ", DescribeTorchError(e)));
    }
  }
  model.SetTraining(true);
  return std::make_pair(correct, count);
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

void ApplyCheckpoint(const LoadedCheckpoint& ckpt, Model& model, torch::optim::Optimizer& optimizer,
                     const NamedTensors& params) {
  torch::NoGradGuard no_grad;
  NamedTensors targets = params;
  for (auto& buffer : model.NamedBuffers()) targets.push_back(std::move(buffer));
  for (auto& [name, tensor] : targets) tensor.copy_(ckpt.model.at(name));
  LoadOptimizerState(optimizer, params, ckpt.optimizer);
}

class Run {
 public:
  Run(const trainyard::v1::Task& task, const TrainerOptions& options)
      : task_(task), spec_(task.spec()), options_(options), clock_(*options.clock) {}

  absl::StatusOr<TrainResult> Execute();
  // After a failed Execute: tells the strategy's peers that this rank is gone (best effort), so
  // that parameter-server shards need not wait for it.
  void Leave();

 private:
  void Print(const std::string& line) {
    if (options_.print_line) {
      options_.print_line(line);
    } else {
      std::fwrite(line.data(), 1, line.size(), stdout);
      std::fputc('\n', stdout);
      std::fflush(stdout);
    }
  }
  bool StopRequested() const {
    return options_.stop_signal != nullptr && options_.stop_signal->load() != 0;
  }
  absl::Status Prepare();
  void Resume();
  CheckpointData Snapshot(int64_t step, double lr);
  // The checkpoint of a stop at `step` (rank 0): within the deadline if the agent gave one.
  void SaveAtStop(Checkpointer& checkpointer, int64_t step, double lr, bool due,
                  std::optional<absl::Time> deadline, TrainResult& result);
  void ReportStopSkip(Checkpointer& checkpointer, int64_t step, const std::string& why);
  absl::Status Export(TrainResult& result);
  // Remote shards: INVALID_ARGUMENT when the shards a window spans, plus those fetched ahead,
  // cannot fit the worker's data cache.
  absl::Status CheckCacheFits() const;
  // Measures the validation split (at most data.validation.max_samples of it) into
  // result.val_accuracy: every rank its share, summed over ranks, where the strategy can sum;
  // rank 0 all of it otherwise (the other ranks return at once).
  absl::Status Validate(TrainResult& result);

  const trainyard::v1::Task& task_;
  const trainyard::v1::JobSpec& spec_;
  const TrainerOptions& options_;
  const Clock& clock_;

  LossKind loss_kind_ = LossKind::kCrossEntropy;
  std::unique_ptr<Strategy> strategy_;
  std::unique_ptr<TrainingData> data_;
  StepPlan plan_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Teacher> teacher_;  // null unless the job distils
  // Where the model and each batch live; the CPU unless TrainingDevice finds a GPU for the task.
  torch::Device device_ = torch::kCPU;
  // The forward pass's autocast dtype (nullopt: float32), and the loss scale of fp16 jobs.
  std::optional<torch::ScalarType> autocast_;
  std::optional<LossScaler> scaler_;
  NamedTensors params_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::unique_ptr<ObjectStore> store_;  // null without a checkpoint URI
  int64_t start_step_ = 0;
  std::string resumed_from_;
  // How this attempt started (JobProgress.rendezvous_seconds, checkpoint_load_seconds).
  double rendezvous_seconds_ = 0;
  double checkpoint_load_seconds_ = 0;
};

absl::Status Run::Prepare() {
  if (spec_.loss() == "mse") {
    loss_kind_ = LossKind::kMse;
  } else if (spec_.loss().empty() || spec_.loss() == "cross_entropy") {
    loss_kind_ = LossKind::kCrossEntropy;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("loss: unknown loss '", spec_.loss(), "' (cross_entropy, mse)"));
  }
  StrategyOptions strategy_options;
  strategy_options.rendezvous = options_.rendezvous;
  strategy_options.overlap = options_.overlap_communication;
  const Steady::time_point meet_start = Steady::now();
  absl::StatusOr<std::unique_ptr<Strategy>> strategy = MakeStrategy(task_, strategy_options);
  rendezvous_seconds_ += SecondsSince(meet_start);
  if (!strategy.ok()) return strategy.status();
  strategy_ = *std::move(strategy);

  device_ = TrainingDevice(task_);
  absl::StatusOr<std::optional<torch::ScalarType>> autocast =
      AutocastType(spec_.precision(), device_);
  if (!autocast.ok()) return autocast.status();
  autocast_ = *autocast;
  if (spec_.precision() == trainyard::v1::FP16) scaler_.emplace();
  DataOptions data_options = options_.data;
  data_options.pin_memory = !device_.is_cpu();
  absl::StatusOr<std::unique_ptr<TrainingData>> data = OpenTrainingData(
      spec_.data(), spec_.seed(), loss_kind_ == LossKind::kCrossEntropy, data_options);
  if (!data.ok()) return data.status();
  data_ = *std::move(data);
  const int64_t outputs = data_->outputs();
  absl::StatusOr<StepPlan> plan = PlanSteps(spec_, data_->train_size(), strategy_->world_size());
  if (!plan.ok()) return plan.status();
  plan_ = *plan;
  if (absl::Status fits = CheckCacheFits(); !fits.ok()) return fits;
  strategy_->SetTotalSteps(plan_.total_steps, plan_.end_step);

  absl::StatusOr<std::unique_ptr<Model>> model =
      BuildModel(spec_.model(), spec_.seed(), data_->FeatureWidth(), outputs, data_->max_ids());
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
  if (absl::Status format = ApplyMemoryFormat(*model_, spec_.model().memory_format());
      !format.ok()) {
    return format;
  }
  params_ = model_->NamedParameters();
  if (params_.empty()) return absl::InvalidArgumentError("model: it has no parameters to train");
  // A quick forward pass turns shape mismatches into a clear error before training starts.
  absl::StatusOr<Batch> first = data_->Gather({0});
  if (!first.ok()) return first.status();
  int64_t classes = 0;
  try {
    torch::NoGradGuard no_grad;
    model_->SetTraining(false);
    torch::Tensor out = model_->Forward(
        first->features.to(device_),
        first->categorical.defined() ? first->categorical.to(device_) : torch::Tensor());
    model_->SetTraining(true);
    if (out.dim() != 2) {
      return absl::InvalidArgumentError(absl::StrCat("model: forward() returns shape [",
                                                     absl::StrJoin(out.sizes(), ","),
                                                     "], expected [N, outputs]"));
    }
    if (loss_kind_ == LossKind::kCrossEntropy && out.size(1) < outputs) {
      return absl::InvalidArgumentError(absl::StrCat("data.labels: class id ", outputs - 1,
                                                     " is out of range for the model's ",
                                                     out.size(1), " outputs"));
    }
    classes = out.size(1);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("model: forward() fails on the data: ", DescribeTorchError(e)));
  }
  if (spec_.has_distill()) {
    if (loss_kind_ != LossKind::kCrossEntropy) {
      return absl::InvalidArgumentError("distill: only with loss cross_entropy");
    }
    absl::StatusOr<std::unique_ptr<Teacher>> teacher = Teacher::Load(spec_.distill(), device_);
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

  if (!task_.checkpoint_uri().empty()) {
    absl::StatusOr<std::unique_ptr<ObjectStore>> store = OpenObjectStore(task_.checkpoint_uri());
    if (!store.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint.uri: ", store.status().message()));
    }
    store_ = *std::move(store);
  }
  const Steady::time_point setup_start = Steady::now();
  absl::Status setup = strategy_->Setup(*model_);
  rendezvous_seconds_ += SecondsSince(setup_start);
  return setup;
}

absl::Status Run::CheckCacheFits() const {
  if (!data_->remote()) return absl::OkStatus();
  const trainyard::v1::DataSpec& spec = spec_.data();
  const bool shuffle = !spec.has_shuffle() || spec.shuffle();
  const std::vector<int64_t>& samples = data_->shard_train_samples();
  int64_t largest = 0, all = 0, fewest = INT64_MAX;
  for (size_t k = 0; k < samples.size(); ++k) {
    if (samples[k] == 0) continue;
    largest = std::max(largest, data_->ShardBytes(static_cast<int>(k)));
    all += data_->ShardBytes(static_cast<int>(k));
    fewest = std::min(fewest, samples[k]);
  }
  const int64_t cache = options_.data.cache_bytes;
  if (shuffle && spec.shuffle_window() == 0) {
    if (all <= cache) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("data.shuffle_window: a permutation of all samples needs all ", all,
                     " bytes of the remote shards in the worker's data cache of ", cache,
                     " bytes; set data.shuffle_window to read the shards a few at a time"));
  }
  const int64_t window = shuffle ? spec.shuffle_window() : plan_.global_batch_size;
  // A batch may straddle two windows; a window spans whole shards plus one cut at each end.
  const int64_t span = (2 * window + fewest - 1) / fewest + 1;
  const int64_t ahead = spec.prefetch_shards() > 0 ? spec.prefetch_shards() : 2;
  const int64_t need = std::min(all, (span + ahead) * largest);
  if (need <= cache) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "data.shuffle_window: windows of ", window, " samples span up to ", span, " shards of up to ",
      largest, " bytes; with ", ahead, " fetched ahead (data.prefetch_shards)", " that is ", need,
      " bytes, more than the worker's data cache of ", cache,
      " bytes (trainyard-worker --data_cache_bytes)"));
}

absl::Status Run::Validate(TrainResult& result) {
  const int64_t limit = spec_.data().validation().max_samples();
  const int64_t count =
      limit > 0 ? std::min(limit, data_->validation_size()) : data_->validation_size();
  const bool shared = strategy_->sums_over_ranks();
  const int rank = strategy_->rank();
  const int world = strategy_->world_size();
  if (!shared && rank != 0) return absl::OkStatus();
  const int64_t begin = shared ? count * rank / world : 0;
  const int64_t end = shared ? count * (rank + 1) / world : count;
  absl::StatusOr<std::pair<int64_t, int64_t>> mine =
      CountCorrect(*model_, *data_, *strategy_, data_->train_size() + begin, end - begin, device_);
  if (!mine.ok()) return mine.status();
  std::vector<double> sums = {static_cast<double>(mine->first), static_cast<double>(mine->second)};
  if (shared) {
    absl::StatusOr<std::vector<double>> all = strategy_->SumOverRanks(sums);
    if (!all.ok()) return all.status();
    sums = *std::move(all);
  }
  if (sums[1] > 0) result.val_accuracy = sums[0] / sums[1];
  return absl::OkStatus();
}

void Run::Resume() {
  for (const std::string& uri : task_.resume_checkpoints()) {
    absl::StatusOr<std::unique_ptr<ObjectStore>> store = OpenObjectStore(uri);
    absl::StatusOr<LoadedCheckpoint> ckpt = store.ok()
                                                ? ReadCheckpoint(**store, uri)
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

CheckpointData Run::Snapshot(int64_t step, double lr) {
  const absl::Time start = clock_.Now();
  torch::NoGradGuard no_grad;
  CheckpointData data;
  // Host copies: the checkpoint thread encodes them while training goes on.
  for (const auto& [name, p] : params_) data.model.emplace_back(name, CopyTo(p, torch::kCPU));
  for (const auto& [name, b] : model_->NamedBuffers()) {
    data.model.emplace_back(name, CopyTo(b, torch::kCPU));
  }
  data.optimizer = OptimizerStateTensors(*optimizer_, params_);
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
  s.parameter_servers = strategy_->Layout();
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
  checkpointer.SaveAsync(Snapshot(step, lr), /*final_save=*/true, limit);
  absl::Status saved = checkpointer.WaitUntil(limit);
  if (!saved.ok()) LogWarning("checkpoint at stop failed: ", saved.ToString());
}

absl::Status Run::Export(TrainResult& result) {
  absl::StatusOr<std::string> bytes = model_->Export();
  if (!bytes.ok()) return bytes.status();
  const std::string uri = JoinUri(JoinUri(task_.checkpoint_uri(), kFinalModelFolder), model_->ExportName());
  absl::Status put =
      RetryCall(4, absl::Milliseconds(250), [&] { return store_->Put(uri, *bytes); });
  if (!put.ok()) {
    return absl::UnavailableError(absl::StrCat("model export: ", put.message()));
  }
  result.model_uri = uri;
  LogInfo("model exported to ", uri);
  if (options_.coordinator != nullptr) {
    absl::Status report =
        RetryUntil(clock_, clock_.Now() + options_.coordinator_retry_for, absl::Milliseconds(250),
                   absl::Seconds(2), [&] { return options_.coordinator->ReportModel(uri); });
    if (!report.ok()) {
      return absl::UnavailableError(absl::StrCat("ReportModel: ", report.message()));
    }
  }
  return absl::OkStatus();
}

void Run::Leave() {
  if (strategy_ == nullptr) return;
  if (absl::Status left = strategy_->Finish(); !left.ok()) {
    LogInfo("leaving the other ranks: ", left.ToString());
  }
}

absl::StatusOr<TrainResult> Run::Execute() {
  torch::set_num_threads(std::max(1, options_.num_threads));
  KeepStepMemory();
  absl::Status status = Prepare();
  if (!status.ok()) return status;
  const Steady::time_point load_start = Steady::now();
  Resume();
  if (task_.resume_checkpoints_size() > 0) checkpoint_load_seconds_ = SecondsSince(load_start);
  // Every rank starts from rank 0's parameters, resumed or fresh, and from the same step.
  const Steady::time_point sync_start = Steady::now();
  status = strategy_->SyncState(*model_, start_step_);
  rendezvous_seconds_ += SecondsSince(sync_start);
  if (!status.ok()) return status;
  const int rank = strategy_->rank();
  const int world = strategy_->world_size();
  const int accumulate = std::max(1, spec_.accumulate_steps());

  // The schedule runs to `total`; this job stops at `end` (a search's rung ends earlier).
  const int64_t total = plan_.total_steps;
  const int64_t end = plan_.end_step;
  const int64_t log_every = spec_.log_every_steps();
  const bool has_val = data_->validation_size() > 0 && loss_kind_ == LossKind::kCrossEntropy;
  const trainyard::v1::ValidationSpec& val_spec = spec_.data().validation();
  // Validation is due every every_steps, at each epoch's end with every_epoch, every log line
  // when neither is set, and at the last step.
  auto validation_due = [&](int64_t step) {
    if (!has_val) return false;
    if (step == end) return true;
    if (val_spec.every_epoch() && step % plan_.steps_per_epoch == 0) return true;
    if (val_spec.every_steps() > 0) return step % val_spec.every_steps() == 0;
    return !val_spec.every_epoch() && step % log_every == 0;
  };
  Print(absl::StrFormat(
      "start: model=%s parameters=%d train_samples=%d validation_samples=%d features=%d "
      "batch_size=%d steps_per_epoch=%d total_steps=%d start_step=%d threads=%d rank=%d "
      "world_size=%d end_step=%d",
      model_->Kind(), model_->ParameterCount(), data_->train_size(), data_->validation_size(),
      data_->FeatureWidth(), plan_.global_batch_size, plan_.steps_per_epoch, total, start_step_,
      std::max(1, options_.num_threads), rank, world, end));

  // Ranks hold identical replicas: rank 0 alone saves and reports.
  std::unique_ptr<Checkpointer> checkpointer;
  if (store_ != nullptr && rank == 0) {
    Checkpointer::Options ckpt_options;
    ckpt_options.base_uri = task_.checkpoint_uri();
    ckpt_options.collect_garbage = true;
    ckpt_options.commit_retry_for = options_.coordinator_retry_for;
    ckpt_options.committed.assign(task_.resume_checkpoints().begin(),
                                  task_.resume_checkpoints().end());
    checkpointer =
        std::make_unique<Checkpointer>(store_.get(), options_.coordinator, clock_, ckpt_options);
  }
  std::unique_ptr<ProgressReporter> reporter;
  if (options_.coordinator != nullptr && rank == 0) {
    reporter =
        std::make_unique<ProgressReporter>(options_.coordinator, clock_, options_.report_interval);
  }

  TrainResult result;
  result.total_steps = end;
  result.start_step = start_step_;
  result.resumed_from = resumed_from_;
  trainyard::v1::JobProgress progress;
  progress.set_total_steps(end);
  progress.set_world_size(world);
  progress.set_attempt_start_step(start_step_);
  progress.set_rendezvous_seconds(rendezvous_seconds_);
  progress.set_checkpoint_load_seconds(checkpoint_load_seconds_);

  const bool shuffle = !spec_.data().has_shuffle() || spec_.data().shuffle();
  BatchPrefetcher::Order order;
  order.seed = spec_.seed();
  order.shuffle = shuffle;
  order.window = spec_.data().shuffle_window();
  order.prefetch_shards = spec_.data().prefetch_shards() > 0 ? spec_.data().prefetch_shards() : 2;
  BatchPrefetcher prefetcher(*data_, plan_, order, rank, world, start_step_, end);
  const std::unique_ptr<DeviceFeed> feed = MakeDeviceFeed(prefetcher, device_);
  // The last update's loss, on the device: read (a wait for the GPU) only to print or report it.
  torch::Tensor last_loss;
  auto read_loss = [&] {
    if (last_loss.defined()) result.loss = last_loss.item<double>();
  };
  const int64_t every = spec_.checkpoint().every_steps();
  int64_t step = start_step_;
  int64_t last_checkpoint_step = start_step_;
  double lr = 0;
  double samples_per_s = 0;
  absl::Time interval_start = clock_.Now();
  int64_t interval_steps = 0;
  // The samples the job trained between two log lines: the global batch per update where ranks
  // update together; where they go at their own pace, a rank's share per update any rank made.
  const int64_t rank_share = std::max<int64_t>(1, plan_.global_batch_size / world);
  std::optional<int64_t> interval_updates = strategy_->UpdatesApplied();
  // Where step time goes, summed over the steps since the last report.
  auto seconds_since = [](Steady::time_point t) { return SecondsSince(t); };
  double data_wait_s = 0, step_s = 0, communication_s = 0, checkpoint_s = 0, validation_s = 0;
  int64_t timed_steps = 0;
  absl::Time timing_start = clock_.Now();
  strategy_->TakeCommunicationSeconds();  // the start-up broadcast is not a step's
  bool stop_agreed = false;
  model_->SetTraining(true);
  while (step < end) {
    if (options_.before_step) options_.before_step(step, start_step_);
    // One rank alone may stop at once; several stop together at an update they agreed on.
    if (stop_agreed || (world == 1 && StopRequested())) {
      result.stopped = true;
      break;
    }
    const Steady::time_point step_start = Steady::now();
    std::optional<Batch> batch;
    try {
      batch = feed->Next();
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat("data: moving the batch of step ", step + 1,
                                              " to ", device_.str(), ": ", DescribeTorchError(e)));
    }
    if (!batch.has_value()) {
      absl::Status data_status = prefetcher.status();
      return data_status.ok() ? absl::InternalError("the data thread ended early") : data_status;
    }
    double waited = seconds_since(step_start);
    lr = LearningRateAt(spec_.optimizer(), step, total);
    SetLearningRate(*optimizer_, lr);
    // What the update draws (dropout masks) is a function of the step and the rank alone, so a
    // resumed run draws exactly what the uninterrupted one did, on CPU and GPU alike, and the
    // ranks draw independently of each other.
    torch::manual_seed(StepSeed(spec_.seed(), step, rank));
    // The update's loss stays on the device: reading it here would make the host wait for every
    // step on a GPU.
    torch::Tensor update_loss;
    try {
      // Zeroed in place: the data-parallel strategy keeps each gradient in its bucket, which
      // LibTorch 2's default (set_to_none) would replace with a new tensor every step.
#if TORCH_VERSION_MAJOR >= 2
      optimizer_->zero_grad(/*set_to_none=*/false);
#else
      optimizer_->zero_grad();
#endif
      const int64_t n = batch->features.size(0);
      if (n < accumulate) {
        return absl::InvalidArgumentError(absl::StrCat("accumulate_steps: ", accumulate,
                                                       " micro-batches do not fit in a rank's ", n,
                                                       " samples"));
      }
      // Micro-batch losses weighted by their share add up to the loss of the rank's whole
      // batch, so accumulating changes memory use, not the result.
      for (int m = 0; m < accumulate; ++m) {
        const int64_t begin = n * m / accumulate;
        const int64_t size = n * (m + 1) / accumulate - begin;
        const torch::Tensor categorical = batch->categorical.defined()
                                              ? batch->categorical.narrow(0, begin, size)
                                              : torch::Tensor();
        status = strategy_->BeforeForward(categorical);
        if (!status.ok()) return status;
        const torch::Tensor features = batch->features.narrow(0, begin, size);
        const torch::Tensor labels = batch->labels.narrow(0, begin, size);
        torch::Tensor loss;
        {
          // The forward pass and the loss under autocast, backward outside it: torch.autocast's
          // recipe.
          AutocastGuard autocast(device_, autocast_);
          torch::Tensor out = model_->Forward(features, categorical);
          // The teacher sees the student's micro-batch: its loss is a mean over the same samples.
          loss = teacher_ != nullptr ? teacher_->Loss(out, features, labels)
                                     : ComputeLoss(loss_kind_, out, labels);
        }
        if (accumulate > 1) loss = loss * (static_cast<double>(size) / static_cast<double>(n));
        const torch::Tensor share = loss.detach().to(torch::kDouble);
        update_loss = update_loss.defined() ? update_loss + share : share;
        const bool last = m + 1 == accumulate;
        strategy_->BeforeBackward(last, update_loss, last && StopRequested());
        (scaler_.has_value() ? scaler_->Scale(loss) : loss).backward();
      }
      status = strategy_->AfterBackward(*model_);
      if (!status.ok()) return status;
      // fp16: gradients (all-reduced already, so every rank agrees) back to their true size; an
      // update with an overflow is skipped and the scale lowered.
      const bool overflow = scaler_.has_value() && scaler_->Unscale(params_);
      if (!strategy_->updates_parameters() && !overflow) optimizer_->step();
      if (scaler_.has_value()) scaler_->Update(overflow);
      // The next batch's copy runs while the GPU works through this update.
      const Steady::time_point prefetch_start = Steady::now();
      feed->Prefetch();
      waited += seconds_since(prefetch_start);
    } catch (const std::exception& e) {
      return absl::InvalidArgumentError(
          absl::StrCat("model: training step ", step + 1, " failed: ", DescribeTorchError(e)));
    }
    absl::StatusOr<StepAgreement> agreed = strategy_->EndStep();
    if (!agreed.ok()) return agreed.status();
    stop_agreed = agreed->stop;
    data_wait_s += waited;
    result.data_wait_seconds += waited;
    ++step;
    ++interval_steps;
    last_loss = agreed->loss;
    if (options_.after_step) options_.after_step(step);
    if (step == start_step_ + 1) {
      read_loss();
      result.first_loss = result.loss;
    }

    const int64_t epoch = step / plan_.steps_per_epoch;
    bool validated = false;
    if (step % log_every == 0 || step == end) {
      const absl::Time now = clock_.Now();
      const double seconds = absl::ToDoubleSeconds(now - interval_start);
      int64_t samples = interval_steps * plan_.global_batch_size;
      if (const std::optional<int64_t> updates = strategy_->UpdatesApplied(); updates.has_value()) {
        samples = (*updates - interval_updates.value_or(*updates)) * rank_share;
        interval_updates = updates;
      }
      if (seconds > 0) samples_per_s = static_cast<double>(samples) / seconds;
      interval_start = now;
      interval_steps = 0;
      read_loss();
      std::string line = absl::StrFormat(
          "step=%d total=%d loss=%.8f lr=%g samples_per_s=%.1f "
          "epoch=%d",
          step, total, result.loss, lr, samples_per_s, epoch);
      if (result.val_accuracy.has_value() || validation_due(step)) {
        if (validation_due(step)) {
          const Steady::time_point val_start = Steady::now();
          if (status = Validate(result); !status.ok()) return status;
          validation_s += seconds_since(val_start);
          validated = true;
        }
        if (result.val_accuracy.has_value()) {
          absl::StrAppendFormat(&line, " val_accuracy=%.4f", *result.val_accuracy);
        }
      }
      Print(line);
    }
    if (!validated && validation_due(step)) {
      const Steady::time_point val_start = Steady::now();
      if (status = Validate(result); !status.ok()) return status;
      validation_s += seconds_since(val_start);
      if (result.val_accuracy.has_value()) {
        Print(absl::StrFormat("step=%d val_accuracy=%.4f", step, *result.val_accuracy));
      }
    }
    if (checkpointer != nullptr && every > 0 && step % every == 0 && step < end) {
      const Steady::time_point save_start = Steady::now();
      if (status = strategy_->GatherOptimizerState(step); !status.ok()) return status;
      const bool saving = checkpointer->SaveAsync(step, [&] { return Snapshot(step, lr); });
      checkpoint_s += seconds_since(save_start);
      if (saving) last_checkpoint_step = step;
    }
    const double stepped = seconds_since(step_start);
    step_s += stepped;
    result.step_seconds += stepped;
    communication_s += strategy_->TakeCommunicationSeconds();
    ++timed_steps;
    if (clock_.Now() - timing_start >= options_.report_interval || step == end) {
      read_loss();  // the progress report's
      const double n = static_cast<double>(timed_steps);
      progress.set_data_wait_seconds(data_wait_s / n);
      progress.set_communication_seconds(communication_s / n);
      progress.set_checkpoint_seconds(checkpoint_s / n);
      progress.set_validation_seconds(validation_s / n);
      progress.set_compute_seconds(
          std::max(0.0, step_s - data_wait_s - communication_s - checkpoint_s - validation_s) / n);
      data_wait_s = step_s = communication_s = checkpoint_s = validation_s = 0;
      timed_steps = 0;
      timing_start = clock_.Now();
    }
    if (reporter != nullptr) {
      progress.set_step(step);
      progress.set_loss(result.loss);
      progress.set_samples_per_second(samples_per_s);
      progress.set_epoch(epoch);
      progress.set_has_val_accuracy(result.val_accuracy.has_value());
      progress.set_val_accuracy(result.val_accuracy.value_or(0));
      reporter->Update(progress);
    }
  }
  result.step = step;
  read_loss();
  if (data_->remote()) {
    LogInfo("data: fetched ", data_->bytes_fetched(), " bytes of remote shards into the cache");
  }

  std::optional<absl::Time> deadline;
  if (result.stopped && rank == 0 && !options_.stop_deadline_file.empty()) {
    deadline = ReadStopDeadline(options_.stop_deadline_file);
    if (deadline.has_value()) {
      LogInfo("stopping at step ", step, " with ", absl::FormatDuration(*deadline - clock_.Now()),
              " left before the deadline");
    }
  }
  if (checkpointer != nullptr) {
    const bool due = step > 0 && step != last_checkpoint_step;
    if (result.stopped) {
      SaveAtStop(*checkpointer, step, lr, due, deadline, result);
    } else {
      if (due) {
        status = strategy_->GatherOptimizerState(step);
        if (!status.ok()) {
          return absl::UnavailableError(absl::StrCat("final checkpoint: ", status.message()));
        }
        checkpointer->SaveAsync(Snapshot(step, lr), /*final_save=*/true);
      }
      absl::Status saved = checkpointer->Wait();
      if (!saved.ok()) {
        return absl::UnavailableError(absl::StrCat("final checkpoint: ", saved.message()));
      }
    }
  }
  if (!result.stopped && store_ != nullptr && rank == 0) {
    status = strategy_->GatherModel(step);
    if (!status.ok()) {
      return absl::UnavailableError(absl::StrCat("model export: ", status.message()));
    }
  }
  // Every rank is past its last exchange (and rank 0 past its checkpoint).
  if (absl::Status finished = strategy_->Finish(); !finished.ok()) {
    LogWarning("ending the run with the other ranks: ", finished.ToString());
  }
  if (!result.stopped && store_ != nullptr && rank == 0) {
    status = Export(result);
    if (!status.ok()) return status;
  }
  if (reporter != nullptr) {
    progress.set_step(step);
    progress.set_loss(result.loss);
    progress.set_epoch(step / plan_.steps_per_epoch);
    progress.set_has_val_accuracy(result.val_accuracy.has_value());
    progress.set_val_accuracy(result.val_accuracy.value_or(0));
    // It keeps trying while the coordinator may be restarting; at a stop, only until the
    // process must be gone.
    const absl::Time report_until = !result.stopped ? clock_.Now() + options_.coordinator_retry_for
                                    : deadline.has_value() ? *deadline
                                                           : clock_.Now() + kStopReportTime;
    absl::Status reported = reporter->Finish(progress, report_until);
    if (!reported.ok() && !result.stopped) {
      return absl::UnavailableError(absl::StrCat("final progress report: ", reported.message()));
    }
  }
  std::string done = absl::StrFormat("done: step=%d total=%d loss=%.8f stopped=%s", step, total,
                                     result.loss, result.stopped ? "true" : "false");
  if (result.val_accuracy.has_value()) {
    absl::StrAppendFormat(&done, " val_accuracy=%.4f", *result.val_accuracy);
  }
  if (!result.model_uri.empty()) absl::StrAppend(&done, " model=", result.model_uri);
  Print(done);
  return result;
}

}  // namespace

// glibc's malloc serves blocks of 128 KiB and more with fresh mmap()s until frees raise that
// threshold, and hands freed memory at the top of the heap back to the kernel past a similar
// one. A step allocates and frees the same few MB of activations and gradients every time, so
// with the defaults a run can stay in a state where every step faults those pages in again,
// each zeroed by the kernel (1.5 thousand page faults and a tenth of the step time for the MLP
// of bench/ddp_scaling on one rank). Fixed thresholds keep the memory of a step for the next one:
// blocks below 32 MiB (glibc's maximum for this threshold) come from the heap, and the heap keeps
// up to 1 GiB of free memory. A GLIBC_TUNABLES setting of the malloc thresholds wins.
void KeepStepMemory() {
#ifdef __GLIBC__
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (tunables != nullptr && std::strstr(tunables, "glibc.malloc.") != nullptr) return;
  if (mallopt(M_MMAP_THRESHOLD, 32 << 20) != 1 || mallopt(M_TRIM_THRESHOLD, 1 << 30) != 1) {
    LogWarning("cannot set malloc's mmap and trim thresholds; steps may fault memory in again");
  }
#endif
}

std::optional<absl::Time> ReadStopDeadline(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  int64_t unix_ms = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(text.str()), &unix_ms) || unix_ms <= 0) {
    LogWarning(path, ": not a deadline in unix milliseconds: '", text.str(), "'");
    return std::nullopt;
  }
  return absl::FromUnixMillis(unix_ms);
}

absl::StatusOr<TrainResult> RunTrainer(const trainyard::v1::Task& task,
                                       const TrainerOptions& options) {
  // The spec's defaults, applied where the coordinator applies them at submission (one home:
  // common/job_spec.h); a task made by hand (tests, benchmarks) gets them here. Idempotent.
  trainyard::v1::Task with_defaults = task;
  ApplyJobSpecDefaults(*with_defaults.mutable_spec());
  try {
    Run run(with_defaults, options);
    absl::StatusOr<TrainResult> result = run.Execute();
    if (!result.ok()) run.Leave();
    return result;
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("unexpected: ", DescribeTorchError(e)));
  }
}

}  // namespace trainyard::trainer
