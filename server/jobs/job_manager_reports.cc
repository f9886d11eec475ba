// What trainers report: progress (and the recovery it measures), checkpoint commits, the
// exported model and events; an agent's preemption notice; rendezvous.

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/byte_size.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/restart_reason.h"
#include "common/rpc/credentials.h"
#include "common/sha256.h"
#include "common/spec/job_spec.h"
#include "common/storage/checkpoint_layout.h"
#include "common/storage/uri.h"
#include "server/jobs/capacity.h"
#include "server/jobs/checkpoint_registry.h"
#include "server/jobs/job_manager.h"
#include "server/jobs/job_manager_internal.h"
#include "server/jobs/restart_policy.h"
#include "server/jobs/task_report.h"
#include "server/lifecycle/job_state.h"
#include "server/scheduling/scheduler.h"

namespace trainyard {

using job_manager_internal::LastEventTime;
using job_manager_internal::RanksOf;
using job_manager_internal::TaskName;

absl::Status JobManager::ReportProgress(absl::string_view job_id, int64_t generation, int rank,
                                        const v1::JobProgress& progress) {
  v1::JobProgress stored;
  uint64_t report = 0;
  std::shared_ptr<GroupCommitter::Ticket> ticket;
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<JobEntry*> fenced = FencedLocked(job_id, generation);
    if (!fenced.ok()) return fenced.status();
    JobEntry& entry = **fenced;
    const absl::Time now = clock_.Now();
    // A program that reports no steps (steps_unknown) has no stall clock.
    if (!progress.steps_unknown() && progress.step() > entry.last_step_seen) {
      entry.last_step_seen = progress.step();
      entry.last_step_change = now;
    }
    if (entry.job.state() == v1::RESTARTING) {
      // The ended attempt's last word (its final step) tells how many steps the restart loses.
      v1::Restart* last = entry.job.mutable_restarts(entry.job.restarts_size() - 1);
      if (progress.step() > last->last_step()) last->set_last_step(progress.step());
    }
    // Rank 0 speaks for the job; other ranks only fill in while rank 0 lags behind. Compared
    // with the latest report queued, which may not be written yet.
    const v1::JobProgress& latest =
        entry.progress_reports > 0 ? entry.queued_progress : entry.job.progress();
    if (rank != 0 && progress.step() < latest.step() &&
        latest.attempt_start_step() == progress.attempt_start_step()) {
      return absl::OkStatus();
    }
    stored = progress;
    stored.set_updated_unix_ms(absl::ToUnixMillis(now));
    entry.queued_progress = stored;
    report = ++entry.progress_reports;
    // Written before it is acknowledged or shown, in a transaction shared with whatever else is
    // being written meanwhile (other jobs' reports, submissions).
    StoreMutation m;
    m.progress.emplace_back(std::string(job_id), stored);
    v1::MetricPoint& point =
        m.metric_points.emplace_back(std::string(job_id), v1::MetricPoint()).second;
    point.set_unix_ms(stored.updated_unix_ms());
    *point.mutable_progress() = stored;
    for (const MetricPointKey& key :
         entry.history.Add({stored.updated_unix_ms(), stored.step()}, options_.metric_history)) {
      m.removed_metric_points.emplace_back(std::string(job_id), key.unix_ms);
    }
    ticket = committer_.Enqueue(std::move(m));
  }
  const absl::Status written = committer_.Wait(ticket);
  absl::MutexLock lock(&mu_);
  if (!written.ok()) return written;
  JobEntry* entry = FindLocked(job_id);
  // A later report of this job that was written first stays.
  if (entry == nullptr || report <= entry->progress_applied) return absl::OkStatus();
  entry->progress_applied = report;
  *entry->job.mutable_progress() = stored;
  const absl::Time now = clock_.Now();
  if (options_.event_sink != nullptr) options_.event_sink->OnProgress(job_id, stored.step(), now);
  entry->version++;
  changed_.SignalAll();
  if (entry->job.restarts_size() > 0 && entry->job.generation() == generation) {
    const v1::Restart& last = entry->job.restarts(entry->job.restarts_size() - 1);
    if (!last.recovered() && last.generation() < generation &&
        (entry->job.state() == v1::RUNNING || entry->job.state() == v1::SCHEDULED)) {
      RecordRecoveryLocked(*entry, stored);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::MetricPoint>> JobManager::MetricHistoryOf(
    absl::string_view job_id, int64_t after_unix_ms) const {
  return store_->LoadMetricHistory(job_id, after_unix_ms);
}

void JobManager::RecordRecoveryLocked(JobEntry& entry, const v1::JobProgress& progress) {
  const absl::Time now = clock_.Now();
  v1::Job updated = entry.job;
  v1::Restart& r = *updated.mutable_restarts(updated.restarts_size() - 1);
  const absl::Time failed = absl::FromUnixMillis(r.failed_unix_ms());
  const absl::Time detected = absl::FromUnixMillis(r.detected_unix_ms());
  absl::Time placed = LastEventTime(updated, v1::SCHEDULED);
  absl::Time running = LastEventTime(updated, v1::RUNNING);
  if (placed < detected) placed = detected;
  if (running < placed) running = now;
  auto seconds = [](absl::Time from, absl::Time to) {
    return std::max(0.0, absl::ToDoubleSeconds(to - from));
  };
  r.set_recovered(true);
  r.set_recovered_unix_ms(absl::ToUnixMillis(now));
  // A program that reports no steps: how many were lost is not known, and there is no first
  // step to time (its recovery ends when it started).
  const bool unknown = progress.steps_unknown();
  r.set_resumed_step(progress.attempt_start_step());
  r.set_steps_lost_unknown(unknown);
  r.set_steps_lost(unknown ? 0
                           : std::max<int64_t>(0, r.last_step() - progress.attempt_start_step()));
  r.set_detection_seconds(seconds(failed, detected));
  r.set_scheduling_seconds(seconds(detected, placed));
  r.set_start_seconds(seconds(placed, running));
  r.set_rendezvous_seconds(std::max(0.0, progress.rendezvous_seconds()));
  r.set_checkpoint_load_seconds(std::max(0.0, progress.checkpoint_load_seconds()));
  const double before_first_step = r.scheduling_seconds() + r.start_seconds() +
                                   r.rendezvous_seconds() + r.checkpoint_load_seconds();
  r.set_recovery_seconds(unknown ? before_first_step : seconds(detected, now));
  r.set_first_step_seconds(std::max(0.0, r.recovery_seconds() - before_first_step));
  v1::JobEvent event;
  event.set_time_unix_ms(absl::ToUnixMillis(now));
  event.set_from(updated.state());
  event.set_to(updated.state());
  event.set_reason(absl::StrFormat(
      "recovered from %s: attempt %d resumed at step %d, %s, %s %.1fs after detection (detection "
      "%.1fs, scheduling %.1fs, start %.1fs, rendezvous %.1fs, checkpoint load %.1fs, first step "
      "%.1fs)",
      RestartReasonName(r.reason()), updated.generation(), r.resumed_step(),
      r.steps_lost_unknown() ? "steps lost unknown (the program reports no steps)"
                             : absl::StrCat(r.steps_lost(), " steps lost"),
      r.steps_lost_unknown() ? "the program started" : "first step", r.recovery_seconds(),
      r.detection_seconds(), r.scheduling_seconds(), r.start_seconds(), r.rendezvous_seconds(),
      r.checkpoint_load_seconds(), r.first_step_seconds()));
  *updated.add_events() = event;
  const v1::Restart recovered = r;
  if (absl::Status s = CommitLocked(entry, std::move(updated), {event}, {}); !s.ok()) {
    return;  // the next report tries again
  }
  LogInfo("job ", entry.job.id(), ": ", event.reason());
  if (options_.event_sink != nullptr) options_.event_sink->OnRecovered(entry.job, recovered);
}

absl::StatusOr<std::vector<std::string>> JobManager::CommitCheckpoint(
    const v1::CommitCheckpointRequest& request) {
  if (request.step() < 0) return absl::InvalidArgumentError("step: must be >= 0");
  absl::MutexLock lock(&mu_);
  absl::StatusOr<JobEntry*> fenced =
      FencedLocked(request.job_id(), request.generation(), /*cancelled_ok=*/true);
  if (!fenced.ok()) return fenced.status();
  JobEntry& entry = **fenced;
  StoredCheckpoint added;
  added.checkpoint.set_job_id(entry.job.id());
  added.checkpoint.set_step(request.step());
  // The trainer writes step folders where the layout puts them; retention hands this URI back for
  // deletion, so it is the job's own by construction.
  added.checkpoint.set_uri(CheckpointStepUri(entry.job.checkpoint_uri(), request.step()));
  added.checkpoint.set_size_bytes(request.size_bytes());
  added.checkpoint.set_created_unix_ms(absl::ToUnixMillis(clock_.Now()));
  added.checkpoint.set_generation(request.generation());
  CheckpointCommitPlan plan =
      PlanCheckpointCommit(entry.checkpoints, added, entry.job.spec().checkpoint().keep_last());
  if (plan.retry) return plan.retired;
  StoreMutation extra;
  extra.checkpoints = std::move(plan.upserts);
  extra.removed_checkpoints = std::move(plan.removals);
  v1::Job updated = entry.job;
  updated.set_committed_step(std::max(updated.committed_step(), request.step()));
  updated.set_updated_unix_ms(absl::ToUnixMillis(clock_.Now()));
  if (absl::Status s = CommitLocked(entry, std::move(updated), {}, {}, std::move(extra)); !s.ok()) {
    return s;
  }
  entry.checkpoints = std::move(plan.records);
  if (options_.event_sink != nullptr) {
    options_.event_sink->OnCheckpointCommitted(
        entry.job.id(), request.step(), clock_.Now(),
        request.save_started_unix_ms() > 0 ? absl::FromUnixMillis(request.save_started_unix_ms())
                                           : absl::InfinitePast());
  }
  return plan.retired;
}

absl::Status JobManager::ReportModel(absl::string_view job_id, int64_t generation,
                                     absl::string_view uri) {
  if (uri.empty()) return absl::InvalidArgumentError("uri: required");
  absl::MutexLock lock(&mu_);
  absl::StatusOr<JobEntry*> fenced = FencedLocked(job_id, generation);
  if (!fenced.ok()) return fenced.status();
  v1::Job updated = (*fenced)->job;
  updated.set_model_uri(std::string(uri));
  return CommitLocked(**fenced, std::move(updated), {}, {});
}

absl::Status JobManager::ReportEvent(absl::string_view job_id, int64_t generation,
                                     absl::string_view message) {
  if (message.empty()) return absl::InvalidArgumentError("message: required");
  absl::MutexLock lock(&mu_);
  absl::StatusOr<JobEntry*> fenced = FencedLocked(job_id, generation);
  if (!fenced.ok()) return fenced.status();
  v1::Job updated = (*fenced)->job;
  v1::JobEvent event;
  event.set_time_unix_ms(absl::ToUnixMillis(clock_.Now()));
  event.set_from(updated.state());
  event.set_to(updated.state());
  event.set_reason(absl::StrCat("warning: ", message.substr(0, 1024)));
  *updated.add_events() = event;
  updated.set_updated_unix_ms(event.time_unix_ms());
  LogWarning("job ", job_id, ": ", event.reason());
  return CommitLocked(**fenced, std::move(updated), {event}, {});
}

absl::Status JobManager::ReportPreemption(const v1::ReportPreemptionRequest& request) {
  if (request.worker_id().empty()) return absl::InvalidArgumentError("worker_id: required");
  absl::MutexLock lock(&mu_);
  const WorkerRecord* record = workers_.Find(request.worker_id());
  if (record == nullptr) {
    return absl::NotFoundError(absl::StrCat("worker '", request.worker_id(), "' unknown"));
  }
  if (record->info.state() == v1::LOST) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker '", request.worker_id(), "' is LOST: register again"));
  }
  const absl::Time now = clock_.Now();
  // A deadline in the past or absent still asks for the fastest stop.
  const int64_t deadline_ms =
      std::max<int64_t>(request.deadline_unix_ms(), absl::ToUnixMillis(now));
  // DRAINING and the stop deadlines of every rank on the worker are one transaction.
  BeginUnitLocked();
  if (record->info.state() != v1::DRAINING) {
    SaveWorkerLocked(request.worker_id());
    workers_.SetState(request.worker_id(), v1::DRAINING).IgnoreError();  // known: found above
    ClusterChangedLocked();
    PersistWorkerLocked(request.worker_id()).IgnoreError();  // deferred to EndUnitLocked
    AfterCommitLocked([id = request.worker_id(), source = request.source(),
                       left = absl::FromUnixMillis(deadline_ms) - now] {
      LogWarning("worker ", id, " is being preempted (", source, "): DRAINING, deadline in ",
                 absl::FormatDuration(absl::Trunc(left, absl::Milliseconds(100))));
    });
  }
  std::set<std::string> job_ids;
  for (const auto& [entry, task] : ActiveTasksLocked(request.worker_id())) {
    job_ids.insert(entry->job.id());
  }
  const std::string source = request.source().empty() ? "notice" : request.source();
  for (const std::string& job_id : job_ids) {
    JobEntry* entry = FindLocked(job_id);
    if (entry == nullptr) continue;
    const std::string message = request.message().substr(0, 256);
    const std::string reason = absl::StrFormat(
        "preemption notice for worker %s (%s%s%s): every rank saves at the next step they agree "
        "on and stops within %.1fs; the job then restarts elsewhere",
        request.worker_id(), source, message.empty() ? "" : ": ", message,
        absl::ToDoubleSeconds(absl::FromUnixMillis(deadline_ms) - now));
    if (!AskToStopLocked(*entry, deadline_ms, reason)) continue;  // asked already
    entry->preemption_notice = absl::StrCat("worker ", request.worker_id(), " (", source, ")");
  }
  if (absl::Status s = EndUnitLocked(); !s.ok()) return s;
  RequestTickLocked();
  changed_.SignalAll();
  return absl::OkStatus();
}

absl::Status JobManager::RendezvousSet(absl::string_view job_id, int64_t generation,
                                       absl::string_view key, std::string value) {
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<JobEntry*> fenced = FencedLocked(job_id, generation);
    if (!fenced.ok()) return fenced.status();
  }
  // An attempt that ends between the check and the call is refused by the store itself.
  return rendezvous_.Set(job_id, generation, key, std::move(value));
}

absl::StatusOr<std::string> JobManager::RendezvousGet(absl::string_view job_id, int64_t generation,
                                                      absl::string_view key, absl::Duration wait) {
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<JobEntry*> fenced = FencedLocked(job_id, generation);
    if (!fenced.ok()) return fenced.status();
  }
  return rendezvous_.Get(job_id, generation, key, std::min(wait, options_.max_rendezvous_wait));
}

}  // namespace trainyard
