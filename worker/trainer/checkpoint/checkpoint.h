#ifndef TRAINYARD_WORKER_TRAINER_CHECKPOINT_CHECKPOINT_H_
#define TRAINYARD_WORKER_TRAINER_CHECKPOINT_CHECKPOINT_H_

// Part checkpoint/ of the trainer (worker/trainer/PARTS): checkpoint folders: writing, committing,
// reading back, retiring. It may call coordinator/, model/.
//
// Checkpoints (docs/architecture.md, "Checkpoints"). A checkpoint of step S lives in
// {checkpoint_uri}/step-{S:%012d}/ and holds, G the generation of the attempt that wrote it:
//   model.gG.safetensors      parameters and buffers by module path name
//   optimizer.gG.safetensors  per-parameter state "<param>.<field>" (see OptimizerStateTensors),
//                             metadata {"optimizer": "<name>"}
//   trainer_state.gG.json     TrainerState below
//   MANIFEST.gG.json          written last: {"format": "trainyard-checkpoint/1", "job_id",
//                             "step", "generation", "created_unix_ms",
//                             "objects": [{"name", "size", "sha256"}]}
// Every name carries G, so that an old attempt still writing (cut off from the coordinator, not
// yet fenced) never touches what a newer one wrote; a reader takes the newest attempt's manifest
// (common/storage/checkpoint_layout.h). Checkpoints written before that named their objects
// model.safetensors, optimizer.safetensors, trainer_state.json and MANIFEST.json; they are read.
// A pipeline job's stages each write model.stage-K-gG.safetensors and
// optimizer.stage-K-gG.safetensors instead, and PART-K-gG.json (Options::part); the manifest
// lists every stage's objects, and a reader merges them.
//
// Saving policy: the training thread snapshots (clones; the last save of a run shares them, as
// nothing updates them any more) every tensor at a step boundary and hands
// the copy to Checkpointer::SaveAsync, which writes and commits it on a background thread. The
// snapshot is the only copy: each safetensors object is sent from the snapshot's tensors as they
// are (ObjectStore::PutPieces, a small header in front), and the SHA-256 in the manifest comes
// from the pass over the bytes that the store makes anyway (the payload hash of the S3 request
// signature, or the file write), so the background thread reads every byte of a save once to
// hash it and once to send it. (A signed multipart S3 upload also hashes each part, in the same
// pass.) At most one save is in flight. When the next checkpoint falls due while the previous
// one is still uploading, the training thread waits for it at most Options::max_wait (default
// 30 s), and no longer than until it has taken twice the longest of the recent saves and a
// second more (an upload far slower than usual is a store in trouble); if it is still uploading
// then, the new checkpoint is skipped (a warning is logged, the in-flight upload carries on, and
// the next due step tries again), so a slow or unreachable store costs checkpoint frequency,
// never a stall of training. The final save (end of training or a stop)
// always waits. A failed intermediate save is logged and training goes on (its manifest is never
// written, so it is never committed); the caller learns about a failed final save from Wait().
//
// Commits ride out a coordinator restart: a commit that fails in transport is retried with
// exponential backoff for Options::commit_retry_for (60 s) or until the save's give-up time,
// whichever comes first; a refusal (the attempt was fenced off) is never retried. While a commit
// is being retried, a due checkpoint is skipped at once instead of waiting for it.
//
// Save durations: every save that completes (manifest written, and committed when there is a
// coordinator) records how long it took from the snapshot (CheckpointData::snapshot_time) to
// the commit; RecentSaveDurations() returns the last three, from which a stop with a deadline
// judges whether one more save can finish in time.
//
// Objects go through ObjectStore::PutPieces, which the S3 store turns into a parallel multipart
// upload above its threshold (64 MiB). The upload thread runs at nice 10 and, with
// Options::upload_cpus, only on those CPUs; the threads it starts inherit both.
//
// Garbage: with Options::collect_garbage, every step folder under base_uri that is not a
// committed checkpoint (left by an upload that was cut off, or a retired checkpoint whose
// deletion failed) is deleted before the first save and after each commit. Only folders named
// step-*; the exported model under final/ is never touched.

