#ifndef TRAINYARD_SERVER_JOBS_RESTART_POLICY_H_
#define TRAINYARD_SERVER_JOBS_RESTART_POLICY_H_

#include <optional>
#include <string>

#include "absl/time/time.h"
#include "trainyard/v1/job.pb.h"

namespace trainyard {

// The restart policy as pure functions of a job's record: what a rank's end means, which cause
// names an attempt's end best, whether a restart budget is spent and how long a restart waits.
// The JobManager applies them; they hold no state.

// What a rank's end (not a success) means: a rank told to save for a preemption is PREEMPTED
// however it ends; a trainer the worker cannot start is a FAILURE (retrying would hide a bad
// installation); a rank the agent stopped unasked, or one that exited with the infrastructure
// code or for SIGTERM, is INFRASTRUCTURE; anything else is the user's FAILURE.
trainyard::v1::RestartReason ClassifyTaskEnd(const trainyard::v1::TaskInfo& task);

// How specific a cause is, higher is better: a rank that exits with an infrastructure error is
// usually the consequence of something else (a peer that died, a worker that vanished) that is
// found out later and then names the restart instead.
int CauseRank(trainyard::v1::RestartReason reason);

// nullopt while the job's restarts (plus `extra` more of `reason`'s kind) stay within the budget
// of `reason`'s kind (restart.max_failures, max_infrastructure_errors, max_preemptions);
// otherwise what to add to the cause when the job fails, e.g. " (4 failures; max_failures is
// 3)", or "" when max_failures is 0 and the cause says it all.
std::optional<std::string> BudgetSpent(const trainyard::v1::Job& job,
                                       trainyard::v1::RestartReason reason, int extra);

// How long the restart now recorded last in `job` waits before the next attempt: none when the
// scheduler preempted it, or when the attempt that ended got further than the step it started
// from (job.progress()), so a lost machine costs no waiting; otherwise restarts in a row whose
// attempt never got to a step back off exponentially, the n-th waiting jitter * min(base * 2^(n-1),
// max) with `jitter` drawn from [0.5, 1]; to the millisecond. Zero when `base` is zero.
absl::Duration RestartBackoff(const trainyard::v1::Job& job, absl::Duration base,
                              absl::Duration max, double jitter);

}  // namespace trainyard

#endif  // TRAINYARD_SERVER_JOBS_RESTART_POLICY_H_
