#include "server/store/sqlite_job_store.h"

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
#include "server/lifecycle/job_state.h"
#include "server/store/sqlite_statement.h"

namespace trainyard {

using sqlite::SqliteError;
using sqlite::Statement;

namespace {

// 2: tasks gained role, shard (parameter-server shards) and stop_deadline_ms.
// 3: checkpoints gained retired_by (the step of the commit that retired them); progress moved
//    to a table of its own (a small row per report instead of the whole job).
// 4: jobs gained finished_ms and the indexes by state and by finish time, so that finished jobs
//    are listed and expired from the store rather than held in memory.
// 5: jobs gained owner (with an index for listing one owner's jobs); tokens.
// 6: searches and their trials.
// 7: tasks gained out_of_memory, memory_limit and memory_peak.
// 8: queues.
// 9: metric_points, the jobs' metric histories.
constexpr int kSchemaVersion = 9;

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

constexpr char kMigrateFrom6[] = R"sql(
BEGIN IMMEDIATE;
ALTER TABLE tasks ADD COLUMN out_of_memory INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tasks ADD COLUMN memory_limit INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tasks ADD COLUMN memory_peak INTEGER NOT NULL DEFAULT 0;
UPDATE meta SET value = '7' WHERE key = 'schema_version';
COMMIT;
)sql";

constexpr char kMigrateFrom7[] = R"sql(
BEGIN IMMEDIATE;
CREATE TABLE IF NOT EXISTS queues(name TEXT PRIMARY KEY, queue BLOB NOT NULL);
UPDATE meta SET value = '8' WHERE key = 'schema_version';
COMMIT;
)sql";

constexpr char kMigrateFrom8[] = R"sql(
BEGIN IMMEDIATE;
CREATE TABLE IF NOT EXISTS metric_points(
  job_id TEXT NOT NULL, unix_ms INTEGER NOT NULL, step INTEGER NOT NULL, progress BLOB NOT NULL,
  PRIMARY KEY(job_id, unix_ms));
UPDATE meta SET value = '9' WHERE key = 'schema_version';
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
    const char* const migrations[] = {kMigrateFrom1, kMigrateFrom2, nullptr,       kMigrateFrom4,
                                      kMigrateFrom5, kMigrateFrom6, kMigrateFrom7, kMigrateFrom8};
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

