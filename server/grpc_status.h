#ifndef TRAINYARD_SERVER_GRPC_STATUS_H_
#define TRAINYARD_SERVER_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace trainyard {

// The one place absl::Status becomes grpc::Status: same code (the enums share their numbering),
// same message.
grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace trainyard

#endif  // TRAINYARD_SERVER_GRPC_STATUS_H_
