#include "server/jobs/job_table.h"

#include <utility>

#include "server/lifecycle/job_state.h"

namespace trainyard {

bool JobTable::IsActiveTask(const v1::Job& job, const v1::TaskInfo& task) {
  const v1::JobState state = job.state();
  return (state == v1::SCHEDULED || state == v1::RUNNING) &&
         task.generation() == job.generation() && !TaskEnded(task.state());
}

JobEntry& JobTable::Add(int64_t seq, v1::Job job) {
  const std::string id = job.id();
  JobEntry& entry = jobs_[id];
  entry.seq = seq;
  by_seq_[seq] = id;
  // Indexed as a change from nothing: a job in no state, with no tasks.
  v1::Job none;
  none.set_state(v1::JOB_STATE_UNSPECIFIED);
  entry.job = std::move(job);
  Reindex(entry, none);
  return entry;
}

std::set<std::string> JobTable::Reindex(JobEntry& entry, const v1::Job& before) {
  const v1::Job& job = entry.job;
  if (before.state() != v1::JOB_STATE_UNSPECIFIED) {
    if (--counts_[before.state()] == 0) counts_.erase(before.state());
  }
  counts_[job.state()]++;
  std::set<std::pair<std::string, std::string>> was_active;
  for (const v1::TaskInfo& t : before.tasks()) {
    if (IsActiveTask(before, t)) was_active.emplace(t.worker_id(), t.task_id());
  }
  const bool was_final =
      before.state() != v1::JOB_STATE_UNSPECIFIED && IsFinalJobState(before.state());
  const bool is_final = IsFinalJobState(job.state());
  if (!is_final && job.generation() > 0) {
    attempts_.insert(entry.seq);
  } else {
    attempts_.erase(entry.seq);
  }
  if (job.state() != v1::PENDING) {
    pending_.erase(KeyOf(entry));
    parked_.erase(KeyOf(entry));
  } else if (!parked_.count(KeyOf(entry))) {
    pending_[KeyOf(entry)] = &entry;
  }
  std::set<std::pair<std::string, std::string>> active;
  for (const v1::TaskInfo& t : job.tasks()) {
    job_of_task_[t.task_id()] = job.id();
    if (IsActiveTask(job, t)) active.emplace(t.worker_id(), t.task_id());
  }
  std::set<std::string> touched;
  for (const auto& p : was_active) {
    if (active.count(p)) continue;
    touched.insert(p.first);
    auto it = active_tasks_by_worker_.find(p.first);
    if (it != active_tasks_by_worker_.end()) {
      it->second.erase(p.second);
      if (it->second.empty()) active_tasks_by_worker_.erase(it);
    }
  }
  for (const auto& p : active) {
    if (was_active.count(p)) continue;
    touched.insert(p.first);
    active_tasks_by_worker_[p.first].insert(p.second);
  }
  const bool was_unfinished = before.state() != v1::JOB_STATE_UNSPECIFIED && !was_final;
  if (const std::string& from = job.spec().checkpoint().resume_from();
      !from.empty() && was_unfinished != !is_final) {
    if (!is_final) {
      resumed_from_[from]++;
    } else if (auto it = resumed_from_.find(from); it != resumed_from_.end() && --it->second == 0) {
      resumed_from_.erase(it);
    }
  }
  if (is_final) {
    active_.erase(entry.seq);
    if (!was_final) {
      stopping_.insert(entry.seq);
      finished_.emplace(job.finished_unix_ms(), entry.seq);
    }
  } else {
    active_.insert(entry.seq);
    if (was_final) {
      stopping_.erase(entry.seq);
      finished_.erase({before.finished_unix_ms(), entry.seq});
    }
  }
  return touched;
}

void JobTable::Remove(absl::string_view id) {
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return;
  CountStored(it->second.job.state(), -1);
  Erase(id);
}

void JobTable::Evict(absl::string_view id) {
  if (const JobEntry* entry = Find(id); entry != nullptr && IsFinalJobState(entry->job.state())) {
    Erase(id);
  }
}

JobEntry& JobTable::Readmit(int64_t seq, v1::Job job) {
  const v1::JobState state = job.state();
  JobEntry& entry = Add(seq, std::move(job));
  CountStored(state, -1);  // Add counted it again
  stopping_.erase(seq);
  return entry;
}

void JobTable::CountStored(v1::JobState state, int n) {
  auto c = counts_.find(state);
  if (c == counts_.end()) c = counts_.emplace(state, 0).first;
  c->second += n;
  if (c->second <= 0) counts_.erase(c);
}

void JobTable::Erase(absl::string_view id) {
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return;
  const JobEntry& entry = it->second;
  const v1::Job& job = entry.job;
  if (const std::string& from = job.spec().checkpoint().resume_from();
      !from.empty() && !IsFinalJobState(job.state())) {
    if (auto it = resumed_from_.find(from); it != resumed_from_.end() && --it->second == 0) {
      resumed_from_.erase(it);
    }
  }
  active_.erase(entry.seq);
  attempts_.erase(entry.seq);
  stopping_.erase(entry.seq);
  finished_.erase({job.finished_unix_ms(), entry.seq});
  pending_.erase(KeyOf(entry));
  parked_.erase(KeyOf(entry));
  for (const v1::TaskInfo& t : job.tasks()) {
    job_of_task_.erase(t.task_id());
    auto w = active_tasks_by_worker_.find(t.worker_id());
    if (w == active_tasks_by_worker_.end()) continue;
    w->second.erase(t.task_id());
    if (w->second.empty()) active_tasks_by_worker_.erase(w);
  }
  by_seq_.erase(entry.seq);
  jobs_.erase(it);
}

JobEntry* JobTable::Find(absl::string_view id) {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : &it->second;
}

const JobEntry* JobTable::Find(absl::string_view id) const {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : &it->second;
}

JobEntry* JobTable::FindBySeq(int64_t seq) {
  auto it = by_seq_.find(seq);
  return it == by_seq_.end() ? nullptr : Find(it->second);
}

const JobEntry* JobTable::FindBySeq(int64_t seq) const {
  auto it = by_seq_.find(seq);
  return it == by_seq_.end() ? nullptr : Find(it->second);
}

JobEntry* JobTable::FindByTask(absl::string_view task_id) {
  auto it = job_of_task_.find(task_id);
  return it == job_of_task_.end() ? nullptr : Find(it->second);
}

const JobEntry* JobTable::FindByTask(absl::string_view task_id) const {
  auto it = job_of_task_.find(task_id);
  return it == job_of_task_.end() ? nullptr : Find(it->second);
}

std::vector<std::pair<const JobEntry*, const v1::TaskInfo*>> JobTable::ActiveTasksOn(
    absl::string_view worker_id) const {
  std::vector<std::pair<const JobEntry*, const v1::TaskInfo*>> out;
  auto it = active_tasks_by_worker_.find(worker_id);
  if (it == active_tasks_by_worker_.end()) return out;
  for (const std::string& task_id : it->second) {
    const JobEntry* entry = FindByTask(task_id);
    if (entry == nullptr) continue;
    for (const v1::TaskInfo& t : entry->job.tasks()) {
      if (t.task_id() == task_id && IsActiveTask(entry->job, t)) out.emplace_back(entry, &t);
    }
  }
  return out;
}

void JobTable::Park(const QueueKey& key) {
  auto node = pending_.extract(key);
  if (!node.empty()) parked_.insert(std::move(node));
}

void JobTable::UnparkAll() {
  pending_.merge(parked_);
  parked_.clear();
}

}  // namespace trainyard
