#include <sqlite3.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "gtest/gtest.h"
#include "server/store/postgres_job_store.h"
#include "server/store/sqlite_job_store.h"
#include "tests/common/postgres_server.h"
#include "tests/server/test_util.h"

namespace trainyard {
namespace {

StoredJob MakeJob(const std::string& id, int64_t seq, v1::JobState state) {
  StoredJob stored;
  stored.seq = seq;
  stored.job.set_id(id);
  stored.job.set_name("demo");
  stored.job.set_state(state);
  stored.job.set_reason("why");
  stored.job.set_generation(2);
  stored.job.set_committed_step(200);
  stored.job.mutable_spec()->set_name("demo");
  stored.job.mutable_spec()->set_batch_size(64);
  stored.job.mutable_progress()->set_step(250);
  stored.job.set_checkpoint_uri("file:///ckpt/" + id);
  return stored;
}

v1::JobEvent MakeEvent(int64_t t, v1::JobState from, v1::JobState to, const std::string& why) {
  v1::JobEvent e;
  e.set_time_unix_ms(t);
  e.set_from(from);
  e.set_to(to);
  e.set_reason(why);
  return e;
}

// The stores the contract runs on. Each gives a new, empty store, the same data opened again, and
// a count of rows read behind the store's back.
class SqliteBackend {
 public:
  static constexpr char kName[] = "Sqlite";
  absl::StatusOr<std::unique_ptr<JobStore>> Open() { return SqliteJobStore::Open(path_); }
  absl::StatusOr<std::unique_ptr<JobStore>> Reopen() { return Open(); }
  int64_t CountRows(const std::string& table, const std::string& column, const std::string& value) {
    sqlite3* db = nullptr;
    EXPECT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
    sqlite3_stmt* st = nullptr;
    const std::string sql = "SELECT COUNT(*) FROM " + table + " WHERE " + column + " = ?";
    EXPECT_EQ(sqlite3_prepare_v2(db, sql.c_str(), -1, &st, nullptr), SQLITE_OK) << sql;
    sqlite3_bind_text(st, 1, value.c_str(), -1, SQLITE_TRANSIENT);
    EXPECT_EQ(sqlite3_step(st), SQLITE_ROW);
    const int64_t n = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    sqlite3_close(db);
    return n;
  }

 private:
  TempDir dir_;
  const std::string path_ = dir_.path() + "/state.db";
};

// One server for the whole test program (started on first use), a new database per test.
class PostgresBackend {
 public:
  static constexpr char kName[] = "Postgres";
  static testing::PostgresServer* Server() {
    absl::StatusOr<testing::PostgresServer*> server = testing::PostgresServer::Shared();
    return server.ok() ? *server : nullptr;
  }
  absl::StatusOr<std::unique_ptr<JobStore>> Open() {
    absl::StatusOr<testing::PostgresServer*> server = testing::PostgresServer::Shared();
    if (!server.ok()) return server.status();
    if (uri_.empty()) {
      static int databases = 0;
      db_ = absl::StrCat("store_", ++databases);
      absl::StatusOr<std::string> uri = (*server)->CreateDatabase(db_);
      if (!uri.ok()) return uri.status();
      uri_ = *uri;
    }
    pg::ConnectOptions options;
    options.conninfo = uri_;
    return PostgresJobStore::Open(options);
  }
  absl::StatusOr<std::unique_ptr<JobStore>> Reopen() { return Open(); }
  int64_t CountRows(const std::string& table, const std::string& column, const std::string& value) {
    absl::StatusOr<std::string> out = Server()->Psql(
        db_, absl::StrCat("SELECT COUNT(*) FROM ", table, " WHERE ", column, " = '", value, "'"));
    EXPECT_TRUE(out.ok()) << out.status();
    int64_t n = -1;
    EXPECT_TRUE(out.ok() && absl::SimpleAtoi(absl::StripAsciiWhitespace(*out), &n)) << *out;
    return n;
  }

