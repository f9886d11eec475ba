#ifndef TRAINYARD_TESTS_SERVER_FAKE_JOB_STORE_H_
#define TRAINYARD_TESTS_SERVER_FAKE_JOB_STORE_H_

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "server/store/job_store.h"

namespace trainyard {

// A JobStore in memory for unit tests: keeps what was written (jobs, events, tasks, workers,
// checkpoints, progress), counts transactions, fails the writes a test chooses and can hold a
// write until the test lets it go. Thread-safe.
class FakeJobStore : public JobStore {
 public:
  // Writes for which `fail` returns true fail with UNAVAILABLE and change nothing.
  void FailWhen(std::function<bool(const StoreMutation&)> fail) {
    absl::MutexLock lock(&mu_);
    fail_ = std::move(fail);
  }
  // The next Apply notifies `entered` and then waits for `release` before it writes.
  void HoldNextWrite(absl::Notification* entered, absl::Notification* release) {
    absl::MutexLock lock(&mu_);
    entered_ = entered;
    release_ = release;
  }

  absl::Status Apply(const StoreMutation& m) override {
    absl::Notification* entered = nullptr;
    absl::Notification* release = nullptr;
    {
      absl::MutexLock lock(&mu_);
      std::swap(entered, entered_);
      std::swap(release, release_);
    }
    if (entered != nullptr) entered->Notify();
    if (release != nullptr) release->WaitForNotification();
    absl::MutexLock lock(&mu_);
    if (fail_ && fail_(m)) return absl::UnavailableError("fake store: write refused");
    transactions_.push_back(m);
    for (const StoredJob& j : m.jobs) jobs_[j.job.id()] = j;
    for (const auto& [id, e] : m.events) events_[id].push_back(e);
    for (const auto& [id, p] : m.progress) progress_[id] = p;
    for (const trainyard::v1::Worker& w : m.workers) workers_[w.id()] = w;
    for (const auto& [id, t] : m.tasks) tasks_[t.task_id()] = {id, t};
    for (const StoredCheckpoint& c : m.checkpoints) {
      checkpoints_[{c.checkpoint.job_id(), c.checkpoint.step()}] = c;
    }
    if (m.next_job_seq.has_value()) next_job_seq_ = *m.next_job_seq;
    for (const StoreMutation::EventTrim& trim : m.trimmed_events) {
      auto& events = events_[trim.job_id];
      const size_t from = std::min<size_t>(trim.keep_first, events.size());
      const size_t to = std::min<size_t>(from + trim.count, events.size());
      events.erase(events.begin() + from, events.begin() + to);
    }
    for (const StoredToken& t : m.tokens) tokens_[t.id] = t;
    for (const StoredSearch& search : m.searches) searches_[search.search.id()] = search;
    for (trainyard::v1::Queue queue : m.queues) {
      queue.clear_status();
      queues_[queue.name()] = std::move(queue);
    }
    for (const std::string& name : m.removed_queues) queues_.erase(name);
    for (const auto& [id, trial] : m.trials) trials_[id][trial.number()] = trial;
    for (const auto& key : m.removed_checkpoints) checkpoints_.erase(key);
    for (const auto& [id, point] : m.metric_points) metric_points_[id][point.unix_ms()] = point;
    for (const auto& [id, ms] : m.removed_metric_points) metric_points_[id].erase(ms);
    for (const std::string& id : m.removed_jobs) {
      jobs_.erase(id);
      metric_points_.erase(id);
      events_.erase(id);
      progress_.erase(id);
      for (auto it = tasks_.begin(); it != tasks_.end();) {
        it = it->second.first == id ? tasks_.erase(it) : std::next(it);
      }
      for (auto it = checkpoints_.begin(); it != checkpoints_.end();) {
        it = it->first.first == id ? checkpoints_.erase(it) : std::next(it);
      }
    }
    for (const std::string& id : m.removed_workers) workers_.erase(id);
    return absl::OkStatus();
  }

