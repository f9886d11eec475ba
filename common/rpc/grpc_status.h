#ifndef TRAINYARD_COMMON_RPC_GRPC_STATUS_H_
#define TRAINYARD_COMMON_RPC_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace trainyard {

// The one place absl::Status and grpc::Status turn into each other. absl::Status to grpc::Status:
// same code (the enums share their numbering), same message.
grpc::Status ToGrpcStatus(const absl::Status& status);

// The way back, for clients: the same code, the message after `context` and ": " when a context
// is given (the call that failed, for example).
absl::Status FromGrpcStatus(const grpc::Status& status, absl::string_view context = {});

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_RPC_GRPC_STATUS_H_
