#ifndef TRAINYARD_WORKER_TRAINER_PS_SERVER_H_
#define TRAINYARD_WORKER_TRAINER_PS_SERVER_H_

// The parameter-server shard over gRPC (proto/trainyard/v1/ps_service.proto): this server serves
// one ParameterShard; client.h is what a worker keeps for each shard, wire.h what they exchange.
// Tensors travel as raw bytes in the pieces' order, shapes and dtypes: both ends compute the same
// partition. The
// update's exchange is one PushPull call per shard whose messages are frames, not protobuf
// messages: the gradients are sent from the rank's own memory (no copy), read on the shard from
// gRPC's buffers into the tensors the push adds up (one copy), and the shard's pieces of a
// version are copied once and sent from that copy to every rank, which reads them from gRPC's
// buffers straight into its parameters (one copy). The other calls (Init, Push, Pull, PullRows,
// State) are plain protobuf messages: they carry little or run once per checkpoint.

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/trainer/ps/shard.h"

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

// How a shard's server admits its callers and what it accepts from them.
struct PsServerOptions {
  // The attempt's secret (Task.attempt_secret): every call must present it as its bearer
  // credential, or it is refused with UNAUTHENTICATED. Empty: anyone who reaches the port.
  std::string caller_secret;
  // The largest message accepted (a larger one is refused with RESOURCE_EXHAUSTED before it is
  // handled). 0: Start's is ps_wire::MessageLimit of its shard, StartEmpty's
  // ps_wire::kMaxMessageBytes.
  int64_t max_message_bytes = 0;
  // PEM certificate and key (both or neither): serve TLS. Without them the server speaks
  // plaintext, and warns once when it listens beyond loopback.
  std::string tls_cert_file;
  std::string tls_key_file;
};

class PsServer {
 public:
  // Serves `shard` (not owned; it must outlive the server) on `listen`, for example
  // "127.0.0.1:0" (port picked by the kernel). UNAVAILABLE when it cannot listen there;
  // INVALID_ARGUMENT naming the file when the TLS material cannot be read. With a secret, a
  // caller without it is refused from its call's metadata, before its message is read (gRPC's
  // AuthMetadataProcessor), over TLS and on loopback; in plaintext beyond loopback only once the
  // message is received, before it is parsed.
  static absl::StatusOr<std::unique_ptr<PsServer>> Start(ParameterShard* shard,
                                                         const std::string& listen,
                                                         PsServerOptions options);
  static absl::StatusOr<std::unique_ptr<PsServer>> Start(ParameterShard* shard,
                                                         const std::string& listen,
                                                         std::string caller_secret = "");
  // Serves a shard that rank 0 creates with Init: `config` less start_version and total_steps,
  // which Init brings along with the pieces. Before Init, a pull waits for it (until its
  // deadline) and a push is refused with FAILED_PRECONDITION; a second Init too.
  static absl::StatusOr<std::unique_ptr<PsServer>> StartEmpty(ShardConfig config,
                                                              const std::string& listen,
                                                              PsServerOptions options);
  static absl::StatusOr<std::unique_ptr<PsServer>> StartEmpty(ShardConfig config,
                                                              const std::string& listen,
                                                              std::string caller_secret = "");
  ~PsServer();  // stops serving: calls in flight end with CANCELLED or their result
  int port() const { return port_; }
  // Where ranks reach it through `host`: "HOST:PORT", or with TLS "tls:HOST:PORT"
  // (ps_wire::kTlsAddressPrefix), which PsClient understands.
  std::string AddressFor(const std::string& host) const;
  bool tls() const { return tls_; }
  int64_t max_message_bytes() const { return max_message_bytes_; }
  // Whether every rank of the shard's attempt has called Finish; waits for it until `deadline`.
  bool WaitUntilFinished(absl::Time deadline);
  // Whether no call is in flight and none ended within `quiet` of now.
  bool Quiet(absl::Duration quiet) const;
  ShardStats Stats() const;

 private:
  class Service;
  PsServer() = default;
  static absl::StatusOr<std::unique_ptr<PsServer>> Serve(std::unique_ptr<Service> service,
                                                         const std::string& listen,
                                                         const PsServerOptions& options);
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  bool tls_ = false;
  int64_t max_message_bytes_ = 0;
};

}  // namespace trainyard::trainer

#endif  // TRAINYARD_WORKER_TRAINER_PS_SERVER_H_
