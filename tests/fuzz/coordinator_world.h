#ifndef TRAINYARD_TESTS_FUZZ_COORDINATOR_WORLD_H_
#define TRAINYARD_TESTS_FUZZ_COORDINATOR_WORLD_H_

// What the fuzz targets that run a coordinator share: a clock that never makes anyone wait, and a
// store in memory that outlives the coordinator using it, so that a second one recovers from it.

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "server/store/job_store.h"
#include "tests/server/fake_job_store.h"

namespace trainyard {

// Simulated time that never makes anyone wait: a wait for a deadline moves the clock to it at
// once (as a long poll would have waited), a sleep moves it by the sleep. Waits without a
// deadline wait a millisecond of real time, and their callers loop on their conditions.
class ImpatientClock final : public Clock {
 public:
  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) const {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }
  void SleepFor(absl::Duration d) const override { Advance(d); }
  bool WaitWithDeadline(absl::CondVar& cv, absl::Mutex& mu, absl::Time deadline) const override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (deadline == absl::InfiniteFuture()) {
      cv.WaitWithTimeout(&mu, absl::Milliseconds(1));
      return false;
    }
    MoveTo(deadline);
    return true;
  }
  bool AwaitWithDeadline(absl::Mutex& mu, const absl::Condition& condition,
                         absl::Time deadline) const override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (condition.Eval()) return true;
    if (deadline == absl::InfiniteFuture()) {
      return mu.AwaitWithTimeout(condition, absl::Milliseconds(1));
    }
    MoveTo(deadline);
    return condition.Eval();
  }

 private:
  void MoveTo(absl::Time t) const {
    absl::MutexLock lock(&mu_);
    if (t > now_) now_ = t;
  }
  mutable absl::Mutex mu_;
  // Long past in real time: a real-time wait for a deadline of this clock ends at once.
  mutable absl::Time now_ ABSL_GUARDED_BY(mu_) = absl::FromUnixSeconds(1000000000);
};

// The manager's store, kept by the run so that a second manager recovers from it.
class SharedStore final : public JobStore {
 public:
  explicit SharedStore(FakeJobStore& store) : store_(store) {}
  absl::Status Apply(const StoreMutation& m) override { return store_.Apply(m); }
  absl::StatusOr<StoreContents> LoadAll() override { return store_.LoadAll(); }
  absl::StatusOr<StoreContents> LoadActive() override { return store_.LoadActive(); }
  absl::StatusOr<StoredJobRecord> LoadJob(absl::string_view id) override {
    return store_.LoadJob(id);
  }
  absl::StatusOr<std::vector<StoredJob>> ListFinishedJobs(
      const std::vector<trainyard::v1::JobState>& states, int64_t before_seq, int limit,
      absl::string_view owner) override {
    return store_.ListFinishedJobs(states, before_seq, limit, owner);
  }
  absl::StatusOr<std::vector<std::pair<std::string, trainyard::v1::JobState>>> FinishedBefore(
      int64_t unix_ms, int limit) override {
    return store_.FinishedBefore(unix_ms, limit);
  }
  absl::StatusOr<std::vector<StoredToken>> LoadTokens() override { return store_.LoadTokens(); }
  absl::StatusOr<std::vector<StoredSearch>> LoadSearches() override {
    return store_.LoadSearches();
  }
  absl::StatusOr<std::vector<trainyard::v1::Queue>> LoadQueues() override {
    return store_.LoadQueues();
  }
  absl::StatusOr<std::vector<trainyard::v1::MetricPoint>> LoadMetricHistory(
      absl::string_view job_id, int64_t after_unix_ms) override {
    return store_.LoadMetricHistory(job_id, after_unix_ms);
  }
  absl::StatusOr<std::map<std::string, std::vector<std::pair<int64_t, int64_t>>>> LoadMetricKeys(
      const std::vector<std::string>& job_ids) override {
    return store_.LoadMetricKeys(job_ids);
  }

 private:
  FakeJobStore& store_;
};

}  // namespace trainyard

#endif  // TRAINYARD_TESTS_FUZZ_COORDINATOR_WORLD_H_
