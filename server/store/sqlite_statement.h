#ifndef TRAINYARD_SERVER_STORE_SQLITE_STATEMENT_H_
#define TRAINYARD_SERVER_STORE_SQLITE_STATEMENT_H_

// SQLite's C API as the job store uses it: errors as statuses, statements that finalize
// themselves. Internal to sqlite_job_store*.cc.

#include <sqlite3.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace trainyard::sqlite {

// A status for SQLite result code `rc` of `what`: UNAVAILABLE for what may pass (busy, I/O,
// full disk), DATA_LOSS for a corrupt file, INTERNAL otherwise; with SQLite's message.
inline absl::Status SqliteError(sqlite3* db, int rc, absl::string_view what) {
  std::string message = absl::StrCat("sqlite ", what, ": ", sqlite3_errstr(rc));
  if (db != nullptr && sqlite3_errmsg(db) != nullptr) {
    absl::StrAppend(&message, " (", sqlite3_errmsg(db), ")");
  }
  switch (rc & 0xff) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
    case SQLITE_IOERR:
    case SQLITE_FULL:
    case SQLITE_CANTOPEN:
      return absl::UnavailableError(message);
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      return absl::DataLossError(message);
    default:
      return absl::InternalError(message);
  }
}

// One prepared statement, finalized on destruction.
class Statement {
 public:
  Statement(sqlite3* db, absl::string_view sql) : db_(db) {
    rc_ = sqlite3_prepare_v2(db, sql.data(), static_cast<int>(sql.size()), &stmt_, nullptr);
  }
  ~Statement() { sqlite3_finalize(stmt_); }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  absl::Status status() const {
    return rc_ == SQLITE_OK ? absl::OkStatus() : SqliteError(db_, rc_, "prepare");
  }
  Statement& Bind(int i, int64_t v) {
    sqlite3_bind_int64(stmt_, i, v);
    return *this;
  }
  Statement& Bind(int i, absl::string_view v) {
    sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  Statement& BindBlob(int i, absl::string_view v) {
    sqlite3_bind_blob(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  // Runs a statement that returns no rows.
  absl::Status Run() {
    if (rc_ != SQLITE_OK) return status();
    int rc = sqlite3_step(stmt_);
    if (rc != SQLITE_DONE) return SqliteError(db_, rc, "step");
    return absl::OkStatus();
  }
  // Advances to the next row: true with a row, false at the end or on error (see step_status).
  bool Next() {
    if (rc_ != SQLITE_OK) return false;
    int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc != SQLITE_DONE) step_error_ = SqliteError(db_, rc, "step");
    return false;
  }
  absl::Status step_status() const { return rc_ != SQLITE_OK ? status() : step_error_; }
  int64_t Int(int col) { return sqlite3_column_int64(stmt_, col); }
  bool IsNull(int col) { return sqlite3_column_type(stmt_, col) == SQLITE_NULL; }
  std::string Text(int col) {
    const void* p = sqlite3_column_blob(stmt_, col);
    int n = sqlite3_column_bytes(stmt_, col);
    return p == nullptr ? std::string() : std::string(static_cast<const char*>(p), n);
  }

 private:
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
  int rc_;
  absl::Status step_error_;
};

}  // namespace trainyard::sqlite

#endif  // TRAINYARD_SERVER_STORE_SQLITE_STATEMENT_H_
