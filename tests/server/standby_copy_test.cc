// A standby's warm copy (server/leadership/standby_copy.h) against a real PostgreSQL: after any
// sequence of writes, what it hands over is what a leader's own loads read.
#include "server/leadership/standby_copy.h"

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/clock.h"
#include "gtest/gtest.h"
#include "server/leadership/leader_lease.h"
#include "server/store/postgres_job_store.h"
#include "tests/common/fake_clock.h"
#include "tests/common/postgres_server.h"

namespace trainyard {
namespace {

using testing::PostgresServer;

StoredJob MakeJob(const std::string& id, int64_t seq, v1::JobState state) {
  StoredJob stored;
  stored.seq = seq;
  stored.job.set_id(id);
  stored.job.set_state(state);
  stored.job.set_owner("ana");
  return stored;
}

v1::TaskInfo MakeTask(const std::string& job, int rank, v1::TaskState state) {
  v1::TaskInfo t;
  t.set_task_id(absl::StrCat(job, ".g1.r", rank));
  t.set_rank(rank);
  t.set_generation(1);
  t.set_worker_id("w1");
  t.set_state(state);
  return t;
}

v1::JobEvent MakeEvent(int64_t ms, v1::JobState from, v1::JobState to) {
  v1::JobEvent e;
  e.set_time_unix_ms(ms);
  e.set_from(from);
  e.set_to(to);
  e.set_reason(absl::StrCat("to ", v1::JobState_Name(to)));
  return e;
}

StoredCheckpoint MakeCheckpoint(const std::string& job, int64_t step) {
  StoredCheckpoint c;
  c.checkpoint.set_job_id(job);
  c.checkpoint.set_step(step);
  c.checkpoint.set_uri(absl::StrCat("file:///c/", job, "/step-", step));
  return c;
}

v1::Worker MakeWorker(const std::string& id, int slots) {
  v1::Worker w;
  w.set_id(id);
  w.set_address(id + ":7071");
  w.set_slots(slots);
  return w;
}

// Everything a coordinator's start reads, in an order that does not depend on the database's
// collation: jobs by seq, checkpoints and workers by id, counts without zeros.
std::string Describe(const StoreContents& c, const std::vector<v1::Queue>& queues,
                     const std::vector<StoredToken>& tokens,
                     const std::vector<StoredSearch>& searches) {
  std::string out = absl::StrCat("next_job_seq ", c.next_job_seq, "\n");
  for (const StoredJob& j : c.jobs) absl::StrAppend(&out, "job ", j.seq, " ", j.job.DebugString());
  std::map<std::string, std::string> checkpoints;
  for (const StoredCheckpoint& k : c.checkpoints) {
    absl::StrAppend(&checkpoints[k.checkpoint.job_id()], k.checkpoint.DebugString(), " retired ",
                    k.retired, " by ", k.retired_by_step, "\n");
  }
  for (const auto& [job, text] : checkpoints)
    absl::StrAppend(&out, "checkpoints of ", job, ":\n", text);
  std::map<std::string, std::string> workers;
  for (const v1::Worker& w : c.workers) workers[w.id()] = w.DebugString();
  for (const auto& [id, text] : workers) absl::StrAppend(&out, "worker ", text);
  for (const auto& [state, n] : c.not_loaded) {
    if (n != 0) absl::StrAppend(&out, "not loaded ", v1::JobState_Name(state), " ", n, "\n");
  }
  std::map<std::string, std::string> by_name;
  for (const v1::Queue& q : queues) by_name[q.name()] = q.DebugString();
  for (const auto& [name, text] : by_name) absl::StrAppend(&out, "queue ", text);
  for (const StoredToken& t : tokens) {
    absl::StrAppend(&out, "token ", t.id, " ", t.name, " ", t.role, " ", t.hash, " ",
                    t.revoked_unix_ms, "\n");
  }
  for (const StoredSearch& s : searches) {
    absl::StrAppend(&out, "search ", s.seq, " ", s.search.DebugString());
  }
  return out;
}

class PostgresStandbyCopyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // The program's one server, a database per test.
    auto server = PostgresServer::Shared();
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *server;
    static int databases = 0;
    db_ = absl::StrCat("standby_copy_", ++databases);
    auto uri = server_->CreateDatabase(db_);
    ASSERT_TRUE(uri.ok()) << uri.status();
    options_.conninfo = *uri;
    options_.timeout = absl::Seconds(5);
    auto lease =
        LeaderLease::Open(options_, "leader", "leader:7070", absl::Seconds(60), RealClock::Get());
    ASSERT_TRUE(lease.ok()) << lease.status();
    lease_ = *std::move(lease);
    ASSERT_TRUE(*lease_->TryAcquire());
    auto leader = PostgresJobStore::Open(options_, lease_->fence());
    ASSERT_TRUE(leader.ok()) << leader.status();
    leader_ = *std::move(leader);
  }

