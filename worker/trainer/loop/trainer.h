#ifndef TRAINYARD_WORKER_TRAINER_LOOP_TRAINER_H_
#define TRAINYARD_WORKER_TRAINER_LOOP_TRAINER_H_

// Part loop/ of the trainer (worker/trainer/PARTS): the two things a trainer process runs: a rank's
// training loop and a shard's serving. It may call checkpoint/, collective/, coordinator/, data/,
// model/, ps/, strategy/.
//
// The training run of one task: load data and model, resume from the newest good checkpoint,
// train, checkpoint, export, report. Free of LibTorch types so that callers need not include it.

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/exit_codes.h"
#include "common/flight_record.h"
#include "common/rpc/ps_tls.h"
#include "trainyard/v1/agent_service.pb.h"
#include "worker/trainer/coordinator/coordinator_client.h"
#include "worker/trainer/coordinator/rendezvous_client.h"
#include "worker/trainer/data/data.h"

namespace trainyard::trainer {

// The file in a task's folder into which the agent writes the deadline of a stop (unix ms,
// decimal, one line) before it sends the trainer SIGTERM.
using ::trainyard::kStopDeadlineFile;

// The deadline in the stop-deadline file at `path`; nullopt when there is no such file or it
// does not hold one (a warning is logged then).
std::optional<absl::Time> ReadStopDeadline(const std::string& path);

// Sets glibc's malloc thresholds so that memory freed at the end of a step (or a checkpoint's
// snapshot, once uploaded) is kept for the next one instead of being faulted in again; not when
// GLIBC_TUNABLES sets them. RunTrainer calls it; benchmarks call it to run as the trainer does.
void KeepStepMemory();

struct TrainerOptions {
  // Null: standalone (no reports; checkpoints are written but neither committed nor retired).
  // Not owned.
  CoordinatorClient* coordinator = nullptr;
  // Where the ranks of a data_parallel attempt meet; required when the task has more than one
  // rank. Not owned.
  RendezvousClient* rendezvous = nullptr;
  // data_parallel: start gradient all-reduces during backward (true) or after it.
  bool overlap_communication = true;
  // When it becomes non-zero the run stops at the next step boundary (after saving a checkpoint
  // of that step if it has a checkpoint URI). Typically set by a signal handler. Not owned.
  const std::atomic<int>* stop_signal = nullptr;
  // Read by rank 0 when the run stops on stop_signal (ReadStopDeadline). With a deadline, the
  // checkpoint of the stop step is skipped when the longest of the last three saves of this run,
  // plus kStopSaveMargin, would not end before it (with no save measured yet it is attempted),
  // and every wait and retry at the stop ends at the deadline. Empty: stops have no deadline.
  std::string stop_deadline_file;
  // How long checkpoint commits, the model report and the final progress report keep retrying
  // while the coordinator is unreachable (a coordinator restart takes seconds).
  absl::Duration coordinator_retry_for = absl::Seconds(60);
  int num_threads = 1;  // torch::set_num_threads
  // The worker's data cache for remote shards (pin_memory is decided by the device; the stores
  // are `stores`).
  DataOptions data;
  // How ranks reach parameter-server shards that serve TLS (the cluster's CA and the name the
  // shards' certificates carry; PsTls::FromEnvironment in the trainer's main).
  PsTls ps_tls;
  // Where the data, the TorchScript modules and the checkpoints are read and written; not owned.
  // Required: RunTrainer fails with FAILED_PRECONDITION without.
  const ObjectStoreResolver* stores = nullptr;
  const Clock* clock = &RealClock::Get();
  absl::Duration report_interval = absl::Seconds(1);
  // Receives the progress lines ("step=... total=... loss=..."), the start line and the end
  // line; default: stdout.
  std::function<void(const std::string&)> print_line;
  // Called on the training thread after each update with the new step count (tests).
  std::function<void(int64_t)> after_step;
  // Called on the training thread before each update with the updates done so far and the step
  // this attempt started from; it may block (a test holding the run at a step, main.cc).
  std::function<void(int64_t step, int64_t attempt_start_step)> before_step;
  // The rank's flight record: the phase it is in, its step, and the collectives and messages of
  // its communicators (StrategyOptions::recorder says which). Not owned; it must outlive
  // RunTrainer. Null: none kept.
  FlightRecorder* recorder = nullptr;
  // Called on the training thread in the data phase before it takes the batch of each update,
  // with the updates done so far and the step this attempt started from; it may block (a test
  // holding a rank in its data read, main.cc).
  std::function<void(int64_t step, int64_t attempt_start_step)> in_data_wait;
  // Called before each point-to-point send (a pipeline's) with its peer and its number among
  // this rank's sends (1, 2, ...: every peer counted), before the send is recorded or issued; it
  // may block (a test holding a rank before a send, main.cc). Only with a recorder: the recording
  // communicator calls it (RecordingOptions::before_send).
  std::function<void(int peer, int64_t send)> before_send;
};

// Added to the longest recent save when judging whether a save fits before a stop's deadline.
inline constexpr absl::Duration kStopSaveMargin = absl::Seconds(1);

struct TrainResult {
  int64_t step = 0;  // updates done, resumed ones included
  int64_t total_steps = 0;
  int64_t start_step = 0;    // step this run resumed from; 0 when fresh
  std::string resumed_from;  // the checkpoint resumed from; empty when fresh
  double first_loss = 0;     // batch loss of this run's first update
  double loss = 0;           // batch loss of the last update
  std::optional<double> val_accuracy;
  // The validation split's mean cross-entropy per prediction (per token for a language model,
  // where val_perplexity is set: the log lines then show exp(val_loss)).
  std::optional<double> val_loss;
  bool val_perplexity = false;
  bool stopped = false;  // stop_signal ended the run before total_steps
  // Rank 0 of a stopped run did not checkpoint the stop step: its save would not have finished
  // before the deadline (a job event says so), or the one before it was still being written.
  bool stop_checkpoint_skipped = false;
  std::string model_uri;  // the exported model; empty when stopped or without checkpoint_uri
  // This rank's seconds over all its updates: in whole steps, and waiting for their batches.
  double step_seconds = 0;
  double data_wait_seconds = 0;
  // Updates replayed from the step's CUDA graph (cuda_graph); 0 without one.
  int64_t graph_replays = 0;
};

// Runs `task` to completion (blocking) on the calling thread plus a data thread, a checkpoint
// thread and, with a coordinator, a report thread (and a communication thread for data_parallel).
// With several ranks, rank 0 checkpoints, exports and reports; every rank trains. Errors,
// classified for ExitCodeForStatus: INVALID_ARGUMENT / NOT_FOUND / UNIMPLEMENTED naming the spec
// field for bad specs, data or models; UNAVAILABLE when the final checkpoint, export or report
// cannot be done or a peer is lost, DEADLINE_EXCEEDED when a collective times out,
// ABORTED / FAILED_PRECONDITION when the attempt was fenced off; INTERNAL for anything
// unexpected. A stop whose deadline passes while a checkpoint is being written still waits for
// that write: the caller ends the process at the deadline if it must (main.cc does).
// It sets LibTorch's global thread count and glibc's malloc thresholds (KeepStepMemory) and
// reseeds LibTorch's process-wide random generator before every update; the ranks of one job may
// run as threads of one process (tests) if their model draws no random numbers (no dropout), since
// they would share that generator.
absl::StatusOr<TrainResult> RunTrainer(const trainyard::v1::Task& task,
                                       const TrainerOptions& options);

}  // namespace trainyard::trainer

#endif  // TRAINYARD_WORKER_TRAINER_LOOP_TRAINER_H_
