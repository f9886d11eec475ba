#ifndef TRAINYARD_SERVER_STORE_POSTGRES_LOG_BACKEND_H_
#define TRAINYARD_SERVER_STORE_POSTGRES_LOG_BACKEND_H_

// Task logs in the PostgreSQL store's database (schema version 2: task_logs, task_log_pieces),
// so that a coordinator that takes over serves the logs shipped to the one before it. Each
// append is one transaction in one round trip, fenced by the leader lease as the job store's
// writes are: a deposed leader adds nothing to a log.

#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/store/log_store.h"
#include "server/store/postgres_connection.h"
#include "server/store/postgres_job_store.h"

namespace trainyard {

class PostgresLogBackend final : public LogBackend {
 public:
  // Connects and makes or migrates the schema (EnsurePostgresSchema).
  static absl::StatusOr<std::unique_ptr<PostgresLogBackend>> Open(
      const pg::ConnectOptions& options, std::optional<LeaseFence> fence = std::nullopt);

  absl::StatusOr<Record> Load(absl::string_view job_id, absl::string_view task_id) override;
  absl::Status Append(absl::string_view job_id, absl::string_view task_id, int64_t at,
                      absl::string_view data) override;
  absl::Status WriteCap(absl::string_view job_id, absl::string_view task_id,
                        const LogCap& cap) override;
  absl::StatusOr<std::string> Read(absl::string_view job_id, absl::string_view task_id,
                                   int64_t offset, int64_t n) override;
  absl::Status RemoveJob(absl::string_view job_id) override;

 private:
  PostgresLogBackend(std::unique_ptr<pg::Connection> db, std::optional<LeaseFence> fence)
      : db_(std::move(db)), fence_(std::move(fence)) {}
  // Runs `statements` as one transaction, after the fence when there is one.
  absl::Status Write(std::vector<pg::Connection::Statement> statements);

  absl::Mutex mu_;
  const std::unique_ptr<pg::Connection> db_ ABSL_PT_GUARDED_BY(mu_);
  const std::optional<LeaseFence> fence_;
};

}  // namespace trainyard

#endif  // TRAINYARD_SERVER_STORE_POSTGRES_LOG_BACKEND_H_