  absl::StatusOr<StoreContents> LoadAll() override {
    absl::MutexLock lock(&mu_);
    StoreContents out;
    std::map<int64_t, StoredJob> by_seq;
    for (const auto& [id, j] : jobs_) by_seq[j.seq] = j;
    for (auto& [seq, j] : by_seq) {
      j.job.clear_events();
      j.job.clear_tasks();
      for (const auto& e : events_[j.job.id()]) *j.job.add_events() = e;
      for (const auto& [task_id, t] : tasks_) {
        if (t.first == j.job.id()) *j.job.add_tasks() = t.second;
      }
      if (auto p = progress_.find(j.job.id()); p != progress_.end()) {
        *j.job.mutable_progress() = p->second;
      }
      out.jobs.push_back(j);
    }
    for (const auto& [id, w] : workers_) out.workers.push_back(w);
    for (const auto& [key, c] : checkpoints_) out.checkpoints.push_back(c);
    out.next_job_seq = next_job_seq_;
    return out;
  }

  absl::StatusOr<StoreContents> LoadActive() override {
    absl::StatusOr<StoreContents> all = LoadAll();
    if (!all.ok()) return all;
    StoreContents out;
    out.workers = std::move(all->workers);
    out.next_job_seq = all->next_job_seq;
    std::set<std::string> loaded;
    for (StoredJob& j : all->jobs) {
      bool live = !IsFinal(j.job.state());
      for (const trainyard::v1::TaskInfo& t : j.job.tasks()) {
        live = live || t.state() == trainyard::v1::TASK_STARTING ||
               t.state() == trainyard::v1::TASK_RUNNING;
      }
      if (live) {
        loaded.insert(j.job.id());
        out.jobs.push_back(std::move(j));
      } else {
        out.not_loaded[j.job.state()]++;
      }
    }
    for (StoredCheckpoint& c : all->checkpoints) {
      if (loaded.count(c.checkpoint.job_id())) out.checkpoints.push_back(std::move(c));
    }
    return out;
  }

  absl::StatusOr<StoredJobRecord> LoadJob(absl::string_view job_id) override {
    absl::StatusOr<StoreContents> all = LoadAll();
    if (!all.ok()) return all.status();
    absl::MutexLock lock(&mu_);
    ++job_loads_;
    StoredJobRecord record;
    for (StoredJob& j : all->jobs) {
      if (j.job.id() == job_id) record.job = std::move(j);
    }
    if (record.job.job.id().empty()) return absl::NotFoundError("fake store: no such job");
    for (StoredCheckpoint& c : all->checkpoints) {
      if (c.checkpoint.job_id() == job_id) record.checkpoints.push_back(std::move(c));
    }
    return record;
  }

  absl::StatusOr<std::vector<StoredJob>> ListFinishedJobs(
      const std::vector<trainyard::v1::JobState>& states, int64_t before_seq, int limit,
      absl::string_view owner) override {
    absl::StatusOr<StoreContents> all = LoadAll();
    if (!all.ok()) return all.status();
    std::vector<StoredJob> out;
    for (auto it = all->jobs.rbegin(); it != all->jobs.rend(); ++it) {
      if (static_cast<int>(out.size()) == limit) break;
      const trainyard::v1::JobState state = it->job.state();
      if (it->seq >= before_seq || !IsFinal(state)) continue;
      if (!owner.empty() && it->job.owner() != owner) continue;
      if (!states.empty() && std::find(states.begin(), states.end(), state) == states.end()) {
        continue;
      }
      it->job.clear_events();
      it->job.clear_tasks();
      out.push_back(std::move(*it));
    }
    return out;
  }

  absl::StatusOr<std::vector<std::pair<std::string, trainyard::v1::JobState>>> FinishedBefore(
      int64_t unix_ms, int limit) override {
    absl::MutexLock lock(&mu_);
    std::vector<std::tuple<int64_t, int64_t, std::string, trainyard::v1::JobState>> found;
    for (const auto& [id, j] : jobs_) {
      if (IsFinal(j.job.state()) && j.job.finished_unix_ms() <= unix_ms) {
        found.emplace_back(j.job.finished_unix_ms(), j.seq, id, j.job.state());
      }
    }
    std::sort(found.begin(), found.end());
    std::vector<std::pair<std::string, trainyard::v1::JobState>> out;
    for (const auto& [ms, seq, id, state] : found) {
      if (static_cast<int>(out.size()) == limit) break;
      out.emplace_back(id, state);
    }
    return out;
  }