 private:
  std::string db_;
  std::string uri_;
};

// The store contract: every JobStore behaves alike, on every backend.
template <typename Backend>
class JobStoreContract : public ::testing::Test {
 protected:
  absl::StatusOr<std::unique_ptr<JobStore>> Open() { return backend_.Open(); }
  absl::StatusOr<std::unique_ptr<JobStore>> Reopen() { return backend_.Reopen(); }
  int64_t CountRows(const std::string& table, const std::string& column, const std::string& value) {
    return backend_.CountRows(table, column, value);
  }
  Backend backend_;
};

struct BackendName {
  template <typename T>
  static std::string GetName(int) {
    return T::kName;
  }
};
using Backends = ::testing::Types<SqliteBackend, PostgresBackend>;
TYPED_TEST_SUITE(JobStoreContract, Backends, BackendName);

TEST(SqliteJobStoreTest, UsesWal) {
  TempDir dir;
  auto store = SqliteJobStore::Open(dir.path() + "/state.db");
  ASSERT_TRUE(store.ok()) << store.status();
  auto mode = (*store)->JournalMode();
  ASSERT_TRUE(mode.ok()) << mode.status();
  EXPECT_EQ(*mode, "wal");
}

TYPED_TEST(JobStoreContract, EveryTableRoundTripsAndSurvivesReopen) {
  {
    auto store = this->Open();
    ASSERT_TRUE(store.ok()) << store.status();
    StoreMutation m;
    m.jobs.push_back(MakeJob("demo-1", 1, v1::RUNNING));
    m.jobs.push_back(MakeJob("demo-2", 2, v1::PENDING));
    m.events.emplace_back("demo-1",
                          MakeEvent(10, v1::JOB_STATE_UNSPECIFIED, v1::PENDING, "submitted"));
    m.events.emplace_back("demo-1", MakeEvent(20, v1::PENDING, v1::SCHEDULED, "placed on w1"));
    v1::TaskInfo task;
    task.set_task_id("demo-1.g2.r1");
    task.set_rank(1);
    task.set_worker_id("w1");
    task.set_state(v1::TASK_EXITED);
    task.set_exit_code(2);
    task.set_signal(0);
    task.set_message("boom");
    task.set_generation(2);
    m.tasks.emplace_back("demo-1", task);
    task.set_task_id("demo-1.g2.r0");
    task.set_rank(0);
    m.tasks.emplace_back("demo-1", task);
    v1::TaskInfo shard = task;
    shard.set_task_id("demo-1.g2.s1");
    shard.set_role(v1::TASK_ROLE_SHARD);
    shard.set_shard(1);
    shard.set_stop_deadline_unix_ms(123456789);
    shard.set_out_of_memory(true);
    shard.set_memory_limit_bytes(int64_t{3} << 30);
    shard.set_memory_peak_bytes((int64_t{3} << 30) - 4096);
    m.tasks.emplace_back("demo-1", shard);
    v1::Worker worker;
    worker.set_id("w1");
    worker.set_address("10.0.0.1");
    worker.set_slots(4);
    worker.set_gpus(2);
    worker.set_state(v1::DRAINING);
    m.workers.push_back(worker);
    StoredCheckpoint c;
    c.checkpoint.set_job_id("demo-1");
    c.checkpoint.set_step(200);
    c.checkpoint.set_uri("file:///ckpt/demo-1/step-000000000200");
    c.checkpoint.set_size_bytes(1234);
    c.checkpoint.set_created_unix_ms(99);
    c.checkpoint.set_generation(2);
    c.retired = true;
    m.checkpoints.push_back(c);
    m.next_job_seq = 3;
    ASSERT_TRUE((*store)->Apply(m).ok());

    // A later change to the same rows replaces them.
    StoreMutation update;
    StoredJob job2 = MakeJob("demo-2", 2, v1::CANCELLED);
    update.jobs.push_back(job2);
    update.events.emplace_back("demo-2", MakeEvent(30, v1::PENDING, v1::CANCELLED, "cancelled"));
    ASSERT_TRUE((*store)->Apply(update).ok());
  }
  auto store = this->Reopen();
  ASSERT_TRUE(store.ok()) << store.status();
  auto contents = (*store)->LoadAll();
  ASSERT_TRUE(contents.ok()) << contents.status();
  EXPECT_EQ(contents->next_job_seq, 3);
  ASSERT_EQ(contents->jobs.size(), 2u);
  const v1::Job& j1 = contents->jobs[0].job;
  EXPECT_EQ(contents->jobs[0].seq, 1);
  EXPECT_EQ(j1.id(), "demo-1");
  EXPECT_EQ(j1.state(), v1::RUNNING);
  EXPECT_EQ(j1.spec().batch_size(), 64);
  EXPECT_EQ(j1.progress().step(), 250);
  EXPECT_EQ(j1.committed_step(), 200);
  EXPECT_EQ(j1.checkpoint_uri(), "file:///ckpt/demo-1");
  ASSERT_EQ(j1.events_size(), 2);
  EXPECT_EQ(j1.events(0).reason(), "submitted");
  EXPECT_EQ(j1.events(1).from(), v1::PENDING);
  EXPECT_EQ(j1.events(1).to(), v1::SCHEDULED);
  EXPECT_EQ(j1.events(1).time_unix_ms(), 20);
  ASSERT_EQ(j1.tasks_size(), 3);
  EXPECT_EQ(j1.tasks(0).task_id(), "demo-1.g2.r0");  // ranks by rank, then shards
  EXPECT_EQ(j1.tasks(2).task_id(), "demo-1.g2.s1");
  EXPECT_EQ(j1.tasks(2).role(), v1::TASK_ROLE_SHARD);
  EXPECT_EQ(j1.tasks(2).shard(), 1);
  EXPECT_EQ(j1.tasks(2).stop_deadline_unix_ms(), 123456789);
  EXPECT_TRUE(j1.tasks(2).out_of_memory());
  EXPECT_EQ(j1.tasks(2).memory_limit_bytes(), int64_t{3} << 30);
  EXPECT_EQ(j1.tasks(2).memory_peak_bytes(), (int64_t{3} << 30) - 4096);
  EXPECT_FALSE(j1.tasks(0).out_of_memory());
  EXPECT_EQ(j1.tasks(0).role(), v1::TASK_ROLE_RANK);
  EXPECT_EQ(j1.tasks(1).exit_code(), 2);
  EXPECT_EQ(j1.tasks(1).message(), "boom");
  EXPECT_EQ(j1.tasks(1).state(), v1::TASK_EXITED);
  EXPECT_EQ(j1.tasks(1).worker_id(), "w1");
  const v1::Job& j2 = contents->jobs[1].job;
  EXPECT_EQ(j2.state(), v1::CANCELLED);
  ASSERT_EQ(j2.events_size(), 1);
  ASSERT_EQ(contents->workers.size(), 1u);
  EXPECT_EQ(contents->workers[0].slots(), 4);
  EXPECT_EQ(contents->workers[0].state(), v1::DRAINING);
  ASSERT_EQ(contents->checkpoints.size(), 1u);
  EXPECT_EQ(contents->checkpoints[0].checkpoint.size_bytes(), 1234);
  EXPECT_EQ(contents->checkpoints[0].checkpoint.generation(), 2);
  EXPECT_TRUE(contents->checkpoints[0].retired);
}

// A database written by a coordinator before tasks had roles opens, keeps its tasks as ranks and
// takes shard tasks afterwards.
TEST(SqliteJobStoreTest, MigratesSchemaVersion1) {
  TempDir dir;
  const std::string path = dir.path() + "/state.db";
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
    const char* v1_schema = R"sql(
CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE jobs(
  id TEXT PRIMARY KEY, seq INTEGER NOT NULL UNIQUE, state INTEGER NOT NULL, job BLOB NOT NULL);
CREATE TABLE tasks(
  task_id TEXT PRIMARY KEY, job_id TEXT NOT NULL, generation INTEGER NOT NULL,
  rank INTEGER NOT NULL, worker_id TEXT NOT NULL, state INTEGER NOT NULL,
  exit_code INTEGER NOT NULL, signal INTEGER NOT NULL, message TEXT NOT NULL);
INSERT INTO meta VALUES('schema_version', '1');
INSERT INTO tasks VALUES('old-1.g1.r0', 'old-1', 1, 0, 'w1', 3, 0, 0, 'done');
)sql";
    char* error = nullptr;
    ASSERT_EQ(sqlite3_exec(db, v1_schema, nullptr, nullptr, &error), SQLITE_OK) << error;
    StoredJob job = MakeJob("old-1", 1, v1::SUCCEEDED);
    job.job.set_finished_unix_ms(5000);
    sqlite3_stmt* st = nullptr;
    ASSERT_EQ(sqlite3_prepare_v2(db, "INSERT INTO jobs VALUES('old-1', 1, 4, ?)", -1, &st, nullptr),
              SQLITE_OK);
    const std::string blob = job.job.SerializeAsString();
    sqlite3_bind_blob(st, 1, blob.data(), static_cast<int>(blob.size()), SQLITE_TRANSIENT);
    ASSERT_EQ(sqlite3_step(st), SQLITE_DONE);
    sqlite3_finalize(st);
    sqlite3_close(db);
  }
  for (int open = 0; open < 2; ++open) {  // the second open finds version 5
    auto store = SqliteJobStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    if (open == 0) {
      StoreMutation m;
      v1::TaskInfo shard;
      shard.set_task_id("old-1.g1.s0");
      shard.set_generation(1);
      shard.set_worker_id("w2");
      shard.set_role(v1::TASK_ROLE_SHARD);
      m.tasks.emplace_back("old-1", shard);
      StoredCheckpoint retired;
      retired.checkpoint.set_job_id("old-1");
      retired.checkpoint.set_step(10);
      retired.checkpoint.set_uri("file:///c/old-1/step-000000000010");
      retired.retired = true;
      retired.retired_by_step = 30;
      m.checkpoints.push_back(retired);
      ASSERT_TRUE((*store)->Apply(m).ok());
    }
    auto contents = (*store)->LoadAll();
    ASSERT_TRUE(contents.ok()) << contents.status();
    ASSERT_EQ(contents->jobs.size(), 1u);
    const v1::Job& job = contents->jobs[0].job;
    ASSERT_EQ(job.tasks_size(), 2);
    EXPECT_EQ(job.tasks(0).task_id(), "old-1.g1.r0");
    EXPECT_EQ(job.tasks(0).role(), v1::TASK_ROLE_RANK);
    EXPECT_EQ(job.tasks(0).message(), "done");
    EXPECT_EQ(job.tasks(1).role(), v1::TASK_ROLE_SHARD);
    ASSERT_EQ(contents->checkpoints.size(), 1u);
    EXPECT_EQ(contents->checkpoints[0].retired_by_step, 30);
    // Version 4 took the finish time out of the job's row.
    auto expired = (*store)->FinishedBefore(5000, 10);
    ASSERT_TRUE(expired.ok()) << expired.status();
    ASSERT_EQ(expired->size(), 1u);
    EXPECT_EQ((*expired)[0].first, "old-1");
    EXPECT_EQ((*expired)[0].second, v1::SUCCEEDED);
    EXPECT_TRUE((*store)->FinishedBefore(4999, 10)->empty());
    // Version 5: a job from before has no owner (admins only), and tokens are kept.
    EXPECT_EQ((*store)->ListFinishedJobs({}, INT64_MAX, 10, "")->size(), 1u);
    EXPECT_TRUE((*store)->ListFinishedJobs({}, INT64_MAX, 10, "alice")->empty());
    if (open == 0) {
      StoreMutation m;
      StoredToken token;
      token.id = "0123456789ab";
      token.name = "alice";
      token.role = "user";
      token.hash = "ab";
      token.created_unix_ms = 7;
      m.tokens.push_back(token);
      ASSERT_TRUE((*store)->Apply(m).ok());
    }
    auto tokens = (*store)->LoadTokens();
    ASSERT_TRUE(tokens.ok()) << tokens.status();
    ASSERT_EQ(tokens->size(), 1u);
    EXPECT_EQ((*tokens)[0].name, "alice");
    EXPECT_EQ((*tokens)[0].created_unix_ms, 7);
  }
}

