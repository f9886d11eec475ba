#ifndef TRAINYARD_SERVER_JOBS_METRICS_SINK_H_
#define TRAINYARD_SERVER_JOBS_METRICS_SINK_H_

// The seam between the JobManager and the coordinator's metrics: events the manager reports as
// they happen (for counters and histograms) and the snapshot of its state it hands out on each
// scrape (for gauges, so that they always agree with the state). No Prometheus types here.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "trainyard/v1/job.pb.h"
#include "trainyard/v1/search_service.pb.h"

namespace trainyard {

// One job that has been placed at least once and is not final: its progress as last reported.
struct JobMetricsSnapshot {
  std::string id;
  trainyard::v1::JobState state = trainyard::v1::JOB_STATE_UNSPECIFIED;
  int64_t generation = 0;  // attempts so far; restarts = generation - 1
  trainyard::v1::JobProgress progress;
  int64_t committed_step = -1;
  bool checkpointing = false;  // the spec asks for periodic checkpoints
  // Newest committed checkpoint; InfinitePast when none.
  absl::Time last_checkpoint = absl::InfinitePast();
  absl::Time started = absl::InfinitePast();          // first RUNNING; InfinitePast before
  absl::Duration max_runtime = absl::ZeroDuration();  // zero: no limit
  int ranks = 0;                                      // tasks of the current attempt
  int gpus = 0;                                       // GPUs held by the current attempt
  // GPUs times the time spent SCHEDULED or RUNNING over every attempt, up to the snapshot.
  double gpu_seconds = 0;
};

// What the coordinator's gauges show of one search.
struct SearchMetrics {
  std::string id;
  std::string metric;  // searcher.metric
  trainyard::v1::SearchState state = trainyard::v1::SEARCH_STATE_UNSPECIFIED;
  std::map<trainyard::v1::TrialState, int> trials;  // by state
  bool has_best = false;
  double best_metric = 0;
};

// The coordinator's state at one moment, taken under the JobManager's lock.
struct ClusterMetricsSnapshot {
  absl::Time now;
  std::map<trainyard::v1::JobState, int> jobs_by_state;
  std::map<trainyard::v1::WorkerState, int> workers_by_state;
  // READY or DRAINING workers held unreachable by a mass loss (WorkerRegistry::ExpireLeases).
  int workers_unreachable = 0;
  // Capacity of READY workers (the scheduler places nothing elsewhere), and what tasks hold on
  // every worker.
  int64_t slots_total = 0;
  int64_t slots_used = 0;
  int64_t gpus_total = 0;
  int64_t gpus_used = 0;
  // When the job that has waited longest in PENDING entered it; InfinitePast if none waits.
  absl::Time oldest_pending_since = absl::InfinitePast();
  std::vector<JobMetricsSnapshot> jobs;
  std::vector<SearchMetrics> searches;  // from SearchManager::MetricsSnapshot
  // Every queue, the default one included, with its status (quotas as the scheduler applies them).
  std::vector<trainyard::v1::Queue> queues;
};

// Told about events by the JobManager. Calls arrive under the manager's lock, from any thread:
// implementations must be thread-safe, must not block and must not call back into the manager.
class JobEventSink {
 public:
  virtual ~JobEventSink() = default;

  virtual void OnJobSubmitted(const trainyard::v1::Job& job) = 0;
  // `job` is the job after the transition (its events end with this one).
  virtual void OnJobTransition(const trainyard::v1::Job& job, trainyard::v1::JobState from,
                               trainyard::v1::JobState to, absl::string_view reason,
                               absl::Time now) = 0;
  // A progress report of the current attempt was accepted.
  virtual void OnProgress(absl::string_view job_id, int64_t step, absl::Time now) = 0;
  // A checkpoint at `step` was committed (recorded in the store) at `now`; the trainer started
  // saving it at `save_started` (InfinitePast when it did not say).
  virtual void OnCheckpointCommitted(absl::string_view job_id, int64_t step, absl::Time now,
                                     absl::Time save_started) = 0;
  // A worker's lease ran out.
  virtual void OnWorkerLost(absl::string_view worker_id) = 0;
  // A job left RESTARTING (for PENDING, or FAILED when the settled cause spent its budget, or
  // SUCCEEDED when its ranks all finished meanwhile); `restart` is its last restart, with the
  // cause as settled.
  virtual void OnRestart(const trainyard::v1::Job& job, const trainyard::v1::Restart& restart) = 0;
  // A rank or shard of `job` was killed for memory (task.out_of_memory), as its agent reported.
  virtual void OnTaskOutOfMemory(const trainyard::v1::Job& job,
                                 const trainyard::v1::TaskInfo& task) = 0;
  // The attempt after `restart` reported its first step: its recovery fields are filled in.
  virtual void OnRecovered(const trainyard::v1::Job& job,
                           const trainyard::v1::Restart& restart) = 0;
};

}  // namespace trainyard

#endif  // TRAINYARD_SERVER_JOBS_METRICS_SINK_H_
