#ifndef TRAINYARD_WORKER_TRAINER_LOOP_RUN_H_
#define TRAINYARD_WORKER_TRAINER_LOOP_RUN_H_

// One training run of a task, inside RunTrainer (trainer.h): its state, the loop itself
// (trainer.cc) and what happens around it (run_setup.cc: preparing the data, model, optimizer and
// strategy, resuming, the checkpoint of a stop, validation, the export). Internal to loop/.

#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/storage/object_store.h"
#include "worker/trainer/checkpoint/checkpoint.h"
#include "worker/trainer/coordinator/coordinator_client.h"
#include "worker/trainer/data/data.h"
#include "worker/trainer/data/schedule.h"
#include "worker/trainer/loop/step_graph.h"
#include "worker/trainer/loop/trainer.h"
#include "worker/trainer/model/device_modes.h"
#include "worker/trainer/model/distill.h"
#include "worker/trainer/model/model.h"
#include "worker/trainer/model/precision.h"
#include "worker/trainer/pipeline/strategy.h"
#include "worker/trainer/strategy/strategy.h"

namespace trainyard::trainer::internal {

enum class LossKind { kCrossEntropy, kMse };

// How long the final progress report of a stop without a deadline keeps trying.
inline constexpr absl::Duration kStopReportTime = absl::Seconds(5);

using Steady = std::chrono::steady_clock;

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
  // Enters `phase` in the rank's flight record (TrainerOptions::recorder), if it keeps one.
  void Phase(RankPhase phase) const {
    if (options_.recorder != nullptr) options_.recorder->SetPhase(phase);
  }
  // The step loop (trainer.cc): its state, the run brought to its first step (prepared, resumed,
  // every rank in step), the loop opened (the start line, the checkpointer and reporter, the
  // data), one update, what follows it (the log line and validation), the checkpoint it may
  // save, and the step's times and progress report.
  struct Loop;
  absl::Status Begin();
  void OpenLoop(Loop& loop);
  absl::Status Step(Loop& loop);
  bool ValidationDue(const Loop& loop) const;
  absl::Status AfterStep(Loop& loop);
  // Validate, in the validation phase, its time counted in the loop's.
  absl::Status ValidateInLoop(Loop& loop);
  absl::Status MaybeSave(Loop& loop);
  void Account(Loop& loop, double stepped);
  absl::Status Prepare();
  // The model this rank trains: the whole of spec.model, or a pipeline stage's layers of it.
  absl::StatusOr<std::unique_ptr<Model>> BuildRankModel(int64_t outputs);
  // The model's outputs on `first` (a batch of the data) have the data's shape: the model's
  // output width, or INVALID_ARGUMENT naming the mismatch.
  absl::StatusOr<int64_t> CheckForward(const Batch& first, int64_t outputs);
  void Resume();
  // Rank 0's checkpointer; null on other ranks and without a checkpoint store.
  std::unique_ptr<Checkpointer> MakeCheckpointer(int rank) const;
  // One optimizer update on `batch` (the step after `step`), in `accumulate` micro-batches:
  // through the step's CUDA graph where the job has one (run_graph.cc), else eagerly.
  absl::Status Update(const Batch& batch, int64_t step, int accumulate);
  // The update queued op by op; its loss (on the device) into `loss` where not null.
  absl::Status EagerUpdate(const Batch& batch, int64_t step, int accumulate, torch::Tensor* loss);
  absl::Status UpdateInGraph(const Batch& batch, int64_t step, int accumulate);
  // run_graph.cc: the device's fast paths (DeviceModes: layout, cuDNN autotuning, TF32) chosen
  // and set once the model is on its device; the step's CUDA graph once the optimizer exists.
  absl::Status SetUpDeviceModes();
  absl::Status SetUpStepGraph();
  // After the loop, which ended at `step` (result.stopped if asked to stop): the final or stop
  // checkpoint (rank 0; `checkpointer` null elsewhere), the model's export, the strategy's end,
  // the final progress report (through `reporter` where not null) and the "done" line.
  absl::Status Conclude(int64_t step, double lr, int64_t last_checkpoint_step,
                        Checkpointer* checkpointer, ProgressReporter* reporter,
                        trainyard::v1::JobProgress& progress, TrainResult& result);
  // `last`: no update follows (the final save, or the save at a stop).
  // A pipeline over a TorchScript model, exported by rank 0 to `uri`: the module of
  // model.torchscript, or each file of model.stages as <uri>/<i>.pt. The final checkpoint's model
  // tensors are read once into a local file; each module is then loaded alone and given its
  // tensors from there, so that no process holds more than one module and the checkpoint is
  // read once, whatever the number of files.
  absl::Status ExportScriptFromCheckpoint(int64_t step, const std::string& uri);
  // One model.pt per file of model.stages, <uri>/0.pt, 1.pt, ..., each written by
  // `write(index, path)` and put with PutExportFile, in order, until the first error.
  absl::Status PutStageFiles(const std::string& uri,
                             const std::function<absl::Status(int, const std::string&)>& write);
  // Writes an export into a new local file with `write`, then uploads the file to `uri`: the
  // writer's error as it is, the upload's UNAVAILABLE.
  absl::Status PutExportFile(const std::string& uri,
                             const std::function<absl::Status(const std::string&)>& write);
  CheckpointData Snapshot(int64_t step, double lr, bool last = false);
  // The checkpoint of a stop at `step` (rank 0): within the deadline if the agent gave one.
  void SaveAtStop(Checkpointer& checkpointer, int64_t step, double lr, bool due,
                  std::optional<absl::Time> deadline, TrainResult& result);
  void ReportStopSkip(Checkpointer& checkpointer, int64_t step, const std::string& why);
  absl::Status Export(TrainResult& result);
  // The training shards: the largest one's bytes, all of theirs, and the fewest samples any holds.
  struct ShardSizes {
    int64_t largest = 0;
    int64_t all = 0;
    int64_t fewest = INT64_MAX;
  };
  ShardSizes TrainShardSizes() const;
  // The most shards a window of `window` samples has in hand, shards holding at least `fewest`
  // samples each: a window spans whole shards plus a cut one at each end, and a batch may
  // straddle two windows.
  static int64_t WindowSpan(int64_t window, int64_t fewest);
  // Remote shards: INVALID_ARGUMENT when the shards a window spans, plus those fetched ahead,
  // cannot fit the worker's data cache.
  absl::Status CheckCacheFits() const;
  // Keeps the shards the data order holds at once within the data's share of the task's memory
  // limit (kDataShareOfMemory of what the model leaves of Task.memory_limit_bytes): the default
  // order over more data than that gets a window (shuffle_window_), logged and reported as a job
  // event; INVALID_ARGUMENT naming data.shuffle_window when not even one batch's window fits.
  // Under a limit that is not the task's own (a container's), only a warning: the order must not
  // depend on where a rank runs.
  absl::Status FitDataToMemory();
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
  // strategy_ when it is a pipeline's (whose stages run the passes themselves); null otherwise.
  pipeline::PipelineStrategy* pipeline_ = nullptr;
  std::unique_ptr<TrainingData> data_;
  StepPlan plan_;
  // The data order's window: data.shuffle_window, or what FitDataToMemory chose.
  int64_t shuffle_window_ = 0;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Teacher> teacher_;  // null unless the job distils
  // Where the model and each batch live; the CPU unless TrainingDevice finds a GPU for the task.
  torch::Device device_ = torch::kCPU;
  // The forward pass's autocast dtype (nullopt: float32), and the loss scale of fp16 jobs.
  std::optional<torch::ScalarType> autocast_;
  std::optional<LossScaler> scaler_;
  NamedTensors params_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  DeviceModes modes_;
  std::unique_ptr<StepGraph> graph_;  // null unless the job has cuda_graph
  int64_t graph_replays_ = 0;
  std::shared_ptr<ObjectStore> store_;  // null without a checkpoint URI
  int64_t start_step_ = 0;
  std::string resumed_from_;
  // How this attempt started (JobProgress.rendezvous_seconds, checkpoint_load_seconds).
  double rendezvous_seconds_ = 0;
  double checkpoint_load_seconds_ = 0;
};

}  // namespace trainyard::trainer::internal

#endif  // TRAINYARD_WORKER_TRAINER_LOOP_RUN_H_
