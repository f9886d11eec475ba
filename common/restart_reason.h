#ifndef TRAINYARD_COMMON_RESTART_REASON_H_
#define TRAINYARD_COMMON_RESTART_REASON_H_

#include <string>

#include "trainyard/v1/job.pb.h"

namespace trainyard {

// The one name of a restart reason, in events, `describe` and the `reason` label of
// trainyard_restarts_total: preempted, worker_lost, hang, infrastructure, failure ("unknown" for
// an unset reason).
inline std::string RestartReasonName(trainyard::v1::RestartReason reason) {
  switch (reason) {
    case trainyard::v1::PREEMPTED:
      return "preempted";
    case trainyard::v1::WORKER_LOST:
      return "worker_lost";
    case trainyard::v1::HANG:
      return "hang";
    case trainyard::v1::INFRASTRUCTURE:
      return "infrastructure";
    case trainyard::v1::FAILURE:
      return "failure";
    default:
      return "unknown";
  }
}

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_RESTART_REASON_H_
