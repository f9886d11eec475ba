// What only the PostgreSQL store does: the leader lease and its fence, a database that restarts
// or goes away, schema versions, and the secrets all coordinators share. The store's contract,
// which both stores meet, is in job_store_test.cc.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/leadership/leader_lease.h"
#include "server/leadership/leadership.h"
#include "server/store/postgres_job_store.h"
#include "tests/common/postgres_server.h"
#include "tests/common/processes.h"

namespace trainyard {
namespace {

using ::testing::HasSubstr;
using testing::PostgresServer;

StoredJob MakeJob(const std::string& id, int64_t seq) {
  StoredJob stored;
  stored.seq = seq;
  stored.job.set_id(id);
  stored.job.set_state(v1::PENDING);
  return stored;
}

StoreMutation Submit(const std::string& id, int64_t seq) {
  StoreMutation m;
  m.jobs.push_back(MakeJob(id, seq));
  m.next_job_seq = seq + 1;
  return m;
}

class PostgresStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = PostgresServer::Start();
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    auto uri = server_->CreateDatabase("trainyard");
    ASSERT_TRUE(uri.ok()) << uri.status();
    options_.conninfo = *uri;
    options_.timeout = absl::Seconds(3);
  }
  std::string Sql(const std::string& sql) {
    absl::StatusOr<std::string> out = server_->Psql("trainyard", sql);
    EXPECT_TRUE(out.ok()) << out.status();
    return out.ok() ? std::string(absl::StripAsciiWhitespace(*out)) : "";
  }
  std::unique_ptr<LeaderLease> Lease(const std::string& holder) {
    auto lease =
        LeaderLease::Open(options_, holder, holder + ":7070", absl::Seconds(30), RealClock::Get());
    EXPECT_TRUE(lease.ok()) << lease.status();
    return lease.ok() ? *std::move(lease) : nullptr;
  }
  // Ends the lease now, as if its holder had stopped renewing it long ago.
  void ExpireLease() { Sql("UPDATE leader SET expires_at = now() - interval '1 second'"); }

  std::unique_ptr<PostgresServer> server_;
  pg::ConnectOptions options_;
};

