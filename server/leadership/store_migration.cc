#include "server/leadership/store_migration.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/clock.h"
#include "common/rpc/credentials.h"
#include "server/leadership/leader_lease.h"
#include "server/leadership/leadership.h"
#include "server/store/log_store.h"
#include "server/store/postgres_job_store.h"
#include "server/store/postgres_log_backend.h"
#include "server/store/sqlite_job_store.h"

namespace trainyard {
namespace {

constexpr int64_t kLogPieceBytes = int64_t{1} << 20;

// FAILED_PRECONDITION naming what the database already holds, if anything. Tokens do not count:
// coordinators started on it before the migration made an admin token, which stays beside the
// migrated ones (ids are random).
absl::Status CheckEmpty(pg::Connection& db) {
  std::vector<std::string> held;
  for (const char* table : {"jobs", "searches", "queues"}) {
    absl::StatusOr<pg::Result> n = db.Exec(absl::StrCat("SELECT COUNT(*) FROM ", table));
    if (!n.ok()) return n.status();
    if (n->Int(0, 0) > 0) held.push_back(absl::StrCat(n->Int(0, 0), " ", table));
  }
  if (held.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "the database already holds ", absl::StrJoin(held, ", "),
      ": a state folder is migrated into an empty database only (nothing was written)"));
}

// The task logs under `dir` ({job_id}/{task_id}.log), by job.
std::map<std::string, std::vector<std::string>> ListLogs(const std::string& dir) {
  std::map<std::string, std::vector<std::string>> out;
  std::error_code ec;
  for (const auto& job : std::filesystem::directory_iterator(dir, ec)) {
    if (!job.is_directory()) continue;
    std::error_code inner;
    for (const auto& file : std::filesystem::directory_iterator(job.path(), inner)) {
      const std::string name = file.path().filename().string();
      if (!absl::EndsWith(name, ".log")) continue;
      out[job.path().filename().string()].push_back(name.substr(0, name.size() - 4));
    }
  }
  return out;
}

}  // namespace

namespace {

// Each job's task logs from the state folder's files into the database, replacing any left by a
// migration cut short; the logs of jobs no longer in the state are left behind.
absl::Status CopyLogs(const std::string& state_dir, const StoreContents& contents,
                      PostgresLogBackend& pg_logs, MigrationCounts& counts) {
  std::unique_ptr<LogBackend> files = NewFileLogBackend(state_dir + "/logs");
  std::set<std::string> job_ids;
  for (const StoredJob& job : contents.jobs) job_ids.insert(job.job.id());
  for (const auto& [job_id, task_ids] : ListLogs(state_dir + "/logs")) {
    if (!job_ids.count(job_id) || !IsSafeFileName(job_id)) continue;  // a removed job's
    if (absl::Status s = pg_logs.RemoveJob(job_id); !s.ok()) return s;
    for (const std::string& task_id : task_ids) {
      if (!IsSafeFileName(task_id)) continue;
      absl::StatusOr<LogBackend::Record> record = files->Load(job_id, task_id);
      if (!record.ok()) return record.status();
      for (int64_t at = 0; at < record->size; at += kLogPieceBytes) {
        absl::StatusOr<std::string> piece =
            files->Read(job_id, task_id, at, std::min(kLogPieceBytes, record->size - at));
        if (!piece.ok()) return piece.status();
        if (absl::Status s = pg_logs.Append(job_id, task_id, at, *piece); !s.ok()) {
          return s;
        }
      }
      if (record->cap.has_value()) {
        if (absl::Status s = pg_logs.WriteCap(job_id, task_id, *record->cap); !s.ok()) {
          return s;
        }
      }
      ++counts.logs;
      counts.log_bytes += record->size;
    }
  }
  return absl::OkStatus();
}

// Everything of the state but the logs, as one write.
StoreMutation MutationOf(const StoreContents& contents, const std::vector<StoredToken>& tokens,
                         const std::vector<StoredSearch>& searches,
                         const std::vector<v1::Queue>& queues) {
  StoreMutation m;
  for (const StoredJob& stored : contents.jobs) {
    for (const v1::JobEvent& event : stored.job.events()) {
      m.events.emplace_back(stored.job.id(), event);
    }
    for (const v1::TaskInfo& task : stored.job.tasks()) m.tasks.emplace_back(stored.job.id(), task);
    if (stored.job.has_progress()) m.progress.emplace_back(stored.job.id(), stored.job.progress());
    m.jobs.push_back(stored);
  }
  m.workers = contents.workers;
  m.checkpoints = contents.checkpoints;
  m.next_job_seq = contents.next_job_seq;
  m.tokens = tokens;
  for (const StoredSearch& search : searches) {
    for (const v1::Trial& trial : search.search.trials()) {
      m.trials.emplace_back(search.search.id(), trial);
    }
    m.searches.push_back(search);
  }
  m.queues = queues;
  return m;
}

}  // namespace

