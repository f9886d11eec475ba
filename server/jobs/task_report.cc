#include "server/jobs/task_report.h"

#include "absl/strings/str_cat.h"
#include "common/exit_codes.h"
#include "server/jobs/job_manager_internal.h"
#include "server/jobs/restart_policy.h"

namespace trainyard {

using job_manager_internal::IsShard;
using job_manager_internal::TaskFailureReason;
using job_manager_internal::TaskName;
using job_manager_internal::TaskSucceeded;
using Kind = TaskReportOutcome::Kind;

TaskReportOutcome DecideTaskReport(const v1::Job& job, const v1::TaskInfo& task) {
  TaskReportOutcome out;
  const bool current_attempt = (job.state() == v1::SCHEDULED || job.state() == v1::RUNNING ||
                                job.state() == v1::RESTARTING) &&
                               task.generation() == job.generation();
  if (!current_attempt) return out;
  switch (task.state()) {
    case v1::TASK_RUNNING:
      if (job.state() == v1::SCHEDULED) {
        out.kind = Kind::kRunning;
        out.reason = absl::StrCat(TaskName(task), " running on ", task.worker_id());
        out.started = true;
      }
      return out;
    case v1::TASK_EXITED:
    case v1::TASK_FAILED_TO_START:
    case v1::TASK_STOPPED:
      break;
    default:
      return out;
  }
  if (!TaskSucceeded(task)) {
    out.restart_reason = ClassifyTaskEnd(task);
    out.reason = TaskFailureReason(task);
    // Over its memory limit: the same limit would stop it again, so the job fails at once.
    out.user_error = out.restart_reason == v1::OUT_OF_MEMORY ||
                     (task.state() == v1::TASK_EXITED && task.exit_code() == kExitUserError &&
                      out.restart_reason == v1::FAILURE);
    if (job.state() != v1::RESTARTING) {
      out.kind = Kind::kEndAttempt;
      return out;
    }
    // The attempt is already over: a rank that failed on its own (not one we stopped) may name
    // the cause better than the first report did.
    out.kind = Kind::kRestartingTaskEnded;
    out.relabel =
        task.state() == v1::TASK_EXITED && job.restarts_size() > 0 &&
        CauseRank(out.restart_reason) > CauseRank(job.restarts(job.restarts_size() - 1).reason());
    return out;
  }
  int ranks = 0;
  int shards = 0;
  bool all_done = true;
  for (const v1::TaskInfo& t : job.tasks()) {
    if (t.generation() != job.generation()) continue;
    (IsShard(t) ? shards : ranks)++;
    all_done = all_done && TaskSucceeded(t);
  }
  if (all_done) {
    out.kind = Kind::kSucceeded;
    out.reason = ranks == 1 ? std::string("training finished: rank 0")
                            : absl::StrCat("training finished: all ", ranks, " ranks");
    if (shards > 0)
      absl::StrAppend(&out.reason, " and ", shards, shards == 1 ? " shard" : " shards");
    absl::StrAppend(&out.reason, " exited with code 0");
  } else if (job.state() == v1::SCHEDULED) {
    out.kind = Kind::kRunning;
    out.reason = absl::StrCat(TaskName(task), " finished");
  } else if (job.state() == v1::RESTARTING) {
    out.kind = Kind::kRestartingTaskEnded;
  }
  return out;
}

}  // namespace trainyard
