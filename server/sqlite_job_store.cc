#include "server/sqlite_job_store.h"

#include <sqlite3.h>

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/job_state.h"

namespace trainyard {
namespace {

// 2: tasks gained role, shard (parameter-server shards) and stop_deadline_ms.
// 3: checkpoints gained retired_by (the step of the commit that retired them); progress moved
//    to a table of its own (a small row per report instead of the whole job).
// 4: jobs gained finished_ms and the indexes by state and by finish time, so that finished jobs
//    are listed and expired from the store rather than held in memory.
// 5: jobs gained owner (with an index for listing one owner's jobs); tokens.
// 6: searches and their trials.
constexpr int kSchemaVersion = 6;

// From version 1 to 2, in one transaction with the new version number.
constexpr char kMigrateFrom1[] = R"sql(
BEGIN IMMEDIATE;
ALTER TABLE tasks ADD COLUMN role INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tasks ADD COLUMN shard INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tasks ADD COLUMN stop_deadline_ms INTEGER NOT NULL DEFAULT 0;
UPDATE meta SET value = '2' WHERE key = 'schema_version';
COMMIT;
)sql";

constexpr char kMigrateFrom2[] = R"sql(
BEGIN IMMEDIATE;
ALTER TABLE checkpoints ADD COLUMN retired_by INTEGER NOT NULL DEFAULT -1;
CREATE TABLE IF NOT EXISTS progress(job_id TEXT PRIMARY KEY, progress BLOB NOT NULL);
UPDATE meta SET value = '3' WHERE key = 'schema_version';
COMMIT;
)sql";

// From version 3 to 4, inside the transaction of MigrateFrom3 (which also fills finished_ms).
constexpr char kMigrateFrom3[] = R"sql(
ALTER TABLE jobs ADD COLUMN finished_ms INTEGER NOT NULL DEFAULT 0;
CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs(state, seq);
CREATE INDEX IF NOT EXISTS jobs_finished ON jobs(finished_ms, seq) WHERE state IN (4, 5, 6);
)sql";

constexpr char kMigrateFrom4[] = R"sql(
BEGIN IMMEDIATE;
ALTER TABLE jobs ADD COLUMN owner TEXT NOT NULL DEFAULT '';
CREATE INDEX IF NOT EXISTS jobs_by_owner ON jobs(owner, state, seq);
CREATE TABLE IF NOT EXISTS tokens(
  id TEXT PRIMARY KEY, name TEXT NOT NULL, role TEXT NOT NULL, hash TEXT NOT NULL,
  created_ms INTEGER NOT NULL, expires_ms INTEGER NOT NULL, revoked_ms INTEGER NOT NULL,
  created_by TEXT NOT NULL, revoked_by TEXT NOT NULL);
UPDATE meta SET value = '5' WHERE key = 'schema_version';
COMMIT;
)sql";

constexpr char kMigrateFrom5[] = R"sql(
BEGIN IMMEDIATE;
CREATE TABLE IF NOT EXISTS searches(
  id TEXT PRIMARY KEY, seq INTEGER NOT NULL UNIQUE, state INTEGER NOT NULL, search BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS trials(
  search_id TEXT NOT NULL, number INTEGER NOT NULL, trial BLOB NOT NULL,
  PRIMARY KEY(search_id, number));
UPDATE meta SET value = '6' WHERE key = 'schema_version';
COMMIT;
)sql";

