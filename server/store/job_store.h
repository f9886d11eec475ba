#ifndef TRAINYARD_SERVER_STORE_JOB_STORE_H_
#define TRAINYARD_SERVER_STORE_JOB_STORE_H_

// Room store/: the coordinator's durable state. The JobStore interface and its two
// implementations (SQLite, PostgreSQL with fenced writes), their rows, the task log backends and
// the group committer that batches writes. It may call lifecycle/ and nothing above it; every
// other room reaches the database only through these classes.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "trainyard/v1/agent_service.pb.h"
#include "trainyard/v1/job.pb.h"
#include "trainyard/v1/search_service.pb.h"

namespace trainyard {

// A job as stored: the Job message plus its global submission sequence number (the scheduler's
// FIFO order and the ListJobs order). The `events` and `tasks` fields of `job` are ignored when
// writing; they live in their own tables and come back filled in by the loads (events in order,
// tasks by generation, role, rank and shard), except from ListFinishedJobs.
struct StoredJob {
  int64_t seq = 0;
  trainyard::v1::Job job;
};

struct StoredCheckpoint {
  trainyard::v1::Checkpoint checkpoint;
  bool retired = false;  // outside retention: its objects may be deleted
  // The step of the commit that retired it (-1: not retired, or retired before this was
  // recorded), so that a retried commit hands back the same folders to delete.
  int64_t retired_by_step = -1;
};

// An API token as stored: never the token itself, only its SHA-256.
struct StoredToken {
  std::string id;
  std::string name;
  std::string role;  // "admin", "user", "agent"
  std::string hash;
  int64_t created_unix_ms = 0;
  int64_t expires_unix_ms = 0;  // 0: never
  int64_t revoked_unix_ms = 0;  // 0: not revoked
  std::string created_by;
  std::string revoked_by;
};

// A hyperparameter search as stored, with its sequence number (the ListSearches order). Its
// `trials` are ignored when writing: each trial is a row of its own (StoreMutation::trials).
struct StoredSearch {
  int64_t seq = 0;
  trainyard::v1::Search search;
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
  std::vector<StoredToken> tokens;     // upserted by id
  std::vector<StoredSearch> searches;  // upserted by id
  std::vector<std::pair<std::string, trainyard::v1::Trial>>
      trials;                                // (search id, trial), by number
  std::vector<trainyard::v1::Queue> queues;  // upserted by name (their `status` not stored)
  std::vector<std::string> removed_queues;   // deleted after the writes above
  // (job id, point) of jobs' metric histories, upserted by (job id, point's unix_ms).
  std::vector<std::pair<std::string, trainyard::v1::MetricPoint>> metric_points;
  // Deleted after the writes above, by (job id, unix_ms): points a history thinned away.
  std::vector<std::pair<std::string, int64_t>> removed_metric_points;

  bool empty() const {
    return jobs.empty() && events.empty() && tasks.empty() && workers.empty() &&
           checkpoints.empty() && progress.empty() && !next_job_seq.has_value() &&
           removed_jobs.empty() && removed_workers.empty() && trimmed_events.empty() &&
           removed_checkpoints.empty() && tokens.empty() && searches.empty() && trials.empty() &&
           queues.empty() && removed_queues.empty() && metric_points.empty() &&
           removed_metric_points.empty();
  }
};

struct StoreContents {
  std::vector<StoredJob> jobs;                 // by seq
  std::vector<trainyard::v1::Worker> workers;  // by id
  std::vector<StoredCheckpoint> checkpoints;   // of those jobs, by (job_id, step)
  int64_t next_job_seq = 1;
  // From LoadActive: the final jobs in the store that it did not return, by state.
  std::map<trainyard::v1::JobState, int64_t> not_loaded;
};

// One job read alone: the whole job and its checkpoint records (by step).
struct StoredJobRecord {
  StoredJob job;
  std::vector<StoredCheckpoint> checkpoints;
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

  // What a coordinator needs to start, in memory proportional to the jobs not finished: like
  // LoadAll, but of the final jobs only those with a task not ended (its trainer may still hold
  // capacity); the others are counted in `not_loaded`. Workers and next_job_seq as LoadAll.
  virtual absl::StatusOr<StoreContents> LoadActive() = 0;

  // One whole job with its checkpoint records. NOT_FOUND when the store has no such job.
  virtual absl::StatusOr<StoredJobRecord> LoadJob(absl::string_view job_id) = 0;

  // Final jobs in one of `states` (empty: any final state; other states are ignored) with a seq
  // below `before_seq`, of `owner` (empty: anyone's), newest first, at most `limit`: summaries
  // with their latest progress but without events and tasks.
  virtual absl::StatusOr<std::vector<StoredJob>> ListFinishedJobs(
      const std::vector<trainyard::v1::JobState>& states, int64_t before_seq, int limit,
      absl::string_view owner = "") = 0;

  // Final jobs that finished (Job.finished_unix_ms) at or before `unix_ms`, the oldest first, at
  // most `limit`: (id, state).
  virtual absl::StatusOr<std::vector<std::pair<std::string, trainyard::v1::JobState>>>
  FinishedBefore(int64_t unix_ms, int limit) = 0;

  // Every API token, revoked and expired ones included.
  virtual absl::StatusOr<std::vector<StoredToken>> LoadTokens() = 0;

  // Every search by seq, each with its trials by number.
  virtual absl::StatusOr<std::vector<StoredSearch>> LoadSearches() = 0;

  // Every queue by name.
  virtual absl::StatusOr<std::vector<trainyard::v1::Queue>> LoadQueues() = 0;

  // Job `job_id`'s metric history taken after `after_unix_ms`, oldest first (none for a job
  // with none, or an unknown one).
  virtual absl::StatusOr<std::vector<trainyard::v1::MetricPoint>> LoadMetricHistory(
      absl::string_view job_id, int64_t after_unix_ms) = 0;

  // Of each job in `job_ids` with a metric history: its points as (unix_ms, step), oldest first.
  virtual absl::StatusOr<std::map<std::string, std::vector<std::pair<int64_t, int64_t>>>>
  LoadMetricKeys(const std::vector<std::string>& job_ids) = 0;
};

}  // namespace trainyard

#endif  // TRAINYARD_SERVER_STORE_JOB_STORE_H_
