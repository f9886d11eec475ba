#ifndef TRAINYARD_SERVER_STORE_POSTGRES_JOB_STORE_H_
#define TRAINYARD_SERVER_STORE_POSTGRES_JOB_STORE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/store/job_store.h"
#include "server/store/postgres_connection.h"

namespace trainyard {

// The leader lease a coordinator must still hold for its writes to land
// (server/leadership/leader_lease.h): its holder name and fencing token.
struct LeaseFence {
  std::string holder;
  int64_t token = 0;
};

// The statement that opens every fenced write's transaction: it fails the transaction unless
// `fence` still leads (trainyard_fence, SQLSTATE TY001).
pg::Connection::Statement FenceStatement(const LeaseFence& fence);

// The schema version of the PostgreSQL store this binary writes.
inline constexpr int kPostgresSchemaVersion = 4;

// The change feed's kinds (table `changes`, written by triggers): a job (its row, events, tasks,
// progress and checkpoint records; the key is its id), a worker (by id), and the tokens, searches
// (with their trials) and queues, each as a whole (empty key). The job sequence is read at every
// read of the feed.
inline constexpr char kJobChange[] = "job";
inline constexpr char kWorkerChange[] = "worker";
inline constexpr char kTokensChange[] = "tokens";
inline constexpr char kSearchesChange[] = "searches";
inline constexpr char kQueuesChange[] = "queues";
// How long the leader keeps a change row. A reader whose previous read is older than half this
// reads everything again.
inline constexpr absl::Duration kChangeRetention = absl::Minutes(10);

// What a standby's warm copy (server/leadership/standby_copy.h) reads: in one snapshot, what was
// committed after an earlier read's snapshot (or everything).
struct StoreChanges {
  // This read's snapshot (pg_snapshot as text): the next read's `since`.
  std::string snapshot;
  // True when this read is everything: `contents` as LoadActive returns it, and the queues,
  // tokens and searches all present.
  bool everything = false;
  // The jobs and workers changed (not listed when everything): some may be gone, or final and
  // not loaded.
  std::set<std::string> jobs;
  std::set<std::string> workers;
  // Of the changed jobs, those LoadActive would return now, with their checkpoint records; of the
  // changed workers, those still stored; next_job_seq. `not_loaded` is left empty.
  StoreContents contents;
  // The final jobs in the store by state (those loaded included), when asked for or everything.
  std::map<trainyard::v1::JobState, int64_t> finished;
  // Each when it changed (or everything).
  std::optional<std::vector<trainyard::v1::Queue>> queues;
  std::optional<std::vector<StoredToken>> tokens;
  std::optional<std::vector<StoredSearch>> searches;
};

// Creates or migrates the PostgreSQL schema (under an advisory lock, so that coordinators starting
// together do it once). FAILED_PRECONDITION for a schema newer than this binary understands.
absl::Status EnsurePostgresSchema(pg::Connection& db);

// JobStore on PostgreSQL, for more than one coordinator (one leads; docs/operations.md). The
// tables are SQLite's (server/store/sqlite_job_store.h) with PostgreSQL's types, plus
//   leader(id, holder, address, token, expires_at)   the lease (server/leadership/leader_lease.h)
//   secrets(name, value)                             keys all coordinators share
//   changes(xid, at, kind, key)                      the change feed standbys read (ReadChanges)
// Schema version 3; migrations run on open, each in a transaction with its version number.
// A committed Apply is durable as the server's synchronous_commit makes it (on by default).
// With a fence, every Apply checks in its own transaction that the lease row still names the
// fence's holder and token and has not expired, holding the row (FOR SHARE) until it commits: a
// coordinator deposed, or cut off past its lease, writes nothing (FAILED_PRECONDITION), and a new
// leader's takeover waits for a write in flight to end. An Apply is one round trip to the
// database (the check, the writes and the commit pipelined). Loads read one snapshot (REPEATABLE
// READ). Thread-safe (one connection behind a mutex).
class PostgresJobStore final : public JobStore {
 public:
  // Connects and brings the schema up to date. UNAVAILABLE when the database cannot be reached,
  // FAILED_PRECONDITION for a newer schema, INVALID_ARGUMENT for a bad conninfo.
  static absl::StatusOr<std::unique_ptr<PostgresJobStore>> Open(
      const pg::ConnectOptions& options, std::optional<LeaseFence> fence = std::nullopt);