// The tables as of version 2 (created where missing); the migrations take them on from there.
constexpr int kBaseSchemaVersion = 2;
constexpr char kSchema[] = R"sql(
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS jobs(
  id TEXT PRIMARY KEY, seq INTEGER NOT NULL UNIQUE, state INTEGER NOT NULL, job BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS events(
  id INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL, time_ms INTEGER NOT NULL,
  from_state INTEGER NOT NULL, to_state INTEGER NOT NULL, reason TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS events_by_job ON events(job_id, id);
CREATE TABLE IF NOT EXISTS tasks(
  task_id TEXT PRIMARY KEY, job_id TEXT NOT NULL, generation INTEGER NOT NULL,
  rank INTEGER NOT NULL, worker_id TEXT NOT NULL, state INTEGER NOT NULL,
  exit_code INTEGER NOT NULL, signal INTEGER NOT NULL, message TEXT NOT NULL,
  role INTEGER NOT NULL DEFAULT 0, shard INTEGER NOT NULL DEFAULT 0,
  stop_deadline_ms INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS tasks_by_job ON tasks(job_id, generation, rank);
-- The few tasks not ended, found without reading every task (LoadActive).
CREATE INDEX IF NOT EXISTS tasks_live ON tasks(state) WHERE state IN (0, 1, 2);
CREATE TABLE IF NOT EXISTS workers(id TEXT PRIMARY KEY, worker BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS checkpoints(
  job_id TEXT NOT NULL, step INTEGER NOT NULL, uri TEXT NOT NULL, size_bytes INTEGER NOT NULL,
  created_ms INTEGER NOT NULL, generation INTEGER NOT NULL, retired INTEGER NOT NULL,
  PRIMARY KEY(job_id, step));
)sql";

absl::Status SqliteError(sqlite3* db, int rc, absl::string_view what) {
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

absl::Status SetMeta(sqlite3* db, absl::string_view key, absl::string_view value) {
  Statement st(db, "INSERT OR REPLACE INTO meta(key, value) VALUES(?, ?)");
  return st.Bind(1, key).Bind(2, value).Run();
}

}  // namespace

absl::StatusOr<std::unique_ptr<SqliteJobStore>> SqliteJobStore::Open(const std::string& path) {
  sqlite3* db = nullptr;
  int rc =
      sqlite3_open_v2(path.c_str(), &db,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    absl::Status s = SqliteError(db, rc, absl::StrCat("open ", path));
    sqlite3_close(db);
    return s;
  }
  std::unique_ptr<SqliteJobStore> store(new SqliteJobStore(db));
  absl::MutexLock lock(&store->mu_);
  sqlite3_busy_timeout(db, 5000);
  for (const char* pragma :
       {"PRAGMA journal_mode=WAL", "PRAGMA synchronous=FULL", "PRAGMA foreign_keys=ON"}) {
    Statement st(db, pragma);
    while (st.Next()) {
    }
    if (absl::Status s = st.step_status(); !s.ok()) return s;
  }
  if (absl::Status s = store->Exec(kSchema); !s.ok()) return s;
  std::optional<int> version;
  {
    Statement st(db, "SELECT value FROM meta WHERE key = 'schema_version'");
    if (st.Next()) {
      int v = 0;
      if (!absl::SimpleAtoi(st.Text(0), &v)) {
        return absl::DataLossError(absl::StrCat(path, ": bad schema_version '", st.Text(0), "'"));
      }
      version = v;
    } else if (absl::Status s = st.step_status(); !s.ok()) {
      return s;
    }
  }
  if (!version.has_value()) {
    if (absl::Status s = SetMeta(db, "schema_version", absl::StrCat(kBaseSchemaVersion)); !s.ok()) {
      return s;
    }
    version = kBaseSchemaVersion;
  }
  if (*version > kSchemaVersion) {
    return absl::FailedPreconditionError(absl::StrCat(path, ": schema version ", *version,
                                                      " is newer than supported ", kSchemaVersion));
  } else {
    // Each step in its own transaction with its version number: one cut short is redone.
    const char* const migrations[] = {kMigrateFrom1, kMigrateFrom2, nullptr, kMigrateFrom4,
                                      kMigrateFrom5};
    for (int from = *version; from < kSchemaVersion; ++from) {
      absl::Status s = from == 3 ? store->MigrateFrom3() : store->Exec(migrations[from - 1]);
      if (!s.ok()) {
        store->Exec("ROLLBACK").IgnoreError();
        return absl::Status(s.code(), absl::StrCat(path, ": migrating schema ", from, " to ",
                                                   from + 1, ": ", s.message()));
      }
    }
  }
  return store;
}

SqliteJobStore::~SqliteJobStore() {
  absl::MutexLock lock(&mu_);
  sqlite3_close_v2(db_);
}

absl::Status SqliteJobStore::MigrateFrom3() {
  if (absl::Status s = Exec("BEGIN IMMEDIATE"); !s.ok()) return s;
  if (absl::Status s = Exec(kMigrateFrom3); !s.ok()) return s;
  // finished_ms of the final jobs already there, from their rows.
  std::vector<std::pair<std::string, int64_t>> finished;
  {
    Statement st(db_, "SELECT id, job FROM jobs WHERE state IN (4, 5, 6)");
    while (st.Next()) {
      v1::Job job;
      if (!job.ParseFromString(st.Text(1))) {
        return absl::DataLossError(absl::StrCat("jobs row '", st.Text(0), "' does not parse"));
      }
      finished.emplace_back(st.Text(0), job.finished_unix_ms());
    }
    if (absl::Status s = st.step_status(); !s.ok()) return s;
  }
  for (const auto& [id, ms] : finished) {
    Statement st(db_, "UPDATE jobs SET finished_ms = ? WHERE id = ?");
    if (absl::Status s = st.Bind(1, ms).Bind(2, id).Run(); !s.ok()) return s;
  }
  if (absl::Status s = SetMeta(db_, "schema_version", "4"); !s.ok()) return s;
  return Exec("COMMIT");
}

absl::Status SqliteJobStore::Exec(absl::string_view sql) {
  std::string owned(sql);
  char* error = nullptr;
  int rc = sqlite3_exec(db_, owned.c_str(), nullptr, nullptr, &error);
  sqlite3_free(error);
  if (rc != SQLITE_OK) return SqliteError(db_, rc, "exec");
  return absl::OkStatus();
}

absl::StatusOr<std::string> SqliteJobStore::JournalMode() {
  absl::MutexLock lock(&mu_);
  Statement st(db_, "PRAGMA journal_mode");
  if (!st.Next()) {
    absl::Status s = st.step_status();
    return s.ok() ? absl::InternalError("PRAGMA journal_mode returned nothing") : s;
  }
  return st.Text(0);
}

absl::Status SqliteJobStore::Apply(const StoreMutation& mutation) {
  if (mutation.empty()) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  if (absl::Status s = Exec("BEGIN IMMEDIATE"); !s.ok()) return s;
  absl::Status s = ApplyLocked(mutation);
  if (s.ok()) s = Exec("COMMIT");
  if (!s.ok()) Exec("ROLLBACK").IgnoreError();
  return s;
}

absl::Status SqliteJobStore::ApplyLocked(const StoreMutation& m) {
  for (const StoredJob& stored : m.jobs) {
    v1::Job row = stored.job;
    row.clear_events();
    row.clear_tasks();
    // An upsert rather than INSERT OR REPLACE: a clash on the unique seq must fail, not delete
    // the other job.
    Statement st(db_,
                 "INSERT INTO jobs(id, seq, state, job, finished_ms, owner) VALUES(?, ?, ?, ?, ?, "
                 "?) ON CONFLICT(id) DO UPDATE SET seq = excluded.seq, state = excluded.state, "
                 "job = excluded.job, finished_ms = excluded.finished_ms, owner = excluded.owner");
    st.Bind(1, row.id()).Bind(2, stored.seq).Bind(3, static_cast<int64_t>(row.state()));
    st.BindBlob(4, row.SerializeAsString()).Bind(5, row.finished_unix_ms()).Bind(6, row.owner());
    if (absl::Status s = st.Run(); !s.ok()) return s;
  }
  for (const auto& [job_id, event] : m.events) {
    Statement st(db_,
                 "INSERT INTO events(job_id, time_ms, from_state, to_state, reason) "
                 "VALUES(?, ?, ?, ?, ?)");
    st.Bind(1, job_id).Bind(2, event.time_unix_ms()).Bind(3, static_cast<int64_t>(event.from()));
    st.Bind(4, static_cast<int64_t>(event.to())).Bind(5, event.reason());
    if (absl::Status s = st.Run(); !s.ok()) return s;
  }
  for (const auto& [job_id, task] : m.tasks) {
    Statement st(db_,
                 "INSERT OR REPLACE INTO tasks(task_id, job_id, generation, rank, worker_id, "
                 "state, exit_code, signal, message, role, shard, stop_deadline_ms) "
                 "VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)");
    st.Bind(1, task.task_id()).Bind(2, job_id).Bind(3, task.generation()).Bind(4, task.rank());
    st.Bind(5, task.worker_id()).Bind(6, static_cast<int64_t>(task.state()));
    st.Bind(7, task.exit_code()).Bind(8, task.signal()).Bind(9, task.message());
    st.Bind(10, static_cast<int64_t>(task.role())).Bind(11, task.shard());
    st.Bind(12, task.stop_deadline_unix_ms());
    if (absl::Status s = st.Run(); !s.ok()) return s;
  }
  for (const v1::Worker& worker : m.workers) {
    Statement st(db_, "INSERT OR REPLACE INTO workers(id, worker) VALUES(?, ?)");
    st.Bind(1, worker.id()).BindBlob(2, worker.SerializeAsString());
    if (absl::Status s = st.Run(); !s.ok()) return s;
  }
  for (const StoredCheckpoint& c : m.checkpoints) {
    Statement st(db_,
                 "INSERT OR REPLACE INTO checkpoints(job_id, step, uri, size_bytes, created_ms, "
                 "generation, retired, retired_by) VALUES(?, ?, ?, ?, ?, ?, ?, ?)");
    st.Bind(1, c.checkpoint.job_id()).Bind(2, c.checkpoint.step()).Bind(3, c.checkpoint.uri());
    st.Bind(4, c.checkpoint.size_bytes()).Bind(5, c.checkpoint.created_unix_ms());
    st.Bind(6, c.checkpoint.generation()).Bind(7, int64_t{c.retired ? 1 : 0});
    st.Bind(8, c.retired_by_step);
    if (absl::Status s = st.Run(); !s.ok()) return s;
  }
  for (const auto& [job_id, progress] : m.progress) {
    Statement st(db_, "INSERT OR REPLACE INTO progress(job_id, progress) VALUES(?, ?)");
    st.Bind(1, job_id).BindBlob(2, progress.SerializeAsString());
    if (absl::Status s = st.Run(); !s.ok()) return s;
  }
  if (m.next_job_seq.has_value()) {
    if (absl::Status s = SetMeta(db_, "next_job_seq", absl::StrCat(*m.next_job_seq)); !s.ok()) {
      return s;
    }
  }
  for (const StoreMutation::EventTrim& trim : m.trimmed_events) {
    Statement st(db_,
                 "DELETE FROM events WHERE id IN (SELECT id FROM events WHERE job_id = ? ORDER BY "
                 "id LIMIT ? OFFSET ?)");
    st.Bind(1, trim.job_id).Bind(2, int64_t{trim.count}).Bind(3, int64_t{trim.keep_first});
    if (absl::Status s = st.Run(); !s.ok()) return s;
  }
  for (const StoredToken& t : m.tokens) {
    Statement st(db_,
                 "INSERT INTO tokens(id, name, role, hash, created_ms, expires_ms, revoked_ms, "
                 "created_by, revoked_by) VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(id) DO "
                 "UPDATE SET name = excluded.name, role = excluded.role, hash = excluded.hash, "
                 "created_ms = excluded.created_ms, expires_ms = excluded.expires_ms, revoked_ms = "
                 "excluded.revoked_ms, created_by = excluded.created_by, revoked_by = "
                 "excluded.revoked_by");
    st.Bind(1, t.id).Bind(2, t.name).Bind(3, t.role).Bind(4, t.hash).Bind(5, t.created_unix_ms);
    st.Bind(6, t.expires_unix_ms).Bind(7, t.revoked_unix_ms).Bind(8, t.created_by);
    st.Bind(9, t.revoked_by);
    if (absl::Status s = st.Run(); !s.ok()) return s;
  }
  for (const StoredSearch& stored : m.searches) {
    v1::Search row = stored.search;
    row.clear_trials();
    // An upsert, as for jobs: a clash on the unique seq must fail.
    Statement st(db_,
                 "INSERT INTO searches(id, seq, state, search) VALUES(?, ?, ?, ?) ON CONFLICT(id) "
                 "DO UPDATE SET seq = excluded.seq, state = excluded.state, search = "
                 "excluded.search");
    st.Bind(1, row.id()).Bind(2, stored.seq).Bind(3, static_cast<int64_t>(row.state()));
    st.BindBlob(4, row.SerializeAsString());
    if (absl::Status s = st.Run(); !s.ok()) return s;
  }
  for (const auto& [search_id, trial] : m.trials) {
    Statement st(db_, "INSERT OR REPLACE INTO trials(search_id, number, trial) VALUES(?, ?, ?)");
    st.Bind(1, search_id).Bind(2, trial.number()).BindBlob(3, trial.SerializeAsString());
    if (absl::Status s = st.Run(); !s.ok()) return s;
  }
  for (const auto& [job_id, step] : m.removed_checkpoints) {
    Statement st(db_, "DELETE FROM checkpoints WHERE job_id = ? AND step = ?");
    st.Bind(1, job_id).Bind(2, step);
    if (absl::Status s = st.Run(); !s.ok()) return s;
  }
  for (const std::string& job_id : m.removed_jobs) {
    for (const char* sql :
         {"DELETE FROM events WHERE job_id = ?", "DELETE FROM tasks WHERE job_id = ?",
          "DELETE FROM checkpoints WHERE job_id = ?", "DELETE FROM progress WHERE job_id = ?",
          "DELETE FROM jobs WHERE id = ?"}) {
      Statement st(db_, sql);
      st.Bind(1, job_id);
      if (absl::Status s = st.Run(); !s.ok()) return s;
    }
  }
  for (const std::string& worker_id : m.removed_workers) {
    Statement st(db_, "DELETE FROM workers WHERE id = ?");
    st.Bind(1, worker_id);
    if (absl::Status s = st.Run(); !s.ok()) return s;
  }
  return absl::OkStatus();
}

namespace {

// States of jobs not finished, and of tasks not ended, as SQL lists (from the proto's numbers).
constexpr char kActiveJobStates[] = "(1, 2, 3, 7)";  // PENDING SCHEDULED RUNNING RESTARTING
constexpr char kLiveTaskStates[] = "(0, 1, 2)";      // unspecified, STARTING, RUNNING
static_assert(v1::PENDING == 1 && v1::SCHEDULED == 2 && v1::RUNNING == 3 && v1::RESTARTING == 7);
static_assert(v1::TASK_STARTING == 1 && v1::TASK_RUNNING == 2);

constexpr char kTaskColumns[] =
    "t.task_id, t.generation, t.rank, t.worker_id, t.state, t.exit_code, t.signal, t.message, "
    "t.role, t.shard, t.stop_deadline_ms";
constexpr char kTaskOrder[] = "t.generation, t.role, t.rank, t.shard";

// Reads the kTaskColumns of the statement's row, from column `first` on.
template <typename Row>
void ReadTask(Row& st, int first, v1::TaskInfo* t) {
  t->set_task_id(st.Text(first));
  t->set_generation(st.Int(first + 1));
  t->set_rank(static_cast<int32_t>(st.Int(first + 2)));
  t->set_worker_id(st.Text(first + 3));
  t->set_state(static_cast<v1::TaskState>(st.Int(first + 4)));
  t->set_exit_code(static_cast<int32_t>(st.Int(first + 5)));
  t->set_signal(static_cast<int32_t>(st.Int(first + 6)));
  t->set_message(st.Text(first + 7));
  t->set_role(static_cast<v1::TaskRole>(st.Int(first + 8)));
  t->set_shard(static_cast<int32_t>(st.Int(first + 9)));
  t->set_stop_deadline_unix_ms(st.Int(first + 10));
}

template <typename Row>
void ReadEvent(Row& st, int first, v1::JobEvent* e) {
  e->set_time_unix_ms(st.Int(first));
  e->set_from(static_cast<v1::JobState>(st.Int(first + 1)));
  e->set_to(static_cast<v1::JobState>(st.Int(first + 2)));
  e->set_reason(st.Text(first + 3));
}

}  // namespace

absl::Status SqliteJobStore::ReadJobs(const std::string& sql, int64_t bound, bool with_progress,
                                      std::vector<StoredJob>* out, absl::string_view owner) {
  Statement st(db_, sql);
  if (bound != kNoBound) st.Bind(1, bound);
  if (!owner.empty()) st.Bind(2, owner);
  while (st.Next()) {
    StoredJob stored;
    stored.seq = st.Int(0);
    if (!stored.job.ParseFromString(st.Text(1))) {
      return absl::DataLossError(absl::StrCat("jobs row seq ", stored.seq, " does not parse"));
    }
    if (with_progress && !st.IsNull(2) &&
        !stored.job.mutable_progress()->ParseFromString(st.Text(2))) {
      return absl::DataLossError(
          absl::StrCat("progress of job seq ", stored.seq, " does not parse"));
    }
    out->push_back(std::move(stored));
  }
  return st.step_status();
}

absl::Status SqliteJobStore::ReadDetails(const std::string& which,
                                         const std::optional<std::string>& param,
                                         std::vector<StoredJob>& jobs,
                                         std::vector<StoredCheckpoint>* checkpoints) {
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < jobs.size(); ++i) index[jobs[i].job.id()] = i;
  const std::string where =
      which.empty() ? std::string() : absl::StrCat(" WHERE job_id IN ", which);
  {
    Statement st(db_, absl::StrCat("SELECT job_id, time_ms, from_state, to_state, reason FROM "
                                   "events",
                                   where, " ORDER BY id"));
    if (param.has_value()) st.Bind(1, *param);
    while (st.Next()) {
      auto it = index.find(st.Text(0));
      if (it != index.end()) ReadEvent(st, 1, jobs[it->second].job.add_events());
    }
    if (absl::Status s = st.step_status(); !s.ok()) return s;
  }
  {
    Statement st(db_, absl::StrCat("SELECT t.job_id, ", kTaskColumns, " FROM tasks t", where,
                                   " ORDER BY t.job_id, ", kTaskOrder));
    if (param.has_value()) st.Bind(1, *param);
    while (st.Next()) {
      auto it = index.find(st.Text(0));
      if (it != index.end()) ReadTask(st, 1, jobs[it->second].job.add_tasks());
    }
    if (absl::Status s = st.step_status(); !s.ok()) return s;
  }
  {
    Statement st(db_, absl::StrCat("SELECT job_id, progress FROM progress", where));
    if (param.has_value()) st.Bind(1, *param);
    while (st.Next()) {
      auto it = index.find(st.Text(0));
      if (it == index.end()) continue;
      if (!jobs[it->second].job.mutable_progress()->ParseFromString(st.Text(1))) {
        return absl::DataLossError(absl::StrCat("progress row '", st.Text(0), "' does not parse"));
      }
    }
    if (absl::Status s = st.step_status(); !s.ok()) return s;
  }
  {
    Statement st(db_, absl::StrCat("SELECT job_id, step, uri, size_bytes, created_ms, generation, "
                                   "retired, retired_by FROM checkpoints",
                                   where, " ORDER BY job_id, step"));
    if (param.has_value()) st.Bind(1, *param);
    while (st.Next()) {
      if (!index.count(st.Text(0))) continue;
      StoredCheckpoint c;
      c.checkpoint.set_job_id(st.Text(0));
      c.checkpoint.set_step(st.Int(1));
      c.checkpoint.set_uri(st.Text(2));
      c.checkpoint.set_size_bytes(st.Int(3));
      c.checkpoint.set_created_unix_ms(st.Int(4));
      c.checkpoint.set_generation(st.Int(5));
      c.retired = st.Int(6) != 0;
      c.retired_by_step = st.Int(7);
      checkpoints->push_back(std::move(c));
    }
    if (absl::Status s = st.step_status(); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<StoredJobRecord> SqliteJobStore::LoadJob(absl::string_view job_id) {
  absl::MutexLock lock(&mu_);
  std::vector<StoredJob> jobs;
  {
    Statement st(db_, "SELECT seq, job FROM jobs WHERE id = ?");
    st.Bind(1, job_id);
    if (st.Next()) {
      StoredJob& stored = jobs.emplace_back();
      stored.seq = st.Int(0);
      if (!stored.job.ParseFromString(st.Text(1))) {
        return absl::DataLossError(absl::StrCat("jobs row '", job_id, "' does not parse"));
      }
    } else if (absl::Status s = st.step_status(); !s.ok()) {
      return s;
    } else {
      return absl::NotFoundError(absl::StrCat("job '", job_id, "' not in the store"));
    }
  }
  // One job: its rows through the by-job indexes.
  StoredJobRecord record;
  if (absl::Status s = ReadDetails("(?)", std::string(job_id), jobs, &record.checkpoints);
      !s.ok()) {
    return s;
  }
  record.job = std::move(jobs[0]);
  return record;
}

absl::StatusOr<std::vector<StoredJob>> SqliteJobStore::ListFinishedJobs(
    const std::vector<v1::JobState>& states, int64_t before_seq, int limit,
    absl::string_view owner) {
  std::set<int> wanted;
  for (v1::JobState state : states) {
    if (IsFinalJobState(state)) wanted.insert(state);
  }
  if (states.empty()) wanted = {v1::SUCCEEDED, v1::FAILED, v1::CANCELLED};
  std::vector<StoredJob> out;
  if (limit <= 0) return out;
  // A query per state, each a walk down jobs_by_state from before_seq that stops at `limit`
  // (one query over several states would sort all of their jobs first), merged by seq.
  absl::MutexLock lock(&mu_);
  for (int state : wanted) {
    const std::string sql = absl::StrCat(
        "SELECT j.seq, j.job, p.progress FROM jobs j INDEXED BY ",
        owner.empty() ? "jobs_by_state" : "jobs_by_owner",
        " LEFT JOIN progress p ON p.job_id = j.id WHERE j.state = ", state, " AND j.seq < ?",
        owner.empty() ? "" : " AND j.owner = ?", " ORDER BY j.seq DESC LIMIT ", limit);
    if (absl::Status s = ReadJobs(sql, before_seq, /*with_progress=*/true, &out, owner); !s.ok()) {
      return s;
    }
  }
  std::sort(out.begin(), out.end(),
            [](const StoredJob& a, const StoredJob& b) { return a.seq > b.seq; });
  if (static_cast<int>(out.size()) > limit) out.resize(limit);
  return out;
}

absl::StatusOr<std::vector<std::pair<std::string, v1::JobState>>> SqliteJobStore::FinishedBefore(
    int64_t unix_ms, int limit) {
  absl::MutexLock lock(&mu_);
  std::vector<std::pair<std::string, v1::JobState>> out;
  // A walk along the partial index jobs_finished (its WHERE is repeated word for word) that stops
  // at `limit`.
  Statement st(db_,
               "SELECT id, state FROM jobs INDEXED BY jobs_finished WHERE state IN (4, 5, 6) AND "
               "finished_ms <= ? ORDER BY finished_ms, seq LIMIT ?");
  st.Bind(1, unix_ms).Bind(2, int64_t{limit});
  while (st.Next()) out.emplace_back(st.Text(0), static_cast<v1::JobState>(st.Int(1)));
  if (absl::Status s = st.step_status(); !s.ok()) return s;
  return out;
}

absl::StatusOr<std::vector<StoredToken>> SqliteJobStore::LoadTokens() {
  absl::MutexLock lock(&mu_);
  std::vector<StoredToken> out;
  Statement st(db_,
               "SELECT id, name, role, hash, created_ms, expires_ms, revoked_ms, created_by, "
               "revoked_by FROM tokens ORDER BY created_ms, id");
  while (st.Next()) {
    StoredToken t;
    t.id = st.Text(0);
    t.name = st.Text(1);
    t.role = st.Text(2);
    t.hash = st.Text(3);
    t.created_unix_ms = st.Int(4);
    t.expires_unix_ms = st.Int(5);
    t.revoked_unix_ms = st.Int(6);
    t.created_by = st.Text(7);
    t.revoked_by = st.Text(8);
    out.push_back(std::move(t));
  }
  if (absl::Status s = st.step_status(); !s.ok()) return s;
  return out;
}

absl::StatusOr<std::vector<StoredSearch>> SqliteJobStore::LoadSearches() {
  absl::MutexLock lock(&mu_);
  std::vector<StoredSearch> out;
  std::map<std::string, size_t> by_id;
  {
    Statement st(db_, "SELECT seq, search FROM searches ORDER BY seq");
    while (st.Next()) {
      StoredSearch stored;
      stored.seq = st.Int(0);
      if (!stored.search.ParseFromString(st.Text(1))) {
        return absl::DataLossError(absl::StrCat("searches row ", stored.seq, " does not parse"));
      }
      by_id[stored.search.id()] = out.size();
      out.push_back(std::move(stored));
    }
    if (absl::Status s = st.step_status(); !s.ok()) return s;
  }
  Statement st(db_, "SELECT search_id, number, trial FROM trials ORDER BY search_id, number");
  while (st.Next()) {
    auto it = by_id.find(st.Text(0));
    if (it == by_id.end()) continue;  // a trial of no search: nothing refers to it
    if (!out[it->second].search.add_trials()->ParseFromString(st.Text(2))) {
      return absl::DataLossError(
          absl::StrCat("trials row (", st.Text(0), ", ", st.Int(1), ") does not parse"));
    }
  }
  if (absl::Status s = st.step_status(); !s.ok()) return s;
  return out;
}

absl::StatusOr<StoreContents> SqliteJobStore::Load(bool active_only) {
  absl::MutexLock lock(&mu_);
  StoreContents out;
  if (!active_only) {
    if (absl::Status s =
            ReadJobs("SELECT seq, job FROM jobs ORDER BY seq", kNoBound, false, &out.jobs);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = ReadDetails("", std::nullopt, out.jobs, &out.checkpoints); !s.ok())
      return s;
  } else {
    // The jobs not finished (through jobs_by_state), then the final ones with a task not ended
    // (through tasks_live); their ids go to a temporary table that the other reads join.
    if (absl::Status s = ReadJobs(absl::StrCat("SELECT seq, job FROM jobs WHERE state IN ",
                                               kActiveJobStates, " ORDER BY seq"),
                                  kNoBound, false, &out.jobs);
        !s.ok()) {
      return s;
    }
    if (absl::Status s =
            ReadJobs(absl::StrCat("SELECT seq, job FROM jobs WHERE state NOT IN ", kActiveJobStates,
                                  " AND id IN (SELECT job_id FROM tasks WHERE state IN ",
                                  kLiveTaskStates, ") ORDER BY seq"),
                     kNoBound, false, &out.jobs);
        !s.ok()) {
      return s;
    }
    std::sort(out.jobs.begin(), out.jobs.end(),
              [](const StoredJob& a, const StoredJob& b) { return a.seq < b.seq; });
    if (absl::Status s = Exec("CREATE TEMP TABLE IF NOT EXISTS loading(id TEXT PRIMARY KEY); "
                              "DELETE FROM temp.loading");
        !s.ok()) {
      return s;
    }
    for (const StoredJob& j : out.jobs) {
      Statement st(db_, "INSERT INTO temp.loading(id) VALUES(?)");
      if (absl::Status s = st.Bind(1, j.job.id()).Run(); !s.ok()) return s;
    }
    absl::Status read =
        ReadDetails("(SELECT id FROM temp.loading)", std::nullopt, out.jobs, &out.checkpoints);
    Exec("DELETE FROM temp.loading").IgnoreError();
    if (!read.ok()) return read;
    Statement st(db_, absl::StrCat("SELECT state, COUNT(*) FROM jobs WHERE state NOT IN ",
                                   kActiveJobStates, " GROUP BY state"));
    while (st.Next()) out.not_loaded[static_cast<v1::JobState>(st.Int(0))] = st.Int(1);
    if (absl::Status s = st.step_status(); !s.ok()) return s;
    for (const StoredJob& j : out.jobs) {
      if (IsFinalJobState(j.job.state())) out.not_loaded[j.job.state()]--;
    }
  }
  {
    Statement st(db_, "SELECT id, worker FROM workers ORDER BY id");
    while (st.Next()) {
      v1::Worker w;
      if (!w.ParseFromString(st.Text(1))) {
        return absl::DataLossError(absl::StrCat("workers row '", st.Text(0), "' does not parse"));
      }
      out.workers.push_back(std::move(w));
    }
    if (absl::Status s = st.step_status(); !s.ok()) return s;
  }
  {
    Statement st(db_, "SELECT value FROM meta WHERE key = 'next_job_seq'");
    if (st.Next()) {
      if (!absl::SimpleAtoi(st.Text(0), &out.next_job_seq)) {
        return absl::DataLossError(absl::StrCat("bad next_job_seq '", st.Text(0), "'"));
      }
    }
    if (absl::Status s = st.step_status(); !s.ok()) return s;
  }
  return out;
}

}  // namespace trainyard
