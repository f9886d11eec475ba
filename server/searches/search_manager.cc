#include "server/searches/search_manager.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/spec/job_spec.h"
#include "server/jobs/job_manager.h"
#include "server/searches/search_spec.h"
#include "server/store/log_store.h"

namespace trainyard {
namespace {

using trainyard::v1::Job;
using trainyard::v1::JobSpec;
using trainyard::v1::Search;
using trainyard::v1::SearchState;
using trainyard::v1::Trial;

class JobManagerTrials final : public TrialJobs {
 public:
  explicit JobManagerTrials(JobManager& jobs) : jobs_(jobs) {}

  absl::Status Submit(JobSpec spec, const std::string& id, const v1::TrialLink& trial,
                      const std::string& owner, bool validate_only) override {
    SubmitOptions options;
    options.id = id;
    options.trial = trial;
    options.validate_only = validate_only;
    Principal principal;
    principal.role = Role::kUser;
    principal.name = owner;
    return jobs_.SubmitJob(std::move(spec), owner.empty() ? nullptr : &principal, options).status();
  }
  absl::StatusOr<Job> Get(absl::string_view id) override { return jobs_.GetJob(id); }
  absl::Status Cancel(absl::string_view id, absl::string_view reason) override {
    return jobs_.CancelJob(id, reason, "its search").status();
  }

 private:
  JobManager& jobs_;
};

std::string TrialJobId(absl::string_view search_id, int number, int rung) {
  return absl::StrCat(search_id, ".t", number, ".r", rung);
}

bool IsFinal(SearchState state) {
  return state == v1::SEARCH_SUCCEEDED || state == v1::SEARCH_FAILED ||
         state == v1::SEARCH_CANCELLED;
}

// A better trial went further (more rungs finished), then has the better metric.
bool Better(const Trial& a, const Trial& b, bool smaller_is_better) {
  if (a.rung_metrics_size() != b.rung_metrics_size()) {
    return a.rung_metrics_size() > b.rung_metrics_size();
  }
  return smaller_is_better ? a.metric() < b.metric() : a.metric() > b.metric();
}

}  // namespace

std::unique_ptr<TrialJobs> TrialJobsOf(JobManager& jobs) {
  return std::make_unique<JobManagerTrials>(jobs);
}

absl::StatusOr<std::unique_ptr<SearchManager>> SearchManager::Create(
    const Clock& clock, TrialJobs& jobs, std::unique_ptr<JobStore> store,
    SearchManagerOptions options) {
  absl::StatusOr<std::vector<StoredSearch>> stored = store->LoadSearches();
  if (!stored.ok()) return stored.status();
  std::unique_ptr<SearchManager> manager(new SearchManager(clock, jobs, std::move(store), options));
  absl::MutexLock lock(&manager->mu_);
  for (StoredSearch& s : *stored) {
    manager->next_seq_ = std::max(manager->next_seq_, s.seq + 1);
    Entry& entry = manager->searches_[s.search.id()];
    entry.seq = s.seq;
    entry.search = std::move(s.search);
  }
  return manager;
}

absl::StatusOr<Search> SearchManager::Submit(absl::string_view spec_yaml, const Principal* by) {
  if (static_cast<int64_t>(spec_yaml.size()) > options_.max_spec_yaml_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("spec_yaml: ", spec_yaml.size(),
                                                   " bytes is over the limit of ",
                                                   options_.max_spec_yaml_bytes));
  }
  absl::StatusOr<v1::SearchSpec> spec = ParseSearchYaml(spec_yaml);
  if (!spec.ok()) return spec.status();
  if (!IsValidName(spec->name())) {
    return absl::InvalidArgumentError(
        absl::StrCat("name: '", spec->name(), "' must match ", kNameRule));
  }
  const std::string owner = by != nullptr ? by->name : "";
  // The first trial's job as the job manager would take it: allowed paths, names.
  Search probe;
  *probe.mutable_spec() = *spec;
  Trial first;
  for (const auto& [path, value] : ValuesOfTrial(*spec, 0)) {
    (*first.mutable_hyperparameters())[path] = value;
  }
  absl::StatusOr<JobSpec> job = RungJobSpec(probe, first);
  if (!job.ok()) return job.status();
  if (absl::Status s = jobs_.Submit(*job, "", {}, owner, /*validate_only=*/true); !s.ok()) {
    if (absl::IsInvalidArgument(s)) {
      return absl::InvalidArgumentError(absl::StrCat("template.", s.message()));
    }
    return s;
  }