absl::StatusOr<MigrationCounts> MigrateSqliteToPostgres(
    const std::string& state_dir, const pg::ConnectOptions& options,
    const std::function<void(absl::string_view)>& progress) {
  const std::string db_path = state_dir + "/state.db";
  if (!std::filesystem::exists(db_path)) {
    return absl::NotFoundError(absl::StrCat("no state to migrate: ", db_path, " does not exist"));
  }
  absl::StatusOr<std::unique_ptr<SqliteJobStore>> sqlite = SqliteJobStore::Open(db_path);
  if (!sqlite.ok()) return sqlite.status();
  absl::StatusOr<StoreContents> contents = (*sqlite)->LoadAll();
  if (!contents.ok()) return contents.status();
  absl::StatusOr<std::vector<StoredToken>> tokens = (*sqlite)->LoadTokens();
  if (!tokens.ok()) return tokens.status();
  absl::StatusOr<std::vector<StoredSearch>> searches = (*sqlite)->LoadSearches();
  if (!searches.ok()) return searches.status();
  absl::StatusOr<std::vector<v1::Queue>> queues = (*sqlite)->LoadQueues();
  if (!queues.ok()) return queues.status();
  const std::string key_path = state_dir + "/task-credential.key";
  std::vector<std::pair<std::string, std::string>> secrets;
  if (std::filesystem::exists(key_path)) {
    absl::StatusOr<std::string> key = LoadOrCreateKey(key_path);
    if (!key.ok()) return key.status();
    secrets.emplace_back("task-credential-key", *key);
  }
  progress(absl::StrCat("read ", db_path, ": ", contents->jobs.size(), " jobs, ", tokens->size(),
                        " tokens, ", searches->size(), " searches, ", queues->size(), " queues, ",
                        contents->workers.size(), " workers"));

  // The lease, held while writing: a coordinator started on the database meanwhile stands by.
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  absl::StatusOr<std::unique_ptr<LeaderLease>> lease =
      LeaderLease::Open(options, absl::StrCat("migration/", host, "/", getpid()), "",
                        absl::Seconds(30), RealClock::Get());
  if (!lease.ok()) return lease.status();
  absl::StatusOr<bool> led = (*lease)->TryAcquire();
  if (!led.ok()) return led.status();
  if (!*led) {
    absl::StatusOr<LeaderInfo> who = (*lease)->Current();
    return absl::FailedPreconditionError(
        absl::StrCat("a coordinator leads on this database (", who.ok() ? who->holder : "unknown",
                     "): stop the coordinators using it first (nothing was written)"));
  }
  // A lease lost meanwhile fails the writes that follow (they are fenced).
  auto keeper =
      std::make_unique<LeaseKeeper>(**lease, RealClock::Get(), [](const absl::Status&) {});
  auto release = [&](absl::Status s) {
    keeper.reset();
    (*lease)->Release().IgnoreError();
    return s;
  };
  const LeaseFence fence = (*lease)->fence();
  absl::StatusOr<std::unique_ptr<pg::Connection>> check = pg::Connection::Open(options);
  if (!check.ok()) return release(check.status());
  if (absl::Status s = CheckEmpty(**check); !s.ok()) return release(s);

  // Logs first, each job's replacing any left by a migration cut short; then everything else in
  // one transaction.
  MigrationCounts counts;
  absl::StatusOr<std::unique_ptr<PostgresLogBackend>> pg_logs =
      PostgresLogBackend::Open(options, fence);
  if (!pg_logs.ok()) return release(pg_logs.status());
  if (absl::Status s = CopyLogs(state_dir, *contents, **pg_logs, counts); !s.ok()) {
    return release(s);
  }
  progress(absl::StrFormat("copied the logs of %d tasks (%.1f MiB)", counts.logs,
                           static_cast<double>(counts.log_bytes) / (1 << 20)));

  StoreMutation m = MutationOf(*contents, *tokens, *searches, *queues);
  // The jobs' metric histories, in the same transaction.
  for (const StoredJob& job : contents->jobs) {
    absl::StatusOr<std::vector<v1::MetricPoint>> points =
        (*sqlite)->LoadMetricHistory(job.job.id(), 0);
    if (!points.ok()) return release(points.status());
    for (v1::MetricPoint& point : *points) m.metric_points.emplace_back(job.job.id(), point);
  }
  absl::StatusOr<std::unique_ptr<PostgresJobStore>> pg_store =
      PostgresJobStore::Open(options, fence);
  if (!pg_store.ok()) return release(pg_store.status());
  if (absl::Status s = (*pg_store)->Import(m, secrets); !s.ok()) return release(s);
  counts.jobs = static_cast<int64_t>(contents->jobs.size());
  counts.tokens = static_cast<int64_t>(tokens->size());
  counts.searches = static_cast<int64_t>(searches->size());
  counts.queues = static_cast<int64_t>(queues->size());
  counts.workers = static_cast<int64_t>(contents->workers.size());
  if (absl::Status s = release(absl::OkStatus()); !s.ok()) return s;
  return counts;
}

}  // namespace trainyard
