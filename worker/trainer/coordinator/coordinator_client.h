#ifndef TRAINYARD_WORKER_TRAINER_COORDINATOR_COORDINATOR_CLIENT_H_
#define TRAINYARD_WORKER_TRAINER_COORDINATOR_COORDINATOR_CLIENT_H_

// Part coordinator/ of the trainer (worker/trainer/PARTS): the trainer's calls to the coordinator:
// progress, checkpoint commits, the rendezvous store. It may call no other part.
//
// What a trainer tells the coordinator: progress, committed checkpoints, the exported model.
// The interface keeps gRPC out of the training runtime; tests use a fake.

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/backoff.h"
#include "common/clock.h"
#include "trainyard/v1/job.pb.h"

namespace trainyard::trainer {

// One call = one attempt (no retries inside). Errors: UNAVAILABLE / DEADLINE_EXCEEDED for
// transport failures (the coordinator is down or restarting: worth retrying), ABORTED (the gRPC
// client) or FAILED_PRECONDITION when the coordinator refuses the call, e.g. because a newer
// attempt fenced off this generation (never worth retrying). Implementations are thread-safe;
// calls block up to their deadline.
class CoordinatorClient {
 public:
  virtual ~CoordinatorClient() = default;
  virtual absl::Status ReportProgress(const trainyard::v1::JobProgress& progress) = 0;
  // Records the checkpoint of `step` (written to its step folder, CheckpointStepUri of the task's
  // checkpoint URI), snapshotted at `save_started`. Returns the step folders now outside
  // retention, whose objects the caller deletes.
  virtual absl::StatusOr<std::vector<std::string>> CommitCheckpoint(int64_t step,
                                                                    int64_t size_bytes,
                                                                    absl::Time save_started) = 0;
  virtual absl::Status ReportModel(const std::string& uri) = 0;
  // A warning for the job's events (a skipped corrupt checkpoint). Clients that cannot report
  // events drop it.
  virtual absl::Status ReportEvent(const std::string& message) { return absl::OkStatus(); }
};

// A client over trainyard.v1.AgentService on `channel` (grpc_channel.h) that presents job_id,
// generation and rank on every call.
std::unique_ptr<CoordinatorClient> NewGrpcCoordinatorClient(std::shared_ptr<grpc::Channel> channel,
                                                            const std::string& job_id,
                                                            int64_t generation, int32_t rank,
                                                            absl::Duration rpc_timeout);

// Whether a coordinator call that failed with `status` may succeed if repeated: UNAVAILABLE and
// DEADLINE_EXCEEDED (transport), not refusals.
bool IsRetryableCoordinatorError(const absl::Status& status);

// The policy of a coordinator call made to ride out a coordinator restart: retried (with
// IsRetryableCoordinatorError) from `backoff`, doubling up to `max_backoff`, until `give_up_at`.
inline RetryPolicy CoordinatorRetry(absl::Time give_up_at,
                                    absl::Duration backoff = absl::Milliseconds(250),
                                    absl::Duration max_backoff = absl::Seconds(2)) {
  RetryPolicy policy;
  policy.give_up_at = give_up_at;
  policy.backoff = backoff;
  policy.max_backoff = max_backoff;
  return policy;
}

// Sends progress to the coordinator from a background thread, so that a slow or absent
// coordinator never holds up training. The first Update goes out at once (the coordinator
// counts a restarted job as recovered at its first step report); later ones at most once per
// `min_interval`. A transport failure is logged and the latest progress is sent again after
// `min_interval`, for as long as it takes; a refused report is dropped. Thread-safe.
class ProgressReporter {
 public:
  // `client` is not owned and must outlive this object.
  ProgressReporter(CoordinatorClient* client, const Clock& clock, absl::Duration min_interval);
  ~ProgressReporter();  // stops the thread without a final report

  // Records the latest progress; never blocks on the network.
  void Update(const trainyard::v1::JobProgress& progress);

  // Stops the thread and sends `final_progress`, retrying transport failures until `give_up_at`
  // (Retry with CoordinatorRetry). Returns the last error if it never got through. Call at most
  // once.
  absl::Status Finish(const trainyard::v1::JobProgress& final_progress, absl::Time give_up_at);

 private:
  void Loop();
  void Stop();

  CoordinatorClient* const client_;
  const Clock& clock_;
  const absl::Duration min_interval_;

  absl::Mutex mu_;
  std::optional<trainyard::v1::JobProgress> pending_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace trainyard::trainer

#endif  // TRAINYARD_WORKER_TRAINER_COORDINATOR_COORDINATOR_CLIENT_H_
