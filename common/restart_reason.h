#ifndef TRAINYARD_COMMON_RESTART_REASON_H_
#define TRAINYARD_COMMON_RESTART_REASON_H_

#include <string>

#include "absl/strings/ascii.h"
#include "trainyard/v1/job.pb.h"

namespace trainyard {

// The one name of a restart reason, in events, `describe` and the `reason` label of
// trainyard_restarts_total: preempted, worker_lost, hang, infrastructure, failure ("unknown" for
// an unset reason).
inline std::string RestartReasonName(trainyard::v1::RestartReason reason) {
  if (reason == trainyard::v1::RESTART_REASON_UNSPECIFIED ||
      !trainyard::v1::RestartReason_IsValid(reason)) {
    return "unknown";
  }
  return absl::AsciiStrToLower(trainyard::v1::RestartReason_Name(reason));
}

// Which restart budget a reason draws on: restart.max_failures for the user's code (true),
// restart.max_preemptions for everything the user's code is not to blame for.
inline bool OnFailureBudget(trainyard::v1::RestartReason reason) {
  return reason == trainyard::v1::FAILURE;
}

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_RESTART_REASON_H_
