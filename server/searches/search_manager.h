#ifndef TRAINYARD_SERVER_SEARCHES_SEARCH_MANAGER_H_
#define TRAINYARD_SERVER_SEARCHES_SEARCH_MANAGER_H_

// Room searches/: hyperparameter searches (grid, random, ASHA) as jobs of the job manager. It
// may call jobs/, auth/ and store/.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "server/auth/auth.h"
#include "server/jobs/metrics_sink.h"
#include "server/store/job_store.h"
#include "trainyard/v1/job.pb.h"
#include "trainyard/v1/search_service.pb.h"

namespace trainyard {

// What a search needs of the coordinator's jobs: JobManager in the coordinator (TrialJobsOf), a
// fake in unit tests. Implementations are thread-safe.
class TrialJobs {
 public:
  virtual ~TrialJobs() = default;
  // Queues `spec` as job `id`, linked to its trial, owned by `owner` (empty: nobody).
  // ALREADY_EXISTS when a job has that id; the job manager's errors otherwise (INVALID_ARGUMENT
  // for a bad spec, RESOURCE_EXHAUSTED when too many jobs are active). With validate_only, only
  // checks.
  virtual absl::Status Submit(trainyard::v1::JobSpec spec, const std::string& id,
                              const trainyard::v1::TrialLink& trial, const std::string& owner,
                              bool validate_only) = 0;
  // NOT_FOUND for an unknown job.
  virtual absl::StatusOr<trainyard::v1::Job> Get(absl::string_view id) = 0;
  // FAILED_PRECONDITION for a final job, NOT_FOUND for an unknown one.
  virtual absl::Status Cancel(absl::string_view id, absl::string_view reason) = 0;
};

class JobManager;
// TrialJobs over the coordinator's JobManager (which must outlive it).
std::unique_ptr<TrialJobs> TrialJobsOf(JobManager& jobs);

struct SearchManagerOptions {
  int max_active_searches = 1000;         // RUNNING searches; beyond: RESOURCE_EXHAUSTED
  int64_t max_spec_yaml_bytes = 1 << 20;  // beyond: INVALID_ARGUMENT
};

// Hyperparameter searches (random, grid, ASHA) whose trials are ordinary jobs.
//
// A trial runs as job "{search id}.t{number}.r{rung}"; an ASHA trial runs one job per rung, each
// (stop_at_step: the rung's end) resuming from the one before, so no step is redone. A search's
// state is written to the store before it acts on it: a trial is recorded, then its job
// submitted under its fixed id, then marked as submitted. A coordinator that restarts between
// any two of these finds the job or submits it, never twice (ALREADY_EXISTS). The decision at
// the end of a rung is recorded in the same write as the rung's metric and the next rung's job.
//
// Thread-safe: one mutex guards the searches; it is held while calling TrialJobs, never the other
// way round. Tick() does the work: call it after each JobManager::Tick.
class SearchManager {
 public:
  // Loads every search from `store`. `clock` and `jobs` must outlive the manager.
  static absl::StatusOr<std::unique_ptr<SearchManager>> Create(const Clock& clock, TrialJobs& jobs,
                                                               std::unique_ptr<JobStore> store,
                                                               SearchManagerOptions options = {});

  // Parses and checks the spec (ParseSearchYaml; its first trial's job as JobManager would) and
  // records the search, RUNNING; Tick starts its trials. INVALID_ARGUMENT naming the field,
  // RESOURCE_EXHAUSTED past max_active_searches, the store's error when the write fails.
  absl::StatusOr<trainyard::v1::Search> Submit(absl::string_view spec_yaml,
                                               const Principal* by = nullptr);
  // With its trials. NOT_FOUND for an unknown id.
  absl::StatusOr<trainyard::v1::Search> Get(absl::string_view id) const;
  // Newest first, without trials; of `owner` only unless empty.
  std::vector<trainyard::v1::Search> List(absl::string_view owner = "") const;
  absl::StatusOr<std::string> Owner(absl::string_view id) const;
  // CANCELLED, with its running trials and their jobs. FAILED_PRECONDITION for a search already
  // ended, NOT_FOUND for an unknown one.
  absl::StatusOr<trainyard::v1::Search> Cancel(absl::string_view id, absl::string_view reason,
                                               absl::string_view by = "");
  // Raises max_trials to `max_trials`; a search that had SUCCEEDED runs again. INVALID_ARGUMENT
  // unless it is more than now (and, for grid, at most the grid's size); FAILED_PRECONDITION for a
  // FAILED or CANCELLED search.
  absl::StatusOr<trainyard::v1::Search> Extend(absl::string_view id, int max_trials);

  // Follows every running trial's job, takes the searcher's decisions, starts trials, ends
  // searches, and finishes what a restart left half done. Level-triggered: what a failed write
  // left undone is done next time. Blocks on store writes and on JobManager calls.
  void Tick();

  std::vector<SearchMetrics> MetricsSnapshot() const;

 private:
  struct Entry {
    int64_t seq = 0;
    trainyard::v1::Search search;  // with trials
  };

  SearchManager(const Clock& clock, TrialJobs& jobs, std::unique_ptr<JobStore> store,
                SearchManagerOptions options)
      : clock_(clock), jobs_(jobs), store_(std::move(store)), options_(options) {}

  // One search's round of Tick; writes what changed in one transaction.
  void TickSearchLocked(Entry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Looks at a RUNNING trial's job and records what it means: progress, the end of a rung, a
  // failure. Returns whether the trial changed in a way to write now.
  bool FollowTrialLocked(Entry& entry, trainyard::v1::Trial& trial)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Submits the job of a trial recorded but not yet seen submitted; true when that changed it.
  bool SubmitTrialJobLocked(const Entry& entry, trainyard::v1::Trial& trial)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job spec of a trial's current rung.
  absl::StatusOr<trainyard::v1::JobSpec> RungJobSpec(const trainyard::v1::Search& search,
                                                     const trainyard::v1::Trial& trial) const;
  // Ends a search (FAILED or CANCELLED): running trials are cancelled with their jobs.
  void EndSearchLocked(Entry& entry, trainyard::v1::SearchState state, absl::string_view reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Cancels the jobs of trials marked job_pending_cancel; true when any trial changed.
  bool CancelPendingJobsLocked(Entry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts and best trial from the trials.
  static void Summarize(trainyard::v1::Search& search);
  absl::Status WriteLocked(const Entry& entry, const std::vector<int>& trials)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Entry* FindLocked(absl::string_view id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const Entry* FindLocked(absl::string_view id) const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  // Fixed at construction.
  const Clock& clock_;
  TrialJobs& jobs_;
  const std::unique_ptr<JobStore> store_;
  const SearchManagerOptions options_;

  mutable absl::Mutex mu_;
  std::map<std::string, Entry, std::less<>> searches_ ABSL_GUARDED_BY(mu_);
  int64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace trainyard

#endif  // TRAINYARD_SERVER_SEARCHES_SEARCH_MANAGER_H_
