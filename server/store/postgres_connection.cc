#include "server/store/postgres_connection.h"

#include <libpq-fe.h>
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/clock.h"

namespace trainyard::pg {
namespace {

// Type OIDs of the columns Result reads as integers (from PostgreSQL's pg_type.dat).
constexpr unsigned kBoolOid = 16;
constexpr unsigned kInt8Oid = 20;
constexpr unsigned kInt2Oid = 21;
constexpr unsigned kInt4Oid = 23;

std::string Trimmed(const char* message) {
  return message == nullptr ? std::string()
                            : std::string(absl::StripTrailingAsciiWhitespace(message));
}

// The status of a failed statement, by its SQLSTATE: what may pass is UNAVAILABLE, so that callers
// retry it; a unique-key clash ALREADY_EXISTS; the rest INTERNAL.
absl::Status StatementError(const PGresult* r, absl::string_view sql) {
  const char* state = PQresultErrorField(r, PG_DIAG_SQLSTATE);
  const std::string code = state == nullptr ? "" : state;
  std::string message =
      absl::StrCat("postgres: ", Trimmed(PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY)), " (",
                   code.empty() ? "no SQLSTATE" : code, ") in '", sql.substr(0, 80),
                   sql.size() > 80 ? "...'" : "'");
  if (code == "23505") return absl::AlreadyExistsError(message);
  // Raised by trainyard_fence() (postgres_job_store.cc): the writer no longer leads.
  if (code == "TY001") {
    return absl::FailedPreconditionError(
        absl::StrCat("postgres: ", Trimmed(PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY))));
  }
  // 08: connection exceptions; 40001 serialization failure, 40P01 deadlock; 53: insufficient
  // resources (too many connections, disk full); 57P: the server shutting down or restarting;
  // 55P03 lock not available (lock_timeout); 57014 a statement cancelled (statement_timeout).
  if (absl::StartsWith(code, "08") || code == "40001" || code == "40P01" ||
      absl::StartsWith(code, "53") || absl::StartsWith(code, "57P") || code == "55P03" ||
      code == "57014") {
    return absl::UnavailableError(message);
  }
  return absl::InternalError(message);
}

}  // namespace

std::string RedactConninfo(absl::string_view conninfo) {
  std::string out(conninfo);
  // postgres://user:secret@host -> postgres://user:***@host
  if (size_t scheme = out.find("://"); scheme != std::string::npos) {
    const size_t at = out.find('@', scheme + 3);
    const size_t colon = out.find(':', scheme + 3);
    if (at != std::string::npos && colon != std::string::npos && colon < at) {
      out.replace(colon + 1, at - colon - 1, "***");
    }
  }
  // password=secret (keyword form) or ?password=secret (URI form)
  for (size_t at = out.find("password="); at != std::string::npos;
       at = out.find("password=", at + 1)) {
    size_t end = at + 9;
    while (end < out.size() && out[end] != ' ' && out[end] != '&') ++end;
    out.replace(at + 9, end - at - 9, "***");
  }
  return out;
}

absl::Status ValidateConninfo(absl::string_view conninfo) {
  char* error = nullptr;
  PQconninfoOption* options = PQconninfoParse(std::string(conninfo).c_str(), &error);
  if (options == nullptr) {
    std::string why = error != nullptr ? Trimmed(error) : "out of memory";
    PQfreemem(error);
    return absl::InvalidArgumentError(
        absl::StrCat("'", RedactConninfo(conninfo), "' is not a PostgreSQL address: ", why));
  }
  PQconninfoFree(options);
  return absl::OkStatus();
}

std::string TextArray(const std::vector<std::string>& items) {
  std::string out = "{";
  for (const std::string& item : items) {
    if (out.size() > 1) out += ',';
    out += '"';
    for (char c : item) {
      if (c == '"' || c == '\\') out += '\\';
      out += c;
    }
    out += '"';
  }
  return out + "}";
}

Params& Params::Add(int64_t v) {
  values_.push_back(absl::StrCat(v));
  formats_.push_back(0);
  return *this;
}

Params& Params::Add(absl::string_view text) {
  values_.emplace_back(text);
  formats_.push_back(0);
  return *this;
}

Params& Params::AddBlob(absl::string_view bytes) {
  values_.emplace_back(bytes);
  formats_.push_back(1);
  return *this;
}

