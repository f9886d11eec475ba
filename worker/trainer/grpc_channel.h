#ifndef TRAINYARD_WORKER_TRAINER_GRPC_CHANNEL_H_
#define TRAINYARD_WORKER_TRAINER_GRPC_CHANNEL_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

namespace trainyard::trainer {

// An insecure channel to the coordinator at `address` (host:port). gRPC's default reconnect
// backoff grows to two minutes; a coordinator that restarts within seconds must be reached again
// within about a second of coming back, or commits and reports retried across the outage would
// keep failing on a channel that is still backing off.
inline std::shared_ptr<grpc::Channel> NewCoordinatorChannel(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

}  // namespace trainyard::trainer

#endif  // TRAINYARD_WORKER_TRAINER_GRPC_CHANNEL_H_
