#include "worker/trainer/loop/trainer.h"

#include <sys/resource.h>
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
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/log.h"
#include "common/spec/job_spec.h"
#include "common/storage/checkpoint_layout.h"
#include "common/storage/object_store.h"
#include "common/storage/uri.h"
#include "worker/trainer/checkpoint/checkpoint.h"
#include "worker/trainer/data/data.h"
#include "worker/trainer/data/device_feed.h"
#include "worker/trainer/data/schedule.h"
#include "worker/trainer/loop/run.h"
#include "worker/trainer/model/distill.h"
#include "worker/trainer/model/model.h"
#include "worker/trainer/model/optimizer.h"
#include "worker/trainer/model/precision.h"
#include "worker/trainer/pipeline/plan.h"
#include "worker/trainer/pipeline/strategy.h"
#include "worker/trainer/strategy/strategy.h"

namespace trainyard::trainer {
namespace internal {
namespace {

torch::Tensor ComputeLoss(LossKind kind, const torch::Tensor& out, const torch::Tensor& labels) {
  if (kind == LossKind::kCrossEntropy) {
    // A language model's [N, T, vocab] logits: the mean over every position's next token.
    if (out.dim() == 3) {
      return torch::nn::functional::cross_entropy(out.reshape({-1, out.size(2)}),
                                                  labels.reshape({-1}));
    }
    return torch::nn::functional::cross_entropy(out, labels);
  }
  return torch::mse_loss(out, labels.reshape_as(out));
}

// The last validation's figures for a log line: " val_accuracy=A val_loss=L" (and
// " val_perplexity=P" for a language model); empty before the first.
std::string ValidationFields(const TrainResult& result) {
  if (!result.val_accuracy.has_value()) return "";
  std::string out = absl::StrFormat(" val_accuracy=%.4f", *result.val_accuracy);
  if (result.val_loss.has_value()) {
    absl::StrAppendFormat(&out, " val_loss=%.4f", *result.val_loss);
    if (result.val_perplexity) {
      absl::StrAppendFormat(&out, " val_perplexity=%.2f", std::exp(*result.val_loss));
    }
  }
  return out;
}

void SetValidation(const TrainResult& result, trainyard::v1::JobProgress& progress) {
  progress.set_has_val_accuracy(result.val_accuracy.has_value());
  progress.set_val_accuracy(result.val_accuracy.value_or(0));
  progress.set_has_val_loss(result.val_loss.has_value());
  progress.set_val_loss(result.val_loss.value_or(0));
}

// The samples the job trained per second between two log lines: the global batch per update
// where ranks update together; where they go at their own pace (UpdatesApplied has a count), a
// rank's share per update any rank made.
class Throughput {
 public:
  Throughput(const Clock& clock, int64_t global_batch, int world, std::optional<int64_t> updates)
      : clock_(clock),
        global_batch_(global_batch),
        rank_share_(std::max<int64_t>(1, global_batch / world)),
        start_(clock.Now()),
        updates_(updates) {}

  // This rank made an update.
  void Step() { ++steps_; }
  // Samples per second since the last call (or construction), given the count of updates the
  // ranks made so far where the strategy keeps one; nullopt when no time has passed.
  std::optional<double> Measure(std::optional<int64_t> updates) {
    const absl::Time now = clock_.Now();
    const double seconds = absl::ToDoubleSeconds(now - start_);
    int64_t samples = steps_ * global_batch_;
    if (updates.has_value()) {
      samples = (*updates - updates_.value_or(*updates)) * rank_share_;
      updates_ = updates;
    }
    start_ = now;
    steps_ = 0;
    if (seconds <= 0) return std::nullopt;
    return static_cast<double>(samples) / seconds;
  }

 private:
  const Clock& clock_;
  const int64_t global_batch_;
  const int64_t rank_share_;
  absl::Time start_;
  int64_t steps_ = 0;
  std::optional<int64_t> updates_;
};

// Where step time goes, summed over the steps since the last progress report.
struct StepTimes {
  double data_wait = 0;
  double step = 0;  // the whole of each step, the others included
  double communication = 0;
  double checkpoint = 0;
  double validation = 0;
  int64_t steps = 0;