TYPED_TEST(JobStoreContract, RemovingAJobRemovesEveryRowOfIt) {
  auto store = this->Open();
  ASSERT_TRUE(store.ok()) << store.status();
  StoreMutation m;
  for (const auto& [id, seq] : {std::pair<std::string, int64_t>{"gone-1", 1}, {"kept-2", 2}}) {
    m.jobs.push_back(MakeJob(id, seq, v1::SUCCEEDED));
    m.events.emplace_back(id, MakeEvent(10, v1::JOB_STATE_UNSPECIFIED, v1::PENDING, "submitted"));
    v1::TaskInfo task;
    task.set_task_id(id + ".g1.r0");
    m.tasks.emplace_back(id, task);
    StoredCheckpoint c;
    c.checkpoint.set_job_id(id);
    c.checkpoint.set_step(5);
    m.checkpoints.push_back(c);
    v1::JobProgress progress;
    progress.set_step(5);
    m.progress.emplace_back(id, progress);
    v1::MetricPoint point;
    point.set_unix_ms(77);
    *point.mutable_progress() = progress;
    m.metric_points.emplace_back(id, point);
  }
  v1::Worker worker;
  worker.set_id("w-gone");
  m.workers.push_back(worker);
  ASSERT_TRUE((*store)->Apply(m).ok());

  StoreMutation removal;
  removal.removed_jobs.push_back("gone-1");
  removal.removed_workers.push_back("w-gone");
  ASSERT_TRUE((*store)->Apply(removal).ok());
  for (const auto& [table, column] :
       std::vector<std::pair<std::string, std::string>>{{"jobs", "id"},
                                                        {"events", "job_id"},
                                                        {"tasks", "job_id"},
                                                        {"checkpoints", "job_id"},
                                                        {"progress", "job_id"},
                                                        {"metric_points", "job_id"}}) {
    EXPECT_EQ(this->CountRows(table, column, "gone-1"), 0) << table;
    EXPECT_EQ(this->CountRows(table, column, "kept-2"), 1) << table;
  }
  EXPECT_EQ(this->CountRows("workers", "id", "w-gone"), 0);
  auto contents = (*store)->LoadAll();
  ASSERT_TRUE(contents.ok());
  ASSERT_EQ(contents->jobs.size(), 1u);
  EXPECT_EQ(contents->jobs[0].job.id(), "kept-2");
}