  absl::MutexLock lock(&mu_);
  int active = 0;
  for (const auto& [id, entry] : searches_) active += entry.search.state() == v1::SEARCH_RUNNING;
  if (active >= options_.max_active_searches) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "too many running searches: ", active, " (limit ", options_.max_active_searches, ")"));
  }
  Entry entry;
  entry.seq = next_seq_++;
  Search& search = entry.search;
  search.set_id(absl::StrCat(spec->name(), "-s", entry.seq));
  search.set_name(spec->name());
  *search.mutable_spec() = *std::move(spec);
  search.set_state(v1::SEARCH_RUNNING);
  search.set_reason(by != nullptr ? absl::StrCat("submitted by ", by->name) : "submitted");
  search.set_owner(owner);
  const int64_t now_ms = absl::ToUnixMillis(clock_.Now());
  search.set_created_unix_ms(now_ms);
  search.set_updated_unix_ms(now_ms);
  Summarize(search);
  if (absl::Status s = WriteLocked(entry, {}); !s.ok()) return s;
  LogInfo("search ", search.id(), " submitted: ", search.spec().searcher().name(), ", ",
          search.spec().searcher().max_trials(), " trials");
  Search out = search;
  searches_[search.id()] = std::move(entry);
  return out;
}

absl::StatusOr<Search> SearchManager::Get(absl::string_view id) const {
  absl::MutexLock lock(&mu_);
  const Entry* entry = FindLocked(id);
  if (entry == nullptr) return absl::NotFoundError(absl::StrCat("search '", id, "' not found"));
  return entry->search;
}

std::vector<Search> SearchManager::List(absl::string_view owner) const {
  absl::MutexLock lock(&mu_);
  std::vector<std::pair<int64_t, const Search*>> found;
  for (const auto& [id, entry] : searches_) {
    if (owner.empty() || entry.search.owner() == owner)
      found.emplace_back(entry.seq, &entry.search);
  }
  std::sort(found.begin(), found.end(),
            [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<Search> out;
  for (const auto& [seq, search] : found) {
    out.push_back(*search);
    out.back().clear_trials();
  }
  return out;
}

absl::StatusOr<std::string> SearchManager::Owner(absl::string_view id) const {
  absl::MutexLock lock(&mu_);
  const Entry* entry = FindLocked(id);
  if (entry == nullptr) return absl::NotFoundError(absl::StrCat("search '", id, "' not found"));
  return entry->search.owner();
}

absl::StatusOr<Search> SearchManager::Cancel(absl::string_view id, absl::string_view reason,
                                             absl::string_view by) {
  absl::MutexLock lock(&mu_);
  Entry* entry = FindLocked(id);
  if (entry == nullptr) return absl::NotFoundError(absl::StrCat("search '", id, "' not found"));
  if (IsFinal(entry->search.state())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "search ", id, " has ended (", v1::SearchState_Name(entry->search.state()), ")"));
  }
  const Search before = entry->search;
  std::string why = reason.empty() ? "cancelled" : absl::StrCat("cancelled: ", reason);
  if (!by.empty()) absl::StrAppend(&why, " (by ", by, ")");
  EndSearchLocked(*entry, v1::SEARCH_CANCELLED, why);
  std::vector<int> all;
  for (int i = 0; i < entry->search.trials_size(); ++i) all.push_back(i);
  if (absl::Status s = WriteLocked(*entry, all); !s.ok()) {
    entry->search = before;
    return s;
  }
  // Recorded first: a restart now still cancels the jobs (Tick).
  if (CancelPendingJobsLocked(*entry)) WriteLocked(*entry, all).IgnoreError();
  return entry->search;
}

absl::StatusOr<Search> SearchManager::Extend(absl::string_view id, int max_trials) {
  absl::MutexLock lock(&mu_);
  Entry* entry = FindLocked(id);
  if (entry == nullptr) return absl::NotFoundError(absl::StrCat("search '", id, "' not found"));
  Search& search = entry->search;
  if (search.state() == v1::SEARCH_FAILED || search.state() == v1::SEARCH_CANCELLED) {
    return absl::FailedPreconditionError(
        absl::StrCat("search ", id, " has ended (", v1::SearchState_Name(search.state()), ")"));
  }
  const int now = search.spec().searcher().max_trials();
  if (max_trials <= now) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_trials: ", max_trials, " is not more than the search's ", now));
  }
  if (max_trials > kMaxSearchTrials) {
    return absl::InvalidArgumentError(absl::StrCat("max_trials: at most ", kMaxSearchTrials));
  }
  if (search.spec().searcher().name() == "grid" && max_trials > GridSize(search.spec())) {
    return absl::InvalidArgumentError(absl::StrCat("max_trials: ", max_trials,
                                                   " is more than the grid's ",
                                                   GridSize(search.spec()), " points"));
  }
  const Search before = search;
  search.mutable_spec()->mutable_searcher()->set_max_trials(max_trials);
  search.set_state(v1::SEARCH_RUNNING);
  search.set_finished_unix_ms(0);
  search.set_reason(absl::StrCat("extended to ", max_trials, " trials"));
  search.set_updated_unix_ms(absl::ToUnixMillis(clock_.Now()));
  if (absl::Status s = WriteLocked(*entry, {}); !s.ok()) {
    search = before;
    return s;
  }
  LogInfo("search ", id, ": ", search.reason());
  return search;
}