  // Writes the means per step into `progress` (compute: what the others leave of a step) and
  // starts again.
  void ReportInto(trainyard::v1::JobProgress& progress) {
    const double n = static_cast<double>(steps);
    progress.set_data_wait_seconds(data_wait / n);
    progress.set_communication_seconds(communication / n);
    progress.set_checkpoint_seconds(checkpoint / n);
    progress.set_validation_seconds(validation / n);
    progress.set_compute_seconds(
        std::max(0.0, step - data_wait - communication - checkpoint - validation) / n);
    *this = StepTimes();
  }
};

// Each pipeline stage's busy and idle time per update, and its bubble against the schedule's ideal.
void ReportStages(pipeline::PipelineStrategy& stages, const trainyard::v1::PipelineSpec& spec,
                  trainyard::v1::JobProgress& progress) {
  const std::vector<pipeline::StageTime> times = stages.TakeStageTimes();
  if (times.empty()) return;
  progress.clear_pipeline_stages();
  const double ideal = pipeline::IdealBubble(stages.topology().stages, spec.microbatches());
  for (size_t s = 0; s < times.size(); ++s) {
    trainyard::v1::PipelineStageTime& out = *progress.add_pipeline_stages();
    out.set_stage(static_cast<int32_t>(s));
    out.set_busy_seconds(times[s].busy);
    out.set_idle_seconds(times[s].idle);
    const double total = times[s].busy + times[s].idle;
    out.set_bubble(total > 0 ? times[s].idle / total : 0);
    out.set_ideal_bubble(ideal);
  }
}

}  // namespace

absl::Status Run::Update(const Batch& batch, int64_t step, int accumulate) {
  if (graph_ != nullptr) return UpdateInGraph(batch, step, accumulate);
  return EagerUpdate(batch, step, accumulate, nullptr);
}

absl::Status Run::EagerUpdate(const Batch& batch, int64_t step, int accumulate,
                              torch::Tensor* loss_out) {
  // The update's loss stays on the device (the strategy agrees on it with the other ranks):
  // reading it here would make the host wait for every step on a GPU.
  torch::Tensor update_loss;
  try {
    // Zeroed in place: the data-parallel strategy keeps each gradient in its bucket, which
    // LibTorch 2's default (set_to_none) would replace with a new tensor every step.
#if TORCH_VERSION_MAJOR >= 2
    optimizer_->zero_grad(/*set_to_none=*/false);
#else
    optimizer_->zero_grad();
#endif
    if (pipeline_ != nullptr) {
      // The stages run the micro-batches' passes in their schedule (each pass its phase), then
      // combine gradients.
      Phase(RankPhase::kForward);
      absl::Status status = pipeline_->RunPasses(
          *model_, batch.features, batch.labels,
          [this](const torch::Tensor& out, const torch::Tensor& labels) {
            return ComputeLoss(loss_kind_, out, labels);
          },
          StopRequested());
      Phase(RankPhase::kOptimizer);
      if (status.ok()) status = strategy_->AfterBackward(*model_);
      if (!status.ok()) return status;
      optimizer_->step();
      return absl::OkStatus();
    }
    const int64_t n = batch.features.size(0);
    if (n < accumulate) {
      return absl::InvalidArgumentError(absl::StrCat("accumulate_steps: ", accumulate,
                                                     " micro-batches do not fit in a rank's ", n,
                                                     " samples"));
    }
    // Micro-batch losses weighted by their share add up to the loss of the rank's whole
    // batch, so accumulating changes memory use, not the result.
    for (int m = 0; m < accumulate; ++m) {
      Phase(RankPhase::kForward);
      const int64_t begin = n * m / accumulate;
      const int64_t size = n * (m + 1) / accumulate - begin;
      const torch::Tensor categorical =
          batch.categorical.defined() ? batch.categorical.narrow(0, begin, size) : torch::Tensor();
      absl::Status status = strategy_->BeforeForward(categorical);
      if (!status.ok()) return status;
      const torch::Tensor features = batch.features.narrow(0, begin, size);
      const torch::Tensor labels = batch.labels.narrow(0, begin, size);
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
      Phase(RankPhase::kBackward);
      strategy_->BeforeBackward(last, update_loss, last && StopRequested());
      (scaler_.has_value() ? scaler_->Scale(loss) : loss).backward();
    }
    // Waiting for the gradients' all-reduces, the update, and (Step) agreeing on the step.
    Phase(RankPhase::kOptimizer);
    absl::Status status = strategy_->AfterBackward(*model_);
    if (!status.ok()) return status;
    // fp16: gradients (all-reduced already, so every rank agrees) back to their true size; an
    // update with an overflow is skipped and the scale lowered.
    const bool overflow = scaler_.has_value() && scaler_->Unscale(params_);
    if (!strategy_->updates_parameters() && !overflow) optimizer_->step();
    if (scaler_.has_value()) scaler_->Update(overflow);
    if (loss_out != nullptr) *loss_out = update_loss;
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("model: training step ", step + 1, " failed: ", DescribeTorchError(e)));
  }
  return absl::OkStatus();
}

std::unique_ptr<Checkpointer> Run::MakeCheckpointer(int rank) const {
  if (store_ == nullptr) return nullptr;
  Checkpointer::Options ckpt_options;
  if (pipeline_ != nullptr) {
    // Each stage of the first replica saves its own layers; rank 0 (its first stage) commits.
    const pipeline::Topology& t = pipeline_->topology();
    if (t.replica != 0) return nullptr;
    ckpt_options.part = t.stage;
    ckpt_options.parts = t.stages;
    if (rank != 0) {
      ckpt_options.base_uri = task_.checkpoint_uri();
      return std::make_unique<Checkpointer>(store_.get(), nullptr, clock_, ckpt_options);
    }
  } else if (rank != 0) {
    return nullptr;
  }
  ckpt_options.base_uri = task_.checkpoint_uri();
  ckpt_options.collect_garbage = true;
  ckpt_options.commit_retry_for = options_.coordinator_retry_for;
  ckpt_options.committed.assign(task_.resume_checkpoints().begin(),
                                task_.resume_checkpoints().end());
  return std::make_unique<Checkpointer>(store_.get(), options_.coordinator, clock_, ckpt_options);
}

// The step loop's state: what one step reads and leaves for the next.
struct Run::Loop {
  explicit Loop(int world_size) : world(world_size) {}
  // The last update's loss, on the device: read (a wait for the GPU) only to print or report it.
  // Released once read, so that a step reads it at most once.
  void ReadLoss() {
    if (!last_loss.defined()) return;
    result.loss = last_loss.item<double>();
    last_loss.reset();
  }