// A job's metric history: points by time, read after a time, thinned by key, and the keys read
// back for the jobs a coordinator loads.
TYPED_TEST(JobStoreContract, MetricHistoryIsKeptByTimeAndThinnedByKey) {
  {
    auto store = this->Open();
    ASSERT_TRUE(store.ok()) << store.status();
    StoreMutation m;
    for (int i = 1; i <= 5; ++i) {
      v1::MetricPoint point;
      point.set_unix_ms(1000 * i);
      point.mutable_progress()->set_step(10 * i);
      point.mutable_progress()->set_loss(1.0 / i);
      (*point.mutable_progress()->mutable_metrics())["accuracy"] = 0.1 * i;
      m.metric_points.emplace_back("job-1", point);
    }
    v1::MetricPoint other;
    other.set_unix_ms(1500);
    other.mutable_progress()->set_step(3);
    m.metric_points.emplace_back("job-2", other);
    ASSERT_TRUE((*store)->Apply(m).ok());
    // The same millisecond again replaces its point; thinning deletes by key.
    StoreMutation later;
    v1::MetricPoint again;
    again.set_unix_ms(5000);
    again.mutable_progress()->set_step(55);
    later.metric_points.emplace_back("job-1", again);
    later.removed_metric_points.emplace_back("job-1", 2000);
    ASSERT_TRUE((*store)->Apply(later).ok());
  }
  auto store = this->Reopen();
  ASSERT_TRUE(store.ok()) << store.status();
  auto all = (*store)->LoadMetricHistory("job-1", 0);
  ASSERT_TRUE(all.ok()) << all.status();
  std::vector<int64_t> steps;
  for (const v1::MetricPoint& p : *all) steps.push_back(p.progress().step());
  EXPECT_EQ(steps, (std::vector<int64_t>{10, 30, 40, 55}));
  EXPECT_EQ((*all)[1].unix_ms(), 3000);
  EXPECT_DOUBLE_EQ((*all)[1].progress().loss(), 1.0 / 3);
  EXPECT_DOUBLE_EQ((*all)[1].progress().metrics().at("accuracy"), 0.1 * 3);
  auto since = (*store)->LoadMetricHistory("job-1", 3000);
  ASSERT_TRUE(since.ok());
  ASSERT_EQ(since->size(), 2u);
  EXPECT_EQ((*since)[0].unix_ms(), 4000);
  auto none = (*store)->LoadMetricHistory("no-such-job", 0);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  auto keys = (*store)->LoadMetricKeys({"job-1", "job-2", "job-3"});
  ASSERT_TRUE(keys.ok()) << keys.status();
  ASSERT_EQ(keys->size(), 2u);
  EXPECT_EQ(keys->at("job-1"), (std::vector<std::pair<int64_t, int64_t>>{
                                   {1000, 10}, {3000, 30}, {4000, 40}, {5000, 55}}));
  EXPECT_EQ(keys->at("job-2"), (std::vector<std::pair<int64_t, int64_t>>{{1500, 3}}));
}

