// `trainyard debug`: what every running rank of a job is doing, asked of their agents.

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "server/jobs/hang_diagnosis.h"
#include "server/jobs/job_manager.h"
#include "server/lifecycle/job_state.h"

namespace trainyard {

namespace {
// A live job's ranks, read one by one, are always a few milliseconds apart: a rank is said to
// hold the others up only once they have waited on it this long.
constexpr absl::Duration kDebugHeldAtLeast = absl::Seconds(1);
}  // namespace

absl::StatusOr<v1::DebugJobResponse> JobManager::DebugJob(absl::string_view job_id, bool stacks,
                                                          absl::Duration wait) {
  absl::MutexLock lock(&mu_);
  const JobEntry* entry = FindLocked(job_id);
  if (entry == nullptr) {
    absl::StatusOr<StoredJobRecord> stored = store_->LoadJob(job_id);
    if (stored.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", job_id, " is ", JobStateName(stored->job.job.state()), ": no rank of it runs"));
    }
    return absl::NotFoundError(absl::StrCat("job '", job_id, "' not found"));
  }
  const v1::JobState state = entry->job.state();
  const int64_t generation = entry->job.generation();
  DebugAsks::Ask ask;
  ask.stacks = stacks;
  std::vector<v1::TaskInfo> ranks;
  if (state == v1::SCHEDULED || state == v1::RUNNING) {
    for (const v1::TaskInfo& t : entry->job.tasks()) {
      if (t.generation() != generation || t.role() == v1::TASK_ROLE_SHARD || TaskEnded(t.state()))
        continue;
      ranks.push_back(t);
      ask.tasks[t.worker_id()].push_back(t.task_id());
    }
  }
  if (ranks.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, " is ", JobStateName(state), ": no rank of it runs now",
                     state == v1::PENDING || state == v1::RESTARTING
                         ? " (`trainyard describe` shows why its last attempt ended)"
                         : ""));
  }
  std::vector<std::string> workers;
  for (const auto& [worker_id, tasks] : ask.tasks) workers.push_back(worker_id);
  const std::string id = debug_asks_.Add(std::move(ask));
  for (const std::string& worker_id : workers) {
    workers_.BumpVersion(worker_id);
    WakeWorkerLocked(worker_id);
  }
  // A blocking wait's deadline is real time by nature, as a Sync's is.
  const absl::Time deadline = RealClock::Get().Now() + wait;
  struct Waiting {
    JobManager* manager;
    const std::string* id;
  } waiting{this, &id};
  RealClock::Get().AwaitWithDeadline(mu_,
                                     absl::Condition(
                                         +[](Waiting* w) ABSL_NO_THREAD_SAFETY_ANALYSIS {
                                           return w->manager->shutdown_ ||
                                                  w->manager->debug_asks_.Done(*w->id);
                                         },
                                         &waiting),
                                     deadline);
  const DebugAsks::Ask* answered = debug_asks_.Find(id);
  v1::DebugJobResponse response;
  response.set_generation(generation);
  std::vector<RankView> views;
  for (const v1::TaskInfo& t : ranks) {
    v1::RankDebug* rank = response.add_ranks();
    rank->set_rank(t.rank());
    rank->set_task_id(t.task_id());
    rank->set_worker_id(t.worker_id());
    auto record = answered->records.find(t.task_id());
    if (record != answered->records.end()) {
      *rank->mutable_record() = record->second;
    } else if (answered->answered.count(t.worker_id()) > 0) {
      rank->set_error(absl::StrCat("worker ", t.worker_id(), " does not run it any more"));
    } else {
      rank->set_error(absl::StrCat("worker ", t.worker_id(), " did not answer within ",
                                   absl::FormatDuration(wait)));
    }
  }
  for (const v1::RankDebug& rank : response.ranks()) {
    views.push_back({rank.rank(), rank.worker_id(), rank.has_record() ? &rank.record() : nullptr});
  }
  response.set_diagnosis(DiagnoseHang(views, /*stalled=*/false, kDebugHeldAtLeast));
  debug_asks_.Remove(id);
  return response;
}

absl::Status JobManager::ReportDebug(const v1::ReportDebugRequest& answer) {
  absl::MutexLock lock(&mu_);
  return debug_asks_.Answer(answer);
}

}  // namespace trainyard