// A test program killed from outside (a CI timeout, a person's kill -9) leaves no server behind:
// the server started by a helper run of this program dies with it. The helper is this binary
// again, running only HelperStartsAServerAndWaits.
TEST(PostgresServerTest, TheServerDiesWithTheProgramThatStartedIt) {
  if (PostgresServer::BinDir().empty()) GTEST_SKIP() << "no PostgreSQL server binaries";
  int out[2];
  ASSERT_EQ(pipe(out), 0);
  const pid_t helper = fork();
  if (helper == 0) {
    dup2(out[1], 1);
    setenv("TRAINYARD_TEST_PG_HELPER", "1", 1);
    execl("/proc/self/exe", "postgres_store_test",
          "--gtest_filter=PostgresServerTest.HelperStartsAServerAndWaits", nullptr);
    _exit(127);
  }
  close(out[1]);
  // The helper prints the postmaster's pid once the server answers.
  std::string line;
  char c;
  while (read(out[0], &c, 1) == 1) {
    if (c == '\n' && absl::StartsWith(line, "postmaster ")) break;
    line = c == '\n' ? "" : line + c;
  }
  close(out[0]);
  int postmaster = 0;
  ASSERT_TRUE(absl::SimpleAtoi(line.substr(strlen("postmaster ")), &postmaster)) << line;
  ASSERT_EQ(kill(postmaster, 0), 0);
  ASSERT_EQ(kill(helper, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(waitpid(helper, &status, 0), helper);
  // Gone within a generous bound: an immediate shutdown takes well under a second.
  const absl::Time deadline = RealClock::Get().Now() + absl::Seconds(60);
  while (kill(postmaster, 0) == 0 && RealClock::Get().Now() < deadline) {
    RealClock::Get().SleepFor(absl::Milliseconds(20));
  }
  EXPECT_NE(kill(postmaster, 0), 0) << "the server outlived the program that started it";
}

TEST(PostgresServerTest, HelperStartsAServerAndWaits) {
  if (getenv("TRAINYARD_TEST_PG_HELPER") == nullptr) GTEST_SKIP() << "run by the test above";
  absl::StatusOr<std::unique_ptr<PostgresServer>> server = PostgresServer::Start();
  ASSERT_TRUE(server.ok()) << server.status();
  std::printf("postmaster %d\n", static_cast<int>((*server)->pid()));
  std::fflush(stdout);
  pause();  // until the test above kills this process
}

// One leader at a time, each with a larger token; a deposed one can neither renew nor write, and
// what it tried to write is not there.
TEST_F(PostgresStoreTest, TheLeaseFencesADeposedLeader) {
  std::unique_ptr<LeaderLease> a = Lease("coordinator-a");
  std::unique_ptr<LeaderLease> b = Lease("coordinator-b");
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->valid_until(), absl::InfinitePast());
  ASSERT_TRUE(*a->TryAcquire());
  EXPECT_GT(a->valid_until(), absl::Now());
  EXPECT_FALSE(*b->TryAcquire());  // a holds it
  auto who = b->Current();
  ASSERT_TRUE(who.ok()) << who.status();
  EXPECT_EQ(who->holder, "coordinator-a");
  EXPECT_EQ(who->address, "coordinator-a:7070");
  EXPECT_TRUE(who->live);
  const int64_t first_token = who->token;
  EXPECT_EQ(a->fence().token, first_token);

  auto store_a = PostgresJobStore::Open(options_, a->fence());
  ASSERT_TRUE(store_a.ok()) << store_a.status();
  ASSERT_TRUE((*store_a)->Apply(Submit("by-a-1", 1)).ok());
  ASSERT_TRUE(a->Renew().ok());

  ExpireLease();  // a stops renewing (frozen, cut off)
  // Expired: a writes nothing even before anyone else leads.
  absl::Status late = (*store_a)->Apply(Submit("by-a-2", 2));
  EXPECT_EQ(late.code(), absl::StatusCode::kFailedPrecondition) << late;
  ASSERT_TRUE(*b->TryAcquire());
  EXPECT_EQ(b->fence().token, first_token + 1);
  late = (*store_a)->Apply(Submit("by-a-3", 3));
  EXPECT_EQ(late.code(), absl::StatusCode::kFailedPrecondition) << late;
  EXPECT_EQ(a->Renew().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(a->valid_until(), absl::InfinitePast());

  auto store_b = PostgresJobStore::Open(options_, b->fence());
  ASSERT_TRUE(store_b.ok()) << store_b.status();
  ASSERT_TRUE((*store_b)->Apply(Submit("by-b-2", 2)).ok());
  EXPECT_EQ(Sql("SELECT string_agg(id, ',' ORDER BY seq) FROM jobs"), "by-a-1,by-b-2");
  // Taking the lease back later gives a a new token; its old store stays fenced out.
  ASSERT_TRUE(b->Release().ok());
  ASSERT_TRUE(*a->TryAcquire());
  EXPECT_EQ(a->fence().token, first_token + 2);
  EXPECT_EQ((*store_a)->Apply(Submit("by-a-4", 4)).code(), absl::StatusCode::kFailedPrecondition);
}

// The keeper renews the lease on its own and says, once, when it is lost: taken by another (here
// expired behind its back), or not renewed before it expires (the database gone).
TEST_F(PostgresStoreTest, TheKeeperRenewsAndTellsWhenTheLeaseIsLost) {
  for (const bool database_gone : {false, true}) {
    auto lease = LeaderLease::Open(options_, "keeper", "keeper:7070", absl::Milliseconds(900),
                                   RealClock::Get());
    ASSERT_TRUE(lease.ok()) << lease.status();
    ASSERT_TRUE(*(*lease)->TryAcquire());
    absl::Mutex mu;
    std::vector<absl::Status> lost;
    std::vector<std::string> told;  // what the keeper said, in order: the health follows it
    auto keeper = std::make_unique<LeaseKeeper>(**lease, RealClock::Get(), [&](absl::Status why) {
      absl::MutexLock lock(&mu);
      lost.push_back(why);
      told.push_back("lost");
    });
    keeper->OnCertainty([&](bool sure) {
      absl::MutexLock lock(&mu);
      told.push_back(sure ? "sure" : "unsure");
    });
    // Renewed again and again, for more than two lease lengths, and never lost meanwhile.
    const absl::Time first = (*lease)->valid_until();
    const absl::Time give_up = absl::Now() + absl::Seconds(10);
    while ((*lease)->valid_until() < first + absl::Seconds(2) && absl::Now() < give_up) {
      absl::SleepFor(absl::Milliseconds(20));  // polling for the renewals
    }
    EXPECT_GE((*lease)->valid_until(), first + absl::Seconds(2));
    {
      absl::MutexLock lock(&mu);
      EXPECT_TRUE(lost.empty()) << lost[0];
    }
    EXPECT_GT((*lease)->valid_until(), absl::Now());
    const absl::Time cut = absl::Now();
    if (database_gone) {
      server_->Kill();
    } else {
      ExpireLease();
    }
    {
      absl::MutexLock lock(&mu);
      EXPECT_TRUE(
          mu.AwaitWithTimeout(absl::Condition(
                                  +[](std::vector<absl::Status>* l) { return !l->empty(); }, &lost),
                              absl::Seconds(5)));
      ASSERT_EQ(lost.size(), 1u);
      EXPECT_EQ(lost[0].code(), database_gone ? absl::StatusCode::kUnavailable
                                              : absl::StatusCode::kFailedPrecondition)
          << lost[0];
      // A renewal failed before the lease was given up: the leader said NOT_SERVING first.
      EXPECT_EQ(told, (std::vector<std::string>{"unsure", "lost"}));
    }
    // Within its lease (900 ms), give or take a renewal period.
    EXPECT_LT(absl::Now() - cut, absl::Milliseconds(1500));
    keeper.reset();
    {
      absl::MutexLock lock(&mu);
      EXPECT_EQ(lost.size(), 1u);
    }
    if (database_gone) {
      ASSERT_TRUE(server_->StartAgain().ok());
    }
  }
}

// A clean shutdown hands over at once: the standby need not wait the lease out.
TEST_F(PostgresStoreTest, AReleasedLeaseIsTakenAtOnce) {
  std::unique_ptr<LeaderLease> a = Lease("coordinator-a");
  std::unique_ptr<LeaderLease> b = Lease("coordinator-b");
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(*a->TryAcquire());
  ASSERT_FALSE(*b->TryAcquire());
  ASSERT_TRUE(a->Release().ok());
  EXPECT_FALSE(b->Current()->live);
  ASSERT_TRUE(*b->TryAcquire());
  EXPECT_EQ(b->Current()->holder, "coordinator-b");
}

// Of many coordinators trying at once, exactly one leads.
TEST_F(PostgresStoreTest, ExactlyOneOfManyContendersLeads) {
  std::vector<std::unique_ptr<LeaderLease>> leases;
  for (int i = 0; i < 6; ++i) {
    leases.push_back(Lease(absl::StrCat("coordinator-", i)));
    ASSERT_TRUE(leases.back());
  }
  std::atomic<int> leaders{0};
  std::vector<std::thread> threads;
  for (auto& lease : leases) {
    threads.emplace_back([&leaders, l = lease.get()] {
      absl::StatusOr<bool> led = l->TryAcquire();
      EXPECT_TRUE(led.ok()) << led.status();
      if (led.ok() && *led) ++leaders;
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(leaders.load(), 1);
}

// A database restarted under the store: the call that meets the lost connection fails UNAVAILABLE
// (nothing half-written), the next reconnects, and every committed write is there.
TEST_F(PostgresStoreTest, TheStoreReconnectsAfterTheDatabaseRestarts) {
  auto store = PostgresJobStore::Open(options_);
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->Apply(Submit("before-1", 1)).ok());
  ASSERT_TRUE(server_->Restart().ok());
  absl::Status first = (*store)->Apply(Submit("after-2", 2));
  if (!first.ok()) {
    EXPECT_EQ(first.code(), absl::StatusCode::kUnavailable) << first;
    ASSERT_TRUE((*store)->Apply(Submit("after-2", 2)).ok());
  }
  auto contents = (*store)->LoadAll();
  ASSERT_TRUE(contents.ok()) << contents.status();
  ASSERT_EQ(contents->jobs.size(), 2u);
  EXPECT_EQ(contents->next_job_seq, 3);
}

// With the database gone every call fails UNAVAILABLE within the timeout, rather than hanging.
TEST_F(PostgresStoreTest, ADatabaseThatIsGoneIsUnavailableWithinTheTimeout) {
  auto store = PostgresJobStore::Open(options_);
  ASSERT_TRUE(store.ok()) << store.status();
  // Every process of the server is gone when Kill returns, the store's backend too: each backend
  // is a process group of its own and, left alone, answers until it sees its postmaster gone.
  const std::vector<pid_t> processes = testing::ChildProcesses(server_->pid());
  ASSERT_GE(processes.size(), 2u);  // the background processes and the store's backend
  server_->Kill();
  for (pid_t pid : processes) EXPECT_FALSE(testing::ProcessAlive(pid)) << pid;
  for (int i = 0; i < 2; ++i) {  // the lost connection, then a failed reconnect
    const absl::Time start = absl::Now();
    absl::Status s = (*store)->Apply(Submit("lost-1", 1));
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
    EXPECT_LT(absl::Now() - start, options_.timeout + absl::Seconds(2));
  }
  ASSERT_TRUE(server_->StartAgain().ok());
  EXPECT_TRUE((*store)->Apply(Submit("back-1", 1)).ok());
}

// A write far larger than the socket buffers (pipelined: sent while the answers are read) lands
// whole, in one transaction.
TEST_F(PostgresStoreTest, ALargeWriteLandsWhole) {
  auto store = PostgresJobStore::Open(options_);
  ASSERT_TRUE(store.ok()) << store.status();
  StoreMutation m;
  for (int i = 1; i <= 3000; ++i) {
    StoredJob job = MakeJob(absl::StrCat("big-", i), i);
    job.job.mutable_spec()->set_name(std::string(4096, 'x'));
    m.jobs.push_back(job);
  }
  m.next_job_seq = 3001;
  ASSERT_TRUE((*store)->Apply(m).ok());
  EXPECT_EQ(Sql("SELECT COUNT(*), SUM(length(job)) > 3000 * 4096 FROM jobs"), "3000|t");
}

// A database written by a newer coordinator is refused, not misread.
TEST_F(PostgresStoreTest, ANewerSchemaIsRefused) {
  ASSERT_TRUE(PostgresJobStore::Open(options_).ok());
  EXPECT_EQ(Sql("SELECT value FROM meta WHERE key = 'schema_version'"),
            absl::StrCat(kPostgresSchemaVersion));
  Sql("UPDATE meta SET value = '99' WHERE key = 'schema_version'");
  auto store = PostgresJobStore::Open(options_);
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition) << store.status();
}

// A database of the first schema (before task logs) is migrated, its rows kept.
TEST_F(PostgresStoreTest, AVersionOneDatabaseIsMigrated) {
  {
    auto store = PostgresJobStore::Open(options_);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->Apply(Submit("kept", 1)).ok());
  }
  Sql("DROP TABLE task_logs; DROP TABLE task_log_pieces; "
      "UPDATE meta SET value = '1' WHERE key = 'schema_version'");
  auto store = PostgresJobStore::Open(options_);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ(Sql("SELECT value FROM meta WHERE key = 'schema_version'"),
            absl::StrCat(kPostgresSchemaVersion));
  EXPECT_EQ(Sql("SELECT to_regclass('task_log_pieces') IS NOT NULL"), "t");
  EXPECT_EQ(Sql("SELECT string_agg(id, ',') FROM jobs"), "kept");
}

// Coordinators started together on an empty database make its schema once, without clashing.
TEST_F(PostgresStoreTest, CoordinatorsStartingTogetherMakeTheSchemaOnce) {
  std::vector<std::thread> threads;
  std::atomic<int> opened{0};
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&] {
      auto store = PostgresJobStore::Open(options_);
      EXPECT_TRUE(store.ok()) << store.status();
      if (store.ok()) ++opened;
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(opened.load(), 4);
  EXPECT_EQ(Sql("SELECT COUNT(*) FROM leader"), "1");
}

// The task-credential key: the first coordinator's, whoever asks.
TEST_F(PostgresStoreTest, ASharedSecretIsTheFirstOneMade) {
  auto a = PostgresJobStore::Open(options_);
  auto b = PostgresJobStore::Open(options_);
  ASSERT_TRUE(a.ok() && b.ok());
  auto first = (*a)->SharedSecret("task-key", [] { return std::string("first\0key", 9); });
  auto second = (*b)->SharedSecret("task-key", [] { return std::string("second"); });
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(*first, std::string("first\0key", 9));
  EXPECT_EQ(*second, *first);
}

// TLS to the database when asked (libpq's sslmode and sslrootcert in the address): the server's
// certificate checked against the CA given, a wrong CA refused, no TLS refused by a server that
// requires it.
TEST(PostgresTlsTest, TheStoreSpeaksTlsAndChecksTheServersCertificate) {
  PostgresServer::Options tls;
  tls.tls = true;
  auto server = PostgresServer::Start(tls);
  ASSERT_TRUE(server.ok()) << server.status();
  auto uri = (*server)->CreateDatabase("trainyard");
  ASSERT_TRUE(uri.ok()) << uri.status();
  pg::ConnectOptions options;
  options.conninfo = *uri + "?sslmode=verify-full&sslrootcert=" + (*server)->ca_file();
  options.timeout = absl::Seconds(5);
  auto store = PostgresJobStore::Open(options);
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->Apply(Submit("over-tls-1", 1)).ok());
  auto encrypted = (*server)->Psql(
      "trainyard",
      "SELECT bool_and(s.ssl) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) WHERE "
      "a.application_name = 'trainyard-coordinator'");
  ASSERT_TRUE(encrypted.ok()) << encrypted.status();
  EXPECT_EQ(absl::StripAsciiWhitespace(*encrypted), "t");

  options.conninfo = *uri + "?sslmode=verify-full&sslrootcert=" + (*server)->other_ca_file();
  auto impostor = PostgresJobStore::Open(options);
  EXPECT_EQ(impostor.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(impostor.status().message(), HasSubstr("certificate verify failed"));
  options.conninfo = *uri + "?sslmode=disable";
  auto plain = PostgresJobStore::Open(options);
  EXPECT_EQ(plain.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(plain.status().message(), HasSubstr("no encryption"));
}

TEST(PostgresConninfoTest, BadAddressesAreRefusedAndPasswordsRedacted) {
  EXPECT_EQ(pg::ValidateConninfo("postgres://u@h:5432/db").code(), absl::StatusCode::kOk);
  EXPECT_EQ(pg::ValidateConninfo("postgres://u@h:5432/db?nonsense=1").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pg::ValidateConninfo("host=h port").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pg::RedactConninfo("postgres://u:s3cret@h/db"), "postgres://u:***@h/db");
  EXPECT_EQ(pg::RedactConninfo("host=h password=s3cret user=u"), "host=h password=*** user=u");
  pg::ConnectOptions options;
  options.conninfo = "postgres://u:s3cret@127.0.0.1:1/db";
  options.timeout = absl::Seconds(2);
  auto c = pg::Connection::Open(options);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(c.status().message().find("s3cret"), std::string::npos) << c.status();
}

}  // namespace
}  // namespace trainyard
