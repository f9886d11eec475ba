#ifndef TRAINYARD_COMMON_RESTART_REASON_H_
#define TRAINYARD_COMMON_RESTART_REASON_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/ascii.h"
#include "trainyard/v1/job.pb.h"

namespace trainyard {

// The one name of a restart reason, in events, `describe` and the `reason` label of
// trainyard_restarts_total: preempted, worker_lost, hang, infrastructure, failure, out_of_memory,
// scheduler_preempted ("unknown" for an unset reason).
inline std::string RestartReasonName(trainyard::v1::RestartReason reason) {
  if (reason == trainyard::v1::RESTART_REASON_UNSPECIFIED ||
      !trainyard::v1::RestartReason_IsValid(reason)) {
    return "unknown";
  }
  return absl::AsciiStrToLower(trainyard::v1::RestartReason_Name(reason));
}

// The budgets restarts draw on, one per kind of cause.
enum class RestartBudget {
  kFailures,        // restart.max_failures: the user's code failed
  kInfrastructure,  // restart.max_infrastructure_errors: hangs, object store, coordinator
  kPreemptions,     // restart.max_preemptions: the machine went away
  kNone,            // the scheduler stopped it for another job: counts against nothing
};

// Default of restart.max_infrastructure_errors: enough for passing trouble, few enough that a
// job that can never work (wrong object-store credentials) fails within minutes, not never.
inline constexpr int32_t kDefaultMaxInfrastructureErrors = 10;

inline RestartBudget BudgetOf(trainyard::v1::RestartReason reason) {
  switch (reason) {
    case trainyard::v1::PREEMPTED:
    case trainyard::v1::WORKER_LOST:
      return RestartBudget::kPreemptions;
    case trainyard::v1::HANG:
    case trainyard::v1::INFRASTRUCTURE:
      return RestartBudget::kInfrastructure;
    case trainyard::v1::SCHEDULER_PREEMPTED:
      return RestartBudget::kNone;
    default:
      return RestartBudget::kFailures;
  }
}

// The budget's field name ("restart.max_failures") and its limit for `policy`; nullopt =
// unlimited.
inline const char* BudgetField(RestartBudget budget) {
  switch (budget) {
    case RestartBudget::kFailures:
      return "restart.max_failures";
    case RestartBudget::kInfrastructure:
      return "restart.max_infrastructure_errors";
    default:
      return "restart.max_preemptions";
  }
}
inline std::optional<int32_t> BudgetLimit(const trainyard::v1::RestartPolicy& policy,
                                          RestartBudget budget) {
  switch (budget) {
    case RestartBudget::kFailures:
      return policy.max_failures();
    case RestartBudget::kInfrastructure:
      return policy.has_max_infrastructure_errors() ? policy.max_infrastructure_errors()
                                                    : kDefaultMaxInfrastructureErrors;
    case RestartBudget::kNone:
      return std::nullopt;
    default:
      if (!policy.has_max_preemptions()) return std::nullopt;
      return policy.max_preemptions();
  }
}

// How many of `job`'s restarts drew on `budget`, those whose records were dropped included.
inline int RestartsOn(const trainyard::v1::Job& job, RestartBudget budget) {
  int n = budget == RestartBudget::kFailures         ? job.dropped_failure_restarts()
          : budget == RestartBudget::kInfrastructure ? job.dropped_infrastructure_restarts()
          : budget == RestartBudget::kPreemptions    ? job.dropped_preemption_restarts()
                                                     : 0;
  for (const trainyard::v1::Restart& r : job.restarts()) n += BudgetOf(r.reason()) == budget;
  return n;
}

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_RESTART_REASON_H_
