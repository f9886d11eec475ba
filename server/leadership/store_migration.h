#ifndef TRAINYARD_SERVER_LEADERSHIP_STORE_MIGRATION_H_
#define TRAINYARD_SERVER_LEADERSHIP_STORE_MIGRATION_H_

// From one coordinator on SQLite to several on PostgreSQL: everything a state folder holds
// (jobs with their events, tasks and checkpoint records, workers, API tokens, searches and their
// trials, queues, task logs, the task-credential key) copied into an empty PostgreSQL store
// (`trainyard-coordinator --migrate_state`, docs/operations.md).

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/store/postgres_connection.h"

namespace trainyard {

struct MigrationCounts {
  int64_t jobs = 0;
  int64_t tokens = 0;
  int64_t searches = 0;
  int64_t queues = 0;
  int64_t workers = 0;
  int64_t logs = 0;       // task logs
  int64_t log_bytes = 0;  // their bytes
};

// Copies the state of `state_dir` (its state.db, logs/ and task-credential.key) into the
// database of `options`. The caller keeps any coordinator off `state_dir` meanwhile (its lock).
// The migration holds the database's leader lease while it writes (coordinators started on the
// database meanwhile stand by): FAILED_PRECONDITION when another holds it, or when the database
// already holds jobs, searches or queues (nothing is written then; tokens made there are kept). The
// jobs and the rest land in one transaction, last: a migration cut short leaves the database
// without them and can be run again. `progress` is told what is being done.
absl::StatusOr<MigrationCounts> MigrateSqliteToPostgres(
    const std::string& state_dir, const pg::ConnectOptions& options,
    const std::function<void(absl::string_view)>& progress);

}  // namespace trainyard

#endif  // TRAINYARD_SERVER_LEADERSHIP_STORE_MIGRATION_H_
