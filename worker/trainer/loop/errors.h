#ifndef TRAINYARD_WORKER_TRAINER_LOOP_ERRORS_H_
#define TRAINYARD_WORKER_TRAINER_LOOP_ERRORS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace trainyard::trainer {

// Maps the status a run ended with to the process exit code (common/exit_codes.h):
// INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION, OUT_OF_RANGE, UNIMPLEMENTED -> user error;
// UNAVAILABLE, DEADLINE_EXCEEDED, ABORTED, RESOURCE_EXHAUSTED, DATA_LOSS -> infrastructure;
// OK -> 0; anything else -> internal.
int ExitCodeForStatus(const absl::Status& status);

// Writes `message` (made one line) to {dir}/termination-message. Best effort: failures are
// logged, never returned.
void WriteTerminationMessage(absl::string_view dir, absl::string_view message);

}  // namespace trainyard::trainer

#endif  // TRAINYARD_WORKER_TRAINER_LOOP_ERRORS_H_
