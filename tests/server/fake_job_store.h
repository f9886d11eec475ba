#ifndef TRAINYARD_TESTS_SERVER_FAKE_JOB_STORE_H_
#define TRAINYARD_TESTS_SERVER_FAKE_JOB_STORE_H_

#include <algorithm>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "server/job_store.h"

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
    for (const auto& key : m.removed_checkpoints) checkpoints_.erase(key);
    for (const std::string& id : m.removed_jobs) {
      jobs_.erase(id);
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
    for (StoredJob& j : all->jobs) {
      const trainyard::v1::JobState state = j.job.state();
      if (state != trainyard::v1::SUCCEEDED && state != trainyard::v1::FAILED &&
          state != trainyard::v1::CANCELLED) {
        continue;
      }
      j.full = false;
      j.job.clear_events();
      auto* tasks = j.job.mutable_tasks();
      for (int i = tasks->size() - 1; i >= 0; --i) {
        const trainyard::v1::TaskState t = tasks->Get(i).state();
        if (t != trainyard::v1::TASK_STARTING && t != trainyard::v1::TASK_RUNNING) {
          tasks->DeleteSubrange(i, 1);
        }
      }
    }
    return all;
  }

  absl::StatusOr<JobHistory> LoadHistory(absl::string_view job_id) override {
    absl::MutexLock lock(&mu_);
    ++history_loads_;
    if (!jobs_.count(std::string(job_id))) return absl::NotFoundError("fake store: no such job");
    JobHistory history;
    history.events = events_[std::string(job_id)];
    for (const auto& [task_id, t] : tasks_) {
      if (t.first == job_id) history.tasks.push_back(t.second);
    }
    return history;
  }

  // How many times LoadHistory was called.
  int history_loads() const {
    absl::MutexLock lock(&mu_);
    return history_loads_;
  }

  // Every successful write, in order.
  std::vector<StoreMutation> transactions() const {
    absl::MutexLock lock(&mu_);
    return transactions_;
  }

 private:
  mutable absl::Mutex mu_;
  std::function<bool(const StoreMutation&)> fail_;
  absl::Notification* entered_ = nullptr;
  absl::Notification* release_ = nullptr;
  std::vector<StoreMutation> transactions_;
  std::map<std::string, StoredJob> jobs_;
  std::map<std::string, std::vector<trainyard::v1::JobEvent>> events_;
  std::map<std::string, trainyard::v1::JobProgress> progress_;
  std::map<std::string, trainyard::v1::Worker> workers_;
  std::map<std::string, std::pair<std::string, trainyard::v1::TaskInfo>> tasks_;
  std::map<std::pair<std::string, int64_t>, StoredCheckpoint> checkpoints_;
  int64_t next_job_seq_ = 1;
  int history_loads_ = 0;
};

}  // namespace trainyard

#endif  // TRAINYARD_TESTS_SERVER_FAKE_JOB_STORE_H_
