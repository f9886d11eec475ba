#include "server/store/postgres_job_store.h"

#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/clock.h"

namespace trainyard {

using pg::Params;

namespace {

// Version 1: the SQLite store's tables as of its version 8, the lease and the shared secrets.
// Integers are BIGINT throughout (Result reads them as such); blobs are serialized protos.
constexpr char kSchemaV1[] = R"sql(
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS jobs(
  id TEXT PRIMARY KEY, seq BIGINT NOT NULL UNIQUE, state BIGINT NOT NULL, job BYTEA NOT NULL,
  finished_ms BIGINT NOT NULL DEFAULT 0, owner TEXT NOT NULL DEFAULT '');
CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs(state, seq);
CREATE INDEX IF NOT EXISTS jobs_finished ON jobs(finished_ms, seq) WHERE state IN (4, 5, 6);
CREATE INDEX IF NOT EXISTS jobs_by_owner ON jobs(owner, state, seq);
CREATE TABLE IF NOT EXISTS events(
  id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, job_id TEXT NOT NULL,
  time_ms BIGINT NOT NULL, from_state BIGINT NOT NULL, to_state BIGINT NOT NULL,
  reason TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS events_by_job ON events(job_id, id);
CREATE TABLE IF NOT EXISTS tasks(
  task_id TEXT PRIMARY KEY, job_id TEXT NOT NULL, generation BIGINT NOT NULL,
  rank BIGINT NOT NULL, worker_id TEXT NOT NULL, state BIGINT NOT NULL,
  exit_code BIGINT NOT NULL, signal BIGINT NOT NULL, message TEXT NOT NULL,
  role BIGINT NOT NULL, shard BIGINT NOT NULL, stop_deadline_ms BIGINT NOT NULL,
  out_of_memory BIGINT NOT NULL, memory_limit BIGINT NOT NULL, memory_peak BIGINT NOT NULL);
CREATE INDEX IF NOT EXISTS tasks_by_job ON tasks(job_id, generation, rank);
CREATE INDEX IF NOT EXISTS tasks_live ON tasks(state) WHERE state IN (0, 1, 2);
CREATE TABLE IF NOT EXISTS progress(job_id TEXT PRIMARY KEY, progress BYTEA NOT NULL);
CREATE TABLE IF NOT EXISTS workers(id TEXT PRIMARY KEY, worker BYTEA NOT NULL);
CREATE TABLE IF NOT EXISTS checkpoints(
  job_id TEXT NOT NULL, step BIGINT NOT NULL, uri TEXT NOT NULL, size_bytes BIGINT NOT NULL,
  created_ms BIGINT NOT NULL, generation BIGINT NOT NULL, retired BIGINT NOT NULL,
  retired_by BIGINT NOT NULL, PRIMARY KEY(job_id, step));
CREATE TABLE IF NOT EXISTS tokens(
  id TEXT PRIMARY KEY, name TEXT NOT NULL, role TEXT NOT NULL, hash TEXT NOT NULL,
  created_ms BIGINT NOT NULL, expires_ms BIGINT NOT NULL, revoked_ms BIGINT NOT NULL,
  created_by TEXT NOT NULL, revoked_by TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS searches(
  id TEXT PRIMARY KEY, seq BIGINT NOT NULL UNIQUE, state BIGINT NOT NULL, search BYTEA NOT NULL);
CREATE TABLE IF NOT EXISTS trials(
  search_id TEXT NOT NULL, number BIGINT NOT NULL, trial BYTEA NOT NULL,
  PRIMARY KEY(search_id, number));
CREATE TABLE IF NOT EXISTS queues(name TEXT PRIMARY KEY, queue BYTEA NOT NULL);
CREATE TABLE IF NOT EXISTS secrets(name TEXT PRIMARY KEY, value BYTEA NOT NULL);
CREATE TABLE IF NOT EXISTS leader(
  id INT PRIMARY KEY CHECK (id = 1), holder TEXT NOT NULL, address TEXT NOT NULL,
  token BIGINT NOT NULL, expires_at TIMESTAMPTZ NOT NULL);
INSERT INTO leader(id, holder, address, token, expires_at)
  VALUES(1, '', '', 0, 'epoch') ON CONFLICT (id) DO NOTHING;
-- The fence of a write: fails it (SQLSTATE TY001) unless the lease still names this holder and
-- token and has not expired, and holds the lease row (FOR SHARE) until the write's transaction
-- ends, so that a takeover waits for it. A function, so that the check and the write travel in
-- one round trip (a failure aborts the rest of the transaction at the server).
CREATE OR REPLACE FUNCTION trainyard_fence(h TEXT, t BIGINT) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  PERFORM 1 FROM leader WHERE id = 1 AND holder = h AND token = t AND expires_at > now()
    FOR SHARE;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'this coordinator no longer holds the leader lease (token %): nothing written', t
      USING ERRCODE = 'TY001';
  END IF;
END $$;
)sql";

// Version 2: task logs (server/store/postgres_log_backend.h), so that every coordinator serves
// every log. A log's size and cap in one row; its bytes in pieces, keyed by where each starts.
constexpr char kSchemaV2[] = R"sql(
CREATE TABLE IF NOT EXISTS task_logs(
  job_id TEXT NOT NULL, task_id TEXT NOT NULL, size BIGINT NOT NULL,
  kept BIGINT, shipped_end BIGINT, sealed BOOLEAN NOT NULL DEFAULT false,
  PRIMARY KEY(job_id, task_id));
CREATE TABLE IF NOT EXISTS task_log_pieces(
  job_id TEXT NOT NULL, task_id TEXT NOT NULL, start BIGINT NOT NULL, data BYTEA NOT NULL,
  PRIMARY KEY(job_id, task_id, start));
)sql";

// Version 3: the change feed standbys keep their warm copy by (server/leadership/standby_copy.h).
// Triggers add, for every statement that writes a job's rows (the job, its events, tasks, progress
// and checkpoint records) or a worker, a row per job or worker it touched, and one for any write to
// the tokens, searches (with trials) or queues: in the database, so that every writer is
// followed, an older coordinator's and a migration's included. A row's xid says which snapshots
// see it, so a reader finds exactly what was committed between two of its reads, whatever order
// the transactions committed in. The leader deletes rows older than kChangeRetention.
constexpr char kSchemaV3[] = R"sql(
SET LOCAL client_min_messages = warning;  -- no notices of objects already there
CREATE TABLE IF NOT EXISTS changes(
  xid xid8 NOT NULL DEFAULT pg_current_xact_id(), at TIMESTAMPTZ NOT NULL DEFAULT now(),
  kind TEXT NOT NULL, key TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS changes_by_xid ON changes(xid);
CREATE INDEX IF NOT EXISTS changes_by_time ON changes(at);
-- Rows keyed by `id` (jobs, workers; the kind is the trigger's argument) and by `job_id`; the
-- statement's rows are its transition table.
CREATE OR REPLACE FUNCTION trainyard_changed_by_id() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO changes(kind, key) SELECT DISTINCT TG_ARGV[0], id FROM changed_rows;
  RETURN NULL;
END $$;
CREATE OR REPLACE FUNCTION trainyard_changed_by_job_id() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO changes(kind, key) SELECT DISTINCT 'job', job_id FROM changed_rows;
  RETURN NULL;
END $$;
CREATE OR REPLACE FUNCTION trainyard_changed_table() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO changes(kind, key) VALUES(TG_ARGV[0], '');
  RETURN NULL;
END $$;
DO $$
DECLARE
  t RECORD;
  op TEXT;
BEGIN
  FOR t IN SELECT * FROM (VALUES ('jobs', 'trainyard_changed_by_id', 'job'),
                                 ('workers', 'trainyard_changed_by_id', 'worker'),
                                 ('events', 'trainyard_changed_by_job_id', ''),
                                 ('tasks', 'trainyard_changed_by_job_id', ''),
                                 ('progress', 'trainyard_changed_by_job_id', ''),
                                 ('checkpoints', 'trainyard_changed_by_job_id', ''))
                        AS v(tab, fn, kind) LOOP
    FOREACH op IN ARRAY ARRAY['INSERT', 'UPDATE', 'DELETE'] LOOP
      EXECUTE format('DROP TRIGGER IF EXISTS %I ON %I', t.tab || '_' || lower(op) || '_noted',
                     t.tab);
      EXECUTE format('CREATE TRIGGER %I AFTER %s ON %I REFERENCING %s TABLE AS changed_rows '
                     'FOR EACH STATEMENT EXECUTE FUNCTION %I(%L)',
                     t.tab || '_' || lower(op) || '_noted', op, t.tab,
                     CASE op WHEN 'DELETE' THEN 'OLD' ELSE 'NEW' END, t.fn, t.kind);
    END LOOP;
  END LOOP;
  FOR t IN SELECT * FROM (VALUES ('tokens', 'tokens'), ('searches', 'searches'),
                                 ('trials', 'searches'), ('queues', 'queues')) AS v(tab, kind) LOOP
    EXECUTE format('DROP TRIGGER IF EXISTS %I ON %I', t.tab || '_noted', t.tab);
    EXECUTE format('CREATE TRIGGER %I AFTER INSERT OR UPDATE OR DELETE ON %I '
                   'FOR EACH STATEMENT EXECUTE FUNCTION trainyard_changed_table(%L)',
                   t.tab || '_noted', t.tab, t.kind);
  END LOOP;
END $$;
)sql";

// Version 4: the jobs' metric histories (read by the console; no standby copies them).
constexpr char kSchemaV4[] = R"sql(
CREATE TABLE IF NOT EXISTS metric_points(
  job_id TEXT NOT NULL, unix_ms BIGINT NOT NULL, step BIGINT NOT NULL, progress BYTEA NOT NULL,
  PRIMARY KEY(job_id, unix_ms));
)sql";

// The migrations: kMigrations[v] takes the schema from version v to v + 1 (0: a new database).
constexpr const char* kMigrations[] = {kSchemaV1, kSchemaV2, kSchemaV3, kSchemaV4};
static_assert(sizeof(kMigrations) / sizeof(kMigrations[0]) == kPostgresSchemaVersion);

// Any fixed number: the advisory lock under which one coordinator at a time migrates.
constexpr int64_t kSchemaLock = 0x7472616e79617264;  // "tranyard"

}  // namespace

absl::Status EnsurePostgresSchema(pg::Connection& db) {
  while (true) {
    if (absl::Status s = db.Begin(); !s.ok()) return s;
    auto version = [&]() -> absl::StatusOr<int> {
      if (absl::Status s = db.Run("SELECT pg_advisory_xact_lock($1)", Params().Add(kSchemaLock));
          !s.ok()) {
        return s;
      }
      absl::StatusOr<pg::Result> meta = db.Exec("SELECT to_regclass('meta') IS NOT NULL");
      if (!meta.ok()) return meta.status();
      if (meta->Int(0, 0) == 0) return 0;
      absl::StatusOr<pg::Result> row =
          db.Exec("SELECT value FROM meta WHERE key = 'schema_version'");
      if (!row.ok()) return row.status();
      int v = 0;
      if (row->rows() == 0) return 0;
      if (!absl::SimpleAtoi(row->Text(0, 0), &v) || v < 0) {
        return absl::DataLossError(absl::StrCat("bad schema_version '", row->Text(0, 0), "'"));
      }
      return v;
    }();
    if (!version.ok()) {
      db.Rollback();
      return version.status();
    }
    if (*version > kPostgresSchemaVersion) {
      db.Rollback();
      return absl::FailedPreconditionError(absl::StrCat("the database's schema version ", *version,
                                                        " is newer than this coordinator's ",
                                                        kPostgresSchemaVersion));
    }
    if (*version == kPostgresSchemaVersion) {
      db.Rollback();
      return absl::OkStatus();
    }
    // One step per transaction, with its version number: one cut short is redone.
    absl::Status s = db.Run(kMigrations[*version]);
    if (s.ok()) {
      s = db.Run(
          "INSERT INTO meta(key, value) VALUES('schema_version', $1) ON CONFLICT (key) DO "
          "UPDATE SET value = excluded.value",
          Params().Add(absl::StrCat(*version + 1)));
    }
    if (s.ok()) s = db.Commit();
    if (!s.ok()) {
      db.Rollback();
      return absl::Status(s.code(), absl::StrCat("migrating the schema from version ", *version,
                                                 ": ", s.message()));
    }
  }
}

absl::StatusOr<std::unique_ptr<PostgresJobStore>> PostgresJobStore::Open(
    const pg::ConnectOptions& options, std::optional<LeaseFence> fence) {
  absl::StatusOr<std::unique_ptr<pg::Connection>> db = pg::Connection::Open(options);
  if (!db.ok()) return db.status();
  if (absl::Status s = EnsurePostgresSchema(**db); !s.ok()) return s;
  return std::unique_ptr<PostgresJobStore>(new PostgresJobStore(*std::move(db), std::move(fence)));
}

pg::Connection::Statement FenceStatement(const LeaseFence& fence) {
  return {"SELECT trainyard_fence($1, $2)", Params().Add(fence.holder).Add(fence.token)};
}

absl::Status PostgresJobStore::Apply(const StoreMutation& mutation) {
  if (mutation.empty()) return absl::OkStatus();
  return Import(mutation, {});
}

absl::Status PostgresJobStore::Import(
    const StoreMutation& mutation,
    const std::vector<std::pair<std::string, std::string>>& secrets) {
  std::vector<pg::Connection::Statement> statements;
  if (fence_.has_value()) statements.push_back(FenceStatement(*fence_));
  for (const auto& [name, value] : secrets) {
    statements.push_back(
        {"INSERT INTO secrets(name, value) VALUES($1, $2) ON CONFLICT (name) DO "
         "UPDATE SET value = excluded.value",
         Params().Add(name).AddBlob(value)});
  }
  Writes(mutation, &statements);
  absl::MutexLock lock(&mu_);
  // The leader trims the change feed now and then, in a write of its own (a standby never).
  const absl::Time now = RealClock::Get().Now();
  const bool trim = fence_.has_value() && now - last_trim_ >= absl::Seconds(10);
  if (trim) {
    statements.push_back({"DELETE FROM changes WHERE at < now() - make_interval(secs => $1)",
                          Params().Add(absl::ToInt64Seconds(kChangeRetention))});
  }
  absl::Status s = db_->RunTransaction(statements);
  if (s.ok() && trim) last_trim_ = now;
  return s;
}

namespace {

using Statements = std::vector<pg::Connection::Statement>;

// The jobs' rows, their events and tasks.
void JobWrites(const StoreMutation& m, Statements* out) {
  for (const StoredJob& stored : m.jobs) {
    v1::Job row = stored.job;
    row.clear_events();
    row.clear_tasks();
    // An upsert on id: a clash on the unique seq fails rather than replacing the other job.
    out->push_back(
        {"INSERT INTO jobs(id, seq, state, job, finished_ms, owner) VALUES($1, $2, $3, $4, $5, $6) "
         "ON CONFLICT (id) DO UPDATE SET seq = excluded.seq, state = excluded.state, job = "
         "excluded.job, finished_ms = excluded.finished_ms, owner = excluded.owner",
         Params()
             .Add(row.id())
             .Add(stored.seq)
             .Add(int64_t{row.state()})
             .AddBlob(row.SerializeAsString())
             .Add(row.finished_unix_ms())
             .Add(row.owner())});
  }
  for (const auto& [job_id, event] : m.events) {
    out->push_back(
        {"INSERT INTO events(job_id, time_ms, from_state, to_state, reason) VALUES($1, $2, $3, $4, "
         "$5)",
         Params()
             .Add(job_id)
             .Add(event.time_unix_ms())
             .Add(int64_t{event.from()})
             .Add(int64_t{event.to()})
             .Add(event.reason())});
  }
  for (const auto& [job_id, task] : m.tasks) {
    out->push_back(
        {"INSERT INTO tasks(task_id, job_id, generation, rank, worker_id, state, exit_code, "
         "signal, message, role, shard, stop_deadline_ms, out_of_memory, memory_limit, "
         "memory_peak) VALUES($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15) "
         "ON CONFLICT (task_id) DO UPDATE SET job_id = excluded.job_id, generation = "
         "excluded.generation, rank = excluded.rank, worker_id = excluded.worker_id, state = "
         "excluded.state, exit_code = excluded.exit_code, signal = excluded.signal, message = "
         "excluded.message, role = excluded.role, shard = excluded.shard, stop_deadline_ms = "
         "excluded.stop_deadline_ms, out_of_memory = excluded.out_of_memory, memory_limit = "
         "excluded.memory_limit, memory_peak = excluded.memory_peak",
         Params()
             .Add(task.task_id())
             .Add(job_id)
             .Add(task.generation())
             .Add(int64_t{task.rank()})
             .Add(task.worker_id())
             .Add(int64_t{task.state()})
             .Add(int64_t{task.exit_code()})
             .Add(int64_t{task.signal()})
             .Add(task.message())
             .Add(int64_t{task.role()})
             .Add(int64_t{task.shard()})
             .Add(task.stop_deadline_unix_ms())
             .Add(int64_t{task.out_of_memory() ? 1 : 0})
             .Add(task.memory_limit_bytes())
             .Add(task.memory_peak_bytes())});
  }
}

// Workers, checkpoints, progress, the next job number and trimmed events.
void RecordWrites(const StoreMutation& m, Statements* out) {
  for (const v1::Worker& worker : m.workers) {
    out->push_back(
        {"INSERT INTO workers(id, worker) VALUES($1, $2) ON CONFLICT (id) DO UPDATE SET worker = "
         "excluded.worker",
         Params().Add(worker.id()).AddBlob(worker.SerializeAsString())});
  }
  for (const StoredCheckpoint& c : m.checkpoints) {
    out->push_back(
        {"INSERT INTO checkpoints(job_id, step, uri, size_bytes, created_ms, generation, retired, "
         "retired_by) VALUES($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (job_id, step) DO UPDATE "
         "SET uri = excluded.uri, size_bytes = excluded.size_bytes, created_ms = "
         "excluded.created_ms, generation = excluded.generation, retired = excluded.retired, "
         "retired_by = excluded.retired_by",
         Params()
             .Add(c.checkpoint.job_id())
             .Add(c.checkpoint.step())
             .Add(c.checkpoint.uri())
             .Add(c.checkpoint.size_bytes())
             .Add(c.checkpoint.created_unix_ms())
             .Add(c.checkpoint.generation())
             .Add(int64_t{c.retired ? 1 : 0})
             .Add(c.retired_by_step)});
  }
  for (const auto& [job_id, progress] : m.progress) {
    out->push_back(
        {"INSERT INTO progress(job_id, progress) VALUES($1, $2) ON CONFLICT (job_id) DO UPDATE "
         "SET progress = excluded.progress",
         Params().Add(job_id).AddBlob(progress.SerializeAsString())});
  }
  for (const auto& [job_id, point] : m.metric_points) {
    out->push_back(
        {"INSERT INTO metric_points(job_id, unix_ms, step, progress) VALUES($1, $2, $3, $4) ON "
         "CONFLICT (job_id, unix_ms) DO UPDATE SET step = excluded.step, progress = "
         "excluded.progress",
         Params()
             .Add(job_id)
             .Add(point.unix_ms())
             .Add(point.progress().step())
             .AddBlob(point.progress().SerializeAsString())});
  }
  if (m.next_job_seq.has_value()) {
    out->push_back(
        {"INSERT INTO meta(key, value) VALUES('next_job_seq', $1) ON CONFLICT (key) DO UPDATE SET "
         "value = excluded.value",
         Params().Add(absl::StrCat(*m.next_job_seq))});
  }
  for (const StoreMutation::EventTrim& trim : m.trimmed_events) {
    out->push_back(
        {"DELETE FROM events WHERE id IN (SELECT id FROM events WHERE job_id = $1 ORDER BY id "
         "LIMIT $2 OFFSET $3)",
         Params().Add(trim.job_id).Add(int64_t{trim.count}).Add(int64_t{trim.keep_first})});
  }
}

// Tokens, searches and their trials, queues.
void AccessAndSearchWrites(const StoreMutation& m, Statements* out) {
  for (const StoredToken& t : m.tokens) {
    out->push_back(
        {"INSERT INTO tokens(id, name, role, hash, created_ms, expires_ms, revoked_ms, "
         "created_by, revoked_by) VALUES($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT (id) DO "
         "UPDATE SET name = excluded.name, role = excluded.role, hash = excluded.hash, "
         "created_ms = excluded.created_ms, expires_ms = excluded.expires_ms, revoked_ms = "
         "excluded.revoked_ms, created_by = excluded.created_by, revoked_by = excluded.revoked_by",
         Params()
             .Add(t.id)
             .Add(t.name)
             .Add(t.role)
             .Add(t.hash)
             .Add(t.created_unix_ms)
             .Add(t.expires_unix_ms)
             .Add(t.revoked_unix_ms)
             .Add(t.created_by)
             .Add(t.revoked_by)});
  }
  for (const StoredSearch& stored : m.searches) {
    v1::Search row = stored.search;
    row.clear_trials();
    out->push_back(
        {"INSERT INTO searches(id, seq, state, search) VALUES($1, $2, $3, $4) ON CONFLICT (id) DO "
         "UPDATE SET seq = excluded.seq, state = excluded.state, search = excluded.search",
         Params()
             .Add(row.id())
             .Add(stored.seq)
             .Add(int64_t{row.state()})
             .AddBlob(row.SerializeAsString())});
  }
  for (const auto& [search_id, trial] : m.trials) {
    out->push_back(
        {"INSERT INTO trials(search_id, number, trial) VALUES($1, $2, $3) ON CONFLICT (search_id, "
         "number) DO UPDATE SET trial = excluded.trial",
         Params().Add(search_id).Add(int64_t{trial.number()}).AddBlob(trial.SerializeAsString())});
  }
  for (v1::Queue queue : m.queues) {
    queue.clear_status();
    out->push_back(
        {"INSERT INTO queues(name, queue) VALUES($1, $2) ON CONFLICT (name) DO UPDATE SET queue = "
         "excluded.queue",
         Params().Add(queue.name()).AddBlob(queue.SerializeAsString())});
  }
}

// What the mutation removes.
void Removals(const StoreMutation& m, Statements* out) {
  for (const std::string& name : m.removed_queues) {
    out->push_back({"DELETE FROM queues WHERE name = $1", Params().Add(name)});
  }
  for (const auto& [job_id, step] : m.removed_checkpoints) {
    out->push_back({"DELETE FROM checkpoints WHERE job_id = $1 AND step = $2",
                    Params().Add(job_id).Add(step)});
  }
  for (const auto& [job_id, unix_ms] : m.removed_metric_points) {
    out->push_back({"DELETE FROM metric_points WHERE job_id = $1 AND unix_ms = $2",
                    Params().Add(job_id).Add(unix_ms)});
  }
  for (const std::string& job_id : m.removed_jobs) {
    for (const char* sql :
         {"DELETE FROM events WHERE job_id = $1", "DELETE FROM tasks WHERE job_id = $1",
          "DELETE FROM checkpoints WHERE job_id = $1", "DELETE FROM progress WHERE job_id = $1",
          "DELETE FROM metric_points WHERE job_id = $1", "DELETE FROM jobs WHERE id = $1"}) {
      out->push_back({sql, Params().Add(job_id)});
    }
  }
  for (const std::string& worker_id : m.removed_workers) {
    out->push_back({"DELETE FROM workers WHERE id = $1", Params().Add(worker_id)});
  }
}

}  // namespace

void PostgresJobStore::Writes(const StoreMutation& m, std::vector<pg::Connection::Statement>* out) {
  JobWrites(m, out);
  RecordWrites(m, out);
  AccessAndSearchWrites(m, out);
  Removals(m, out);
}

absl::StatusOr<std::string> PostgresJobStore::SharedSecret(
    absl::string_view name, const std::function<std::string()>& make) {
  absl::MutexLock lock(&mu_);
  // Insert-if-absent then read: of two coordinators racing, both read the first one's value.
  if (absl::Status s =
          db_->Run("INSERT INTO secrets(name, value) VALUES($1, $2) ON CONFLICT (name) DO NOTHING",
                   Params().Add(name).AddBlob(make()));
      !s.ok()) {
    return s;
  }
  absl::StatusOr<pg::Result> r =
      db_->Exec("SELECT value FROM secrets WHERE name = $1", Params().Add(name));
  if (!r.ok()) return r.status();
  if (r->rows() != 1) return absl::InternalError(absl::StrCat("secret '", name, "' not stored"));
  return r->Text(0, 0);
}

}  // namespace trainyard
