// The tick: lost workers, restarts, max_runtime, scheduling and retention.

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/log.h"
#include "common/restart_reason.h"
#include "common/spec/job_spec.h"
#include "common/storage/uri.h"
#include "server/jobs/capacity.h"
#include "server/jobs/checkpoint_registry.h"
#include "server/jobs/hang_diagnosis.h"
#include "server/jobs/job_manager.h"
#include "server/jobs/job_manager_internal.h"
#include "server/jobs/model_needs.h"
#include "server/jobs/restart_policy.h"
#include "server/lifecycle/job_state.h"
#include "server/scheduling/scheduler.h"

namespace trainyard {

using job_manager_internal::RankRange;
using job_manager_internal::RunBoundMs;
using job_manager_internal::ShardCount;
using job_manager_internal::TaskName;

// ---- Background ----

void JobManager::Tick() {
  // Finished jobs past their retention are found in the store (where they are) without the
  // lock: only this tick removes jobs, and ForgetExpiredLocked skips those back in memory.
  std::vector<std::pair<std::string, v1::JobState>> expired;
  if (options_.job_retention != absl::InfiniteDuration()) {
    int limit = 0;
    {
      absl::MutexLock lock(&mu_);
      if (clock_.Now() >= next_retention_) {
        limit = kRetentionBatch + static_cast<int>(table_.finished().size());
      }
    }
    if (limit > 0) {
      const int64_t cutoff_ms = absl::ToUnixMillis(clock_.Now() - options_.job_retention);
      absl::StatusOr<std::vector<std::pair<std::string, v1::JobState>>> found =
          store_->FinishedBefore(cutoff_ms, limit);
      if (found.ok()) {
        expired = std::move(*found);
      } else {
        LogWarning("looking for expired jobs: ", found.status().ToString(), " (tried again later)");
      }
      absl::MutexLock lock(&mu_);
      // Once in a while, or at once while a backlog is worked off.
      next_retention_ = static_cast<int>(expired.size()) >= limit ? absl::InfinitePast()
                                                                  : clock_.Now() + kRetentionPeriod;
    }
  }
  std::vector<std::string> removed;
  {
    absl::MutexLock lock(&mu_);
    tick_requested_ = false;
    CheckBeatsLocked();
    ExpireWorkersLocked();
    RestartLostOrStalledLocked();
    EnforceRuntimeLocked();
    ScheduleLocked();
    EvictFinishedLocked();
    removed = ForgetExpiredLocked(expired);
  }
  for (const std::string& id : removed) {
    if (absl::Status s = logs_->RemoveJob(id); !s.ok()) {
      LogWarning("job ", id, ": logs not removed: ", s.ToString());
    }
  }
}

std::vector<std::string> JobManager::ForgetExpiredLocked(
    const std::vector<std::pair<std::string, v1::JobState>>& expired) {
  const absl::Time now = clock_.Now();
  StoreMutation m;
  std::vector<v1::JobState> states;
  for (const auto& [id, state] : expired) {
    // Back in memory: something needs it again (its trainers may still be stopping, or a job
    // resumes from its checkpoints), so it is kept until it leaves memory again.
    if (table_.Find(id) != nullptr) continue;
    // A job waiting to resume from its checkpoints needs their records: kept until it ends.
    if (table_.IsResumedFrom(id) || pinned_sources_.count(id)) continue;
    if (static_cast<int>(m.removed_jobs.size()) == kRetentionBatch) break;
    m.removed_jobs.push_back(id);
    states.push_back(state);
  }
  for (const WorkerRecord* w : workers_.All()) {
    if (w->info.state() == v1::LOST &&
        now - absl::FromUnixMillis(w->info.last_seen_unix_ms()) >= options_.lost_worker_retention) {
      m.removed_workers.push_back(w->info.id());
    }
  }
  if (m.empty()) return {};
  if (absl::Status s = committer_.Apply(m); !s.ok()) {
    LogWarning("removing expired jobs and workers: ", s.ToString(), " (tried again later)");
    return {};
  }
  for (const std::string& id : m.removed_workers) {
    workers_.Remove(id);
    WakeWorkerLocked(id);
    worker_wakeups_.erase(id);
    LogInfo("worker ", id, " forgotten: LOST for ",
            absl::FormatDuration(options_.lost_worker_retention));
  }
  for (size_t i = 0; i < m.removed_jobs.size(); ++i) {
    rendezvous_.Forget(m.removed_jobs[i]);
    table_.CountStored(states[i], -1);
  }
  if (!m.removed_jobs.empty()) {
    LogInfo("removed ", m.removed_jobs.size(), " jobs finished more than ",
            absl::FormatDuration(options_.job_retention), " ago");
    changed_.SignalAll();
  }
  return m.removed_jobs;
}

void JobManager::ExpireWorkersLocked() {
  const WorkerRegistry::Expiry expiry = workers_.ExpireLeases();
  const std::vector<std::string>& lost = expiry.lost;
  if (!expiry.held.empty()) {
    LogWarning("lost contact with ", absl::StrJoin(expiry.held, ", "), ": ", expiry.down, " of ",
               expiry.live,
               " workers unreachable at once, more likely this coordinator cut off than they all "
               "failed; their jobs go on, nothing new is placed there, and they count as lost "
               "only after ",
               absl::FormatDuration(options_.mass_loss_hold), " (--mass_loss_hold)");
  }
  if (!expiry.returned.empty()) {
    LogInfo("workers reachable again: ", absl::StrJoin(expiry.returned, ", "));
  }
  for (const std::string& id : lost) WakeWorkerLocked(id);  // told to register again
  if (!lost.empty() || !expiry.held.empty() || !expiry.returned.empty()) ClusterChangedLocked();
  for (const std::string& worker_id : lost) {
    kill_tasks_.erase(worker_id);
    if (absl::Status s = PersistWorkerLocked(worker_id); !s.ok()) {
      LogError("worker ", worker_id, ": persisting LOST failed: ", s.ToString());
    }
    const WorkerRecord* record = workers_.Find(worker_id);
    LogWarning("worker ", worker_id, record == nullptr ? " lost" : LeaseEndLocked(*record));
    if (options_.event_sink != nullptr) options_.event_sink->OnWorkerLost(worker_id);
  }
  // The jobs with ranks there restart in RestartLostOrStalledLocked, which looks at the state
  // rather than at this edge, so a failed write is retried on the next tick.
  if (!lost.empty()) changed_.SignalAll();
}

void JobManager::CheckBeatsLocked() {
  const WorkerRegistry::Silence silence = workers_.CheckBeats([this](const std::string& id) {
    auto kill = kill_tasks_.find(id);
    return !ActiveTasksLocked(id).empty() || (kill != kill_tasks_.end() && !kill->second.empty());
  });
  for (const std::string& id : silence.silent) {
    LogWarning("worker ", id, ": no word from its agent for ",
               absl::FormatDuration(options_.lease_beat_timeout),
               " (no beat while it runs tasks, or no answer when asked): its lease stream is "
               "ended");
  }
  // Answering their long polls asks them for a word: the next Sync.
  for (const std::string& id : silence.probe) {
    workers_.BumpVersion(id);
    WakeWorkerLocked(id);
  }
  if (!silence.silent.empty()) RequestTickLocked();
}

std::string JobManager::LeaseEndLocked(const WorkerRecord& worker) const {
  if (worker.silenced) {
    return absl::StrCat(" lost (no word from its agent for ",
                        absl::FormatDuration(options_.lease_beat_timeout),
                        ": its host was cut off or froze, and its agent did not come back within ",
                        absl::FormatDuration(options_.worker_stream_grace), ")");
  }
  if (!worker.streamed) {
    return absl::StrCat(" lost (no heartbeat for ", absl::FormatDuration(options_.worker_timeout),
                        ")");
  }
  return absl::StrCat(
      " lost (its connection broke: its host was killed, cut off or frozen, and "
      "its agent did not come back within ",
      absl::FormatDuration(options_.worker_stream_grace), ")");
}

void JobManager::RestartLostOrStalledLocked() {
  const absl::Time now = clock_.Now();
  std::vector<std::pair<std::string, AttemptEnd>> ends;
  std::vector<std::string> restarting;
  for (int64_t seq : table_.attempts()) {
    JobEntry& entry = *table_.FindBySeq(seq);
    const v1::Job& job = entry.job;
    if (job.state() == v1::RESTARTING) {
      restarting.push_back(job.id());
      continue;
    }
    if (job.state() != v1::SCHEDULED && job.state() != v1::RUNNING) continue;
    std::optional<AttemptEnd> end;
    for (const v1::TaskInfo& t : job.tasks()) {
      if (!IsActiveTask(entry, t)) continue;
      const WorkerRecord* worker = workers_.Find(t.worker_id());
      if (worker != nullptr && worker->info.state() != v1::LOST) continue;
      AttemptEnd lost;
      lost.reason = t.stop_deadline_unix_ms() > 0 ? v1::PREEMPTED : v1::WORKER_LOST;
      lost.message = absl::StrCat(TaskName(t), " lost: worker ", t.worker_id(),
                                  worker == nullptr ? " is unknown" : LeaseEndLocked(*worker));
      lost.failed =
          worker == nullptr ? now : absl::FromUnixMillis(worker->info.last_seen_unix_ms());
      end = std::move(lost);
      break;
    }
    if (!end.has_value() && now - entry.attempt_placed >= options_.start_timeout) {
      // Ranks an agent never started (a broken agent, a trainer that cannot be launched) would
      // keep the job SCHEDULED, or its started ranks waiting at the rendezvous, forever.
      std::vector<std::string> starting;
      for (const v1::TaskInfo& t : job.tasks()) {
        if (IsActiveTask(entry, t) && t.state() == v1::TASK_STARTING) {
          starting.push_back(absl::StrCat(TaskName(t), " on ", t.worker_id()));
        }
      }
      if (!starting.empty()) {
        AttemptEnd stuck;
        stuck.reason = v1::INFRASTRUCTURE;
        stuck.message =
            absl::StrCat(absl::StrJoin(starting, ", "), " did not start within ",
                         absl::FormatDuration(options_.start_timeout), " (--start_timeout)");
        stuck.failed = now;
        end = std::move(stuck);
      }
    }
    if (!end.has_value() && job.state() == v1::RUNNING) {
      const int64_t stall_s = job.spec().stall_timeout_seconds() > 0
                                  ? job.spec().stall_timeout_seconds()
                                  : kDefaultStallTimeoutSeconds;
      const absl::Duration stall = absl::Seconds(stall_s);
      if (entry.last_step_change != absl::InfinitePast() && now - entry.last_step_change >= stall) {
        AttemptEnd hang;
        hang.reason = v1::HANG;
        hang.message = absl::StrCat("no step progress for ", absl::FormatDuration(stall),
                                    " (stall_timeout; last step ",
                                    std::max<int64_t>(entry.last_step_seen, 0), ")");
        hang.failed = entry.last_step_change;
        end = std::move(hang);
      }
    }
    if (end.has_value()) ends.emplace_back(job.id(), *std::move(end));
  }
  for (auto& [job_id, end] : ends) {
    JobEntry* entry = FindLocked(job_id);
    if (entry == nullptr) continue;
    EndAttemptLocked(*entry, entry->job, std::move(end), {}).IgnoreError();
  }
  for (const std::string& job_id : restarting) {
    JobEntry* entry = FindLocked(job_id);
    if (entry != nullptr) MaybeFinishRestartLocked(*entry);
  }
}

absl::Status JobManager::EndAttemptLocked(JobEntry& entry, v1::Job updated, AttemptEnd end,
                                          const std::vector<std::string>& changed_task_ids) {
  if (end.reason == v1::PREEMPTED && !updated.preempted_for().empty()) {
    // The scheduler asked it to stop for another job: no budget counts that.
    end.reason = v1::SCHEDULER_PREEMPTED;
    end.message =
        absl::StrCat("preempted by the scheduler ", updated.preempted_for(), ": ", end.message);
  } else if (end.reason == v1::PREEMPTED && !entry.preemption_notice.empty()) {
    end.message =
        absl::StrCat("preemption notice for ", entry.preemption_notice, ": ", end.message);
  }
  updated.clear_preempted_for();
  if (std::optional<std::string> spent = BudgetSpent(updated, end.reason, 1); spent.has_value()) {
    return TransitionLocked(entry, std::move(updated), v1::FAILED, end.message + *spent,
                            changed_task_ids);
  }
  const int64_t generation = updated.generation();
  // The ranks left of an attempt that a failure ended cannot save or finish a step: killed at
  // once rather than asked to stop (a preemption's ranks are saving at the agreed step).
  const bool kill = end.reason != v1::PREEMPTED;
  if (end.user_error) {
    // No data, a model that cannot load, a bad argument: every attempt would end the same way.
    absl::Status s = TransitionLocked(entry, std::move(updated), v1::FAILED,
                                      end.message + " (a user error: the job is not restarted)",
                                      changed_task_ids);
    if (s.ok() && kill) KillSurvivorsLocked(entry, generation);
    return s;
  }
  const absl::Time now = clock_.Now();
  v1::Restart* r = updated.add_restarts();
  r->set_generation(updated.generation());
  r->set_reason(end.reason);
  r->set_message(end.message);
  r->set_failed_unix_ms(absl::ToUnixMillis(std::min(end.failed, now)));
  r->set_detected_unix_ms(absl::ToUnixMillis(now));
  r->set_last_step(std::max<int64_t>({updated.progress().step(), end.last_step, 0}));
  const std::string reason =
      absl::StrCat("restarting (", RestartReasonName(end.reason), "): ", end.message);
  if (absl::Status s =
          TransitionLocked(entry, std::move(updated), v1::RESTARTING, reason, changed_task_ids);
      !s.ok()) {
    return s;
  }
  if (kill) KillSurvivorsLocked(entry, generation);
  entry.restarting_since = now;
  entry.preemption_notice.clear();
  // Ranks still waiting to meet must not wait for peers that are being stopped.
  AfterCommitLocked([this, id = entry.job.id(), generation = entry.job.generation()] {
    rendezvous_.EndAttempts(id, generation);
  });
  RequestTickLocked();
  MaybeFinishRestartLocked(entry);
  return absl::OkStatus();
}

void JobManager::KillSurvivorsLocked(const JobEntry& entry, int64_t generation) {
  for (const v1::TaskInfo& t : entry.job.tasks()) {
    if (t.generation() != generation || TaskEnded(t.state())) continue;
    const WorkerRecord* worker = workers_.Find(t.worker_id());
    if (worker == nullptr || worker->info.state() == v1::LOST) continue;
    kill_tasks_[t.worker_id()].insert(t.task_id());
    workers_.BumpVersion(t.worker_id());
    WakeWorkerLocked(t.worker_id());
  }
}

void JobManager::MaybeFinishRestartLocked(JobEntry& entry) {
  if (entry.job.state() != v1::RESTARTING || entry.job.restarts_size() == 0) return;
  const absl::Time now = clock_.Now();
  const v1::Restart& current = entry.job.restarts(entry.job.restarts_size() - 1);
  bool stopped = true;
  const v1::TaskInfo* lost = nullptr;  // a rank on a vanished worker
  const WorkerRecord* lost_worker = nullptr;
  for (const v1::TaskInfo& t : entry.job.tasks()) {
    if (t.generation() != entry.job.generation() || TaskEnded(t.state())) continue;
    const WorkerRecord* worker = workers_.Find(t.worker_id());
    if (worker == nullptr || worker->info.state() == v1::LOST) {
      if (lost == nullptr) {
        lost = &t;
        lost_worker = worker;
      }
      continue;
    }
    stopped = false;
  }
  // A rank on a vanished worker names the cause better than the errors of its peers.
  const bool relabel = lost != nullptr && CauseRank(current.reason()) < CauseRank(v1::WORKER_LOST);
  const bool waiting = !stopped && now - entry.restarting_since < options_.restart_stop_hold;
  if (waiting && !relabel) return;
  if (!waiting && !relabel) RecordDiagnosisLocked(entry);
  v1::Job updated = entry.job;
  v1::Restart& r = *updated.mutable_restarts(updated.restarts_size() - 1);
  if (relabel) {
    r.set_reason(lost->stop_deadline_unix_ms() > 0 ? v1::PREEMPTED : v1::WORKER_LOST);
    r.set_message(absl::StrCat(TaskName(*lost), " lost: worker ", lost->worker_id(), " lost"));
    // The cause is known only now, when the lease ran out; it happened by the last heartbeat at
    // the latest.
    if (lost_worker != nullptr) {
      r.set_failed_unix_ms(std::min(r.failed_unix_ms(), lost_worker->info.last_seen_unix_ms()));
    }
    r.set_detected_unix_ms(absl::ToUnixMillis(now));
  }
  if (waiting) {
    // Recorded now, so that the detection time is when the cause was found.
    CommitLocked(entry, std::move(updated), {}, {}).IgnoreError();
    return;
  }
  // The cause may have changed kind while the old ranks stopped.
  if (std::optional<std::string> spent = BudgetSpent(updated, r.reason(), 0); spent.has_value()) {
    const std::string reason = r.message() + *spent;
    TransitionLocked(entry, std::move(updated), v1::FAILED, reason, {}).IgnoreError();
    return;
  }
  // Restarts in a row whose attempt never got to a step back off further and further.
  const absl::Duration delay =
      RestartBackoff(updated, options_.restart_backoff, options_.restart_backoff_max,
                     absl::Uniform(jitter_, 0.5, 1.0));
  r.set_backoff_ms(absl::ToInt64Milliseconds(delay));
  updated.set_next_attempt_unix_ms(absl::ToUnixMillis(now + delay));
  const std::string reason =
      delay > absl::ZeroDuration()
          ? absl::StrCat("restart ", updated.restarts_size(), " (", RestartReasonName(r.reason()),
                         "): next attempt in ", absl::FormatDuration(delay), " (backoff)")
          : absl::StrCat("restart ", updated.restarts_size(), " (", RestartReasonName(r.reason()),
                         "): ready for the next attempt");
  TransitionLocked(entry, std::move(updated), v1::PENDING, reason, {}).IgnoreError();
}

void JobManager::RecordDiagnosisLocked(JobEntry& entry) {
  const v1::Restart& last = entry.job.restarts(entry.job.restarts_size() - 1);
  if (!last.diagnosis().empty() ||
      (last.reason() != v1::HANG && last.reason() != v1::INFRASTRUCTURE)) {
    return;
  }
  std::vector<RankView> views;
  for (const v1::TaskInfo& t : entry.job.tasks()) {
    if (t.generation() != last.generation() || t.role() == v1::TASK_ROLE_SHARD) continue;
    RankView& view = views.emplace_back();
    view.rank = t.rank();
    view.worker_id = t.worker_id();
    auto it = entry.ended_ranks.find(t.rank());
    if (it != entry.ended_ranks.end() && it->second.generation == t.generation()) {
      view.record = &it->second.record;
    }
  }
  const std::string diagnosis = DiagnoseHang(views, last.reason() == v1::HANG);
  if (diagnosis.empty()) return;
  v1::Job updated = entry.job;
  updated.mutable_restarts(updated.restarts_size() - 1)->set_diagnosis(diagnosis);
  v1::JobEvent event;
  event.set_time_unix_ms(absl::ToUnixMillis(clock_.Now()));
  event.set_from(updated.state());
  event.set_to(updated.state());
  event.set_reason(absl::StrCat("diagnosis: ", diagnosis));
  *updated.add_events() = event;
  updated.set_updated_unix_ms(event.time_unix_ms());
  LogWarning("job ", updated.id(), " attempt ", last.generation(), ": ", event.reason());
  CommitLocked(entry, std::move(updated), {event}, {}).IgnoreError();
}

void JobManager::EnforceRuntimeLocked() {
  const int64_t now_ms = absl::ToUnixMillis(clock_.Now());
  std::vector<std::string> over;
  for (int64_t seq : table_.attempts()) {
    const JobEntry* entry = table_.FindBySeq(seq);
    if (entry == nullptr) continue;
    const int64_t limit_s = entry->job.spec().max_runtime_seconds();
    const int64_t started = entry->job.started_unix_ms();
    // Time spent restarting or waiting for capacity after a restart counts too.
    if (limit_s <= 0 || started <= 0) continue;
    if (now_ms - started >= limit_s * 1000) over.push_back(entry->job.id());
  }
  for (const std::string& id : over) {
    JobEntry* entry = FindLocked(id);
    const std::string reason =
        absl::StrCat("exceeded max_runtime ",
                     absl::FormatDuration(absl::Seconds(entry->job.spec().max_runtime_seconds())));
    TransitionLocked(*entry, entry->job, v1::FAILED, reason, {}).IgnoreError();
  }
}

SchedJob JobManager::SchedJobLocked(const JobEntry& entry) const {
  SchedJob job;
  job.id = entry.job.id();
  job.priority = entry.job.spec().priority();
  job.seq = entry.seq;
  RankRange(entry.job.spec(), job.min_ranks, job.max_ranks);
  job.batch_size = entry.job.spec().batch_size();
  job.slots_per_rank = SlotsPerRank(entry.job.spec());
  job.gpus_per_rank = GpusPerRank(entry.job.spec());
  job.memory_per_rank = MemoryPerRank(entry.job.spec());
  if (entry.job.spec().pipeline().memory_bytes_size() > 0) {
    for (int rank = 0; rank < job.max_ranks; ++rank) {
      job.rank_memory.push_back(MemoryOfRank(entry.job.spec(), rank));
    }
  }
  job.shards = ShardCount(entry.job.spec());
  job.slots_per_shard = SlotsPerShard(entry.job.spec());
  job.memory_per_shard = MemoryPerShard(entry.job.spec());
  job.queue = entry.job.spec().queue();
  job.preemptible = !entry.job.spec().has_preemptible() || entry.job.spec().preemptible();
  job.runtime_ms = RunBoundMs(entry.job, absl::ToUnixMillis(clock_.Now()));
  if (entry.job.has_model_needs()) {
    job.runtimes.emplace();
    for (const auto& [key, runtime] : runtimes_) {
      if (RuntimeLacks(entry.job.model_needs(), *runtime).empty()) {
        job.runtimes->push_back(runtime->key);
      }
    }
    // Why it waits is spelled out only when no ready worker can run it (the only time the
    // scheduler says it): usually the first ready worker with one of these runtimes ends the
    // search, so a long queue does not compare every job with every worker on every pass.
    std::vector<const WorkerRecord*> ready;
    bool runs = false;
    for (const WorkerRecord* w : workers_.All()) {
      if (w->info.state() != v1::READY || w->unreachable()) continue;
      if (w->runtime != nullptr && std::find(job.runtimes->begin(), job.runtimes->end(),
                                             w->runtime->key) != job.runtimes->end()) {
        runs = true;
        break;
      }
      ready.push_back(w);
    }
    if (!runs) job.runtime_reason = NoWorkerRuns(entry.job.model_needs(), ready);
  }
  return job;
}

void JobManager::ClusterChangedLocked() {
  cluster_epoch_++;
  schedule_all_ = true;
}

}  // namespace trainyard
