#include "server/store/postgres_log_backend.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace trainyard {

using pg::Params;

absl::StatusOr<std::unique_ptr<PostgresLogBackend>> PostgresLogBackend::Open(
    const pg::ConnectOptions& options, std::optional<LeaseFence> fence) {
  absl::StatusOr<std::unique_ptr<pg::Connection>> db = pg::Connection::Open(options);
  if (!db.ok()) return db.status();
  if (absl::Status s = EnsurePostgresSchema(**db); !s.ok()) return s;
  return std::unique_ptr<PostgresLogBackend>(
      new PostgresLogBackend(*std::move(db), std::move(fence)));
}

absl::Status PostgresLogBackend::Write(std::vector<pg::Connection::Statement> statements) {
  if (fence_.has_value()) statements.insert(statements.begin(), FenceStatement(*fence_));
  absl::MutexLock lock(&mu_);
  return db_->RunTransaction(statements);
}

absl::StatusOr<LogBackend::Record> PostgresLogBackend::Load(absl::string_view job_id,
                                                            absl::string_view task_id) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<pg::Result> row = db_->Exec(
      "SELECT size, kept, shipped_end, sealed FROM task_logs WHERE job_id = $1 AND task_id = $2",
      Params().Add(job_id).Add(task_id));
  if (!row.ok()) return row.status();
  Record record;
  if (row->rows() == 0) return record;
  record.size = row->Int(0, 0);
  if (!row->IsNull(0, 1)) record.cap = LogCap{row->Int(0, 1), row->Int(0, 2), row->Int(0, 3) != 0};
  return record;
}

absl::Status PostgresLogBackend::Append(absl::string_view job_id, absl::string_view task_id,
                                        int64_t at, absl::string_view data) {
  if (data.empty()) return absl::OkStatus();
  const int64_t end = at + static_cast<int64_t>(data.size());
  // A piece that starts where another does is a clash (ALREADY_EXISTS): the log is never
  // written twice at one place, whoever believed what about its size.
  return Write({
      {"INSERT INTO task_log_pieces(job_id, task_id, start, data) VALUES($1, $2, $3, $4)",
       Params().Add(job_id).Add(task_id).Add(at).AddBlob(data)},
      {"INSERT INTO task_logs(job_id, task_id, size) VALUES($1, $2, $3) ON CONFLICT (job_id, "
       "task_id) DO UPDATE SET size = excluded.size",
       Params().Add(job_id).Add(task_id).Add(end)},
  });
}

absl::Status PostgresLogBackend::WriteCap(absl::string_view job_id, absl::string_view task_id,
                                          const LogCap& cap) {
  return Write(
      {{"INSERT INTO task_logs(job_id, task_id, size, kept, shipped_end, sealed) "
        "VALUES($1, $2, 0, $3, $4, $5) ON CONFLICT (job_id, task_id) DO UPDATE SET kept "
        "= excluded.kept, shipped_end = excluded.shipped_end, sealed = excluded.sealed",
        Params()
            .Add(job_id)
            .Add(task_id)
            .Add(cap.kept)
            .Add(cap.shipped_end)
            .Add(cap.sealed ? "true" : "false")}});
}

absl::StatusOr<std::string> PostgresLogBackend::Read(absl::string_view job_id,
                                                     absl::string_view task_id, int64_t offset,
                                                     int64_t n) {
  const int64_t end = offset + n;
  absl::StatusOr<pg::Result> rows;
  {
    absl::MutexLock lock(&mu_);
    // From the piece holding `offset` (the last to start at or before it, found through the
    // key), so that a read near the end of a long log does not visit every piece before it.
    rows = db_->Exec(
        "SELECT start, data FROM task_log_pieces WHERE job_id = $1 AND task_id = $2 AND start >= "
        "COALESCE((SELECT start FROM task_log_pieces WHERE job_id = $1 AND task_id = $2 AND "
        "start <= $3 ORDER BY start DESC LIMIT 1), 0) AND start < $4 ORDER BY start",
        Params().Add(job_id).Add(task_id).Add(offset).Add(end));
  }
  if (!rows.ok()) return rows.status();
  std::string out;
  int64_t at = offset;
  for (int i = 0; i < rows->rows() && at < end; ++i) {
    const int64_t start = rows->Int(i, 0);
    const std::string data = rows->Text(i, 1);
    if (start > at) {
      return absl::DataLossError(absl::StrCat("task log ", job_id, "/", task_id,
                                              ": no piece holds bytes ", at, " to ", start));
    }
    const int64_t from = at - start;
    const int64_t take = std::min<int64_t>(static_cast<int64_t>(data.size()) - from, end - at);
    if (take <= 0) continue;
    out.append(data, static_cast<size_t>(from), static_cast<size_t>(take));
    at += take;
  }
  return out;
}

absl::Status PostgresLogBackend::RemoveJob(absl::string_view job_id) {
  return Write({{"DELETE FROM task_log_pieces WHERE job_id = $1", Params().Add(job_id)},
                {"DELETE FROM task_logs WHERE job_id = $1", Params().Add(job_id)}});
}

}  // namespace trainyard
