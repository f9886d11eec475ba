#ifndef TRAINYARD_WORKER_TRAINER_PS_CLIENT_H_
#define TRAINYARD_WORKER_TRAINER_PS_CLIENT_H_

// A worker's end of a parameter-server shard's gRPC service (server.h; the wire format is
// wire.h).

#include <grpcpp/grpcpp.h>
#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/rpc/ps_tls.h"
#include "trainyard/v1/ps_service.grpc.pb.h"
#include "worker/trainer/ps/shard.h"

namespace trainyard::trainer {

// A worker's calls to one shard. Each call ends within `timeout`: a dead or stuck shard becomes
// UNAVAILABLE or DEADLINE_EXCEEDED naming the shard, never a hang. Thread-compatible.
class PsClient {
 public:
  // `address` as the shard published it (PsServer::AddressFor): "tls:HOST:PORT" is verified
  // against `tls.ca_file` (and `tls.server_name` when set; without a CA file, the system's
  // roots). `caller_secret`: what the shard's server asks of its callers (PsServer::Start).
  // Messages are bounded by ps_wire::kMaxMessageBytes until LimitMessages. When the channel
  // cannot be made (a CA file that cannot be read), every call fails with INVALID_ARGUMENT
  // naming it.
  PsClient(const std::string& address, int shard, int64_t generation, int rank,
           absl::Duration timeout, std::string caller_secret = "", const PsTls& tls = {});

  // Bounds the messages to and from the shard to ps_wire::MessageLimit(parameter_bytes,
  // tensors): what the shard's pieces and rows (`tensors` of them, holding `parameter_bytes`)
  // need. A larger answer fails with RESOURCE_EXHAUSTED. Makes a new channel: call it before
  // the calls, not during one.
  void LimitMessages(int64_t parameter_bytes, int64_t tensors);
  int max_message_bytes() const { return max_message_bytes_; }

  // Creates the shard of a server started with StartEmpty from `pieces` (CPU float32 or
  // float64) and their optimizer state (named "p{index}.{field}"; empty when fresh), at version
  // `version`.
  // `tables` are the shard's rows of each embedding table ([RowsOnShard, dim]) and `table_rows`
  // the tables' whole row counts.
  absl::Status Init(int64_t version, int64_t total_steps, const std::vector<torch::Tensor>& pieces,
                    const NamedTensors& optimizer_state = {},
                    const std::vector<torch::Tensor>& tables = {},
                    const std::vector<int64_t>& table_rows = {});
  // Tells the shard this rank is done with it.
  absl::Status Finish();
  // The shard's optimizer state and its rows of each table: `tables` are where the rows go
  // (contiguous CPU tensors of the shard's rows' shapes, written into; those of the result alias
  // them).
  struct StateResult {
    int64_t version = 0;  // Snapshot's
    std::map<std::string, torch::Tensor> optimizer_state;
    std::vector<torch::Tensor> tables;
  };
  // At `version` (FAILED_PRECONDITION if the shard is at another one).
  absl::StatusOr<StateResult> State(int64_t version, const std::vector<torch::Tensor>& tables = {});
  // An asynchronous shard's parameters (copied into `pieces`, this shard's pieces in order),
  // tables and optimizer state at one version. With `after_other_ranks`, once every other rank
  // has finished with the shard: ABORTED "ranks still training" when they have not within the
  // timeout.
  absl::StatusOr<StateResult> Snapshot(bool after_other_ranks, std::vector<torch::Tensor>& pieces,
                                       const std::vector<torch::Tensor>& tables = {});
  // See ParameterShard::Push; the gradients are CPU tensors of the pieces' shapes.
  absl::StatusOr<ParameterShard::PushResult> Push(int64_t base_version,
                                                  const std::vector<torch::Tensor>& gradients,
                                                  double loss = 0, bool stop = false,
                                                  const std::vector<RowGradients>& rows = {});
  // Waits for `min_version` and copies the shard's pieces into `pieces` (CPU, contiguous, of the
  // pieces' shapes and dtypes: the caller lays them out). INTERNAL when the shard's answer does
  // not fit them.
  absl::StatusOr<ParameterShard::PullResult> Pull(int64_t min_version,
                                                  std::vector<torch::Tensor>& pieces);
  // Push and Pull in one call (PushPull frames): the gradients go from their own memory, and the
  // pulled parameters are read from gRPC's buffers straight into `pieces` (contiguous CPU, of the
  // pieces' shapes). Errors as Push's and Pull's.
  struct PushPullResult {
    ParameterShard::PushResult push;
    ParameterShard::PullResult pull;
  };
  absl::StatusOr<PushPullResult> PushPull(int64_t base_version,
                                          const std::vector<torch::Tensor>& gradients, double loss,
                                          bool stop, const std::vector<RowGradients>& rows,
                                          int64_t min_version, std::vector<torch::Tensor>& pieces);
  // Waits for `min_version` and copies the rows `ids[t]` of table t (int64 [k], rows this shard
  // holds; undefined or empty for none) into `rows[t]` (contiguous CPU [k, dim] of the table's
  // dtype). INTERNAL when the answer does not fit them.
  absl::StatusOr<ParameterShard::PullResult> PullRows(int64_t min_version,
                                                      const std::vector<torch::Tensor>& ids,
                                                      std::vector<torch::Tensor>& rows);

 private:
  absl::StatusOr<std::map<std::string, torch::Tensor>> DecodeState(
      const google::protobuf::RepeatedPtrField<trainyard::v1::NamedTensor>& tensors) const;
  absl::StatusOr<StateResult> DecodeStateResponse(const trainyard::v1::StateResponse& response,
                                                  const std::vector<torch::Tensor>& tables) const;
  // Copies a response's pieces into `pieces` (contiguous CPU tensors of the sizes sent).
  absl::Status CopyPieces(const google::protobuf::RepeatedPtrField<trainyard::v1::TensorData>& data,
                          std::vector<torch::Tensor>& pieces) const;
  // The push's fields other than its gradients.
  void FillPush(int64_t base_version, double loss, bool stop, const std::vector<RowGradients>& rows,
                trainyard::v1::PushRequest& request) const;
  using Stub = trainyard::v1::ParameterServer::Stub;
  // One call of `rpc`, bounded by the timeout; errors name the shard, its address and `method`.
  template <typename Request, typename Response>
  absl::Status Call(grpc::Status (Stub::*rpc)(grpc::ClientContext*, const Request&, Response*),
                    const Request& request, Response* response, const char* method);

  const std::string address_;
  const int shard_;
  const int64_t generation_;
  const int rank_;
  const absl::Duration timeout_;
  const std::string bearer_;  // "Bearer SECRET", or empty
  const std::string target_;  // address_ less its TLS mark
  const bool tls_;
  const PsTls tls_files_;
  int max_message_bytes_ = 0;
  // Why the channel could not be made; then every call returns it.
  absl::Status channel_status_;
  // Makes channel_ and stub_ with messages of at most max_message_bytes_.
  void Connect();
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<Stub> stub_;
};

}  // namespace trainyard::trainer

#endif  // TRAINYARD_WORKER_TRAINER_PS_CLIENT_H_
