#ifndef TRAINYARD_WORKER_TRAINER_COORDINATOR_RENDEZVOUS_CLIENT_H_
#define TRAINYARD_WORKER_TRAINER_COORDINATOR_RENDEZVOUS_CLIENT_H_

// How the ranks of one attempt find each other: a key-value store shared by the attempt (the
// coordinator's rendezvous store in production, an in-memory one in tests). Communicators put
// their listening addresses or unique ids here and wait for their peers'.

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace trainyard::trainer {

// Thread-safe. Errors: FAILED_PRECONDITION when the attempt has ended or is fenced off,
// DEADLINE_EXCEEDED when a key is not set in time, UNAVAILABLE when the store cannot be reached
// within the call's own time.
class RendezvousClient {
 public:
  virtual ~RendezvousClient() = default;
  virtual absl::Status Set(const std::string& key, const std::string& value) = 0;
  // Blocks until `key` is set or `timeout` passes.
  virtual absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) = 0;
};

// The coordinator's store over trainyard.v1.AgentService on `channel` (grpc_channel.h),
// namespaced by job id and generation. Transient transport failures are retried until the
// caller's timeout.
std::unique_ptr<RendezvousClient> NewGrpcRendezvousClient(std::shared_ptr<grpc::Channel> channel,
                                                          const std::string& job_id,
                                                          int64_t generation, int32_t rank);

}  // namespace trainyard::trainer

#endif  // TRAINYARD_WORKER_TRAINER_COORDINATOR_RENDEZVOUS_CLIENT_H_