  // A standby's copy that reads only when told (its own thread reads once, at the start).
  std::unique_ptr<StandbyCopy> Copy(const Clock& clock = RealClock::Get()) {
    pg::ConnectOptions options = options_;
    options.application_name = "standby-copy-test";
    auto reader = PostgresJobStore::Open(options);
    EXPECT_TRUE(reader.ok()) << reader.status();
    if (!reader.ok()) return nullptr;
    return std::make_unique<StandbyCopy>(*std::move(reader), absl::InfiniteDuration(), clock);
  }

  // What a leader starting now reads from the database.
  std::string Fresh() {
    auto store = PostgresJobStore::Open(options_);
    EXPECT_TRUE(store.ok()) << store.status();
    if (!store.ok()) return "";
    auto contents = (*store)->LoadActive();
    auto queues = (*store)->LoadQueues();
    auto tokens = (*store)->LoadTokens();
    auto searches = (*store)->LoadSearches();
    EXPECT_TRUE(contents.ok() && queues.ok() && tokens.ok() && searches.ok());
    if (!contents.ok() || !queues.ok() || !tokens.ok() || !searches.ok()) return "";
    return Describe(*contents, *queues, *tokens, *searches);
  }

  static std::string Taken(StandbyCopy& copy) {
    absl::StatusOr<WarmStart> warm = copy.Take();
    EXPECT_TRUE(warm.ok()) << warm.status();
    if (!warm.ok()) return "";
    EXPECT_TRUE(warm->contents && warm->queues && warm->tokens && warm->searches);
    return Describe(*warm->contents, *warm->queues, *warm->tokens, *warm->searches);
  }

  void Apply(const StoreMutation& m) {
    absl::Status s = leader_->Apply(m);
    ASSERT_TRUE(s.ok()) << s;
  }

  std::string Sql(const std::string& sql) {
    absl::StatusOr<std::string> out = server_->Psql(db_, sql);
    EXPECT_TRUE(out.ok()) << out.status();
    return out.ok() ? std::string(absl::StripAsciiWhitespace(*out)) : "";
  }

  PostgresServer* server_ = nullptr;
  std::string db_;
  pg::ConnectOptions options_;
  std::unique_ptr<LeaderLease> lease_;
  std::unique_ptr<PostgresJobStore> leader_;
};