#include <torch/torch.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/backoff.h"
#include "common/clock.h"
#include "common/storage/checkpoint_layout.h"
#include "common/storage/object_store.h"
#include "worker/trainer/coordinator/coordinator_client.h"
#include "worker/trainer/model/model.h"

namespace trainyard::trainer {

inline constexpr char kCheckpointFormat[] = "trainyard-checkpoint/1";

struct TrainerState {
  std::string job_id;
  int64_t generation = 0;
  int64_t step = 0;         // optimizer updates done
  int64_t epoch = 0;        // completed epochs: step / steps_per_epoch
  int64_t data_cursor = 0;  // global samples consumed: step * global_batch_size
  int32_t world_size = 1;
  int64_t global_batch_size = 0;
  int64_t total_steps = 0;
  int64_t seed = 0;
  bool shuffle = true;
  std::string torch_rng_state;  // hex of the default CPU generator's state (TorchRngState())
  std::string lr_schedule;      // "constant" | "cosine"
  double last_lr = 0;           // the lr of the last update; the schedule is a function of step
  // precision: fp16 jobs: the dynamic loss scale and updates since it last changed; 0 otherwise.
  double loss_scale = 0;
  int64_t loss_scale_growth_tracker = 0;
  // parameter_server jobs: how the parameters were laid out over the shards (JSON object, see
  // Strategy::Layout); empty otherwise. Recorded, not needed to resume: the checkpoint holds
  // whole parameters, which any shard count partitions again.
  std::string parameter_servers;
  // pipeline jobs: the stages and the layers each held (JSON object, see Strategy::Layout);
  // empty otherwise. Recorded, not needed to resume: the tensors are named as in the whole model,
  // which any stage count splits again.
  std::string pipeline;
};

std::string EncodeTrainerState(const TrainerState& state);
// INVALID_ARGUMENT for malformed JSON or missing fields.
absl::StatusOr<TrainerState> DecodeTrainerState(absl::string_view json);

// The default CPU generator's state, hex-encoded, and its restore. INVALID_ARGUMENT for a bad
// string. Thread-safe (they take the generator's lock).
std::string TorchRngState();
absl::Status RestoreTorchRngState(const std::string& hex);

// What a checkpoint holds, as snapshotted at a step boundary. Tensors must not alias live
// training state (clone them), except in the last save of a run, which nothing updates until the
// save is over.
struct CheckpointData {
  TrainerState state;
  NamedTensors model;
  NamedTensors optimizer;
  std::string optimizer_name;
  // How long taking the snapshot held up the training thread; part of the save's duration.
  absl::Duration snapshot_time;
};

// A checkpoint read back and verified. Tensors are fresh CPU tensors.
struct LoadedCheckpoint {
  std::string uri;
  TrainerState state;
  std::map<std::string, torch::Tensor> model;
  std::map<std::string, torch::Tensor> optimizer;
  std::string optimizer_name;
};

// Which tensors of a checkpoint a reader keeps, by name: the model's (parameters and buffers)
// and the optimizer's ("<param>.<field>").
struct CheckpointFilter {
  std::function<bool(const std::string&)> model;
  std::function<bool(const std::string&)> optimizer;
};

// Reads the newest manifest of the step folder `step_uri`, then every object it lists, checking
// sizes and SHA-256 before decoding. With `keep`, the model and optimizer objects are read in
// chunks of 8 MiB and only the tensors `keep` accepts are held (a pipeline stage resuming holds its
// own layers, never the whole model); every byte is still hashed. NOT_FOUND for a missing manifest
// or object, DATA_LOSS for a size or hash mismatch, INVALID_ARGUMENT for a malformed manifest,
// state or tensor file; every message names the object. Blocks.
absl::StatusOr<LoadedCheckpoint> ReadCheckpoint(ObjectStore& store, const std::string& step_uri,
                                                const CheckpointFilter* keep = nullptr);

// Writes to the local file `local_path` one safetensors file of every model tensor of the step
// folder `step_uri` (a pipeline's stage objects merged, in their order) with `metadata`: the
// objects are streamed through in chunks of 8 MiB and checked against the manifest's SHA-256 as
// they go, so no process holds the whole model. The file is removed on failure. Errors as
// ReadCheckpoint, UNAVAILABLE when the file cannot be written. Blocks.
absl::Status WriteMergedModel(ObjectStore& store, const std::string& step_uri,
                              const std::map<std::string, std::string>& metadata,
                              const std::string& local_path);

// Fills `targets` (a model's parameters and buffers) from the tensors of the same names in the
// local safetensors file `local_path` (one WriteMergedModel wrote): each is read from where it
// lies in the file straight into its tensor (through a temporary only when the target is not a
// contiguous CPU tensor of the file's dtype), so that memory holds the targets alone, whatever
// the file's size. The file's other tensors are not read. NOT_FOUND for a name the file lacks,
// INVALID_ARGUMENT for another shape or a malformed file, DATA_LOSS for a truncated one,
// UNAVAILABLE when it cannot be read; every message names the file. Blocks.
absl::Status ReadTensorsInto(const std::string& local_path, const NamedTensors& targets);

// The asynchronous writer described at the top of this file. Methods are called from one
// (training) thread.
class Checkpointer {
 public:
  struct Options {
    std::string base_uri;  // task.checkpoint_uri
    int attempts = 4;      // per object Put
    absl::Duration backoff = absl::Milliseconds(200);
    // How long a commit that fails in transport is retried; retries back off from `backoff` up
    // to `max_backoff` apart.
    absl::Duration commit_retry_for = absl::Seconds(60);
    absl::Duration max_backoff = absl::Seconds(2);
    // How long a due checkpoint waits for the one in flight before it is skipped.
    absl::Duration max_wait = absl::Seconds(30);
    // Delete step folders that no committed checkpoint refers to (needs a coordinator and the
    // complete list of this job's committed step folders in `committed`; others are ignored).
    bool collect_garbage = false;
    std::vector<std::string> committed = {};
    // CPUs the upload thread, and the threads it starts, may run on; empty: those of the thread
    // that calls SaveAsync. Keeps serialising, hashing and sending off the cores that train. A
    // CPU set the kernel refuses is logged and ignored.
    std::vector<int> upload_cpus = {};
    // A pipeline's checkpoints (parts > 1): stage `part` of `parts` writes its own layers and
    // their optimizer state (model.stage-{part}-g{generation}.safetensors and the same for
    // optimizer, the tensors named as in the whole model, the generation the attempt's, so that
    // no attempt writes over a key another left), then PART-{part}-g{generation}.json listing
    // them (name, size, sha256). Stage 0 also writes trainer_state.gG.json and, once
    // every other stage has listed its objects of this attempt (it waits up to `parts_wait`),
    // MANIFEST.gG.json over all of them, and commits; the others commit nothing, never skip a save
    // (stage 0 decides which are skipped), and garbage from the step being saved on is left for
    // later (the others may be writing it). No process holds more than its own stage.
    int part = 0;
    int parts = 1;
    absl::Duration parts_wait = absl::Minutes(10);
  };