// A coordinator starts with the jobs not finished, and the finished ones whose trainers may still
// be stopping; the other finished jobs stay in the store, counted, and come whole on request.
TYPED_TEST(JobStoreContract, LoadActiveLeavesFinishedJobsInTheStore) {
  auto store = this->Open();
  ASSERT_TRUE(store.ok()) << store.status();
  StoreMutation m;
  m.jobs.push_back(MakeJob("stopping-1", 1, v1::SUCCEEDED));
  m.jobs.push_back(MakeJob("runs-2", 2, v1::RUNNING));
  m.jobs.push_back(MakeJob("done-3", 3, v1::SUCCEEDED));
  m.jobs.push_back(MakeJob("failed-4", 4, v1::FAILED));
  for (const std::string id : {"stopping-1", "runs-2", "done-3"}) {
    m.events.emplace_back(id, MakeEvent(10, v1::JOB_STATE_UNSPECIFIED, v1::PENDING, "submitted"));
    m.events.emplace_back(id, MakeEvent(20, v1::PENDING, v1::SCHEDULED, "placed"));
    for (int rank = 0; rank < 2; ++rank) {
      v1::TaskInfo t;
      t.set_task_id(absl::StrCat(id, ".g1.r", rank));
      t.set_rank(rank);
      t.set_generation(1);
      t.set_worker_id("w1");
      // stopping-1's rank 1 still runs: it may hold capacity, so the job comes back.
      const bool runs = id == std::string("runs-2") || (id == std::string("stopping-1") && rank);
      t.set_state(runs ? v1::TASK_RUNNING : v1::TASK_EXITED);
      m.tasks.emplace_back(id, t);
    }
    StoredCheckpoint c;
    c.checkpoint.set_job_id(id);
    c.checkpoint.set_step(100);
    c.checkpoint.set_uri("file:///c/" + id + "/step-000000000100");
    m.checkpoints.push_back(c);
  }
  v1::JobProgress latest;
  latest.set_step(300);
  m.progress.emplace_back("done-3", latest);
  ASSERT_TRUE((*store)->Apply(m).ok());

  auto active = (*store)->LoadActive();
  ASSERT_TRUE(active.ok()) << active.status();
  ASSERT_EQ(active->jobs.size(), 2u);
  const v1::Job& stopping = active->jobs[0].job;
  EXPECT_EQ(stopping.id(), "stopping-1");
  EXPECT_EQ(stopping.events_size(), 2);
  EXPECT_EQ(stopping.tasks_size(), 2);
  const v1::Job& runs = active->jobs[1].job;
  EXPECT_EQ(runs.id(), "runs-2");
  EXPECT_EQ(runs.events_size(), 2);
  EXPECT_EQ(runs.tasks_size(), 2);
  ASSERT_EQ(active->checkpoints.size(), 2u);
  EXPECT_EQ(active->checkpoints[0].checkpoint.job_id(), "runs-2");
  EXPECT_EQ(active->checkpoints[1].checkpoint.job_id(), "stopping-1");
  const std::map<v1::JobState, int64_t> counted = {{v1::SUCCEEDED, 1}, {v1::FAILED, 1}};
  EXPECT_EQ(active->not_loaded, counted);

  auto done = (*store)->LoadJob("done-3");
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->job.seq, 3);
  EXPECT_EQ(done->job.job.state(), v1::SUCCEEDED);
  EXPECT_EQ(done->job.job.progress().step(), 300);  // the progress row over the job's
  ASSERT_EQ(done->job.job.events_size(), 2);
  EXPECT_EQ(done->job.job.events(1).reason(), "placed");
  ASSERT_EQ(done->job.job.tasks_size(), 2);
  EXPECT_EQ(done->job.job.tasks(0).task_id(), "done-3.g1.r0");
  ASSERT_EQ(done->checkpoints.size(), 1u);
  EXPECT_EQ(done->checkpoints[0].checkpoint.step(), 100);
  EXPECT_EQ((*store)->LoadJob("nope-9").status().code(), absl::StatusCode::kNotFound);
  // A quote in an id is data, not SQL.
  EXPECT_EQ((*store)->LoadJob("x') OR ('1'='1").status().code(), absl::StatusCode::kNotFound);
}

