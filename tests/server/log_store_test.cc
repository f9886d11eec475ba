// The task log contract, on both backends from one suite: files in the state folder (SQLite's
// coordinator) and the PostgreSQL store's database (where every coordinator serves every log).
// The PostgreSQL cases run in postgres_store_test, against a server the tests start.

#include "server/store/log_store.h"

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/clock.h"
#include "gtest/gtest.h"
#include "server/leadership/leader_lease.h"
#include "server/store/postgres_log_backend.h"
#include "tests/common/postgres_server.h"
#include "tests/server/test_util.h"

namespace trainyard {
namespace {

using testing::PostgresServer;

// Each gives a backend over the same logs every time Open is called.
class FileLogs {
 public:
  static constexpr char kName[] = "Files";
  absl::StatusOr<std::unique_ptr<LogBackend>> Open() { return NewFileLogBackend(dir_.path()); }

 private:
  TempDir dir_;
};

class PostgresLogs {
 public:
  static constexpr char kName[] = "Postgres";
  absl::StatusOr<std::unique_ptr<LogBackend>> Open() {
    absl::StatusOr<PostgresServer*> server = PostgresServer::Shared();
    if (!server.ok()) return server.status();
    if (options_.conninfo.empty()) {
      static int databases = 0;
      absl::StatusOr<std::string> uri =
          (*server)->CreateDatabase(absl::StrCat("logs_", ++databases));
      if (!uri.ok()) return uri.status();
      options_.conninfo = *uri;
    }
    absl::StatusOr<std::unique_ptr<PostgresLogBackend>> backend =
        PostgresLogBackend::Open(options_);
    if (!backend.ok()) return backend.status();
    return std::unique_ptr<LogBackend>(*std::move(backend));
  }