Result::Result(pg_result* r) : r_(r) {}
Result::Result(Result&& other) noexcept : r_(std::exchange(other.r_, nullptr)) {}
Result& Result::operator=(Result&& other) noexcept {
  if (this != &other) {
    PQclear(r_);
    r_ = std::exchange(other.r_, nullptr);
  }
  return *this;
}
Result::~Result() { PQclear(r_); }

int Result::rows() const { return r_ == nullptr ? 0 : PQntuples(r_); }

int64_t Result::affected() const {
  if (r_ == nullptr) return 0;
  const char* n = PQcmdTuples(r_);
  return n == nullptr || *n == '\0' ? 0 : std::strtoll(n, nullptr, 10);
}

bool Result::IsNull(int row, int col) const { return PQgetisnull(r_, row, col) != 0; }

int64_t Result::Int(int row, int col) const {
  if (IsNull(row, col)) return 0;
  const auto* p = reinterpret_cast<const unsigned char*>(PQgetvalue(r_, row, col));
  const int n = PQgetlength(r_, row, col);
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v = (v << 8) | p[i];
  switch (PQftype(r_, col)) {
    case kInt2Oid:
      return static_cast<int16_t>(v);
    case kInt4Oid:
      return static_cast<int32_t>(v);
    case kInt8Oid:
    case kBoolOid:
    default:
      return static_cast<int64_t>(v);
  }
}

std::string Result::Text(int row, int col) const {
  if (IsNull(row, col)) return "";
  return std::string(PQgetvalue(r_, row, col), PQgetlength(r_, row, col));
}

absl::StatusOr<std::unique_ptr<Connection>> Connection::Open(const ConnectOptions& options) {
  if (absl::Status s = ValidateConninfo(options.conninfo); !s.ok()) return s;
  std::unique_ptr<Connection> c(new Connection(options));
  if (absl::Status s = c->Connect(); !s.ok()) return s;
  return c;
}

Connection::~Connection() {
  if (conn_ != nullptr) PQfinish(conn_);
}

absl::Status Connection::Connect() {
  if (conn_ != nullptr) {
    PQfinish(conn_);
    conn_ = nullptr;
  }
  in_transaction_ = false;
  // The caller's settings, then ours where the caller set none.
  std::map<std::string, std::string> settings;
  char* error = nullptr;
  PQconninfoOption* parsed = PQconninfoParse(options_.conninfo.c_str(), &error);
  PQfreemem(error);
  if (parsed == nullptr) return ValidateConninfo(options_.conninfo);
  for (PQconninfoOption* o = parsed; o->keyword != nullptr; ++o) {
    if (o->val != nullptr) settings[o->keyword] = o->val;
  }
  PQconninfoFree(parsed);
  const int64_t timeout_ms = absl::ToInt64Milliseconds(options_.timeout);
  // A peer that vanished (a cut cable) is found by keepalives and by unacknowledged sends.
  settings.emplace("keepalives", "1");
  settings.emplace("keepalives_idle", "2");
  settings.emplace("keepalives_interval", "1");
  settings.emplace("keepalives_count", "3");
  settings.emplace("tcp_user_timeout", absl::StrCat(timeout_ms));
  settings.emplace("application_name", options_.application_name);
  if (!options_.password.empty()) settings["password"] = options_.password;
  std::vector<const char*> keys, values;
  for (const auto& [k, v] : settings) {
    keys.push_back(k.c_str());
    values.push_back(v.c_str());
  }
  keys.push_back(nullptr);
  values.push_back(nullptr);
  // Connected without blocking, so that the timeout holds to the millisecond (libpq's own
  // connect_timeout is in whole seconds and per address).
  const absl::Time deadline = RealClock::Get().Now() + options_.timeout;
  conn_ = PQconnectStartParams(keys.data(), values.data(), /*expand_dbname=*/0);
  if (conn_ == nullptr) return absl::UnavailableError("postgres: out of memory connecting");
  auto failed = [&](absl::string_view why) {
    absl::Status s = absl::UnavailableError(
        absl::StrCat("postgres: cannot connect to ", RedactConninfo(options_.conninfo), ": ", why));
    PQfinish(conn_);
    conn_ = nullptr;
    return s;
  };
  PostgresPollingStatusType polling = PGRES_POLLING_WRITING;
  while (PQstatus(conn_) != CONNECTION_BAD && polling != PGRES_POLLING_OK) {
    if (polling == PGRES_POLLING_FAILED) break;
    const int64_t left = absl::ToInt64Milliseconds(deadline - RealClock::Get().Now());
    if (left <= 0) return failed("no answer in time");
    pollfd p = {PQsocket(conn_),
                static_cast<short>(polling == PGRES_POLLING_READING ? POLLIN : POLLOUT), 0};
    int rc;
    while ((rc = poll(&p, 1, static_cast<int>(left))) < 0 && errno == EINTR) {
    }
    if (rc == 0) return failed("no answer in time");
    polling = PQconnectPoll(conn_);
  }
  if (PQstatus(conn_) != CONNECTION_OK) return failed(Trimmed(PQerrorMessage(conn_)));
  if (PQsetnonblocking(conn_, 1) != 0) {
    return absl::InternalError("postgres: cannot make the connection non-blocking");
  }
  // A session stuck in a transaction (its coordinator frozen) would hold its row locks, the
  // leader row's among them, forever: the server ends it instead.
  const absl::Duration idle = options_.idle_in_transaction_timeout > absl::ZeroDuration()
                                  ? options_.idle_in_transaction_timeout
                                  : options_.timeout;
  return Run(absl::StrCat("SET idle_in_transaction_session_timeout = ",
                          std::max<int64_t>(1, absl::ToInt64Milliseconds(idle)),
                          "; SET lock_timeout = ", timeout_ms));
}