// Listing and retention read finished jobs from the store: newest first from a sequence number
// on, by state, a page at a time; and by when they finished, the oldest first.
TYPED_TEST(JobStoreContract, FinishedJobsAreListedAndExpiredFromTheStore) {
  auto store = this->Open();
  ASSERT_TRUE(store.ok()) << store.status();
  StoreMutation m;
  const v1::JobState states[] = {v1::SUCCEEDED, v1::FAILED,  v1::RUNNING,  v1::CANCELLED,
                                 v1::SUCCEEDED, v1::PENDING, v1::SUCCEEDED};
  for (int i = 0; i < 7; ++i) {
    StoredJob job = MakeJob(absl::StrCat("j-", i + 1), i + 1, states[i]);
    // Finished in the reverse order of submission, apart from the last.
    if (i < 6) job.job.set_finished_unix_ms(1000 - i * 100);
    if (i == 6) job.job.set_finished_unix_ms(2000);
    job.job.set_owner(i % 2 == 0 ? "alice" : "bob");
    m.jobs.push_back(job);
  }
  v1::JobProgress latest;
  latest.set_step(999);
  m.progress.emplace_back("j-5", latest);
  ASSERT_TRUE((*store)->Apply(m).ok());

  auto ids = [](const std::vector<StoredJob>& jobs) {
    std::vector<std::string> out;
    for (const StoredJob& j : jobs) out.push_back(j.job.id());
    return out;
  };
  auto all = (*store)->ListFinishedJobs({}, INT64_MAX, 10, "");
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(ids(*all), (std::vector<std::string>{"j-7", "j-5", "j-4", "j-2", "j-1"}));
  EXPECT_EQ((*all)[1].job.progress().step(), 999);
  EXPECT_EQ((*all)[0].job.progress().step(), 250);
  EXPECT_EQ(ids(*(*store)->ListFinishedJobs({}, 5, 2, "")),
            (std::vector<std::string>{"j-4", "j-2"}));
  EXPECT_EQ(ids(*(*store)->ListFinishedJobs({v1::SUCCEEDED, v1::RUNNING}, INT64_MAX, 10, "")),
            (std::vector<std::string>{"j-7", "j-5", "j-1"}));
  EXPECT_TRUE((*store)->ListFinishedJobs({v1::PENDING}, INT64_MAX, 10, "")->empty());
  // One owner's jobs (users list only their own).
  EXPECT_EQ(ids(*(*store)->ListFinishedJobs({}, INT64_MAX, 10, "bob")),
            (std::vector<std::string>{"j-4", "j-2"}));
  EXPECT_EQ(ids(*(*store)->ListFinishedJobs({v1::SUCCEEDED}, 7, 10, "alice")),
            (std::vector<std::string>{"j-5", "j-1"}));
  EXPECT_TRUE((*store)->ListFinishedJobs({}, INT64_MAX, 10, "carol")->empty());

  auto expired = (*store)->FinishedBefore(1000, 3);
  ASSERT_TRUE(expired.ok()) << expired.status();
  std::vector<std::string> expired_ids;
  for (const auto& [id, state] : *expired) expired_ids.push_back(id);
  EXPECT_EQ(expired_ids, (std::vector<std::string>{"j-5", "j-4", "j-2"}));
  EXPECT_EQ((*expired)[1].second, v1::CANCELLED);
  EXPECT_EQ((*store)->FinishedBefore(999, 10)->size(), 3u);  // j-1 finished at 1000
  EXPECT_EQ((*store)->FinishedBefore(5000, 10)->size(), 5u);
}

