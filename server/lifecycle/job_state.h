#ifndef TRAINYARD_SERVER_LIFECYCLE_JOB_STATE_H_
#define TRAINYARD_SERVER_LIFECYCLE_JOB_STATE_H_

// Room lifecycle/: the job's state machine (which moves are legal, what a final state is),
// pure and below every other room of the coordinator; it calls nothing of theirs.

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "trainyard/v1/job.pb.h"

namespace trainyard {

// The job state machine (docs/architecture.md, "Job states"):
//   PENDING    -> SCHEDULED | CANCELLED | FAILED
//   SCHEDULED  -> RUNNING | SUCCEEDED | FAILED | CANCELLED | RESTARTING
//   RUNNING    -> SUCCEEDED | FAILED | CANCELLED | RESTARTING
//   RESTARTING -> PENDING | FAILED | CANCELLED
// SUCCEEDED, FAILED and CANCELLED are final. SCHEDULED -> SUCCEEDED covers ranks that finish
// before any of them was seen running.

bool IsFinalJobState(trainyard::v1::JobState state);

// A task that exited, failed to start or was stopped: it runs no more.
bool TaskEnded(trainyard::v1::TaskState state);

// OK if `from -> to` is legal, FAILED_PRECONDITION naming both states otherwise.
absl::Status CheckJobTransition(trainyard::v1::JobState from, trainyard::v1::JobState to);

// Moves `job` to `to` at `now`: sets state, reason, updated/started/finished times and appends
// the event, which it also returns. FAILED_PRECONDITION (job untouched) for an illegal move.
absl::StatusOr<trainyard::v1::JobEvent> TransitionJob(trainyard::v1::Job& job,
                                                      trainyard::v1::JobState to,
                                                      absl::string_view reason, absl::Time now);

// "RUNNING", "PENDING", ...
std::string JobStateName(trainyard::v1::JobState state);

}  // namespace trainyard

#endif  // TRAINYARD_SERVER_LIFECYCLE_JOB_STATE_H_