// Every kind of write the leader makes, read by the copy in several steps: the copy hands over
// what a fresh load reads, though it read only the changes after its first read.
TEST_F(PostgresStandbyCopyTest, TheCopyIsWhatALoadReadsAfterEveryKindOfWrite) {
  StoreMutation first;
  first.jobs.push_back(MakeJob("runs-1", 1, v1::RUNNING));
  first.jobs.push_back(MakeJob("queued-2", 2, v1::PENDING));
  first.jobs.push_back(MakeJob("done-3", 3, v1::SUCCEEDED));
  first.jobs.push_back(MakeJob("ends-4", 4, v1::RUNNING));
  first.jobs.push_back(MakeJob("gone-5", 5, v1::PENDING));
  first.next_job_seq = 6;
  for (const std::string job : {"runs-1", "ends-4"}) {
    first.events.emplace_back(job, MakeEvent(10, v1::PENDING, v1::RUNNING));
    first.tasks.emplace_back(job, MakeTask(job, 0, v1::TASK_RUNNING));
    first.tasks.emplace_back(job, MakeTask(job, 1, v1::TASK_RUNNING));
    first.checkpoints.push_back(MakeCheckpoint(job, 100));
    first.checkpoints.push_back(MakeCheckpoint(job, 200));
  }
  first.workers.push_back(MakeWorker("w1", 4));
  first.workers.push_back(MakeWorker("w2", 8));
  v1::Queue queue;
  queue.set_name("research");
  queue.set_weight(2);
  first.queues.push_back(queue);
  StoredToken token;
  token.id = "t1";
  token.name = "ci";
  token.role = "user";
  token.hash = "abc";
  first.tokens.push_back(token);
  StoredSearch search;
  search.seq = 1;
  search.search.set_id("lr-sweep");
  first.searches.push_back(search);
  Apply(first);

  FakeClock clock;
  std::unique_ptr<StandbyCopy> copy = Copy(clock);
  ASSERT_NE(copy, nullptr);
  ASSERT_TRUE(copy->Refresh().ok());
  const StandbyCopy::Stats at_start = copy->stats();
  EXPECT_GE(at_start.full_reads, 1);
  EXPECT_EQ(at_start.jobs, 4u);  // done-3 stays in the store

  // Progress, a task ending, a checkpoint retired and one removed, events trimmed.
  StoreMutation second;
  v1::JobProgress progress;
  progress.set_step(250);
  second.progress.emplace_back("runs-1", progress);
  second.tasks.emplace_back("runs-1", MakeTask("runs-1", 1, v1::TASK_EXITED));
  StoredCheckpoint retired = MakeCheckpoint("runs-1", 100);
  retired.retired = true;
  retired.retired_by_step = 300;
  second.checkpoints.push_back(retired);
  second.checkpoints.push_back(MakeCheckpoint("runs-1", 300));
  second.removed_checkpoints.emplace_back("ends-4", 100);
  second.events.emplace_back("runs-1", MakeEvent(20, v1::RUNNING, v1::RUNNING));
  second.trimmed_events.push_back({"runs-1", 0, 1});
  Apply(second);
  ASSERT_TRUE(copy->Refresh().ok());

  // A job ending: it leaves the copy once its last task has ended, not before.
  StoreMutation third;
  StoredJob ended = MakeJob("ends-4", 4, v1::SUCCEEDED);
  third.jobs.push_back(ended);
  third.tasks.emplace_back("ends-4", MakeTask("ends-4", 0, v1::TASK_EXITED));
  third.events.emplace_back("ends-4", MakeEvent(30, v1::RUNNING, v1::SUCCEEDED));
  Apply(third);
  ASSERT_TRUE(copy->Refresh().ok());
  EXPECT_EQ(copy->stats().jobs, 4u);  // ends-4's rank 1 still runs
  StoreMutation fourth;
  fourth.tasks.emplace_back("ends-4", MakeTask("ends-4", 1, v1::TASK_EXITED));
  // A job removed, a worker changed and one removed, a queue removed and one added, a token
  // revoked, a trial added, new submissions.
  fourth.removed_jobs.push_back("gone-5");
  fourth.workers.push_back(MakeWorker("w1", 6));
  fourth.removed_workers.push_back("w2");
  fourth.removed_queues.push_back("research");
  queue.set_name("prod");
  fourth.queues.push_back(queue);
  token.revoked_unix_ms = 1234;
  fourth.tokens.push_back(token);
  v1::Trial trial;
  trial.set_number(0);
  trial.set_job_id("runs-1");
  fourth.trials.emplace_back("lr-sweep", trial);
  // Ids are data, not SQL or array syntax.
  fourth.jobs.push_back(MakeJob("quote\"comma,brace}-6", 6, v1::PENDING));
  fourth.jobs.push_back(MakeJob("new-7", 7, v1::PENDING));
  fourth.next_job_seq = 8;
  Apply(fourth);
  ASSERT_TRUE(copy->Refresh().ok());
  EXPECT_EQ(copy->stats().jobs, 4u);                         // runs-1, queued-2, quote...-6, new-7
  EXPECT_EQ(copy->stats().full_reads, at_start.full_reads);  // changes only since the first

  // A last write before the takeover, read by Take itself.
  StoreMutation last;
  last.jobs.push_back(MakeJob("last-8", 8, v1::PENDING));
  last.next_job_seq = 9;
  Apply(last);
  const std::string fresh = Fresh();
  EXPECT_NE(fresh.find("last-8"), std::string::npos);
  EXPECT_NE(fresh.find("not loaded SUCCEEDED 2"), std::string::npos) << fresh;
  EXPECT_EQ(Taken(*copy), fresh);
  EXPECT_EQ(copy->stats().full_reads, at_start.full_reads);
  EXPECT_EQ(copy->Take().status().code(), absl::StatusCode::kFailedPrecondition);
}

