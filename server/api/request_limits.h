#ifndef TRAINYARD_SERVER_API_REQUEST_LIMITS_H_
#define TRAINYARD_SERVER_API_REQUEST_LIMITS_H_

// The bounds on every request the coordinator takes, in one place (request_limits.cc), checked
// before a request reaches any logic: the length of each string and bytes field and the number
// of entries of each repeated field, at any depth. A field the table does not name gets the
// default bound of its kind.

#include <cstdint>

#include "absl/status/status.h"
#include "google/protobuf/message.h"

namespace trainyard {

struct FieldBound {
  const char* field;  // full name: "trainyard.v1.SubmitJobRequest.spec_yaml"
  int64_t max;        // bytes for string and bytes fields, entries for repeated fields
};

inline constexpr int64_t kDefaultMaxStringBytes = 4096;
inline constexpr int64_t kDefaultMaxRepeated = 1024;
inline constexpr int kMaxMessageDepth = 16;

// INVALID_ARGUMENT naming the field (as a path: "spec.model.args.hidden"), its size and its bound
// when `request` holds anything over a bound.
absl::Status CheckRequestLimits(const google::protobuf::Message& request);

// The table, for docs and tests.
const FieldBound* RequestBounds(int* count);

}  // namespace trainyard

#endif  // TRAINYARD_SERVER_API_REQUEST_LIMITS_H_
