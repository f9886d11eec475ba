#ifndef TRAINYARD_SERVER_JOBS_TASK_REPORT_H_
#define TRAINYARD_SERVER_JOBS_TASK_REPORT_H_

#include <string>

#include "trainyard/v1/job.pb.h"

namespace trainyard {

// What a rank's or shard's new status means for its job: the reconciliation's decision as a pure
// function, which the JobManager carries out.
struct TaskReportOutcome {
  enum class Kind {
    kRecordOnly,  // the task's record changes, the job's state does not
    kRunning,     // SCHEDULED -> RUNNING, for `reason`
    kSucceeded,   // every task of the attempt exited 0: SUCCEEDED, for `reason`
    kEndAttempt,  // the attempt ends (restart or fail on restart_reason's budget), cause `reason`
    // The job is already RESTARTING and the task ended; with `relabel`, it names the restart's
    // cause better than the report that ended the attempt (restart_reason, `reason`).
    kRestartingTaskEnded,
  };
  Kind kind = Kind::kRecordOnly;
  std::string reason;
  trainyard::v1::RestartReason restart_reason = trainyard::v1::RESTART_REASON_UNSPECIFIED;
  bool relabel = false;
  // With kEndAttempt: the rank exited with kExitUserError (a bad spec, data or model), which
  // another attempt would meet again.
  bool user_error = false;
  // The attempt started running now: its stall clock starts (not when a rank merely finished
  // before any was seen running).
  bool started = false;
};

// `job` is the job with the report already applied to `task` (one of its tasks). A report of an
// attempt other than the current one, or while the job is neither SCHEDULED, RUNNING nor
// RESTARTING, changes only the task.
TaskReportOutcome DecideTaskReport(const trainyard::v1::Job& job,
                                   const trainyard::v1::TaskInfo& task);

}  // namespace trainyard

#endif  // TRAINYARD_SERVER_JOBS_TASK_REPORT_H_
