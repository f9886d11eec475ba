#include "server/leadership/standby_copy.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "common/log.h"
#include "server/lifecycle/job_state.h"

namespace trainyard {

StandbyCopy::StandbyCopy(std::unique_ptr<PostgresJobStore> store, absl::Duration interval,
                         const Clock& clock)
    : store_(std::move(store)), interval_(interval), clock_(clock), thread_([this] { Loop(); }) {}

StandbyCopy::~StandbyCopy() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    cv_.Signal();
  }
  if (thread_.joinable()) thread_.join();
}

void StandbyCopy::Loop() {
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    const int64_t full_reads = stats_.full_reads;
    const absl::Time started = RealClock::Get().Now();
    if (absl::Status s = RefreshLocked(/*count_finished=*/false); !s.ok()) {
      if (s.message() != last_error_) {
        last_error_ = std::string(s.message());
        LogWarning("standby: cannot keep the warm copy of the state: ", s.message(),
                   "; trying again");
      }
    } else {
      if (stats_.full_reads != full_reads) {
        LogInfo("standby: read the whole state for its warm copy (", jobs_.size(), " jobs) in ",
                absl::ToDoubleSeconds(RealClock::Get().Now() - started),
                " s; following the changes");
      }
      if (!last_error_.empty()) {
        last_error_.clear();
        LogInfo("standby: the warm copy of the state is up to date again (", jobs_.size(),
                " jobs)");
      }
    }
    cv_.WaitWithTimeout(&mu_, interval_);
  }
}

absl::Status StandbyCopy::Refresh() {
  absl::MutexLock lock(&mu_);
  return RefreshLocked(/*count_finished=*/false);
}

absl::Status StandbyCopy::RefreshLocked(bool count_finished) {
  // A copy whose last read is older than the feed keeps rows for reads everything again.
  const absl::Time now = clock_.Now();
  if (now - last_read_ > kChangeRetention / 2) snapshot_.clear();
  // The read runs under the lock: Take waits for one in flight, and nothing else waits on it.
  absl::StatusOr<StoreChanges> changes = store_->ReadChanges(snapshot_, count_finished);
  if (!changes.ok()) {
    // The feed keeps what changed meanwhile: after a lost connection the next read goes on from
    // the last one. Anything else (rows that do not parse) reads everything again.
    if (!absl::IsUnavailable(changes.status())) snapshot_.clear();
    return changes.status();
  }
  if (changes->everything) {
    jobs_.clear();
    checkpoints_.clear();
    workers_.clear();
    stats_.full_reads++;
  } else {
    stats_.change_reads++;
    stats_.jobs_reread += static_cast<int64_t>(changes->jobs.size());
  }
  // The changed jobs and workers go; those still to be loaded come back as they are now.
  for (const std::string& id : changes->jobs) {
    jobs_.erase(id);
    checkpoints_.erase(id);
  }
  for (const std::string& id : changes->workers) workers_.erase(id);
  for (StoredJob& j : changes->contents.jobs) {
    const std::string id = j.job.id();
    jobs_[id] = std::move(j);
  }
  for (StoredCheckpoint& c : changes->contents.checkpoints) {
    checkpoints_[c.checkpoint.job_id()].push_back(std::move(c));
  }
  for (v1::Worker& w : changes->contents.workers) {
    const std::string id = w.id();
    workers_[id] = std::move(w);
  }
  next_job_seq_ = changes->contents.next_job_seq;
  if (changes->everything || count_finished) finished_ = std::move(changes->finished);
  if (changes->queues.has_value()) queues_ = *std::move(changes->queues);
  if (changes->tokens.has_value()) tokens_ = *std::move(changes->tokens);
  if (changes->searches.has_value()) searches_ = *std::move(changes->searches);
  snapshot_ = std::move(changes->snapshot);
  last_read_ = now;
  return absl::OkStatus();
}

absl::StatusOr<WarmStart> StandbyCopy::Take() {
  {
    absl::MutexLock lock(&mu_);
    if (taken_) return absl::FailedPreconditionError("the warm copy was taken already");
    taken_ = true;
    stop_ = true;
    cv_.Signal();
  }
  if (thread_.joinable()) thread_.join();
  absl::MutexLock lock(&mu_);
  // The final counts of finished jobs come with this read: the copy does not follow them.
  if (absl::Status s = RefreshLocked(/*count_finished=*/true); !s.ok()) return s;
  WarmStart out;
  StoreContents& contents = out.contents.emplace();
  contents.next_job_seq = next_job_seq_;
  contents.not_loaded = finished_;
  contents.jobs.reserve(jobs_.size());
  for (auto& [id, j] : jobs_) {
    if (IsFinalJobState(j.job.state())) contents.not_loaded[j.job.state()]--;
    contents.jobs.push_back(std::move(j));
  }
  std::sort(contents.jobs.begin(), contents.jobs.end(),
            [](const StoredJob& a, const StoredJob& b) { return a.seq < b.seq; });
  for (auto& [id, list] : checkpoints_) {
    for (StoredCheckpoint& c : list) contents.checkpoints.push_back(std::move(c));
  }
  for (auto& [id, w] : workers_) contents.workers.push_back(std::move(w));
  out.queues = std::move(queues_);
  out.tokens = std::move(tokens_);
  out.searches = std::move(searches_);
  jobs_.clear();
  checkpoints_.clear();
  workers_.clear();
  return out;
}

StandbyCopy::Stats StandbyCopy::stats() const {
  absl::MutexLock lock(&mu_);
  Stats out = stats_;
  out.jobs = jobs_.size();
  return out;
}

}  // namespace trainyard