  int rank = 0;
  int world = 1;
  int accumulate = 1;
  // The schedule runs to `total`; this job stops at `end` (a search's rung ends earlier).
  int64_t total = 0;
  int64_t end = 0;
  int64_t log_every = 1;
  int64_t every = 0;  // checkpoint.every_steps
  bool has_val = false;
  std::unique_ptr<Checkpointer> checkpointer;  // rank 0's
  std::unique_ptr<ProgressReporter> reporter;  // rank 0's, with a coordinator
  TrainResult result;
  trainyard::v1::JobProgress progress;
  std::unique_ptr<BatchPrefetcher> prefetcher;
  std::unique_ptr<DeviceFeed> feed;
  torch::Tensor last_loss;
  int64_t step = 0;
  int64_t last_checkpoint_step = 0;
  double lr = 0;
  double samples_per_s = 0;
  std::optional<Throughput> throughput;  // from the loop's start
  StepTimes times;
  absl::Time timing_start;
  bool stop_agreed = false;
};

absl::Status Run::Begin() {
  torch::set_num_threads(std::max(1, options_.num_threads));
  KeepStepMemory();
  if (absl::Status status = Prepare(); !status.ok()) return status;
  const Steady::time_point load_start = MonotonicNow();
  Resume();
  if (task_.resume_checkpoints_size() > 0) checkpoint_load_seconds_ = SecondsSince(load_start);
  // Every rank starts from rank 0's parameters, resumed or fresh, and from the same step.
  const Steady::time_point sync_start = MonotonicNow();
  absl::Status status = strategy_->SyncState(*model_, start_step_);
  rendezvous_seconds_ += SecondsSince(sync_start);
  return status;
}

void Run::OpenLoop(Loop& loop) {
  loop.rank = strategy_->rank();
  loop.accumulate = std::max(1, spec_.accumulate_steps());
  loop.total = plan_.total_steps;
  loop.end = plan_.end_step;
  loop.log_every = spec_.log_every_steps();
  loop.every = spec_.checkpoint().every_steps();
  loop.has_val = data_->validation_size() > 0 && loss_kind_ == LossKind::kCrossEntropy;
  Print(absl::StrFormat(
      "start: model=%s parameters=%d train_samples=%d validation_samples=%d features=%d "
      "batch_size=%d steps_per_epoch=%d total_steps=%d start_step=%d threads=%d rank=%d "
      "world_size=%d end_step=%d",
      model_->Kind(), model_->ParameterCount(), data_->train_size(), data_->validation_size(),
      data_->FeatureWidth(), plan_.global_batch_size, plan_.steps_per_epoch, loop.total,
      start_step_, std::max(1, options_.num_threads), loop.rank, loop.world, loop.end));
  // Ranks hold identical replicas: rank 0 alone saves and reports.
  loop.checkpointer = MakeCheckpointer(loop.rank);
  if (options_.coordinator != nullptr && loop.rank == 0) {
    loop.reporter =
        std::make_unique<ProgressReporter>(options_.coordinator, clock_, options_.report_interval);
  }
  loop.result.total_steps = loop.end;
  loop.result.start_step = start_step_;
  loop.result.resumed_from = resumed_from_;
  loop.progress.set_total_steps(loop.end);
  loop.progress.set_world_size(loop.world);
  loop.progress.set_attempt_start_step(start_step_);
  loop.progress.set_rendezvous_seconds(rendezvous_seconds_);
  loop.progress.set_checkpoint_load_seconds(checkpoint_load_seconds_);

  BatchPrefetcher::Order order;
  order.seed = spec_.seed();
  order.shuffle = !spec_.data().has_shuffle() || spec_.data().shuffle();
  order.window = shuffle_window_;
  order.prefetch_shards = spec_.data().prefetch_shards();
  // Every stage of a pipeline replica reads that replica's share.
  loop.prefetcher = std::make_unique<BatchPrefetcher>(
      *data_, plan_, order, strategy_->data_rank(), strategy_->data_world(), start_step_, loop.end);
  loop.feed = MakeDeviceFeed(*loop.prefetcher, device_);
  loop.throughput.emplace(clock_, plan_.global_batch_size, loop.world, strategy_->UpdatesApplied());
  loop.step = start_step_;
  if (options_.recorder != nullptr) options_.recorder->SetStep(loop.step);
  loop.last_checkpoint_step = start_step_;
  loop.timing_start = clock_.Now();
  strategy_->TakeCommunicationSeconds();  // the start-up broadcast is not a step's
}

absl::StatusOr<TrainResult> Run::Execute() {
  if (absl::Status status = Begin(); !status.ok()) return status;
  Loop loop(strategy_->world_size());
  OpenLoop(loop);
  model_->SetTraining(true);
  while (loop.step < loop.end) {
    if (options_.before_step) options_.before_step(loop.step, start_step_);
    // One rank alone may stop at once; several stop together at an update they agreed on.
    if (loop.stop_agreed || (loop.world == 1 && StopRequested())) {
      loop.result.stopped = true;
      break;
    }
    const Steady::time_point step_start = MonotonicNow();
    if (absl::Status status = Step(loop); !status.ok()) return status;
    if (absl::Status status = AfterStep(loop); !status.ok()) return status;
    if (absl::Status status = MaybeSave(loop); !status.ok()) return status;
    Account(loop, SecondsSince(step_start));
  }
  Phase(RankPhase::kFinishing);
  loop.result.step = loop.step;
  loop.result.graph_replays = graph_replays_;
  loop.ReadLoss();
  if (absl::Status status =
          Conclude(loop.step, loop.lr, loop.last_checkpoint_step, loop.checkpointer.get(),
                   loop.reporter.get(), loop.progress, loop.result);
      !status.ok()) {
    return status;
  }
  return std::move(loop.result);
}

absl::Status Run::Step(Loop& loop) {
  auto feed_error = [&](int64_t update, const std::exception& e) {
    return absl::InternalError(absl::StrCat("data: moving the batch of step ", update, " to ",
                                            device_.str(), ": ", DescribeTorchError(e)));
  };
  Phase(RankPhase::kData);
  if (options_.in_data_wait) options_.in_data_wait(loop.step, start_step_);
  const Steady::time_point fetch_start = MonotonicNow();
  std::optional<Batch> batch;
  try {
    batch = loop.feed->Next();
  } catch (const std::exception& e) {
    return feed_error(loop.step + 1, e);
  }
  if (!batch.has_value()) {
    absl::Status data_status = loop.prefetcher->status();
    return data_status.ok() ? absl::InternalError("the data thread ended early") : data_status;
  }
  double waited = SecondsSince(fetch_start);
  loop.lr = LearningRateAt(spec_.optimizer(), loop.step, loop.total);
  SetLearningRate(*optimizer_, loop.lr);
  // What the update draws (dropout masks) is a function of the step and the rank alone, so a
  // resumed run draws exactly what the uninterrupted one did, on CPU and GPU alike, and the ranks
  // draw independently of each other.
  torch::manual_seed(StepSeed(spec_.seed(), loop.step, loop.rank));
  if (absl::Status status = Update(*batch, loop.step, loop.accumulate); !status.ok()) {
    return status;
  }
  // The next batch's copy runs while the GPU works through this update.
  const Steady::time_point prefetch_start = MonotonicNow();
  try {
    loop.feed->Prefetch();
  } catch (const std::exception& e) {
    return feed_error(loop.step + 2, e);
  }
  waited += SecondsSince(prefetch_start);
  absl::StatusOr<StepAgreement> agreed = strategy_->EndStep();
  if (!agreed.ok()) return agreed.status();
  loop.stop_agreed = agreed->stop;
  loop.times.data_wait += waited;
  loop.result.data_wait_seconds += waited;
  ++loop.step;
  if (options_.recorder != nullptr) options_.recorder->SetStep(loop.step);
  loop.throughput->Step();
  loop.last_loss = agreed->loss;
  if (options_.after_step) options_.after_step(loop.step);
  if (loop.step == start_step_ + 1) {
    loop.ReadLoss();
    loop.result.first_loss = loop.result.loss;
  }
  return absl::OkStatus();
}

// Validation is due every every_steps, at each epoch's end with every_epoch, every log line when
// neither is set, and at the last step.
bool Run::ValidationDue(const Loop& loop) const {
  if (!loop.has_val) return false;
  const trainyard::v1::ValidationSpec& val_spec = spec_.data().validation();
  if (loop.step == loop.end) return true;
  if (val_spec.every_epoch() && loop.step % plan_.steps_per_epoch == 0) return true;
  if (val_spec.every_steps() > 0) return loop.step % val_spec.every_steps() == 0;
  return !val_spec.every_epoch() && loop.step % loop.log_every == 0;
}

absl::Status Run::AfterStep(Loop& loop) {
  TrainResult& result = loop.result;
  bool validated = false;
  if (loop.step % loop.log_every == 0 || loop.step == loop.end) {
    loop.samples_per_s =
        loop.throughput->Measure(strategy_->UpdatesApplied()).value_or(loop.samples_per_s);
    loop.ReadLoss();
    std::string line = absl::StrFormat(
        "step=%d total=%d loss=%.8f lr=%g samples_per_s=%.1f "
        "epoch=%d",
        loop.step, loop.total, result.loss, loop.lr, loop.samples_per_s,
        loop.step / plan_.steps_per_epoch);
    if (result.val_accuracy.has_value() || ValidationDue(loop)) {
      if (ValidationDue(loop)) {
        if (absl::Status status = ValidateInLoop(loop); !status.ok()) return status;
        validated = true;
      }
      absl::StrAppend(&line, ValidationFields(result));
    }
    Print(line);
  }
  if (!validated && ValidationDue(loop)) {
    if (absl::Status status = ValidateInLoop(loop); !status.ok()) return status;
    if (result.val_accuracy.has_value()) {
      Print(absl::StrCat("step=", loop.step, ValidationFields(result)));
    }
  }
  return absl::OkStatus();
}

absl::Status Run::ValidateInLoop(Loop& loop) {
  Phase(RankPhase::kValidation);
  const Steady::time_point val_start = MonotonicNow();
  absl::Status status = Validate(loop.result);
  loop.times.validation += SecondsSince(val_start);
  return status;
}

absl::Status Run::MaybeSave(Loop& loop) {
  if (loop.checkpointer == nullptr || loop.every <= 0 || loop.step % loop.every != 0 ||
      loop.step >= loop.end) {
    return absl::OkStatus();
  }
  Phase(RankPhase::kCheckpoint);
  const Steady::time_point save_start = MonotonicNow();
  const int64_t step = loop.step;
  if (absl::Status status = strategy_->GatherOptimizerState(step); !status.ok()) return status;
  const double lr = loop.lr;
  const bool saving = loop.checkpointer->SaveAsync(step, [&] { return Snapshot(step, lr); });
  loop.times.checkpoint += SecondsSince(save_start);
  if (saving) loop.last_checkpoint_step = step;
  return absl::OkStatus();
}

void Run::Account(Loop& loop, double stepped) {
  loop.times.step += stepped;
  loop.result.step_seconds += stepped;
  loop.times.communication += strategy_->TakeCommunicationSeconds();
  ++loop.times.steps;
  if (clock_.Now() - loop.timing_start >= options_.report_interval || loop.step == loop.end) {
    loop.ReadLoss();  // the progress report's
    loop.times.ReportInto(loop.progress);
    if (pipeline_ != nullptr) ReportStages(*pipeline_, spec_.pipeline(), loop.progress);
    loop.timing_start = clock_.Now();
  }
  if (loop.reporter != nullptr) {
    loop.progress.set_step(loop.step);
    loop.progress.set_loss(loop.result.loss);
    loop.progress.set_samples_per_second(loop.samples_per_s);
    loop.progress.set_epoch(loop.step / plan_.steps_per_epoch);
    SetValidation(loop.result, loop.progress);
    loop.reporter->Update(loop.progress);
  }
}

absl::Status Run::Conclude(int64_t step, double lr, int64_t last_checkpoint_step,
                           Checkpointer* checkpointer, ProgressReporter* reporter,
                           trainyard::v1::JobProgress& progress, TrainResult& result) {
  const int rank = strategy_->rank();
  const int64_t total = plan_.total_steps;
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
    Phase(RankPhase::kCheckpoint);
    const bool due = step > 0 && step != last_checkpoint_step;
    if (result.stopped) {
      SaveAtStop(*checkpointer, step, lr, due, deadline, result);
    } else {
      if (due) {
        absl::Status status = strategy_->GatherOptimizerState(step);
        if (!status.ok()) {
          return absl::UnavailableError(absl::StrCat("final checkpoint: ", status.message()));
        }
        checkpointer->SaveAsync(Snapshot(step, lr, /*last=*/true), /*final_save=*/true);
      }
      absl::Status saved = checkpointer->Wait();
      if (!saved.ok()) {
        return absl::Status(
            absl::IsPermissionDenied(saved) ? saved.code() : absl::StatusCode::kUnavailable,
            absl::StrCat("final checkpoint: ", saved.message()));
      }
    }
    Phase(RankPhase::kFinishing);
  }
  if (!result.stopped && store_ != nullptr && rank == 0) {
    absl::Status status = strategy_->GatherModel(step);
    if (!status.ok()) {
      return absl::UnavailableError(absl::StrCat("model export: ", status.message()));
    }
  }
  // Every rank is past its last exchange (and rank 0 past its checkpoint).
  if (absl::Status finished = strategy_->Finish(); !finished.ok()) {
    LogWarning("ending the run with the other ranks: ", finished.ToString());
  }
  if (!result.stopped && store_ != nullptr && rank == 0) {
    absl::Status status = Export(result);
    if (!status.ok()) return status;
  }
  if (reporter != nullptr) {
    progress.set_step(step);
    progress.set_loss(result.loss);
    progress.set_epoch(step / plan_.steps_per_epoch);
    SetValidation(result, progress);
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
  absl::StrAppend(&done, ValidationFields(result));
  // The process's peak resident memory: what a pipeline stage, or any rank, needed at most.
  rusage usage{};
  if (getrusage(RUSAGE_SELF, &usage) == 0) {
    absl::StrAppend(&done, " peak_rss_mb=", usage.ru_maxrss / 1024);
  }
  if (!result.model_uri.empty()) absl::StrAppend(&done, " model=", result.model_uri);
  Print(done);
  return absl::OkStatus();
}

}  // namespace internal

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
  // common/spec/job_spec.h); a task made by hand (tests, benchmarks) gets them here. Idempotent.
  trainyard::v1::Task with_defaults = task;
  ApplyJobSpecDefaults(*with_defaults.mutable_spec());
  try {
    internal::Run run(with_defaults, options);
    absl::StatusOr<TrainResult> result = run.Execute();
    if (!result.ok()) run.Leave();
    return result;
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("unexpected: ", DescribeTorchError(e)));
  }
}

}  // namespace trainyard::trainer