absl::Status Connection::EnsureConnected() {
  if (conn_ != nullptr && PQstatus(conn_) == CONNECTION_OK) return absl::OkStatus();
  if (in_transaction_) {
    in_transaction_ = false;
    return absl::UnavailableError("postgres: the connection was lost during a transaction");
  }
  return Connect();
}

absl::Status Connection::Lost(absl::string_view why, absl::string_view sql) {
  absl::Status s =
      absl::UnavailableError(absl::StrCat("postgres: ", why, " in '", sql.substr(0, 80), "'"));
  PQfinish(conn_);
  conn_ = nullptr;
  in_transaction_ = false;
  return s;
}

bool Connection::WaitFor(short events, absl::Time deadline) {
  const int64_t left = absl::ToInt64Milliseconds(deadline - RealClock::Get().Now());
  if (left <= 0) return false;
  pollfd p = {PQsocket(conn_), events, 0};
  int rc;
  while ((rc = poll(&p, 1, static_cast<int>(left))) < 0 && errno == EINTR) {
  }
  return rc > 0;
}

int Connection::SendParams(absl::string_view sql, const Params& params) {
  const std::string query(sql);
  std::vector<const char*> values;
  std::vector<int> lengths;
  for (const std::string& v : params.values_) {
    values.push_back(v.data());
    lengths.push_back(static_cast<int>(v.size()));
  }
  return PQsendQueryParams(conn_, query.c_str(), params.size(), nullptr, values.data(),
                           lengths.data(), params.formats_.data(), /*resultFormat=*/1);
}

absl::Status Connection::Flush(absl::Time deadline, absl::string_view sql) {
  // Reading while sending: a server whose answers nobody reads stops reading in turn.
  for (int rc; (rc = PQflush(conn_)) != 0;) {
    if (rc < 0) return Lost(Trimmed(PQerrorMessage(conn_)), sql);
    if (!WaitFor(POLLIN | POLLOUT, deadline))
      return Lost("no answer from the database in time", sql);
    if (PQconsumeInput(conn_) == 0) return Lost(Trimmed(PQerrorMessage(conn_)), sql);
  }
  return absl::OkStatus();
}

absl::StatusOr<pg_result*> Connection::NextResult(absl::Time deadline, absl::string_view sql) {
  while (PQisBusy(conn_)) {
    if (!WaitFor(POLLIN, deadline)) return Lost("no answer from the database in time", sql);
    if (PQconsumeInput(conn_) == 0) return Lost(Trimmed(PQerrorMessage(conn_)), sql);
  }
  return PQgetResult(conn_);
}

