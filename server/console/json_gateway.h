#ifndef TRAINYARD_SERVER_CONSOLE_JSON_GATEWAY_H_
#define TRAINYARD_SERVER_CONSOLE_JSON_GATEWAY_H_

// Room console/: the web console and its JSON API, served over HTTP(S) beside gRPC.
//
// The JSON API: the people's gRPC calls (JobService, SearchService, AdminService) as JSON,
// through protobuf's JSON mapping. Each call goes to the coordinator's own gRPC server over an
// in-process channel, with the caller's bearer token as its credential: the same checks (auth,
// roles, request limits) and the same answers as a gRPC client gets, whatever the transport.
// Agents and trainers keep to gRPC: their service is not offered here.

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "google/protobuf/descriptor.h"

namespace trainyard {

// The HTTP status for a gRPC status code (google.rpc.Code's mapping: 400, 401, 403, 404, 409,
// 429, 499, 500, 501, 503, 504).
int HttpStatusOf(grpc::StatusCode code);

// The JSON body of an error: {"code": "NOT_FOUND", "message": "..."}.
std::string JsonError(grpc::StatusCode code, absl::string_view message);

// A call as the gateway found it: the method and whether it answers with a stream.
struct JsonMethod {
  const google::protobuf::MethodDescriptor* method = nullptr;
  std::string path;  // "/trainyard.v1.JobService/GetJob": gRPC's name of it
  bool server_streaming = false;
  // Answers carry every field, defaults included, except where they are long lists of numbers
  // (GetJobMetrics: a field at its default is left out, as protobuf's JSON mapping does).
  bool print_defaults = true;
};

class JsonGateway;

// One call in flight: its answers are read one at a time, as a stream is. Not thread-safe.
class JsonCall {
 public:
  enum class Next {
    kMessage,  // `json` holds the next answer
    kQuiet,    // none came within the wait: the call goes on
    kEnd,      // no more: Finish says how it ended
  };
  ~JsonCall();  // cancels the call if it has not ended
  JsonCall(const JsonCall&) = delete;
  JsonCall& operator=(const JsonCall&) = delete;

  // Waits up to `wait` for the next answer.
  Next Read(std::string* json, absl::Duration wait);
  // Cancels the call (the client left); Read then ends it.
  void Cancel();
  // How the call ended; only after Read returned kEnd.
  grpc::Status Finish();

 private:
  friend class JsonGateway;
  JsonCall() = default;
  bool Await();  // the one operation in flight: whether it succeeded

  // The gateway that started it, told when the call is over (JsonGateway::WaitForCalls).
  std::shared_ptr<const JsonGateway> gateway_;
  const google::protobuf::MethodDescriptor* method_ = nullptr;
  bool print_defaults_ = true;
  std::unique_ptr<grpc::GenericStub> stub_;
  grpc::CompletionQueue cq_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call_;
  grpc::ByteBuffer buffer_;
  bool reading_ = false;   // a Read is in flight
  bool ended_ = false;     // no more answers
  bool finished_ = false;  // Finish done
  bool undecodable_ = false;
};

// Made with std::make_shared: each call holds it until the call is over.
class JsonGateway : public std::enable_shared_from_this<JsonGateway> {
 public:
  // Calls go to `channel` (the coordinator's in-process channel).
  explicit JsonGateway(std::shared_ptr<grpc::Channel> channel) : channel_(std::move(channel)) {}

  // The method "Service/Method" (e.g. "JobService/GetJob") names; NOT_FOUND for one not
  // offered (an unknown one, an agent's or a task's, or one that takes a stream of requests).
  static absl::StatusOr<JsonMethod> Find(absl::string_view name);

  // Starts `method` with the request in `json` (empty: {}) and `bearer` as the credential
  // (empty: none). INVALID_ARGUMENT naming the field for a body that is not the request in JSON;
  // UNAUTHENTICATED for a bearer with a byte outside printable ASCII (no token has one).
  absl::StatusOr<std::unique_ptr<JsonCall>> Start(const JsonMethod& method, absl::string_view json,
                                                  const std::string& bearer) const;

  // Waits up to `timeout` until no call it started is left (streams included): whether none is.
  // What waits before the coordinator's server goes (the calls use its in-process channel).
  bool WaitForCalls(absl::Duration timeout) const;

 private:
  friend class JsonCall;
  std::shared_ptr<grpc::Channel> channel_;
  mutable absl::Mutex mu_;
  mutable int calls_ ABSL_GUARDED_BY(mu_) = 0;  // JsonCalls alive
};

}  // namespace trainyard

#endif  // TRAINYARD_SERVER_CONSOLE_JSON_GATEWAY_H_
