#include "server/jobs/restart_policy.h"

#include <signal.h>

#include "absl/strings/str_cat.h"
#include "common/backoff.h"
#include "common/exit_codes.h"
#include "common/restart_reason.h"

namespace trainyard {

v1::RestartReason ClassifyTaskEnd(const v1::TaskInfo& t) {
  // Killed for memory: the task's own doing, whatever else was asked of it meanwhile.
  if (t.out_of_memory()) return v1::OUT_OF_MEMORY;
  // Its GPU failed under it: the machine's doing, as if the worker had been lost.
  if (!t.gpu_fault().empty()) return v1::WORKER_LOST;
  if (t.stop_deadline_unix_ms() > 0) return v1::PREEMPTED;
  switch (t.state()) {
    case v1::TASK_FAILED_TO_START:
      return v1::FAILURE;
    case v1::TASK_STOPPED:  // the agent stopped it without being asked
      return v1::INFRASTRUCTURE;
    default:
      break;
  }
  if (t.signal() == SIGTERM || t.exit_code() == kExitStoppedBySignal ||
      t.exit_code() == kExitInfrastructure) {
    return v1::INFRASTRUCTURE;
  }
  return v1::FAILURE;  // user error, internal error, killed by a signal nobody sent on purpose
}

int CauseRank(v1::RestartReason reason) {
  switch (reason) {
    case v1::INFRASTRUCTURE:
      return 0;
    case v1::HANG:
      return 1;
    case v1::FAILURE:
    case v1::OUT_OF_MEMORY:
      return 2;
    default:
      return 3;  // PREEMPTED, WORKER_LOST
  }
}

std::optional<std::string> BudgetSpent(const v1::Job& job, v1::RestartReason reason, int extra) {
  const RestartBudget budget = BudgetOf(reason);
  const int used = RestartsOn(job, budget) + extra;
  const std::optional<int32_t> limit = BudgetLimit(job.spec().restart(), budget);
  if (!limit.has_value() || used <= *limit) return std::nullopt;
  if (budget == RestartBudget::kFailures && *limit == 0) return "";  // the cause says it all
  const char* what = budget == RestartBudget::kFailures         ? "failures"
                     : budget == RestartBudget::kInfrastructure ? "restarts for hangs or "
                                                                  "infrastructure errors"
                                                                : "restarts for preemptions or "
                                                                  "lost workers";
  return absl::StrCat(" (", used, " ", what, "; ", BudgetField(budget), " is ", *limit, ")");
}

absl::Duration RestartBackoff(const v1::Job& job, absl::Duration base, absl::Duration max,
                              double jitter) {
  if (base <= absl::ZeroDuration()) return absl::ZeroDuration();
  // Stopped by the scheduler, not by a fault: nothing to back off from.
  if (job.restarts_size() > 0 &&
      job.restarts(job.restarts_size() - 1).reason() == v1::SCHEDULER_PREEMPTED) {
    return absl::ZeroDuration();
  }
  // The progress is the ended attempt's only if it reported (the restart before it recovered).
  const int n = job.restarts_size();
  const bool reported = n < 2 || job.restarts(n - 2).recovered();
  if (reported && job.progress().step() > job.progress().attempt_start_step()) {
    return absl::ZeroDuration();
  }
  int in_a_row = 1;
  for (int i = job.restarts_size() - 2; i >= 0 && !job.restarts(i).recovered(); --i) in_a_row++;
  return absl::Trunc(BackoffBound(base, max, in_a_row - 1) * jitter, absl::Milliseconds(1));
}

}  // namespace trainyard
