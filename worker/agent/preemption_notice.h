#ifndef TRAINYARD_WORKER_AGENT_PREEMPTION_NOTICE_H_
#define TRAINYARD_WORKER_AGENT_PREEMPTION_NOTICE_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace trainyard {

// This machine is going away: it will be gone at `deadline`.
struct PreemptionNotice {
  std::string source;   // how the notice came: "SIGTERM", "gce" or "aws"
  absl::Time deadline;  // when the machine will be gone
  std::string message;  // what the notice said, for people reading the job's events
};

// Reads one answer of a cloud's preemption notice endpoint. The shape is recognised from the
// answer, not from the URL:
//  - GCE (`computeMetadata/v1/instance/preempted`): HTTP 200 with the body TRUE (source "gce",
//    deadline now + grace_period) or FALSE (no notice).
//  - AWS (`latest/meta-data/spot/instance-action`): HTTP 404 while nothing is scheduled (no
//    notice); HTTP 200 with a JSON object {"action": "terminate"|"stop"|"hibernate",
//    "time": RFC 3339} when a stop is (source "aws", deadline min(time, now + grace_period); a
//    notice whose time cannot be read gets now + grace_period).
// Returns nullopt when no preemption is announced, INVALID_ARGUMENT for an answer of neither
// shape (another status than 200 or 404 is UNAVAILABLE: the endpoint did not answer the
// question). Pure.
absl::StatusOr<std::optional<PreemptionNotice>> ParsePreemptionAnswer(int http_status,
                                                                      absl::string_view body,
                                                                      absl::Time now,
                                                                      absl::Duration grace_period);

}  // namespace trainyard

#endif  // TRAINYARD_WORKER_AGENT_PREEMPTION_NOTICE_H_