absl::Status Connection::SendAndWait(absl::string_view sql, const Params& params, Result* out) {
  if (absl::Status s = EnsureConnected(); !s.ok()) return s;
  const absl::Time deadline = RealClock::Get().Now() + options_.timeout;
  const int sent = params.size() == 0 && out == nullptr
                       ? PQsendQuery(conn_, std::string(sql).c_str())  // may hold several
                       : SendParams(sql, params);
  if (sent == 0) return Lost(Trimmed(PQerrorMessage(conn_)), sql);
  if (absl::Status s = Flush(deadline, sql); !s.ok()) return s;
  absl::Status status;
  Result last;
  while (true) {
    absl::StatusOr<pg_result*> r = NextResult(deadline, sql);
    if (!r.ok()) return r.status();
    if (*r == nullptr) break;
    const ExecStatusType st = PQresultStatus(*r);
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK && status.ok()) {
      status = StatementError(*r, sql);
    }
    last = Result(*r);
  }
  if (PQstatus(conn_) != CONNECTION_OK) {
    absl::Status s = Lost(Trimmed(PQerrorMessage(conn_)), sql);
    return status.ok() ? s : status;
  }
  if (!status.ok()) return status;
  if (out != nullptr) *out = std::move(last);
  return absl::OkStatus();
}

absl::Status Connection::RunTransaction(const std::vector<Statement>& statements) {
  if (in_transaction_) return absl::FailedPreconditionError("a transaction is already open");
  if (absl::Status s = EnsureConnected(); !s.ok()) return s;
  const absl::Time deadline = RealClock::Get().Now() + options_.timeout;
  const absl::string_view what =
      statements.empty() ? absl::string_view("COMMIT") : absl::string_view(statements[0].sql);
  if (PQenterPipelineMode(conn_) == 0) return Lost(Trimmed(PQerrorMessage(conn_)), what);
  // The statements, then a sync: statements between syncs are one implicit transaction, which
  // commits at the sync; after a failure the server skips the rest and rolls it all back.
  bool sent = true;
  for (size_t i = 0; sent && i < statements.size(); ++i) {
    sent = SendParams(statements[i].sql, statements[i].params) != 0;
  }
  sent = sent && PQpipelineSync(conn_) != 0;
  if (!sent) return Lost(Trimmed(PQerrorMessage(conn_)), what);
  if (absl::Status s = Flush(deadline, what); !s.ok()) return s;
  absl::Status status;
  // Each statement's results end with a null; the sync's result ends the pipeline.
  for (size_t i = 0; i < statements.size();) {
    absl::StatusOr<pg_result*> r = NextResult(deadline, what);
    if (!r.ok()) return r.status();
    if (*r == nullptr) {
      ++i;
      continue;
    }
    Result owned(*r);
    if (PQresultStatus(*r) == PGRES_FATAL_ERROR && status.ok()) {
      status = StatementError(*r, statements[i].sql);
    }
  }
  for (int nulls = 0;;) {
    absl::StatusOr<pg_result*> r = NextResult(deadline, what);
    if (!r.ok()) return r.status();
    if (*r == nullptr) {
      if (++nulls > 1) return Lost("the pipeline's results ended without its sync", what);
      continue;
    }
    Result owned(*r);
    if (PQresultStatus(*r) == PGRES_PIPELINE_SYNC) break;
  }
  if (PQexitPipelineMode(conn_) == 0) {
    absl::Status s = Lost(Trimmed(PQerrorMessage(conn_)), what);
    return status.ok() ? s : status;
  }
  return status;
}

absl::StatusOr<Result> Connection::Exec(absl::string_view sql, const Params& params) {
  Result r;
  if (absl::Status s = SendAndWait(sql, params, &r); !s.ok()) return s;
  return r;
}

absl::Status Connection::Run(absl::string_view sql, const Params& params) {
  return SendAndWait(sql, params, nullptr);
}

absl::Status Connection::Begin(absl::string_view mode) {
  if (absl::Status s = Run(mode.empty() ? std::string("BEGIN") : absl::StrCat("BEGIN ", mode));
      !s.ok()) {
    return s;
  }
  in_transaction_ = true;
  return absl::OkStatus();
}

absl::Status Connection::Commit() {
  absl::Status s = Run("COMMIT");
  in_transaction_ = false;
  return s;
}

void Connection::Rollback() {
  if (conn_ != nullptr && PQstatus(conn_) == CONNECTION_OK) Run("ROLLBACK").IgnoreError();
  in_transaction_ = false;
}

}  // namespace trainyard::pg
