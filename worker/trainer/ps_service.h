#ifndef TRAINYARD_WORKER_TRAINER_PS_SERVICE_H_
#define TRAINYARD_WORKER_TRAINER_PS_SERVICE_H_

// The parameter-server shard over gRPC (proto/trainyard/v1/ps_service.proto): a server that
// serves one ParameterShard, and the client a worker keeps for each shard. Tensors travel as raw
// bytes in the pieces' order, shapes and dtypes: both ends compute the same partition. The
// update's exchange is one PushPull call per shard whose messages are frames, not protobuf
// messages: the gradients are sent from the rank's own memory (no copy), read on the shard from
// gRPC's buffers into the tensors the push adds up (one copy), and the shard's pieces of a
// version are copied once and sent from that copy to every rank, which reads them from gRPC's
// buffers straight into its parameters (one copy). The other calls (Init, Push, Pull, PullRows,
// State) are plain protobuf messages: they carry little or run once per checkpoint.

#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "trainyard/v1/ps_service.grpc.pb.h"
#include "worker/trainer/ps_shard.h"

namespace trainyard::trainer {

// What a shard's server has done since it started, for its metrics.
struct ShardStats {
  int64_t pushes = 0;            // every push answered, applied or not
  int64_t stale_pushes = 0;      // pushes not applied, too stale (asynchronous mode)
  int64_t staleness_sum = 0;     // versions behind, summed over the applied pushes
  int64_t pulls = 0;             // pulls answered
  int64_t bytes_received = 0;    // gradient bytes of the pushes
  int64_t bytes_sent = 0;        // parameter bytes of the pulls
  double pull_wait_seconds = 0;  // time pulls waited for their version (the other ranks' pushes)
  int64_t version = 0;           // the shard's version (0 before rank 0 initialised it)
};

class PsServer {
 public:
  // Serves `shard` (not owned; it must outlive the server) on `listen`, for example
  // "0.0.0.0:0" (port picked by the kernel). UNAVAILABLE when it cannot listen there. With
  // `caller_secret` (the attempt's, Task.attempt_secret), every call must present it as its
  // bearer credential, or it is refused with UNAUTHENTICATED.
  static absl::StatusOr<std::unique_ptr<PsServer>> Start(ParameterShard* shard,
                                                         const std::string& listen,
                                                         std::string caller_secret = "");
  // Serves a shard that rank 0 creates with Init: `config` less start_version and total_steps,
  // which Init brings along with the pieces. Before Init, a pull waits for it (until its
  // deadline) and a push is refused with FAILED_PRECONDITION; a second Init too.
  static absl::StatusOr<std::unique_ptr<PsServer>> StartEmpty(ShardConfig config,
                                                              const std::string& listen,
                                                              std::string caller_secret = "");
  ~PsServer();  // stops serving: calls in flight end with CANCELLED or their result
  int port() const { return port_; }
  // Whether every rank of the shard's attempt has called Finish; waits for it until `deadline`.
  bool WaitUntilFinished(absl::Time deadline);
  // Whether no call is in flight and none ended within `quiet` of now.
  bool Quiet(absl::Duration quiet) const;
  ShardStats Stats() const;

 private:
  class Service;
  PsServer() = default;
  static absl::StatusOr<std::unique_ptr<PsServer>> Serve(std::unique_ptr<Service> service,
                                                         const std::string& listen);
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

// A worker's calls to one shard. Each call ends within `timeout`: a dead or stuck shard becomes
// UNAVAILABLE or DEADLINE_EXCEEDED naming the shard, never a hang. Thread-compatible.
class PsClient {
 public:
  // `caller_secret`: what the shard's server asks of its callers (PsServer::Start).
  PsClient(const std::string& address, int shard, int64_t generation, int rank,
           absl::Duration timeout, std::string caller_secret = "");

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
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<Stub> stub_;
};

}  // namespace trainyard::trainer

#endif  // TRAINYARD_WORKER_TRAINER_PS_SERVICE_H_
