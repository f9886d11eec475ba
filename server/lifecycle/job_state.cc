#include "server/lifecycle/job_state.h"

#include "absl/strings/str_cat.h"

namespace trainyard {

using v1::JobState;

bool IsFinalJobState(JobState state) {
  return state == v1::SUCCEEDED || state == v1::FAILED || state == v1::CANCELLED;
}

bool TaskEnded(v1::TaskState state) {
  return state == v1::TASK_EXITED || state == v1::TASK_FAILED_TO_START || state == v1::TASK_STOPPED;
}

std::string JobStateName(JobState state) { return v1::JobState_Name(state); }

absl::Status CheckJobTransition(JobState from, JobState to) {
  bool ok = false;
  switch (from) {
    case v1::PENDING:
      ok = to == v1::SCHEDULED || to == v1::CANCELLED || to == v1::FAILED;
      break;
    case v1::SCHEDULED:
      ok = to == v1::RUNNING || to == v1::SUCCEEDED || to == v1::FAILED || to == v1::CANCELLED ||
           to == v1::RESTARTING;
      break;
    case v1::RUNNING:
      ok = to == v1::SUCCEEDED || to == v1::FAILED || to == v1::CANCELLED || to == v1::RESTARTING;
      break;
    case v1::RESTARTING:
      // SUCCEEDED: every rank of the ended attempt finished training before it could be stopped.
      ok = to == v1::PENDING || to == v1::FAILED || to == v1::CANCELLED || to == v1::SUCCEEDED;
      break;
    default:
      ok = false;
  }
  if (ok) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("illegal job transition ", JobStateName(from), " -> ", JobStateName(to)));
}

absl::StatusOr<v1::JobEvent> TransitionJob(v1::Job& job, JobState to, absl::string_view reason,
                                           absl::Time now) {
  if (absl::Status s = CheckJobTransition(job.state(), to); !s.ok()) return s;
  const int64_t now_ms = absl::ToUnixMillis(now);
  v1::JobEvent event;
  event.set_time_unix_ms(now_ms);
  event.set_from(job.state());
  event.set_to(to);
  event.set_reason(std::string(reason));
  job.set_state(to);
  job.set_reason(std::string(reason));
  job.set_updated_unix_ms(now_ms);
  if (to == v1::RUNNING && job.started_unix_ms() == 0) job.set_started_unix_ms(now_ms);
  if (IsFinalJobState(to)) job.set_finished_unix_ms(now_ms);
  *job.add_events() = event;
  return event;
}

}  // namespace trainyard