namespace {

// The jobs' rows, their events and tasks.
absl::Status ApplyJobs(sqlite3* db, const StoreMutation& m) {
  for (const StoredJob& stored : m.jobs) {
    v1::Job row = stored.job;
    row.clear_events();
    row.clear_tasks();
    // An upsert rather than INSERT OR REPLACE: a clash on the unique seq must fail, not delete
    // the other job.
    Statement st(db,
                 "INSERT INTO jobs(id, seq, state, job, finished_ms, owner) VALUES(?, ?, ?, ?, ?, "
                 "?) ON CONFLICT(id) DO UPDATE SET seq = excluded.seq, state = excluded.state, "
                 "job = excluded.job, finished_ms = excluded.finished_ms, owner = excluded.owner");
    st.Bind(1, row.id()).Bind(2, stored.seq).Bind(3, static_cast<int64_t>(row.state()));
    st.BindBlob(4, row.SerializeAsString()).Bind(5, row.finished_unix_ms()).Bind(6, row.owner());
    if (absl::Status s = st.Run(); !s.ok()) return s;
  }
  for (const auto& [job_id, event] : m.events) {
    Statement st(db,
                 "INSERT INTO events(job_id, time_ms, from_state, to_state, reason) "
                 "VALUES(?, ?, ?, ?, ?)");
    st.Bind(1, job_id).Bind(2, event.time_unix_ms()).Bind(3, static_cast<int64_t>(event.from()));
    st.Bind(4, static_cast<int64_t>(event.to())).Bind(5, event.reason());
    if (absl::Status s = st.Run(); !s.ok()) return s;
  }
  for (const auto& [job_id, task] : m.tasks) {
    Statement st(db,
                 "INSERT OR REPLACE INTO tasks(task_id, job_id, generation, rank, worker_id, "
                 "state, exit_code, signal, message, role, shard, stop_deadline_ms, "
                 "out_of_memory, memory_limit, memory_peak) "
                 "VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)");
    st.Bind(1, task.task_id()).Bind(2, job_id).Bind(3, task.generation()).Bind(4, task.rank());
    st.Bind(5, task.worker_id()).Bind(6, static_cast<int64_t>(task.state()));
    st.Bind(7, task.exit_code()).Bind(8, task.signal()).Bind(9, task.message());
    st.Bind(10, static_cast<int64_t>(task.role())).Bind(11, task.shard());
    st.Bind(12, task.stop_deadline_unix_ms());
    st.Bind(13, int64_t{task.out_of_memory()}).Bind(14, task.memory_limit_bytes());
    st.Bind(15, task.memory_peak_bytes());
    if (absl::Status s = st.Run(); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// Workers, checkpoints, progress, the next job number and trimmed events.
absl::Status ApplyRecords(sqlite3* db, const StoreMutation& m) {
  for (const v1::Worker& worker : m.workers) {
    Statement st(db, "INSERT OR REPLACE INTO workers(id, worker) VALUES(?, ?)");
    st.Bind(1, worker.id()).BindBlob(2, worker.SerializeAsString());
    if (absl::Status s = st.Run(); !s.ok()) return s;
  }
  for (const StoredCheckpoint& c : m.checkpoints) {
    Statement st(db,
                 "INSERT OR REPLACE INTO checkpoints(job_id, step, uri, size_bytes, created_ms, "
                 "generation, retired, retired_by) VALUES(?, ?, ?, ?, ?, ?, ?, ?)");
    st.Bind(1, c.checkpoint.job_id()).Bind(2, c.checkpoint.step()).Bind(3, c.checkpoint.uri());
    st.Bind(4, c.checkpoint.size_bytes()).Bind(5, c.checkpoint.created_unix_ms());
    st.Bind(6, c.checkpoint.generation()).Bind(7, int64_t{c.retired ? 1 : 0});
    st.Bind(8, c.retired_by_step);
    if (absl::Status s = st.Run(); !s.ok()) return s;
  }
  for (const auto& [job_id, progress] : m.progress) {
    Statement st(db, "INSERT OR REPLACE INTO progress(job_id, progress) VALUES(?, ?)");
    st.Bind(1, job_id).BindBlob(2, progress.SerializeAsString());
    if (absl::Status s = st.Run(); !s.ok()) return s;
  }
  for (const auto& [job_id, point] : m.metric_points) {
    Statement st(db,
                 "INSERT OR REPLACE INTO metric_points(job_id, unix_ms, step, progress) "
                 "VALUES(?, ?, ?, ?)");
    st.Bind(1, job_id).Bind(2, point.unix_ms()).Bind(3, point.progress().step());
    st.BindBlob(4, point.progress().SerializeAsString());
    if (absl::Status s = st.Run(); !s.ok()) return s;
  }
  if (m.next_job_seq.has_value()) {
    if (absl::Status s = SetMeta(db, "next_job_seq", absl::StrCat(*m.next_job_seq)); !s.ok()) {
      return s;
    }
  }
  for (const StoreMutation::EventTrim& trim : m.trimmed_events) {
    Statement st(db,
                 "DELETE FROM events WHERE id IN (SELECT id FROM events WHERE job_id = ? ORDER BY "
                 "id LIMIT ? OFFSET ?)");
    st.Bind(1, trim.job_id).Bind(2, int64_t{trim.count}).Bind(3, int64_t{trim.keep_first});
    if (absl::Status s = st.Run(); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// Tokens, searches and their trials, queues.
absl::Status ApplyAccessAndSearches(sqlite3* db, const StoreMutation& m) {
  for (const StoredToken& t : m.tokens) {
    Statement st(db,
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
    Statement st(db,
                 "INSERT INTO searches(id, seq, state, search) VALUES(?, ?, ?, ?) ON CONFLICT(id) "
                 "DO UPDATE SET seq = excluded.seq, state = excluded.state, search = "
                 "excluded.search");
    st.Bind(1, row.id()).Bind(2, stored.seq).Bind(3, static_cast<int64_t>(row.state()));
    st.BindBlob(4, row.SerializeAsString());
    if (absl::Status s = st.Run(); !s.ok()) return s;
  }
  for (const auto& [search_id, trial] : m.trials) {
    Statement st(db, "INSERT OR REPLACE INTO trials(search_id, number, trial) VALUES(?, ?, ?)");
    st.Bind(1, search_id).Bind(2, trial.number()).BindBlob(3, trial.SerializeAsString());
    if (absl::Status s = st.Run(); !s.ok()) return s;
  }
  for (v1::Queue queue : m.queues) {
    queue.clear_status();
    Statement st(db, "INSERT OR REPLACE INTO queues(name, queue) VALUES(?, ?)");
    st.Bind(1, queue.name()).BindBlob(2, queue.SerializeAsString());
    if (absl::Status s = st.Run(); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// What the mutation removes.
absl::Status ApplyRemovals(sqlite3* db, const StoreMutation& m) {
  for (const std::string& name : m.removed_queues) {
    Statement st(db, "DELETE FROM queues WHERE name = ?");
    st.Bind(1, name);
    if (absl::Status s = st.Run(); !s.ok()) return s;
  }
  for (const auto& [job_id, step] : m.removed_checkpoints) {
    Statement st(db, "DELETE FROM checkpoints WHERE job_id = ? AND step = ?");
    st.Bind(1, job_id).Bind(2, step);
    if (absl::Status s = st.Run(); !s.ok()) return s;
  }
  for (const auto& [job_id, unix_ms] : m.removed_metric_points) {
    Statement st(db, "DELETE FROM metric_points WHERE job_id = ? AND unix_ms = ?");
    st.Bind(1, job_id).Bind(2, unix_ms);
    if (absl::Status s = st.Run(); !s.ok()) return s;
  }
  for (const std::string& job_id : m.removed_jobs) {
    for (const char* sql :
         {"DELETE FROM events WHERE job_id = ?", "DELETE FROM tasks WHERE job_id = ?",
          "DELETE FROM checkpoints WHERE job_id = ?", "DELETE FROM progress WHERE job_id = ?",
          "DELETE FROM metric_points WHERE job_id = ?", "DELETE FROM jobs WHERE id = ?"}) {
      Statement st(db, sql);
      st.Bind(1, job_id);
      if (absl::Status s = st.Run(); !s.ok()) return s;
    }
  }
  for (const std::string& worker_id : m.removed_workers) {
    Statement st(db, "DELETE FROM workers WHERE id = ?");
    st.Bind(1, worker_id);
    if (absl::Status s = st.Run(); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status SqliteJobStore::ApplyLocked(const StoreMutation& m) {
  for (auto apply : {ApplyJobs, ApplyRecords, ApplyAccessAndSearches, ApplyRemovals}) {
    if (absl::Status s = apply(db_, m); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace trainyard
