#ifndef TRAINYARD_SERVER_JOB_STORE_H_
#define TRAINYARD_SERVER_JOB_STORE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "trainyard/v1/agent_service.pb.h"
#include "trainyard/v1/job.pb.h"

namespace trainyard {

// A job as stored: the Job message plus its global submission sequence number (the scheduler's
// FIFO order and the ListJobs order). The `events` and `tasks` fields of `job` are ignored when
// writing; they live in their own tables and come back filled in by LoadAll().
struct StoredJob {
  int64_t seq = 0;
  trainyard::v1::Job job;
  // False for a final job from LoadActive: its events are not loaded, and of its tasks only those
  // not ended (which may still hold capacity). LoadHistory reads the rest.
  bool full = true;
};

// A job's events (in order) and tasks (by generation, role, rank, shard).
struct JobHistory {
  std::vector<trainyard::v1::JobEvent> events;
  std::vector<trainyard::v1::TaskInfo> tasks;
};

struct StoredCheckpoint {
  trainyard::v1::Checkpoint checkpoint;
  bool retired = false;  // outside retention: its objects may be deleted
  // The step of the commit that retired it (-1: not retired, or retired before this was
  // recorded), so that a retried commit hands back the same folders to delete.
  int64_t retired_by_step = -1;
};

// Everything one state change writes. JobStore::Apply writes it in one transaction.
struct StoreMutation {
  std::vector<StoredJob> jobs;                                          // upserted by id
  std::vector<std::pair<std::string, trainyard::v1::JobEvent>> events;  // (job id, event), appended
  std::vector<std::pair<std::string, trainyard::v1::TaskInfo>> tasks;   // (job id, task), upserted
  std::vector<trainyard::v1::Worker> workers;                           // upserted by id
  std::vector<StoredCheckpoint> checkpoints;  // upserted by (job_id, step)
  // (job id, latest progress), upserted; LoadAll puts it over the progress in the job's row.
  std::vector<std::pair<std::string, trainyard::v1::JobProgress>> progress;
  std::optional<int64_t> next_job_seq;
  // Deleted after the writes above: jobs with their events, tasks, progress and checkpoint rows
  // (the checkpoints' objects are not touched), and workers.
  std::vector<std::string> removed_jobs;
  std::vector<std::string> removed_workers;
  // Deleted after the writes above: `count` events of a job after its first `keep_first`, the
  // oldest first (JobManager keeps a job's events under a cap).
  struct EventTrim {
    std::string job_id;
    int keep_first = 0;
    int count = 0;
  };
  std::vector<EventTrim> trimmed_events;
  // Checkpoint rows deleted after the writes above, by (job id, step): retired ones whose
  // retiring commit is no longer the latest.
  std::vector<std::pair<std::string, int64_t>> removed_checkpoints;

  bool empty() const {
    return jobs.empty() && events.empty() && tasks.empty() && workers.empty() &&
           checkpoints.empty() && progress.empty() && !next_job_seq.has_value() &&
           removed_jobs.empty() && removed_workers.empty() && trimmed_events.empty() &&
           removed_checkpoints.empty();
  }
};

struct StoreContents {
  std::vector<StoredJob> jobs;  // by seq; events in insertion order, tasks by (generation, rank)
  std::vector<trainyard::v1::Worker> workers;  // by id
  std::vector<StoredCheckpoint> checkpoints;   // by (job_id, step)
  int64_t next_job_seq = 1;
};

// Durable coordinator state. Implementations are thread-safe; calls block on disk I/O.
class JobStore {
 public:
  virtual ~JobStore() = default;

  // Writes all of `mutation` or nothing. UNAVAILABLE for I/O trouble that may pass (busy, disk),
  // INTERNAL otherwise; on error the store is unchanged.
  virtual absl::Status Apply(const StoreMutation& mutation) = 0;

  // Reads everything back. INTERNAL/DATA_LOSS when rows cannot be decoded.
  virtual absl::StatusOr<StoreContents> LoadAll() = 0;

  // Like LoadAll, but the history of finished jobs stays in the store (StoredJob::full): what a
  // coordinator needs to start, in memory proportional to the jobs not finished.
  virtual absl::StatusOr<StoreContents> LoadActive() = 0;

  // The events and tasks of one job. NOT_FOUND when the store has no such job.
  virtual absl::StatusOr<JobHistory> LoadHistory(absl::string_view job_id) = 0;
};

}  // namespace trainyard

#endif  // TRAINYARD_SERVER_JOB_STORE_H_
