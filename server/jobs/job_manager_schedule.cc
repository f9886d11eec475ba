// The scheduler's pass as the job manager runs it: the workers' capacity and the queue in, its
// placements, preemptions and reasons out.

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/jobs/capacity.h"
#include "server/jobs/job_manager.h"
#include "server/jobs/job_manager_internal.h"
#include "server/lifecycle/job_state.h"
#include "server/scheduling/scheduler.h"

namespace trainyard {

using job_manager_internal::kFullSchedulePeriod;
using job_manager_internal::kStoppingHold;
using job_manager_internal::ShardTaskId;
using job_manager_internal::TaskId;

std::vector<SchedWorker> JobManager::SchedWorkersLocked() const {
  std::vector<SchedWorker> workers;
  std::map<std::string, WorkerUsage> used = UsedCapacityLocked();
  for (const WorkerRecord* record : workers_.All()) {
    SchedWorker w;
    w.id = record->info.id();
    // As shown: a worker held unreachable by a mass loss, or SUSPECT (its beats overdue, its
    // lease stream closed, asked for a word and silent, not heard from since this coordinator
    // started) takes nothing new; its ranks go on where they are.
    w.ready = workers_.ShownState(*record, QuietLimitLocked(), nullptr) == v1::READY;
    w.total_slots = record->info.slots();
    // GPUs out of service take nothing new.
    w.total_gpus = record->info.gpus() - record->info.gpu_faults_size();
    w.free_slots = w.total_slots - used[w.id].slots;
    w.free_gpus = std::max(0, w.total_gpus - used[w.id].gpus);
    w.total_memory = record->info.memory_bytes();
    w.free_memory = w.total_memory - used[w.id].memory_bytes;
    if (record->runtime != nullptr) w.runtime = record->runtime->key;
    workers.push_back(std::move(w));
  }
  return workers;
}

std::vector<SchedJob> JobManager::QueuedJobsLocked(const JobEntry* blocker, absl::Time now,
                                                   absl::Time* next) const {
  std::vector<SchedJob> jobs;
  auto add = [&](const JobEntry& entry) {
    const absl::Time not_before = absl::FromUnixMillis(entry.job.next_attempt_unix_ms());
    if (not_before > now) {
      *next = std::min(*next, not_before);  // a restart's backoff ends
      return;
    }
    jobs.push_back(SchedJobLocked(entry));
  };
  const std::map<QueueKey, JobEntry*>& pending = table_.pending();
  for (const auto& [key, entry] : pending) {
    add(*entry);
    if (entry == blocker) {
      for (auto n = new_pending_.upper_bound(key); n != new_pending_.end(); ++n) {
        if (auto p = pending.find(*n); p != pending.end()) add(*p->second);
      }
      break;
    }
  }
  return jobs;
}

void JobManager::ReleaseStoppedLocked(absl::Time now, absl::Time* next) {
  // Capacity held by stopping ranks comes free by itself after kStoppingHold.
  for (int64_t seq : table_.attempts()) {
    const JobEntry* entry = table_.FindBySeq(seq);
    if (entry != nullptr && entry->restarting_since + kStoppingHold > now) {
      *next = std::min(*next, entry->restarting_since + kStoppingHold);
    }
  }
  // Ended jobs whose trainers all reported gone (or past the hold) no longer hold anything.
  std::vector<int64_t> stopped;
  for (int64_t seq : table_.stopping()) {
    const JobEntry* entry = table_.FindBySeq(seq);
    bool holding = false;
    if (entry != nullptr && now - entry->ended < kStoppingHold) {
      for (const v1::TaskInfo& t : entry->job.tasks()) {
        if (t.generation() == entry->job.generation() && !TaskEnded(t.state())) holding = true;
      }
    }
    if (holding) {
      *next = std::min(*next, entry->ended + kStoppingHold);
    } else {
      stopped.push_back(seq);
    }
  }
  // Nothing of them runs any more: EvictFinishedLocked leaves them to the store.
  for (int64_t seq : stopped) table_.StoppedHolding(seq);
  if (!stopped.empty()) changed_.SignalAll();  // a DeleteJob may wait for it
}

int64_t JobManager::DataMemoryLocked(const v1::Job& job, const Placement& placement) const {
  const v1::JobSpec& spec = job.spec();
  if (spec.resources().memory_bytes() > 0 || spec.data().shuffle_window() > 0 ||
      spec.has_program()) {
    return 0;  // the spec decides (or there is no data order of ours)
  }
  int64_t smallest = 0;
  for (const std::string& id : placement.rank_workers) {
    const WorkerRecord* worker = workers_.Find(id);
    const int64_t memory = worker == nullptr ? 0 : worker->info.memory_bytes();
    if (memory <= 0) return 0;  // a worker that did not say: no basis
    smallest = smallest == 0 ? memory : std::min(smallest, memory);
  }
  return smallest;
}

void JobManager::PlaceLocked(const Placement& placement) {
  JobEntry* entry = FindLocked(placement.job_id);
  if (entry == nullptr) return;
  v1::Job updated = entry->job;
  const int64_t generation = updated.generation() + 1;
  updated.set_generation(generation);
  updated.clear_position();
  updated.clear_estimated_start_unix_ms();
  std::vector<std::string> changed;
  for (int rank = 0; rank < static_cast<int>(placement.rank_workers.size()); ++rank) {
    v1::TaskInfo* task = updated.add_tasks();
    task->set_task_id(TaskId(updated.id(), generation, rank));
    task->set_rank(rank);
    task->set_worker_id(placement.rank_workers[rank]);
    task->set_state(v1::TASK_STARTING);
    task->set_generation(generation);
    changed.push_back(task->task_id());
  }
  for (int shard = 0; shard < static_cast<int>(placement.shard_workers.size()); ++shard) {
    v1::TaskInfo* task = updated.add_tasks();
    task->set_task_id(ShardTaskId(updated.id(), generation, shard));
    task->set_role(v1::TASK_ROLE_SHARD);
    task->set_shard(shard);
    task->set_worker_id(placement.shard_workers[shard]);
    task->set_state(v1::TASK_STARTING);
    task->set_generation(generation);
    changed.push_back(task->task_id());
  }
  if (generation == 1) updated.set_data_memory_bytes(DataMemoryLocked(updated, placement));
  std::string reason = absl::StrCat("placed on ", absl::StrJoin(placement.rank_workers, ", "));
  if (!placement.shard_workers.empty()) {
    absl::StrAppend(&reason, "; parameter-server shards on ",
                    absl::StrJoin(placement.shard_workers, ", "));
  }
  if (TransitionLocked(*entry, std::move(updated), v1::SCHEDULED, reason, changed).ok()) {
    entry->attempt_placed = clock_.Now();
  }
  // Ranks of an earlier attempt must not meet the new ones.
  rendezvous_.EndAttempts(placement.job_id, generation - 1);
}

bool JobManager::ShowReasonsLocked(const ScheduleDecision& decision, bool whole) {
  // Only the reason changed: derived again by every pass, it is shown but not written (a change
  // at the head of a long queue would otherwise rewrite every queued job), and gets no event, so
  // that a waiting job does not flood its history.
  bool reasons_changed = false;
  for (const auto& [job_id, reason] : decision.pending_reasons) {
    JobEntry* entry = FindLocked(job_id);
    if (entry == nullptr) continue;
    if (schedule_blocker_.empty() && job_id == decision.reserved_for) schedule_blocker_ = job_id;
    const int64_t start = job_id == decision.reserved_for ? decision.reserved_start_ms : 0;
    const std::string shown = WithCapacityNoteLocked(job_id, reason);
    if (entry->job.reason() == shown && entry->job.estimated_start_unix_ms() == start) continue;
    entry->job.set_reason(shown);
    entry->job.set_estimated_start_unix_ms(start);
    entry->version++;
    reasons_changed = true;
  }
  // Places in line, from whole passes only (a pass up to the blocker sees part of the line), for
  // the first kShownPlaces: a placement would otherwise change every job's place in a deep line.
  if (!whole) return reasons_changed;
  constexpr size_t kShownPlaces = 1000;
  std::set<std::string> waiting;
  for (size_t i = 0; i < std::min(decision.waiting.size(), kShownPlaces); ++i) {
    JobEntry* entry = FindLocked(decision.waiting[i]);
    if (entry == nullptr) continue;
    waiting.insert(decision.waiting[i]);
    if (entry->job.position() == static_cast<int>(i + 1)) continue;
    entry->job.set_position(static_cast<int>(i + 1));
    entry->version++;
    reasons_changed = true;
  }
  for (const auto& [key, entry] : table_.pending()) {
    if (entry->job.position() != 0 && !waiting.count(entry->job.id())) {
      entry->job.set_position(0);
      entry->version++;
      reasons_changed = true;
    }
  }
  return reasons_changed;
}

std::string JobManager::WithCapacityNoteLocked(const std::string& job_id,
                                               const std::string& reason) const {
  auto note = capacity_notes_.find(job_id);
  return note == capacity_notes_.end() ? reason : absl::StrCat(reason, "; ", note->second);
}

void JobManager::SetCapacityNotes(std::map<std::string, std::string> notes) {
  absl::MutexLock lock(&mu_);
  bool changed = false;
  std::set<std::string> ids;
  for (const auto& [id, note] : capacity_notes_) ids.insert(id);
  for (const auto& [id, note] : notes) ids.insert(id);
  for (const std::string& id : ids) {
    JobEntry* entry = FindLocked(id);
    if (entry == nullptr || entry->job.state() != v1::PENDING) continue;
    auto old = capacity_notes_.find(id);
    auto now = notes.find(id);
    const std::string old_note = old == capacity_notes_.end() ? "" : old->second;
    const std::string new_note = now == notes.end() ? "" : now->second;
    if (old_note == new_note) continue;
    // The scheduler's reason is what precedes the old note.
    std::string reason = entry->job.reason();
    const std::string old_suffix = absl::StrCat("; ", old_note);
    if (!old_note.empty() && absl::EndsWith(reason, old_suffix)) {
      reason.resize(reason.size() - old_suffix.size());
    }
    entry->job.set_reason(new_note.empty() ? reason : absl::StrCat(reason, "; ", new_note));
    entry->version++;
    changed = true;
  }
  capacity_notes_ = std::move(notes);
  if (changed) changed_.SignalAll();
}

void JobManager::ScheduleLocked() {
  const absl::Time now = clock_.Now();
  if (parked_epoch_ != cluster_epoch_) {
    table_.UnparkAll();
    parked_epoch_ = cluster_epoch_;
    schedule_all_ = true;
  }
  const bool timed = now >= next_full_schedule_;
  if (!schedule_all_ && !timed && new_pending_.empty()) return;
  const std::vector<SchedWorker> workers = SchedWorkersLocked();
  absl::Time next = now + kFullSchedulePeriod;
  // The queue up to the job that blocked it last time, and the new submissions behind it. With
  // queues, fair share orders jobs otherwise than the queue map: every pass is whole.
  const JobEntry* blocker = nullptr;
  if (const JobEntry* b = table_.Find(schedule_blocker_);
      b != nullptr && table_.pending().count(JobTable::KeyOf(*b)) && queues_.empty()) {
    blocker = b;
  }
  const SchedContext context = SchedContextLocked();
  bool whole = blocker == nullptr;
  ScheduleDecision decision = Schedule(QueuedJobsLocked(blocker, now, &next), workers, context);
  if (blocker != nullptr) {
    // The blocker was placed or another job went before it: what waits behind it may move.
    auto reason = decision.pending_reasons.find(blocker->job.id());
    if (!decision.placements.empty() || !decision.preemptions.empty() ||
        reason == decision.pending_reasons.end() ||
        !absl::StartsWith(reason->second, "waiting for capacity")) {
      decision = Schedule(QueuedJobsLocked(nullptr, now, &next), workers, context);
      whole = true;
    }
  }
  queue_usage_ = decision.queues;
  if (whole || !decision.reserved_for.empty()) reserved_for_ = decision.reserved_for;
  for (const Preemption& preemption : decision.preemptions) PreemptLocked(preemption);
  ReleaseStoppedLocked(now, &next);
  schedule_all_ = false;
  next_full_schedule_ = next;
  new_pending_.clear();
  // Jobs that cannot run on this cluster wait, out of the passes, until it changes.
  for (const std::string& id : decision.unfit) {
    if (const JobEntry* entry = table_.Find(id); entry != nullptr) {
      table_.Park(JobTable::KeyOf(*entry));
    }
  }
  schedule_blocker_.clear();
  for (const Placement& placement : decision.placements) PlaceLocked(placement);
  if (ShowReasonsLocked(decision, whole)) changed_.SignalAll();
}

}  // namespace trainyard