  // `store` must serve base_uri. `coordinator` may be null (standalone: no commit, no
  // retention). Neither is owned; both must outlive this object.
  Checkpointer(ObjectStore* store, CoordinatorClient* coordinator, const Clock& clock,
               Options options);
  ~Checkpointer();  // waits for a save in flight

  // Waits for the save in flight (if any: at most max_wait or twice the usual save time, not at
  // all while its commit is being retried, or without a bound for a `final_save`), then starts
  // saving `data`, whose commit retries end at `give_up_at` at the latest. Returns false when
  // `data` was skipped because the previous save was still in flight.
  bool SaveAsync(CheckpointData data, bool final_save = false,
                 absl::Time give_up_at = absl::InfiniteFuture()) {
    const int64_t step = data.state.step;
    return SaveAsync(
        step, [&data] { return std::move(data); }, final_save, give_up_at);
  }
  // The same with the snapshot of `step` taken by `snapshot`, only once the save is sure to start
  // (a skipped save costs no copy of the model).
  bool SaveAsync(int64_t step, absl::FunctionRef<CheckpointData()> snapshot,
                 bool final_save = false, absl::Time give_up_at = absl::InfiniteFuture());
  // Waits for the save in flight; returns its outcome (OK when none was started). Errors:
  // UNAVAILABLE (object store), ABORTED / FAILED_PRECONDITION / UNAVAILABLE (commit refused /
  // failed).
  absl::Status Wait();
  // Wait() that gives up at `deadline` (as `clock` tells the time left when called):
  // DEADLINE_EXCEEDED then, and the save goes on (a later Wait() or the destructor joins it).
  absl::Status WaitUntil(absl::Time deadline);