void SearchManager::Tick() {
  absl::MutexLock lock(&mu_);
  for (auto& [id, entry] : searches_) TickSearchLocked(entry);
}

void SearchManager::TickSearchLocked(Entry& entry) {
  Search& search = entry.search;
  const bool pending_cancel = std::any_of(search.trials().begin(), search.trials().end(),
                                          [](const Trial& t) { return t.job_pending_cancel(); });
  if (IsFinal(search.state()) && !pending_cancel) return;
  const Search before = search;
  std::vector<int> changed;
  const v1::SearcherSpec& searcher = search.spec().searcher();

  // What the trials' jobs did.
  for (int i = 0; i < search.trials_size(); ++i) {
    Trial& trial = *search.mutable_trials(i);
    if (trial.state() != v1::TRIAL_RUNNING || !trial.job_submitted()) continue;
    if (FollowTrialLocked(entry, trial)) changed.push_back(i);
  }
  Summarize(search);
  // What the search does about it.
  if (search.state() == v1::SEARCH_RUNNING) {
    if (search.trials_failed() > searcher.max_failed_trials()) {
      EndSearchLocked(entry, v1::SEARCH_FAILED,
                      absl::StrCat(search.trials_failed(), " trials failed (max_failed_trials: ",
                                   searcher.max_failed_trials(), ")"));
      changed.clear();
      for (int i = 0; i < search.trials_size(); ++i) changed.push_back(i);
    }
  }
  if (search.state() == v1::SEARCH_RUNNING) {
    const int64_t now_ms = absl::ToUnixMillis(clock_.Now());
    while (search.trials_running() < searcher.max_concurrent_trials() &&
           search.trials_size() < searcher.max_trials()) {
      Trial& trial = *search.add_trials();
      trial.set_number(search.trials_size() - 1);
      for (const auto& [path, value] : ValuesOfTrial(search.spec(), trial.number())) {
        (*trial.mutable_hyperparameters())[path] = value;
      }
      trial.set_state(v1::TRIAL_RUNNING);
      trial.set_job_id(TrialJobId(search.id(), trial.number(), 0));
      trial.add_job_ids(trial.job_id());
      trial.set_created_unix_ms(now_ms);
      trial.set_updated_unix_ms(now_ms);
      changed.push_back(trial.number());
      Summarize(search);
    }
    if (search.trials_size() >= searcher.max_trials() && search.trials_running() == 0) {
      search.set_state(v1::SEARCH_SUCCEEDED);
      search.set_reason(absl::StrCat("all ", search.trials_size(), " trials ended"));
      search.set_finished_unix_ms(now_ms);
      LogInfo("search ", search.id(), ": ", search.reason());
    }
  }
  Summarize(search);
  const bool search_changed = search.state() != before.state() ||
                              search.trials_size() != before.trials_size() ||
                              search.best_trial() != before.best_trial();
  if (!changed.empty() || search_changed) {
    if (absl::Status s = WriteLocked(entry, changed); !s.ok()) {
      LogWarning("search ", search.id(), ": not recorded, trying again: ", s.ToString());
      search = before;
      return;
    }
  }

  // Recorded: now the jobs. A restart before these are marked done does them again.
  std::vector<int> acted;
  for (int i = 0; i < search.trials_size(); ++i) {
    Trial& trial = *search.mutable_trials(i);
    if (trial.state() == v1::TRIAL_RUNNING && !trial.job_submitted() &&
        SubmitTrialJobLocked(entry, trial)) {
      acted.push_back(i);
    }
  }
  if (CancelPendingJobsLocked(entry)) {
    acted.clear();
    for (int i = 0; i < search.trials_size(); ++i) acted.push_back(i);
  }
  if (!acted.empty()) {
    Summarize(search);
    // Failing this write is harmless: the submissions are found again (ALREADY_EXISTS).
    if (absl::Status s = WriteLocked(entry, acted); !s.ok()) {
      LogWarning("search ", search.id(), ": ", s.ToString());
    }
  }
}