// Tokens, searches with their trials, and queues: each upserted by its key, read back in order.
TYPED_TEST(JobStoreContract, TokensSearchesAndQueuesRoundTrip) {
  auto store = this->Open();
  ASSERT_TRUE(store.ok()) << store.status();
  StoreMutation m;
  for (const auto& [id, created] : {std::pair<std::string, int64_t>{"tok-b", 5}, {"tok-a", 9}}) {
    StoredToken t;
    t.id = id;
    t.name = id + "-name";
    t.role = "user";
    t.hash = "hash-" + id;
    t.created_unix_ms = created;
    t.expires_unix_ms = 100;
    t.created_by = "admin";
    m.tokens.push_back(t);
  }
  for (int i = 2; i >= 1; --i) {
    StoredSearch search;
    search.seq = i;
    search.search.set_id(absl::StrCat("search-", i));
    search.search.set_state(v1::SEARCH_RUNNING);
    search.search.add_trials()->set_number(99);  // not stored: trials are rows of their own
    m.searches.push_back(search);
    for (int n = 1; n >= 0; --n) {
      v1::Trial trial;
      trial.set_number(n);
      trial.set_metric(i * 10 + n);
      (*trial.mutable_hyperparameters())["lr"] = absl::StrCat("0.", n + 1);
      m.trials.emplace_back(search.search.id(), trial);
    }
  }
  for (const std::string name : {"team-b", "team-a", "gone"}) {
    v1::Queue q;
    q.set_name(name);
    q.set_quota_slots(4);
    q.add_users("alice");
    q.mutable_status()->set_used_slots(3);  // not stored
    m.queues.push_back(q);
  }
  ASSERT_TRUE((*store)->Apply(m).ok());
  StoreMutation update;
  StoredToken revoked = m.tokens[0];
  revoked.revoked_unix_ms = 50;
  revoked.revoked_by = "admin";
  update.tokens.push_back(revoked);
  v1::Trial better;
  better.set_number(1);
  better.set_metric(-1);
  update.trials.emplace_back("search-1", better);
  update.removed_queues.push_back("gone");
  ASSERT_TRUE((*store)->Apply(update).ok());

  auto tokens = (*store)->LoadTokens();
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  ASSERT_EQ(tokens->size(), 2u);
  EXPECT_EQ((*tokens)[0].id, "tok-b");  // by creation time
  EXPECT_EQ((*tokens)[0].revoked_unix_ms, 50);
  EXPECT_EQ((*tokens)[0].revoked_by, "admin");
  EXPECT_EQ((*tokens)[0].hash, "hash-tok-b");
  EXPECT_EQ((*tokens)[1].expires_unix_ms, 100);
  auto searches = (*store)->LoadSearches();
  ASSERT_TRUE(searches.ok()) << searches.status();
  ASSERT_EQ(searches->size(), 2u);
  EXPECT_EQ((*searches)[0].search.id(), "search-1");
  ASSERT_EQ((*searches)[0].search.trials_size(), 2);
  EXPECT_EQ((*searches)[0].search.trials(0).number(), 0);
  EXPECT_EQ((*searches)[0].search.trials(0).hyperparameters().at("lr"), "0.1");
  EXPECT_EQ((*searches)[0].search.trials(1).metric(), -1);
  EXPECT_EQ((*searches)[1].search.trials(1).metric(), 21);
  auto queues = (*store)->LoadQueues();
  ASSERT_TRUE(queues.ok()) << queues.status();
  ASSERT_EQ(queues->size(), 2u);
  EXPECT_EQ((*queues)[0].name(), "team-a");
  EXPECT_EQ((*queues)[0].users(0), "alice");
  EXPECT_FALSE((*queues)[0].has_status());
}