  // Step of the last checkpoint whose manifest was written, -1 if none. Call after Wait().
  int64_t last_saved_step() const { return last_saved_step_; }
  // Step of the last checkpoint this object committed, -1 if none. Thread-safe.
  int64_t last_committed_step() {
    absl::MutexLock lock(&mu_);
    return last_committed_step_;
  }
  // How long the last (up to) three completed saves took, snapshot to commit, oldest first.
  // Failed saves are not counted. Thread-safe.
  std::vector<absl::Duration> RecentSaveDurations() {
    absl::MutexLock lock(&mu_);
    return std::vector<absl::Duration>(recent_durations_.begin(), recent_durations_.end());
  }
  // Checkpoints skipped because the previous one was still in flight.
  int64_t skipped() const { return skipped_; }
  // Whether a save is still being written. Thread-safe.
  bool Uploading() {
    absl::MutexLock lock(&mu_);
    return !upload_done_;
  }

 private:
  absl::Status Save(const CheckpointData& data, absl::Time give_up_at);
  absl::Status PutWithRetries(const std::string& uri, const std::string& bytes);
  // An object Put's retries: options' attempts, from their backoff doubling.
  RetryPolicy StorageRetry() const {
    RetryPolicy policy;
    policy.max_attempts = options_.attempts;
    policy.backoff = options_.backoff;
    return policy;
  }
  // Writes the object made of `pieces`; returns its SHA-256 (hex).
  absl::StatusOr<std::string> PutPiecesWithRetries(const std::string& uri,
                                                   const std::vector<absl::string_view>& pieces);
  void DeleteRetired(const std::string& step_uri);
  void RecordDuration(absl::Duration duration);
  // Deletes every step folder under base_uri that is not in committed_.
  // Deletes uncommitted step folders (for a pipeline, those of steps below keep_from).
  void CollectGarbage(int64_t keep_from);

  static constexpr size_t kRecentSaves = 3;

  ObjectStore* const store_;
  CoordinatorClient* const coordinator_;
  const Clock& clock_;
  const Options options_;

  std::thread upload_;  // the save in flight; joined by Wait()
  absl::Mutex mu_;
  bool upload_done_ ABSL_GUARDED_BY(mu_) = true;
  bool commit_retrying_ ABSL_GUARDED_BY(mu_) = false;  // the save in flight retries its commit
  int64_t last_committed_step_ ABSL_GUARDED_BY(mu_) = -1;
  std::deque<absl::Duration> recent_durations_ ABSL_GUARDED_BY(mu_);
  // Written by the upload thread, read after joining it.
  absl::Status upload_status_;
  int64_t upload_step_ = -1;
  absl::Time upload_started_;  // set before the upload thread starts, read by it
  int64_t last_saved_step_ = -1;
  int64_t skipped_ = 0;
  int64_t skip_logged_step_ = -1;  // the commit being retried that a skip was logged for
  // Step folders of committed, not retired checkpoints; used by the upload thread only (saves
  // never overlap).
  std::set<std::string> committed_;
  bool collected_once_ = false;
};

// Logs that the checkpoint at `uri` cannot be used and why, and reports it as a warning event
// on the job when `coordinator` is not null (best effort: a failed report is only logged).
void ReportSkippedCheckpoint(CoordinatorClient* coordinator, const std::string& uri,
                             const absl::Status& why);

}  // namespace trainyard::trainer

#endif  // TRAINYARD_WORKER_TRAINER_CHECKPOINT_CHECKPOINT_H_