 private:
  pg::ConnectOptions options_;
};

template <typename Logs>
class LogStoreContract : public ::testing::Test {
 protected:
  // A store over the logs so far, as a coordinator (re)started with this limit has.
  std::unique_ptr<LogStore> Store(int64_t max_task_bytes = int64_t{64} << 20) {
    absl::StatusOr<std::unique_ptr<LogBackend>> backend = logs_.Open();
    EXPECT_TRUE(backend.ok()) << backend.status();
    if (!backend.ok()) return nullptr;
    return std::make_unique<LogStore>(*std::move(backend), max_task_bytes);
  }
  Logs logs_;
};

struct LogsName {
  template <typename T>
  static std::string GetName(int) {
    return T::kName;
  }
};
using LogBackends = ::testing::Types<FileLogs, PostgresLogs>;
TYPED_TEST_SUITE(LogStoreContract, LogBackends, LogsName);

// Pieces shipped again, out of order or overlapping add only what is new; a gap is refused with
// the offset to resend from; reads cross the pieces' edges; another coordinator reads the same.
TYPED_TEST(LogStoreContract, ShippingIsIdempotentAndReadsCrossPieces) {
  std::unique_ptr<LogStore> logs = this->Store();
  ASSERT_NE(logs, nullptr);
  EXPECT_EQ(*logs->Append("j-1", "t-0", 0, "hello "), 6);
  EXPECT_EQ(*logs->Append("j-1", "t-0", 0, "hello "), 6);       // resent: nothing new
  EXPECT_EQ(*logs->Append("j-1", "t-0", 20, "later"), 6);       // a gap: resend from 6
  EXPECT_EQ(*logs->Append("j-1", "t-0", 3, "lo world\n"), 12);  // overlapping: "world\n" new
  EXPECT_EQ(*logs->Append("j-1", "t-0", 12, "second line\n"), 24);
  EXPECT_EQ(*logs->Read("j-1", "t-0", 0, 1 << 20), "hello world\nsecond line\n");
  EXPECT_EQ(*logs->Read("j-1", "t-0", 4, 10), "o world\nse");  // across two pieces
  EXPECT_EQ(*logs->Read("j-1", "t-0", 24, 10), "");
  EXPECT_EQ(*logs->Read("j-1", "t-9", 0, 10), "");  // no log yet
  EXPECT_EQ(logs->version("j-1"), 3u);
  EXPECT_EQ(logs->Append("j-1", "../t", 0, "x").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(logs->Append("j-1", "t-0", -1, "x").status().code(),
            absl::StatusCode::kInvalidArgument);

  std::unique_ptr<LogStore> again = this->Store();  // a coordinator that took over
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(*again->Read("j-1", "t-0", 0, 1 << 20), "hello world\nsecond line\n");
  EXPECT_EQ(*again->Append("j-1", "t-0", 0, "hello world\nsecond line\nthird\n"), 30);
  EXPECT_EQ(*again->Read("j-1", "t-0", 20, 1 << 20), "ine\nthird\n");
}

// A log shipped in many pieces of uneven sizes reads back whole from any offset: at a piece's
// start, inside one, across several, at the end.
TYPED_TEST(LogStoreContract, ManyPiecesReadBackFromAnyOffset) {
  std::unique_ptr<LogStore> logs = this->Store();
  ASSERT_NE(logs, nullptr);
  std::string whole;
  for (int i = 0; i < 200; ++i) {
    const std::string piece = absl::StrCat("line ", i, std::string(i % 7, '.'), "\n");
    ASSERT_EQ(*logs->Append("j-1", "t-0", static_cast<int64_t>(whole.size()), piece),
              static_cast<int64_t>(whole.size() + piece.size()));
    whole += piece;
  }
  const int64_t size = static_cast<int64_t>(whole.size());
  for (int64_t offset : {int64_t{0}, int64_t{7}, int64_t{8}, size / 3, size / 2 + 1, size - 5}) {
    for (int64_t n : {int64_t{1}, int64_t{9}, int64_t{100}, size}) {
      EXPECT_EQ(*logs->Read("j-1", "t-0", offset, n), whole.substr(offset, n))
          << "offset " << offset << " n " << n;
    }
  }
}

TYPED_TEST(LogStoreContract, ALogPastItsLimitKeepsTheStartAndCountsTheRest) {
  const std::string a(60, 'a');
  const std::string b(60, 'b');
  {
    std::unique_ptr<LogStore> logs = this->Store(100);
    ASSERT_NE(logs, nullptr);
    EXPECT_EQ(*logs->Append("j-1", "t", 0, a), 60);
    EXPECT_EQ(*logs->Append("j-1", "t", 60, b), 120);  // 40 of b kept, 20 dropped
    EXPECT_EQ(*logs->Append("j-1", "t", 120, std::string(50, 'c')), 170);
    EXPECT_EQ(*logs->Append("j-1", "t", 60, b), 170);  // a retry: nothing new
  }
  // A restarted coordinator remembers the log went past its limit.
  std::unique_ptr<LogStore> logs = this->Store(100);
  ASSERT_NE(logs, nullptr);
  EXPECT_EQ(*logs->Append("j-1", "t", 170, std::string(30, 'd')), 200);
  ASSERT_TRUE(logs->Seal("j-1", "t").ok());
  ASSERT_TRUE(logs->Seal("j-1", "t").ok());  // once
  const std::string text = *logs->Read("j-1", "t", 0, 1 << 20);
  EXPECT_EQ(text.substr(0, 100), a + b.substr(0, 40));
  EXPECT_EQ(text.substr(100),
            "\n[trainyard: this task's log reached its limit of 100 bytes (--max_task_log_bytes); "
            "later output is not kept]\n"
            "[trainyard: 100 bytes of later output were not kept]\n");
  // A log within its limit gets no line.
  ASSERT_TRUE(logs->Append("j-1", "u", 0, "short\n").ok());
  ASSERT_TRUE(logs->Seal("j-1", "u").ok());
  EXPECT_EQ(*logs->Read("j-1", "u", 0, 1 << 20), "short\n");
}

TYPED_TEST(LogStoreContract, ALogAlreadyPastALoweredLimitKeepsWhatItHasAndASealedOneStaysSealed) {
  {
    std::unique_ptr<LogStore> logs = this->Store(1000);
    ASSERT_NE(logs, nullptr);
    ASSERT_EQ(*logs->Append("j-1", "t", 0, std::string(200, 'a')), 200);
  }
  {
    std::unique_ptr<LogStore> logs = this->Store(100);  // the limit lowered under a running task
    ASSERT_NE(logs, nullptr);
    EXPECT_EQ(*logs->Append("j-1", "t", 200, std::string(50, 'b')), 250);
    ASSERT_TRUE(logs->Seal("j-1", "t").ok());
  }
  std::unique_ptr<LogStore> logs = this->Store(100);  // a restart after the task ended
  ASSERT_NE(logs, nullptr);
  EXPECT_EQ(*logs->Append("j-1", "t", 250, "late"), 254);
  ASSERT_TRUE(logs->Seal("j-1", "t").ok());
  EXPECT_EQ(*logs->Read("j-1", "t", 0, 1 << 20),
            std::string(200, 'a') +
                "\n[trainyard: this task's log reached its limit of 100 bytes "
                "(--max_task_log_bytes); later output is not kept]\n"
                "[trainyard: 50 bytes of later output were not kept]\n");
}

TYPED_TEST(LogStoreContract, RemovingAJobRemovesItsLogsOnly) {
  std::unique_ptr<LogStore> logs = this->Store(100);
  ASSERT_NE(logs, nullptr);
  ASSERT_TRUE(logs->Append("j-1", "t-0", 0, std::string(150, 'x')).ok());  // capped too
  ASSERT_TRUE(logs->Append("j-1", "t-1", 0, "one\n").ok());
  ASSERT_TRUE(logs->Append("j-2", "t-0", 0, "two\n").ok());
  ASSERT_TRUE(logs->RemoveJob("j-1").ok());
  ASSERT_TRUE(logs->RemoveJob("j-3").ok());  // none: fine
  EXPECT_EQ(*logs->Read("j-1", "t-0", 0, 1 << 20), "");
  std::unique_ptr<LogStore> again = this->Store(100);
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(*again->Read("j-1", "t-1", 0, 1 << 20), "");
  EXPECT_EQ(*again->Read("j-2", "t-0", 0, 1 << 20), "two\n");
  // A job id used again starts from nothing (no cap kept from before).
  EXPECT_EQ(*again->Append("j-1", "t-0", 0, "new\n"), 4);
  EXPECT_EQ(*again->Read("j-1", "t-0", 0, 1 << 20), "new\n");
}

// A deposed leader adds nothing to any log: its appends fail and what the new leader ships is
// what is there.
TEST(PostgresLogTest, ADeposedLeaderWritesNoLog) {
  absl::StatusOr<PostgresServer*> server = PostgresServer::Shared();
  ASSERT_TRUE(server.ok()) << server.status();
  absl::StatusOr<std::string> uri = (*server)->CreateDatabase("logs_fenced");
  ASSERT_TRUE(uri.ok()) << uri.status();
  pg::ConnectOptions options;
  options.conninfo = *uri;
  options.timeout = absl::Seconds(3);
  auto lease = [&](const std::string& holder) {
    return LeaderLease::Open(options, holder, holder + ":7070", absl::Seconds(30),
                             RealClock::Get());
  };
  auto a = lease("coordinator-a");
  auto b = lease("coordinator-b");
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(*(*a)->TryAcquire());
  auto a_logs = PostgresLogBackend::Open(options, (*a)->fence());
  ASSERT_TRUE(a_logs.ok()) << a_logs.status();
  LogStore by_a(*std::move(a_logs));
  ASSERT_EQ(*by_a.Append("j-1", "t-0", 0, "from a\n"), 7);

  ASSERT_TRUE(
      (*server)
          ->Psql("logs_fenced", "UPDATE leader SET expires_at = now() - interval '1 second'")
          .ok());
  ASSERT_TRUE(*(*b)->TryAcquire());
  auto b_logs = PostgresLogBackend::Open(options, (*b)->fence());
  ASSERT_TRUE(b_logs.ok()) << b_logs.status();
  LogStore by_b(*std::move(b_logs));
  EXPECT_EQ(by_a.Append("j-1", "t-0", 7, "late from a\n").status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(by_a.RemoveJob("j-1").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(*by_b.Append("j-1", "t-0", 7, "from b\n"), 14);
  EXPECT_EQ(*by_b.Read("j-1", "t-0", 0, 1 << 20), "from a\nfrom b\n");
}

}  // namespace
}  // namespace trainyard
