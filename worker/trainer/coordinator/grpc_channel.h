#ifndef TRAINYARD_WORKER_TRAINER_COORDINATOR_GRPC_CHANNEL_H_
#define TRAINYARD_WORKER_TRAINER_COORDINATOR_GRPC_CHANNEL_H_

#include <grpcpp/grpcpp.h>

#include <cstdlib>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/channel.h"

namespace trainyard::trainer {

// A channel to the coordinator at `address` (host:port) presenting `credential` (the task's, from
// its Task), with TLS as the agent passed it on: $TRAINYARD_CA_FILE, $TRAINYARD_TLS_SERVER_NAME,
// $TRAINYARD_INSECURE=1. gRPC's default reconnect backoff grows to two minutes; a coordinator
// that restarts within seconds must be reached again within about a second of coming back, or
// commits and reports retried across the outage would keep failing on a channel that is still
// backing off. INVALID_ARGUMENT as NewClientChannel.
inline absl::StatusOr<std::shared_ptr<grpc::Channel>> NewCoordinatorChannel(
    const std::string& address, const std::string& credential) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
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
