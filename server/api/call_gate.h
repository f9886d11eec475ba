#ifndef TRAINYARD_SERVER_API_CALL_GATE_H_
#define TRAINYARD_SERVER_API_CALL_GATE_H_

// What every coordinator RPC passes before its logic runs: the request's bounds
// (request_limits.h), who is calling (auth.h) and whether the RPC is for them, and for streams a
// bound on how many one caller holds open.

#include <grpcpp/grpcpp.h>

#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "google/protobuf/message.h"
#include "server/auth/auth.h"

namespace trainyard {

// The credentials a gRPC call carried: "authorization: Bearer ..." metadata and the client
// certificate that TLS verified.
CallerCredentials CallerOf(const grpc::ServerContextBase& context);

class CallGate {
 public:
  // `auth` must outlive the gate.
  CallGate(const Authenticator& auth, int max_streams_per_caller)
      : auth_(auth), max_streams_(max_streams_per_caller) {}

  // INVALID_ARGUMENT for a request over a bound, UNAUTHENTICATED without a valid credential,
  // PERMISSION_DENIED when `rpc` is not for the caller's role. Thread-safe.
  absl::StatusOr<Principal> Admit(const grpc::ServerContextBase& context,
                                  const google::protobuf::Message& request, Audience audience,
                                  absl::string_view rpc) const;

  // Holds one of a caller's stream slots until destroyed.
  class StreamSlot {
   public:
    StreamSlot(StreamSlot&& other) : gate_(other.gate_), key_(std::move(other.key_)) {
      other.gate_ = nullptr;
    }
    StreamSlot(const StreamSlot&) = delete;
    StreamSlot& operator=(const StreamSlot&) = delete;
    StreamSlot& operator=(StreamSlot&&) = delete;
    ~StreamSlot();

   private:
    friend class CallGate;
    StreamSlot(CallGate* gate, std::string key) : gate_(gate), key_(std::move(key)) {}
    CallGate* gate_;
    std::string key_;
  };
  // RESOURCE_EXHAUSTED when `caller` already holds max_streams_per_caller streams (long polls
  // count as streams: each holds a server thread while it waits).
  absl::StatusOr<StreamSlot> OpenStream(const Principal& caller);

 private:
  const Authenticator& auth_;
  const int max_streams_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, int> open_streams_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trainyard

#endif  // TRAINYARD_SERVER_API_CALL_GATE_H_
