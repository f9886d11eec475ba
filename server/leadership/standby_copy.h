#ifndef TRAINYARD_SERVER_LEADERSHIP_STANDBY_COPY_H_
#define TRAINYARD_SERVER_LEADERSHIP_STANDBY_COPY_H_

// A standby's warm copy of what a leader loads when it starts (docs/operations.md, "More than
// one coordinator"): the active jobs with their details, the workers, queues, tokens and
// searches, kept up to date from the PostgreSQL store's change feed while the standby waits for
// the lease, so that taking over reads only what changed since its last read.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "server/store/job_store.h"
#include "server/store/postgres_job_store.h"

namespace trainyard {

// What a coordinator loads to start: what its stores' LoadActive, LoadQueues, LoadTokens and
// LoadSearches return (StandbyCopy::Take sets all four, from one snapshot).
struct WarmStart {
  std::optional<StoreContents> contents;
  std::optional<std::vector<trainyard::v1::Queue>> queues;
  std::optional<std::vector<StoredToken>> tokens;
  std::optional<std::vector<StoredSearch>> searches;
};

// Keeps a WarmStart up to date on a thread of its own: everything at first (and again after an
// error, or when its last read is older than half the feed's retention), then every `interval`
// the changes since its last read. Errors are logged when they change, and retried.
class StandbyCopy {
 public:
  // `store`: opened without a fence (it only reads). `clock` measures the age of the last read
  // against the feed's retention.
  StandbyCopy(std::unique_ptr<PostgresJobStore> store, absl::Duration interval,
              const Clock& clock = RealClock::Get());
  ~StandbyCopy();
  StandbyCopy(const StandbyCopy&) = delete;
  StandbyCopy& operator=(const StandbyCopy&) = delete;

  // Stops the thread, brings the copy up to date (everything, when it has none) and hands it over.
  // Call once this coordinator holds the lease: no write of an earlier leader can commit after
  // that, so the copy is what a fresh load would read. Once only.
  absl::StatusOr<WarmStart> Take();

  // Reads the changes once now, on the caller's thread (tests; the thread does it every interval).
  absl::Status Refresh() ABSL_LOCKS_EXCLUDED(mu_);

  struct Stats {
    int64_t full_reads = 0;    // reads of everything
    int64_t change_reads = 0;  // reads of the changes since the previous read
    int64_t jobs_reread = 0;   // changed jobs read by those
    size_t jobs = 0;           // jobs in the copy now
  };
  Stats stats() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop();
  absl::Status RefreshLocked(bool count_finished) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::unique_ptr<PostgresJobStore> store_;
  const absl::Duration interval_;
  const Clock& clock_;
  mutable absl::Mutex mu_;
  absl::CondVar cv_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool taken_ ABSL_GUARDED_BY(mu_) = false;
  // The copy: valid once `snapshot_` is set (the snapshot of the read it is as of).
  std::string snapshot_ ABSL_GUARDED_BY(mu_);
  absl::Time last_read_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::map<std::string, StoredJob> jobs_ ABSL_GUARDED_BY(mu_);  // by id
  std::map<std::string, std::vector<StoredCheckpoint>> checkpoints_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, trainyard::v1::Worker> workers_ ABSL_GUARDED_BY(mu_);
  int64_t next_job_seq_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<trainyard::v1::JobState, int64_t> finished_ ABSL_GUARDED_BY(mu_);
  std::vector<trainyard::v1::Queue> queues_ ABSL_GUARDED_BY(mu_);
  std::vector<StoredToken> tokens_ ABSL_GUARDED_BY(mu_);
  std::vector<StoredSearch> searches_ ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);
  std::string last_error_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

// A JobStore whose first LoadActive, LoadQueues, LoadTokens and LoadSearches answer from the
// pieces of `warm` it was given (each handed out once); everything else, and any later load, goes
// to `store`.
class PreloadedJobStore final : public JobStore {
 public:
  PreloadedJobStore(std::unique_ptr<JobStore> store, WarmStart warm)
      : store_(std::move(store)), warm_(std::move(warm)) {}

  absl::Status Apply(const StoreMutation& mutation) override { return store_->Apply(mutation); }
  absl::StatusOr<StoreContents> LoadAll() override { return store_->LoadAll(); }
  absl::StatusOr<StoreContents> LoadActive() override {
    if (auto piece = Take(&WarmStart::contents)) return *std::move(piece);
    return store_->LoadActive();
  }
  absl::StatusOr<StoredJobRecord> LoadJob(absl::string_view job_id) override {
    return store_->LoadJob(job_id);
  }
  absl::StatusOr<std::vector<StoredJob>> ListFinishedJobs(
      const std::vector<trainyard::v1::JobState>& states, int64_t before_seq, int limit,
      absl::string_view owner) override {
    return store_->ListFinishedJobs(states, before_seq, limit, owner);
  }
  absl::StatusOr<std::vector<std::pair<std::string, trainyard::v1::JobState>>> FinishedBefore(
      int64_t unix_ms, int limit) override {
    return store_->FinishedBefore(unix_ms, limit);
  }
  absl::StatusOr<std::vector<StoredToken>> LoadTokens() override {
    if (auto piece = Take(&WarmStart::tokens)) return *std::move(piece);
    return store_->LoadTokens();
  }
  absl::StatusOr<std::vector<StoredSearch>> LoadSearches() override {
    if (auto piece = Take(&WarmStart::searches)) return *std::move(piece);
    return store_->LoadSearches();
  }
  absl::StatusOr<std::vector<trainyard::v1::Queue>> LoadQueues() override {
    if (auto piece = Take(&WarmStart::queues)) return *std::move(piece);
    return store_->LoadQueues();
  }
  absl::StatusOr<std::vector<trainyard::v1::MetricPoint>> LoadMetricHistory(
      absl::string_view job_id, int64_t after_unix_ms) override {
    return store_->LoadMetricHistory(job_id, after_unix_ms);
  }
  absl::StatusOr<std::map<std::string, std::vector<std::pair<int64_t, int64_t>>>> LoadMetricKeys(
      const std::vector<std::string>& job_ids) override {
    return store_->LoadMetricKeys(job_ids);
  }

 private:
  // Moves one piece out of `warm_` (nullopt: none, or handed out already).
  template <typename T>
  std::optional<T> Take(std::optional<T> WarmStart::*piece) {
    absl::MutexLock lock(&mu_);
    std::optional<T> out = std::move(warm_.*piece);
    (warm_.*piece).reset();
    return out;
  }

  const std::unique_ptr<JobStore> store_;
  absl::Mutex mu_;
  WarmStart warm_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trainyard

#endif  // TRAINYARD_SERVER_LEADERSHIP_STANDBY_COPY_H_