bool SearchManager::FollowTrialLocked(Entry& entry, Trial& trial) {
  Search& search = entry.search;
  const v1::SearcherSpec& searcher = search.spec().searcher();
  absl::StatusOr<Job> job = jobs_.Get(trial.job_id());
  const int64_t now_ms = absl::ToUnixMillis(clock_.Now());
  if (absl::IsNotFound(job.status())) {
    trial.set_state(v1::TRIAL_FAILED);
    trial.set_message(absl::StrCat("its job ", trial.job_id(), " is gone"));
    trial.set_updated_unix_ms(now_ms);
    return true;
  }
  if (!job.ok()) return false;
  trial.set_step(job->progress().step());
  if (job->state() != v1::SUCCEEDED && job->state() != v1::FAILED &&
      job->state() != v1::CANCELLED) {
    return false;
  }
  trial.set_updated_unix_ms(now_ms);
  if (!job->model_uri().empty()) trial.set_model_uri(job->model_uri());
  if (job->state() == v1::FAILED || job->state() == v1::CANCELLED) {
    trial.set_state(job->state() == v1::FAILED ? v1::TRIAL_FAILED : v1::TRIAL_CANCELLED);
    trial.set_message(absl::StrCat("job ", job->id(), ": ", job->reason()));
    LogInfo("search ", search.id(), ": trial ", trial.number(), " ",
            v1::TrialState_Name(trial.state()), ": ", trial.message());
    return true;
  }
  const std::optional<double> metric = TrialMetric(job->progress(), searcher.metric());
  if (!metric.has_value()) {
    trial.set_state(v1::TRIAL_FAILED);
    trial.set_message(absl::StrCat("job ", job->id(), " reported no ", searcher.metric()));
    return true;
  }
  const double value = *metric;
  trial.add_rung_metrics(value);
  trial.set_has_metric(true);
  trial.set_metric(value);
  const int rung = trial.rung();
  if (searcher.name() != "asha" || rung + 1 >= searcher.max_rungs()) {
    trial.set_state(v1::TRIAL_COMPLETED);
    trial.set_message(absl::StrCat("completed at step ", trial.step()));
    LogInfo("search ", search.id(), ": trial ", trial.number(), " completed, ", searcher.metric(),
            " ", value);
    return true;
  }
  // Every trial that reached this rung so far, this one included, in the order they did.
  std::vector<double> reached;
  for (const Trial& t : search.trials()) {
    if (t.rung_metrics_size() > rung) reached.push_back(t.rung_metrics(rung));
  }
  if (PromotedAtRung(value, reached, searcher.divisor(), searcher.smaller_is_better())) {
    trial.set_rung(rung + 1);
    trial.set_job_id(TrialJobId(search.id(), trial.number(), rung + 1));
    trial.add_job_ids(trial.job_id());
    trial.set_job_submitted(false);
    trial.set_message(absl::StrCat("promoted to rung ", rung + 1, " at step ", trial.step()));
  } else {
    trial.set_state(v1::TRIAL_STOPPED);
    trial.set_message(absl::StrCat("stopped at the end of rung ", rung, " (step ", trial.step(),
                                   "): not in the best 1/", searcher.divisor(), " of ",
                                   reached.size()));
  }
  LogInfo("search ", search.id(), ": trial ", trial.number(), ": ", trial.message(), ", ",
          searcher.metric(), " ", value);
  return true;
}

bool SearchManager::SubmitTrialJobLocked(const Entry& entry, Trial& trial) {
  const Search& search = entry.search;
  absl::StatusOr<JobSpec> spec = RungJobSpec(search, trial);
  absl::Status submitted = spec.status();
  if (spec.ok()) {
    v1::TrialLink link;
    link.set_search_id(search.id());
    link.set_trial(trial.number());
    link.set_rung(trial.rung());
    submitted = jobs_.Submit(*std::move(spec), trial.job_id(), link, search.owner(),
                             /*validate_only=*/false);
  }
  if (submitted.ok() || absl::IsAlreadyExists(submitted)) {
    trial.set_job_submitted(true);
    return true;
  }
  if (absl::IsResourceExhausted(submitted) || absl::IsUnavailable(submitted) ||
      absl::IsDeadlineExceeded(submitted) || absl::IsAborted(submitted)) {
    return false;  // the queue is full or the store busy: again next tick
  }
  trial.set_state(v1::TRIAL_FAILED);
  trial.set_message(absl::StrCat("job ", trial.job_id(), " not submitted: ", submitted.message()));
  trial.set_updated_unix_ms(absl::ToUnixMillis(clock_.Now()));
  LogWarning("search ", search.id(), ": trial ", trial.number(), ": ", trial.message());
  return true;
}

