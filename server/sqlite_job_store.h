#ifndef TRAINYARD_SERVER_SQLITE_JOB_STORE_H_
#define TRAINYARD_SERVER_SQLITE_JOB_STORE_H_

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "server/job_store.h"

struct sqlite3;

namespace trainyard {

// JobStore on one SQLite file in WAL mode with synchronous=FULL: a committed Apply() survives a
// crash of the process or the machine. Schema (version 1):
//   meta(key, value)              schema_version, next_job_seq
//   jobs(id, seq, state, job)     job = serialized trainyard.v1.Job without events and tasks
//   events(id, job_id, time_ms, from_state, to_state, reason)
//   tasks(task_id, job_id, generation, rank, worker_id, state, exit_code, signal, message)
//   workers(id, worker)           worker = serialized trainyard.v1.Worker
//   checkpoints(job_id, step, uri, size_bytes, created_ms, generation, retired)
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
  absl::StatusOr<JobHistory> LoadHistory(absl::string_view job_id) override;

  // The journal mode SQLite reports ("wal").
  absl::StatusOr<std::string> JournalMode();

 private:
  explicit SqliteJobStore(sqlite3* db) : db_(db) {}
  absl::Status Exec(absl::string_view sql) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ApplyLocked(const StoreMutation& mutation) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // LoadAll, or with `active_only` LoadActive.
  absl::StatusOr<StoreContents> Load(bool active_only);

  absl::Mutex mu_;
  sqlite3* const db_ ABSL_PT_GUARDED_BY(mu_);
};

}  // namespace trainyard

#endif  // TRAINYARD_SERVER_SQLITE_JOB_STORE_H_
