#ifndef TRAINYARD_WORKER_TRAINER_COORDINATOR_GRPC_CHANNEL_H_
#define TRAINYARD_WORKER_TRAINER_COORDINATOR_GRPC_CHANNEL_H_

#include <grpcpp/grpcpp.h>

#include <cstdlib>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/rpc/channel.h"

namespace trainyard::trainer {

// A channel to the coordinator at `address` (host:port) presenting `credential` (the task's, from
// its Task), with TLS as the agent passed it on: $TRAINYARD_CA_FILE, $TRAINYARD_TLS_SERVER_NAME,
// $TRAINYARD_INSECURE=1, and the arguments of CoordinatorClientArguments: commits and reports
// retried across an outage reach the coordinator again within about a second of its return.
// INVALID_ARGUMENT as NewClientChannel.
inline absl::StatusOr<std::shared_ptr<grpc::Channel>> NewCoordinatorChannel(
    const std::string& address, const std::string& credential) {
  const grpc::ChannelArguments args = CoordinatorClientArguments();
  auto env = [](const char* name) {
    const char* value = std::getenv(name);
    return std::string(value != nullptr ? value : "");
  };
  ClientCredentials credentials;
  credentials.token = credential;
  credentials.ca_file = env("TRAINYARD_CA_FILE");
  credentials.server_name = env("TRAINYARD_TLS_SERVER_NAME");
  credentials.insecure = env("TRAINYARD_INSECURE") == "1";
  return NewClientChannel(address, credentials, args);
}

}  // namespace trainyard::trainer

#endif  // TRAINYARD_WORKER_TRAINER_COORDINATOR_GRPC_CHANNEL_H_