TYPED_TEST(JobStoreContract, EmptyStoreStartsAtSequenceOne) {
  auto store = this->Open();
  ASSERT_TRUE(store.ok()) << store.status();
  auto contents = (*store)->LoadAll();
  ASSERT_TRUE(contents.ok());
  EXPECT_EQ(contents->next_job_seq, 1);
  EXPECT_TRUE(contents->jobs.empty());
}

TYPED_TEST(JobStoreContract, FailedMutationWritesNothing) {
  auto store = this->Open();
  ASSERT_TRUE(store.ok()) << store.status();
  StoreMutation m;
  m.jobs.push_back(MakeJob("a-1", 1, v1::PENDING));
  m.jobs.push_back(MakeJob("b-2", 1, v1::PENDING));  // same seq: violates UNIQUE
  m.next_job_seq = 3;
  EXPECT_FALSE((*store)->Apply(m).ok());
  auto contents = (*store)->LoadAll();
  ASSERT_TRUE(contents.ok());
  EXPECT_TRUE(contents->jobs.empty());
  EXPECT_EQ(contents->next_job_seq, 1);
}

TEST(SqliteJobStoreTest, UnopenablePathIsAnError) {
  auto store = SqliteJobStore::Open("/nonexistent-dir/for/sure/state.db");
  EXPECT_FALSE(store.ok());
}

}  // namespace
}  // namespace trainyard