  absl::StatusOr<std::vector<StoredToken>> LoadTokens() override {
    absl::MutexLock lock(&mu_);
    std::vector<StoredToken> out;
    for (const auto& [id, t] : tokens_) out.push_back(t);
    return out;
  }

  absl::StatusOr<std::vector<trainyard::v1::Queue>> LoadQueues() override {
    absl::MutexLock lock(&mu_);
    std::vector<trainyard::v1::Queue> out;
    for (const auto& [name, queue] : queues_) out.push_back(queue);
    return out;
  }

  absl::StatusOr<std::vector<StoredSearch>> LoadSearches() override {
    absl::MutexLock lock(&mu_);
    std::vector<StoredSearch> out;
    for (const auto& [id, stored] : searches_) {
      out.push_back(stored);
      out.back().search.clear_trials();
      if (auto it = trials_.find(id); it != trials_.end()) {
        for (const auto& [number, trial] : it->second) *out.back().search.add_trials() = trial;
      }
    }
    std::sort(out.begin(), out.end(),
              [](const StoredSearch& a, const StoredSearch& b) { return a.seq < b.seq; });
    return out;
  }

  absl::StatusOr<std::vector<trainyard::v1::MetricPoint>> LoadMetricHistory(
      absl::string_view job_id, int64_t after_unix_ms) override {
    absl::MutexLock lock(&mu_);
    std::vector<trainyard::v1::MetricPoint> out;
    auto it = metric_points_.find(std::string(job_id));
    if (it == metric_points_.end()) return out;
    for (auto p = it->second.upper_bound(after_unix_ms); p != it->second.end(); ++p) {
      out.push_back(p->second);
    }
    return out;
  }

  absl::StatusOr<std::map<std::string, std::vector<std::pair<int64_t, int64_t>>>> LoadMetricKeys(
      const std::vector<std::string>& job_ids) override {
    absl::MutexLock lock(&mu_);
    std::map<std::string, std::vector<std::pair<int64_t, int64_t>>> out;
    for (const std::string& id : job_ids) {
      auto it = metric_points_.find(id);
      if (it == metric_points_.end()) continue;
      for (const auto& [ms, point] : it->second) {
        out[id].emplace_back(ms, point.progress().step());
      }
    }
    return out;
  }

  // How many times LoadJob was called.
  int job_loads() const {
    absl::MutexLock lock(&mu_);
    return job_loads_;
  }

  // Every successful write, in order.
  std::vector<StoreMutation> transactions() const {
    absl::MutexLock lock(&mu_);
    return transactions_;
  }

 private:
  static bool IsFinal(trainyard::v1::JobState state) {
    return state == trainyard::v1::SUCCEEDED || state == trainyard::v1::FAILED ||
           state == trainyard::v1::CANCELLED;
  }

  mutable absl::Mutex mu_;
  std::function<bool(const StoreMutation&)> fail_;
  absl::Notification* entered_ = nullptr;
  absl::Notification* release_ = nullptr;
  std::vector<StoreMutation> transactions_;
  std::map<std::string, StoredJob> jobs_;
  std::map<std::string, std::vector<trainyard::v1::JobEvent>> events_;
  std::map<std::string, trainyard::v1::JobProgress> progress_;
  std::map<std::string, trainyard::v1::Worker> workers_;
  std::map<std::string, StoredToken> tokens_;
  std::map<std::string, StoredSearch> searches_;
  std::map<std::string, trainyard::v1::Queue> queues_;
  std::map<std::string, std::map<int, trainyard::v1::Trial>> trials_;
  std::map<std::string, std::pair<std::string, trainyard::v1::TaskInfo>> tasks_;
  std::map<std::pair<std::string, int64_t>, StoredCheckpoint> checkpoints_;
  std::map<std::string, std::map<int64_t, trainyard::v1::MetricPoint>> metric_points_;
  int64_t next_job_seq_ = 1;
  int job_loads_ = 0;
};

}  // namespace trainyard

#endif  // TRAINYARD_TESTS_SERVER_FAKE_JOB_STORE_H_