// A transaction that began before a read and committed after it is read the next time, though a
// later one committed first and was read already: the feed goes by snapshots, not by order. The
// early one is a plain SQL write, as an older coordinator's would be: the triggers note it.
TEST_F(PostgresStandbyCopyTest, AWriteCommittedAfterALaterOneIsNotMissed) {
  std::unique_ptr<StandbyCopy> copy = Copy();
  ASSERT_NE(copy, nullptr);
  auto slow = pg::Connection::Open(options_);
  ASSERT_TRUE(slow.ok()) << slow.status();
  ASSERT_TRUE((*slow)->Begin().ok());
  ASSERT_TRUE((*slow)->Run("SELECT pg_current_xact_id()").ok());  // its xid comes first
  StoreMutation later;
  later.jobs.push_back(MakeJob("later-2", 2, v1::PENDING));
  Apply(later);
  ASSERT_TRUE(copy->Refresh().ok());
  EXPECT_EQ(copy->stats().jobs, 1u);
  StoredJob early = MakeJob("early-1", 1, v1::PENDING);
  ASSERT_TRUE((*slow)
                  ->Run("INSERT INTO jobs(id, seq, state, job) VALUES($1, 1, 1, $2)",
                        pg::Params().Add("early-1").AddBlob(early.job.SerializeAsString()))
                  .ok());
  ASSERT_TRUE((*slow)->Commit().ok());
  ASSERT_TRUE(copy->Refresh().ok());
  EXPECT_EQ(copy->stats().jobs, 2u);
  EXPECT_EQ(Taken(*copy), Fresh());
}

// The copy's connection lost: the next read goes on from the last one, missing nothing. A copy
// whose last read is older than the feed keeps reads everything again. The leader trims the feed.
TEST_F(PostgresStandbyCopyTest, ALostConnectionOrAnOldCopyMissesNothing) {
  FakeClock clock;
  std::unique_ptr<StandbyCopy> copy = Copy(clock);
  ASSERT_NE(copy, nullptr);
  ASSERT_TRUE(copy->Refresh().ok());
  const int64_t full_reads = copy->stats().full_reads;
  EXPECT_EQ(Sql("SELECT COUNT(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = 'standby-copy-test' AND datname = current_database()) t"),
            "1");
  Apply([] {
    StoreMutation m;
    m.jobs.push_back(MakeJob("while-lost-1", 1, v1::PENDING));
    return m;
  }());
  absl::Status lost = copy->Refresh();
  EXPECT_EQ(lost.code(), absl::StatusCode::kUnavailable) << lost;
  ASSERT_TRUE(copy->Refresh().ok());
  EXPECT_EQ(copy->stats().jobs, 1u);
  EXPECT_EQ(copy->stats().full_reads, full_reads);

  // Rows older than the retention go with the leader's next write.
  Sql("UPDATE changes SET at = now() - interval '11 minutes'");
  auto leader = PostgresJobStore::Open(options_, lease_->fence());
  ASSERT_TRUE(leader.ok()) << leader.status();
  StoreMutation m;
  m.jobs.push_back(MakeJob("after-trim-2", 2, v1::PENDING));
  ASSERT_TRUE((*leader)->Apply(m).ok());
  EXPECT_EQ(Sql("SELECT string_agg(key, ',') FROM changes"), "after-trim-2");
  // A copy that has not read for longer than half that reads everything.
  clock.Advance(kChangeRetention / 2 + absl::Seconds(1));
  ASSERT_TRUE(copy->Refresh().ok());
  EXPECT_EQ(copy->stats().full_reads, full_reads + 1);
  EXPECT_EQ(Taken(*copy), Fresh());
}

}  // namespace
}  // namespace trainyard
