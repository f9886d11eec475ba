#ifndef TRAINYARD_SERVER_STORE_SQLITE_JOB_STORE_H_
#define TRAINYARD_SERVER_STORE_SQLITE_JOB_STORE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "server/store/job_store.h"

struct sqlite3;

namespace trainyard {

// JobStore on one SQLite file in WAL mode with synchronous=FULL: a committed Apply() survives a
// crash of the process or the machine. Schema (version 6; older files are migrated on open):
//   meta(key, value)              schema_version, next_job_seq
//   jobs(id, seq, state, job, finished_ms)
//                                 job = serialized trainyard.v1.Job without events and tasks;
//                                 indexed by (state, seq) and, when final, by finished_ms
//   events(id, job_id, time_ms, from_state, to_state, reason)
//   tasks(task_id, job_id, generation, rank, worker_id, state, exit_code, signal, message, role,
//         shard, stop_deadline_ms)
//   progress(job_id, progress)    progress = serialized trainyard.v1.JobProgress, the latest
//   workers(id, worker)           worker = serialized trainyard.v1.Worker
//   checkpoints(job_id, step, uri, size_bytes, created_ms, generation, retired, retired_by)
//   tokens(id, name, role, hash, created_ms, expires_ms, revoked_ms, created_by, revoked_by)
//   searches(id, seq, state, search)   search = serialized trainyard.v1.Search without trials
//   trials(search_id, number, trial)   trial = serialized trainyard.v1.Trial
// Thread-safe (one connection behind a mutex).
class SqliteJobStore final : public JobStore {
 public:
  // Opens or creates the database at `path` (its directory must exist). FAILED_PRECONDITION for a
  // schema newer than this binary understands, UNAVAILABLE if the file cannot be opened.
  static absl::StatusOr<std::unique_ptr<SqliteJobStore>> Open(const std::string& path);
  ~SqliteJobStore() override;

  SqliteJobStore(const SqliteJobStore&) = delete;
  SqliteJobStore& operator=(const SqliteJobStore&) = delete;

  absl::Status Apply(const StoreMutation& mutation) override;
  absl::StatusOr<StoreContents> LoadAll() override { return Load(/*active_only=*/false); }
  absl::StatusOr<StoreContents> LoadActive() override { return Load(/*active_only=*/true); }
  absl::StatusOr<StoredJobRecord> LoadJob(absl::string_view job_id) override;
  absl::StatusOr<std::vector<StoredJob>> ListFinishedJobs(
      const std::vector<trainyard::v1::JobState>& states, int64_t before_seq, int limit,
      absl::string_view owner) override;
  absl::StatusOr<std::vector<std::pair<std::string, trainyard::v1::JobState>>> FinishedBefore(
      int64_t unix_ms, int limit) override;
  absl::StatusOr<std::vector<StoredToken>> LoadTokens() override;
  absl::StatusOr<std::vector<trainyard::v1::Queue>> LoadQueues() override;
  absl::StatusOr<std::vector<StoredSearch>> LoadSearches() override;
  absl::StatusOr<std::vector<trainyard::v1::MetricPoint>> LoadMetricHistory(
      absl::string_view job_id, int64_t after_unix_ms) override;
  absl::StatusOr<std::map<std::string, std::vector<std::pair<int64_t, int64_t>>>> LoadMetricKeys(
      const std::vector<std::string>& job_ids) override;

  // The journal mode SQLite reports ("wal").
  absl::StatusOr<std::string> JournalMode();

 private:
  explicit SqliteJobStore(sqlite3* db) : db_(db) {}
  absl::Status Exec(absl::string_view sql) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ApplyLocked(const StoreMutation& mutation) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status MigrateFrom3() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // LoadAll, or with `active_only` LoadActive.
  absl::StatusOr<StoreContents> Load(bool active_only);
  // Appends the jobs that `sql` selects as (seq, job[, progress]), its first parameter bound to
  // `bound` unless kNoBound and its second to `owner` unless empty.
  static constexpr int64_t kNoBound = INT64_MIN;
  absl::Status ReadJobs(const std::string& sql, int64_t bound, bool with_progress,
                        std::vector<StoredJob>* out, absl::string_view owner = "")
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fills the events, tasks and latest progress of `jobs` and appends their checkpoint records,
  // reading the rows whose job_id is IN `which` (an SQL list or subquery, its one parameter bound
  // to `param` if given; empty: every row).
  absl::Status ReadDetails(const std::string& which, const std::optional<std::string>& param,
                           std::vector<StoredJob>& jobs, std::vector<StoredCheckpoint>* checkpoints)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  sqlite3* const db_ ABSL_PT_GUARDED_BY(mu_);
};

}  // namespace trainyard

#endif  // TRAINYARD_SERVER_STORE_SQLITE_JOB_STORE_H_