  PostgresJobStore(const PostgresJobStore&) = delete;
  PostgresJobStore& operator=(const PostgresJobStore&) = delete;

  absl::Status Apply(const StoreMutation& mutation) override;
  absl::StatusOr<StoreContents> LoadAll() override { return Load(/*active_only=*/false); }
  absl::StatusOr<StoreContents> LoadActive() override { return Load(/*active_only=*/true); }
  absl::StatusOr<StoredJobRecord> LoadJob(absl::string_view job_id) override;
  absl::StatusOr<std::vector<StoredJob>> ListFinishedJobs(
      const std::vector<trainyard::v1::JobState>& states, int64_t before_seq, int limit,
      absl::string_view owner) override;
  absl::StatusOr<std::vector<std::pair<std::string, trainyard::v1::JobState>>> FinishedBefore(
      int64_t unix_ms, int limit) override;
  absl::StatusOr<std::vector<StoredToken>> LoadTokens() override;
  absl::StatusOr<std::vector<StoredSearch>> LoadSearches() override;
  absl::StatusOr<std::vector<trainyard::v1::Queue>> LoadQueues() override;
  absl::StatusOr<std::vector<trainyard::v1::MetricPoint>> LoadMetricHistory(
      absl::string_view job_id, int64_t after_unix_ms) override;
  absl::StatusOr<std::map<std::string, std::vector<std::pair<int64_t, int64_t>>>> LoadMetricKeys(
      const std::vector<std::string>& job_ids) override;

  // Apply, with `secrets` (name, value) written (replacing any of that name) in the same
  // transaction: a migration's import (server/leadership/store_migration.h).
  absl::Status Import(const StoreMutation& mutation,
                      const std::vector<std::pair<std::string, std::string>>& secrets);

  // In one snapshot, what was committed after the read whose StoreChanges::snapshot is `since`
  // (empty: everything), and the counts of final jobs when `count_finished`. Needs the change
  // feed to hold every row since then (kChangeRetention): the caller reads everything again when
  // its last read is older than half that.
  absl::StatusOr<StoreChanges> ReadChanges(absl::string_view since, bool count_finished);

  // The secret named `name`, made with `make` and stored by the first coordinator that asks (all
  // coordinators of a cluster must sign task credentials with one key). Not fenced: a standby
  // may read it before it leads.
  absl::StatusOr<std::string> SharedSecret(absl::string_view name,
                                           const std::function<std::string()>& make);

 private:
  PostgresJobStore(std::unique_ptr<pg::Connection> db, std::optional<LeaseFence> fence)
      : db_(std::move(db)), fence_(std::move(fence)) {}
  // The statements that write `mutation`, in the order Apply promises.
  static void Writes(const StoreMutation& mutation, std::vector<pg::Connection::Statement>* out);
  absl::StatusOr<StoreContents> Load(bool active_only);
  absl::Status LoadLocked(bool active_only, StoreContents* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ReadWorkers(absl::string_view where, const pg::Params& params,
                           std::vector<trainyard::v1::Worker>* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ReadNextJobSeq(int64_t* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CountFinished(std::map<trainyard::v1::JobState, int64_t>* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::vector<StoredToken>> TokensLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::vector<StoredSearch>> SearchesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::vector<trainyard::v1::Queue>> QueuesLocked()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Appends the jobs that `sql` selects as (seq, job[, progress]).
  absl::Status ReadJobs(absl::string_view sql, const pg::Params& params, bool with_progress,
                        std::vector<StoredJob>* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fills the events, tasks and latest progress of `jobs` and appends their checkpoint records,
  // reading the rows whose job_id is IN `which` (an SQL list or subquery with `params`; empty:
  // every row).
  absl::Status ReadDetails(absl::string_view which, const pg::Params& params,
                           std::vector<StoredJob>& jobs, std::vector<StoredCheckpoint>* checkpoints)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  const std::unique_ptr<pg::Connection> db_ ABSL_PT_GUARDED_BY(mu_);
  const std::optional<LeaseFence> fence_;
  absl::Time last_trim_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();  // of the change feed
};

}  // namespace trainyard

#endif  // TRAINYARD_SERVER_STORE_POSTGRES_JOB_STORE_H_