absl::StatusOr<JobSpec> SearchManager::RungJobSpec(const Search& search, const Trial& trial) const {
  TrialValues values(trial.hyperparameters().begin(), trial.hyperparameters().end());
  absl::StatusOr<JobSpec> spec = TrialJobSpec(search.spec(), values);
  if (!spec.ok()) return spec.status();
  const v1::SearcherSpec& searcher = search.spec().searcher();
  if (searcher.name() == "asha") {
    const std::vector<int64_t> ends = RungEndSteps(searcher);
    const int rung = trial.rung();
    if (rung + 1 < static_cast<int>(ends.size())) spec->set_stop_at_step(ends[rung]);
    if (rung > 0) spec->mutable_checkpoint()->set_resume_from(trial.job_ids(rung - 1));
  }
  return spec;
}

void SearchManager::EndSearchLocked(Entry& entry, SearchState state, absl::string_view reason) {
  Search& search = entry.search;
  const int64_t now_ms = absl::ToUnixMillis(clock_.Now());
  search.set_state(state);
  search.set_reason(std::string(reason));
  search.set_finished_unix_ms(now_ms);
  search.set_updated_unix_ms(now_ms);
  for (Trial& trial : *search.mutable_trials()) {
    if (trial.state() != v1::TRIAL_RUNNING) continue;
    trial.set_state(v1::TRIAL_CANCELLED);
    trial.set_message(absl::StrCat("its search ended: ", reason));
    trial.set_job_pending_cancel(true);
    trial.set_updated_unix_ms(now_ms);
  }
  Summarize(search);
  LogInfo("search ", search.id(), " ", v1::SearchState_Name(state), ": ", reason);
}

bool SearchManager::CancelPendingJobsLocked(Entry& entry) {
  bool changed = false;
  for (Trial& trial : *entry.search.mutable_trials()) {
    if (!trial.job_pending_cancel()) continue;
    absl::Status s = jobs_.Cancel(trial.job_id(), trial.message());
    if (s.ok() || absl::IsFailedPrecondition(s) || absl::IsNotFound(s)) {
      trial.set_job_pending_cancel(false);
      changed = true;
    }
  }
  return changed;
}

void SearchManager::Summarize(Search& search) {
  const bool smaller = search.spec().searcher().smaller_is_better();
  int running = 0, failed = 0;
  const Trial* best = nullptr;
  for (const Trial& t : search.trials()) {
    running += t.state() == v1::TRIAL_RUNNING;
    failed += t.state() == v1::TRIAL_FAILED;
    if (t.has_metric() && (best == nullptr || Better(t, *best, smaller))) best = &t;
  }
  search.set_trials_created(search.trials_size());
  search.set_trials_running(running);
  search.set_trials_failed(failed);
  search.set_best_trial(best != nullptr ? best->number() : -1);
  search.set_best_metric(best != nullptr ? best->metric() : 0);
  search.set_best_model_uri(best != nullptr ? best->model_uri() : "");
}

absl::Status SearchManager::WriteLocked(const Entry& entry, const std::vector<int>& trials) {
  StoreMutation m;
  m.searches.push_back({entry.seq, entry.search});
  m.searches.back().search.set_updated_unix_ms(absl::ToUnixMillis(clock_.Now()));
  for (int i : trials) m.trials.emplace_back(entry.search.id(), entry.search.trials(i));
  return store_->Apply(m);
}

SearchManager::Entry* SearchManager::FindLocked(absl::string_view id) {
  auto it = searches_.find(id);
  return it == searches_.end() ? nullptr : &it->second;
}

const SearchManager::Entry* SearchManager::FindLocked(absl::string_view id) const {
  auto it = searches_.find(id);
  return it == searches_.end() ? nullptr : &it->second;
}

std::vector<SearchMetrics> SearchManager::MetricsSnapshot() const {
  absl::MutexLock lock(&mu_);
  std::vector<SearchMetrics> out;
  for (const auto& [id, entry] : searches_) {
    SearchMetrics m;
    m.id = id;
    m.metric = entry.search.spec().searcher().metric();
    m.state = entry.search.state();
    for (const Trial& t : entry.search.trials()) m.trials[t.state()]++;
    m.has_best = entry.search.best_trial() >= 0;
    m.best_metric = entry.search.best_metric();
    out.push_back(std::move(m));
  }
  return out;
}

}  // namespace trainyard
