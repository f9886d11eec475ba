#ifndef TRAINYARD_SERVER_STORE_POSTGRES_CONNECTION_H_
#define TRAINYARD_SERVER_STORE_POSTGRES_CONNECTION_H_

// libpq as the PostgreSQL job store and the leader lease use it: one connection, every call
// bounded by a deadline (a database cut off must not hang the coordinator in a read), errors as
// statuses with PostgreSQL's SQLSTATE, results read in binary. Not thread-safe: its owners hold a
// mutex around it.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

struct pg_conn;
struct pg_result;

namespace trainyard::pg {

// Where and how to connect.
struct ConnectOptions {
  // A libpq connection URI or keyword/value string ("postgres://USER@HOST:PORT/DB?sslmode=..."):
  // host, port, database, user, TLS (sslmode, sslrootcert, sslcert, sslkey) as libpq reads them;
  // a password also from PGPASSWORD or ~/.pgpass, as libpq reads them.
  std::string conninfo;
  // A password read from a file by the caller; empty: libpq's own ways.
  std::string password;
  // The longest any one call may take, connecting included.
  absl::Duration timeout = absl::Seconds(10);
  std::string application_name = "trainyard-coordinator";
  // A transaction of this connection left idle this long is ended by the server, releasing its
  // row locks (the leader row's share lock among them); zero: `timeout`.
  absl::Duration idle_in_transaction_timeout = absl::ZeroDuration();
};

// The conninfo with any password in it replaced by "***", for logs and errors.
std::string RedactConninfo(absl::string_view conninfo);

// INVALID_ARGUMENT naming what is wrong when `conninfo` is not one libpq can parse.
absl::Status ValidateConninfo(absl::string_view conninfo);

// `items` as a PostgreSQL array literal of text ('{"a","b"}', every item quoted), for a text[]
// parameter.
std::string TextArray(const std::vector<std::string>& items);

// Parameters of one statement ($1, $2, ...): integers and text sent as text, blobs as binary.
class Params {
 public:
  Params& Add(int64_t v);
  Params& Add(absl::string_view text);
  Params& Add(const char* text) { return Add(absl::string_view(text)); }
  Params& Add(const std::string& text) { return Add(absl::string_view(text)); }
  Params& AddBlob(absl::string_view bytes);
  int size() const { return static_cast<int>(values_.size()); }

 private:
  friend class Connection;
  std::vector<std::string> values_;
  std::vector<int> formats_;  // 0 text, 1 binary
};

// A result in binary format: BIGINT, INT, BOOL, TEXT and BYTEA columns. Owns the PGresult.
class Result {
 public:
  Result() = default;
  explicit Result(pg_result* r);
  Result(Result&& other) noexcept;
  Result& operator=(Result&& other) noexcept;
  ~Result();

  int rows() const;
  // Rows changed by an INSERT, UPDATE or DELETE.
  int64_t affected() const;
  bool IsNull(int row, int col) const;
  // The value of an INT2/INT4/INT8 or BOOL column (0 for NULL).
  int64_t Int(int row, int col) const;
  // The bytes of a TEXT or BYTEA column (empty for NULL).
  std::string Text(int row, int col) const;

 private:
  pg_result* r_ = nullptr;
};

class Connection {
 public:
  // Connects (within options.timeout). UNAVAILABLE with libpq's reason when it cannot,
  // INVALID_ARGUMENT for a conninfo libpq cannot parse.
  static absl::StatusOr<std::unique_ptr<Connection>> Open(const ConnectOptions& options);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Runs one statement (no parameters: possibly several statements; only the last result
  // returned). Reconnects first when the connection was lost (outside a transaction). Errors:
  // UNAVAILABLE for what may pass (the connection lost or no answer within the timeout, which
  // also drops the connection; serialization failure, deadlock, too many connections, the
  // server shutting down), ALREADY_EXISTS for a unique-key clash, INTERNAL otherwise; each with
  // the SQLSTATE and PostgreSQL's message.
  absl::StatusOr<Result> Exec(absl::string_view sql, const Params& params = Params());

  // Exec of statements whose results are not needed.
  absl::Status Run(absl::string_view sql, const Params& params = Params());

  // One statement of a transaction.
  struct Statement {
    std::string sql;
    Params params;
  };
  // Runs `statements` as one transaction in one round trip (libpq's pipeline mode, the statements
  // then a sync: one implicit transaction that commits at the sync): all of them or none. Errors
  // as Exec's, of the first statement that failed. A connection lost after the sync was sent
  // leaves the outcome unknown (UNAVAILABLE, as for any lost connection).
  absl::Status RunTransaction(const std::vector<Statement>& statements);

  // Opens a transaction (BEGIN with `mode`, e.g. "ISOLATION LEVEL REPEATABLE READ"); Commit and
  // Rollback close it. While one is open a lost connection is an error, never a silent reconnect.
  absl::Status Begin(absl::string_view mode = "");
  absl::Status Commit();
  void Rollback();

 private:
  explicit Connection(ConnectOptions options) : options_(std::move(options)) {}
  absl::Status Connect();
  // Connects again if the connection was lost outside a transaction.
  absl::Status EnsureConnected();
  // Drops the connection after it failed doing `sql`: UNAVAILABLE with `why`.
  absl::Status Lost(absl::string_view why, absl::string_view sql);
  // Waits until the socket is ready for `events`; false when `deadline` passes first.
  bool WaitFor(short events, absl::Time deadline);
  // Queues one statement with binary results (PQsendQueryParams); 0 on failure.
  int SendParams(absl::string_view sql, const Params& params);
  // Sends what libpq has queued, reading answers meanwhile.
  absl::Status Flush(absl::Time deadline, absl::string_view sql);
  // The next result (null at the end of a query's), waiting for it until `deadline`.
  absl::StatusOr<pg_result*> NextResult(absl::Time deadline, absl::string_view sql);
  // Sends and waits for the results within the timeout; the last result in `out`.
  absl::Status SendAndWait(absl::string_view sql, const Params& params, Result* out);

  const ConnectOptions options_;
  pg_conn* conn_ = nullptr;
  bool in_transaction_ = false;
};

}  // namespace trainyard::pg

#endif  // TRAINYARD_SERVER_STORE_POSTGRES_CONNECTION_H_
