#include "worker/trainer/ps/server.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/rpc_method.h>
#include <grpcpp/impl/rpc_service_method.h>
#include <grpcpp/security/auth_metadata_processor.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/support/method_handler.h>
#include <openssl/crypto.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/rpc/channel.h"
#include "common/rpc/grpc_status.h"
#include "trainyard/v1/ps_service.grpc.pb.h"
#include "worker/trainer/ps/wire.h"

namespace trainyard::trainer {
namespace {

using ps_wire::ByteSize;

// Whether `presented` (a call's authorization metadata) is `expected` ("Bearer SECRET"), compared
// in constant time.
bool PresentsSecret(const char* presented, size_t size, const std::string& expected) {
  return size == expected.size() && CRYPTO_memcmp(presented, expected.data(), size) == 0;
}

grpc::Status Unauthenticated() {
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                      "this parameter server serves only the ranks of its own attempt");
}

// Refuses a call without the attempt's secret from its metadata, before gRPC reads its message:
// a stranger who reaches the port cannot make the shard receive, allocate or parse anything.
class SecretChecker final : public grpc::AuthMetadataProcessor {
 public:
  explicit SecretChecker(const std::string& secret) : expected_("Bearer " + secret) {}
  // A comparison in memory: it needs no thread of gRPC's own.
  bool IsBlocking() const override { return false; }
  grpc::Status Process(const InputMetadata& metadata, grpc::AuthContext*, OutputMetadata*,
                       OutputMetadata*) override {
    auto it = metadata.find("authorization");
    if (it != metadata.end() && PresentsSecret(it->second.data(), it->second.size(), expected_)) {
      return grpc::Status::OK;
    }
    return Unauthenticated();
  }

 private:
  const std::string expected_;
};

struct ServerSecurity {
  std::shared_ptr<grpc::ServerCredentials> credentials;
  bool tls = false;
  bool checks_metadata = false;  // the secret is checked before a message is read
};

// TLS with the options' certificate. Without one, on loopback gRPC's local credentials: plaintext
// that admits only peers on this machine and, unlike gRPC's insecure credentials (whose
// SetAuthMetadataProcessor aborts in gRPC 1.51), takes the SecretChecker. Beyond loopback,
// plaintext, with a warning: the secret then travels in clear and is checked by the handlers.
absl::StatusOr<ServerSecurity> SecurityFor(const std::string& listen,
                                           const PsServerOptions& options) {
  ServerSecurity security;
  if (!options.tls_cert_file.empty() || !options.tls_key_file.empty()) {
    ServerTls tls;
    tls.cert_file = options.tls_cert_file;
    tls.key_file = options.tls_key_file;
    absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
        NewServerCredentials(tls);
    if (!credentials.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter server TLS: ", credentials.status().message()));
    }
    security.credentials = *std::move(credentials);
    security.tls = true;
  } else if (IsLoopbackAddress(listen)) {
    security.credentials = grpc::experimental::LocalServerCredentials(LOCAL_TCP);
  } else {
    static std::once_flag warned;
    std::call_once(warned, [&listen] {
      LogWarning("parameter server on ", listen,
                 " in plaintext: its parameters and the attempt's secret travel in clear "
                 "(give the agents --ps_tls_cert and --ps_tls_key)");
    });
    return ServerSecurity{grpc::InsecureServerCredentials(), false, false};
  }
  if (!options.caller_secret.empty()) {
    security.credentials->SetAuthMetadataProcessor(
        std::make_shared<SecretChecker>(options.caller_secret));
    security.checks_metadata = true;
  }
  return security;
}

// ps_wire::MessageLimit of what `shard` holds.
int64_t MessageLimitOf(const ParameterShard& shard) {
  int64_t bytes = 0;
  for (const ParameterShard::PieceShape& shape : shard.shapes()) bytes += ByteSize(shape);
  const ShardConfig& config = shard.config();
  for (const ParameterShard::TableShape& table : shard.table_shapes()) {
    const int64_t row = table.dim * c10::elementSize(table.dtype) + int64_t{8};  // and its id
    bytes += RowsOnShard(table.rows, config.shard, config.shards) * row;
  }
  return ps_wire::MessageLimit(
      bytes, static_cast<int64_t>(shard.shapes().size() + shard.table_shapes().size()));
}

}  // namespace

using ps_wire::kPushPullMethod;
using ps_wire::RowsFrom;
using ps_wire::SetBytes;
using ps_wire::SetLayout;
using ps_wire::SetPullResponse;
using ps_wire::SetPushResponse;
using ps_wire::SliceReader;
using ps_wire::TensorFrame;
using ps_wire::TensorFrom;

class PsServer::Service final : public trainyard::v1::ParameterServer::Service {
 public:
  Service(ParameterShard* shard, std::string caller_secret)
      : secret_(std::move(caller_secret)), shard_unowned_(shard), shard_(shard) {
    AddPushPull();
  }
  Service(ShardConfig config, std::string caller_secret)
      : config_(std::move(config)), secret_(std::move(caller_secret)) {
    AddPushPull();
  }

  // Only the ranks and shards of this attempt know its secret: anyone else who reaches the port
  // is refused before anything is parsed or changed. Where SecretChecker runs, it refused them
  // before their message was even read; this is the check of plaintext beyond loopback.
  grpc::Status Admit(const grpc::ServerContext* context) const {
    if (secret_.empty()) return grpc::Status::OK;
    const auto& metadata = context->client_metadata();
    auto it = metadata.find("authorization");
    const std::string expected = "Bearer " + secret_;
    if (it != metadata.end() && PresentsSecret(it->second.data(), it->second.size(), expected)) {
      return grpc::Status::OK;
    }
    return Unauthenticated();
  }

  // The push of a rank's gradients and the pull that follows, in one call of frames (see
  // TensorFrame): the gradients are read from gRPC's buffers straight into the tensors the push
  // adds up, and the pulled pieces are copied once per version, under the shard's lock, into
  // tensors that gRPC sends from to every rank (ParameterShard::PullShared).
  grpc::Status PushPull(grpc::ServerContext* context, const TensorFrame* request,
                        TensorFrame* response) {
    if (grpc::Status admitted = Admit(context); !admitted.ok()) return admitted;
    const Activity activity(this);
    const absl::Time deadline = absl::FromChrono(context->deadline());
    absl::StatusOr<ParameterShard*> initialised = InitialisedBy(deadline);
    if (!initialised.ok()) return ToGrpcStatus(initialised.status());
    ParameterShard* shard = *initialised;
    trainyard::v1::PushPullHeader header;
    if (!header.ParseFromString(request->header)) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "push-pull: the header does not parse");
    }
    const auto& shapes = shard->shapes();
    int64_t expected = 0;
    for (const auto& shape : shapes) expected += ByteSize(shape);
    if (static_cast<int64_t>(request->data_bytes) != expected) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("push-pull: ", request->data_bytes,
                                       " bytes of gradients for pieces of ", expected));
    }
    SliceReader reader(*request);
    std::vector<torch::Tensor> gradients;
    gradients.reserve(shapes.size());
    for (const auto& [sizes, dtype] : shapes) {
      gradients.push_back(torch::empty(sizes, torch::TensorOptions().dtype(dtype)));
      reader.Read(gradients.back().data_ptr(), gradients.back().nbytes());
    }
    const trainyard::v1::PushRequest& push = header.push();
    absl::StatusOr<std::vector<RowGradients>> rows =
        RowsFrom(push.rows(), shard->table_shapes(), /*with_values=*/true);
    if (!rows.ok()) return ToGrpcStatus(rows.status());
    absl::StatusOr<ParameterShard::PushResult> pushed =
        shard->Push(push.generation(), push.rank(), push.base_version(), gradients, push.loss(),
                    push.stop(), *rows);
    if (!pushed.ok()) return ToGrpcStatus(pushed.status());
    CountPush(*pushed, request->header.size() + request->data_bytes);
    absl::StatusOr<ParameterShard::PullResult> pulled = shard->PullShared(
        push.generation(), header.pull_min_version(), deadline, &response->tensors);
    if (!pulled.ok()) return ToGrpcStatus(pulled.status());
    trainyard::v1::PushPullReply reply;
    SetPushResponse(*pushed, reply.mutable_push());
    SetPullResponse(*pulled, reply.mutable_pull());
    response->header = reply.SerializeAsString();
    int64_t sent = static_cast<int64_t>(response->header.size());
    for (const torch::Tensor& t : response->tensors) sent += t.nbytes();
    CountPull(*pulled, sent);
    return grpc::Status::OK;
  }

  grpc::Status Init(grpc::ServerContext* context, const trainyard::v1::InitRequest* request,
                    trainyard::v1::InitResponse*) override {
    if (grpc::Status admitted = Admit(context); !admitted.ok()) return admitted;
    const Activity activity(this);
    {
      absl::MutexLock lock(&mu_);
      if (shard_ != nullptr) {
        return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                            "the shard is initialised already");
      }
    }
    if (request->generation() != config_.generation) {
      return grpc::Status(
          grpc::StatusCode::FAILED_PRECONDITION,
          absl::StrCat("generation ", request->generation(),
                       " is not this shard's attempt (generation ", config_.generation, ")"));
    }
    if (request->layout_size() != request->values_size()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat(request->layout_size(), " piece layouts for ",
                                       request->values_size(), " values"));
    }
    std::vector<torch::Tensor> pieces;
    for (int i = 0; i < request->layout_size(); ++i) {
      absl::StatusOr<torch::Tensor> piece =
          TensorFrom(request->layout(i), request->values(i).data(), absl::StrCat("piece ", i));
      if (!piece.ok()) return ToGrpcStatus(piece.status());
      pieces.push_back(*std::move(piece));
    }
    std::map<std::string, torch::Tensor> state;
    for (const trainyard::v1::NamedTensor& t : request->optimizer_state()) {
      absl::StatusOr<torch::Tensor> tensor =
          TensorFrom(t.layout(), t.data(), absl::StrCat("optimizer state ", t.name()));
      if (!tensor.ok()) return ToGrpcStatus(tensor.status());
      state[t.name()] = *std::move(tensor);
    }
    std::vector<torch::Tensor> tables;
    std::vector<int64_t> table_rows;
    for (int t = 0; t < request->tables_size(); ++t) {
      const trainyard::v1::TableData& table = request->tables(t);
      absl::StatusOr<torch::Tensor> values =
          TensorFrom(table.layout(), table.data(), absl::StrCat("table ", t));
      if (!values.ok()) return ToGrpcStatus(values.status());
      tables.push_back(*std::move(values));
      table_rows.push_back(table.rows());
    }
    ShardConfig config = config_;
    config.start_version = request->version();
    config.total_steps = request->total_steps();
    absl::StatusOr<std::unique_ptr<ParameterShard>> shard = ParameterShard::Create(
        std::move(config), std::move(pieces), state, std::move(tables), table_rows);
    if (!shard.ok()) return ToGrpcStatus(shard.status());
    absl::MutexLock lock(&mu_);
    if (shard_ != nullptr) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          "the shard is initialised already");
    }
    owned_ = std::move(*shard);
    shard_ = owned_.get();
    return grpc::Status::OK;
  }

  grpc::Status Push(grpc::ServerContext* context, const trainyard::v1::PushRequest* request,
                    trainyard::v1::PushResponse* response) override {
    if (grpc::Status admitted = Admit(context); !admitted.ok()) return admitted;
    const Activity activity(this);
    ParameterShard* shard = Shard(absl::InfinitePast());
    if (shard == nullptr) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          "push before rank 0 initialised the shard");
    }
    const auto& shapes = shard->shapes();
    if (request->gradients_size() != static_cast<int>(shapes.size())) {
      return grpc::Status(
          grpc::StatusCode::INVALID_ARGUMENT,
          absl::StrCat(request->gradients_size(), " gradients for ", shapes.size(), " pieces"));
    }
    // Views of the request's bytes: read during the push only.
    std::vector<torch::Tensor> gradients;
    gradients.reserve(shapes.size());
    for (size_t i = 0; i < shapes.size(); ++i) {
      const std::string& data = request->gradients(i).data();
      if (static_cast<int64_t>(data.size()) != ByteSize(shapes[i])) {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            absl::StrCat("gradient ", i, " has ", data.size(), " bytes, its piece ",
                                         ByteSize(shapes[i])));
      }
      gradients.push_back(torch::from_blob(const_cast<char*>(data.data()), shapes[i].first,
                                           torch::TensorOptions().dtype(shapes[i].second)));
    }
    absl::StatusOr<std::vector<RowGradients>> rows =
        RowsFrom(request->rows(), shard->table_shapes(), /*with_values=*/true);
    if (!rows.ok()) return ToGrpcStatus(rows.status());
    absl::StatusOr<ParameterShard::PushResult> result =
        shard->Push(request->generation(), request->rank(), request->base_version(), gradients,
                    request->loss(), request->stop(), *rows);
    if (!result.ok()) return ToGrpcStatus(result.status());
    CountPush(*result, request->ByteSizeLong());
    SetPushResponse(*result, response);
    return grpc::Status::OK;
  }

  grpc::Status Pull(grpc::ServerContext* context, const trainyard::v1::PullRequest* request,
                    trainyard::v1::PullResponse* response) override {
    if (grpc::Status admitted = Admit(context); !admitted.ok()) return admitted;
    const Activity activity(this);
    const absl::Time deadline = absl::FromChrono(context->deadline());
    absl::StatusOr<ParameterShard*> initialised = InitialisedBy(deadline);
    if (!initialised.ok()) return ToGrpcStatus(initialised.status());
    ParameterShard* shard = *initialised;
    // The pieces go straight from the shard into the response, one copy.
    absl::StatusOr<ParameterShard::PullResult> result = shard->PullWith(
        request->generation(), request->min_version(), deadline,
        [response](const std::vector<torch::Tensor>& pieces) {
          for (const torch::Tensor& piece : pieces) {
            response->add_pieces()->set_data(static_cast<const char*>(piece.data_ptr()),
                                             piece.numel() * piece.element_size());
          }
        });
    if (!result.ok()) return ToGrpcStatus(result.status());
    SetPullResponse(*result, response);
    CountPull(*result, response->ByteSizeLong());
    return grpc::Status::OK;
  }

  grpc::Status PullRows(grpc::ServerContext* context, const trainyard::v1::PullRowsRequest* request,
                        trainyard::v1::PullRowsResponse* response) override {
    if (grpc::Status admitted = Admit(context); !admitted.ok()) return admitted;
    const Activity activity(this);
    const absl::Time deadline = absl::FromChrono(context->deadline());
    absl::StatusOr<ParameterShard*> initialised = InitialisedBy(deadline);
    if (!initialised.ok()) return ToGrpcStatus(initialised.status());
    ParameterShard* shard = *initialised;
    absl::StatusOr<std::vector<RowGradients>> rows =
        RowsFrom(request->rows(), shard->table_shapes(), /*with_values=*/false);
    if (!rows.ok()) return ToGrpcStatus(rows.status());
    std::vector<torch::Tensor> ids;
    for (const RowGradients& r : *rows) ids.push_back(r.ids);
    // The rows are gathered straight into the response's bytes.
    absl::StatusOr<ParameterShard::PullResult> result = shard->PullRowsWith(
        request->generation(), request->min_version(), deadline, ids,
        [&](int table, const torch::Tensor& values, const torch::Tensor& local) {
          trainyard::v1::Rows* out = response->add_rows();
          out->set_table(table);
          std::string* data = out->mutable_values();
          data->resize(local.numel() * values.size(1) * values.element_size());
          torch::Tensor target =
              torch::from_blob(data->data(), {local.numel(), values.size(1)}, values.options());
          torch::index_select_out(target, values, 0, local);
        });
    if (!result.ok()) return ToGrpcStatus(result.status());
    response->set_version(result->version);
    CountPull(*result, response->ByteSizeLong());
    return grpc::Status::OK;
  }

  grpc::Status State(grpc::ServerContext* context, const trainyard::v1::StateRequest* request,
                     trainyard::v1::StateResponse* response) override {
    if (grpc::Status admitted = Admit(context); !admitted.ok()) return admitted;
    const Activity activity(this);
    ParameterShard* shard = Shard(absl::InfinitePast());
    if (shard == nullptr) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "the shard is not initialised");
    }
    if (request->snapshot()) return Snapshot(*shard, *request, context, response);
    absl::StatusOr<NamedTensors> state =
        shard->OptimizerState(request->generation(), request->version());
    if (!state.ok()) return ToGrpcStatus(state.status());
    absl::StatusOr<std::vector<torch::Tensor>> tables =
        shard->Tables(request->generation(), request->version());
    if (!tables.ok()) return ToGrpcStatus(tables.status());
    for (const torch::Tensor& table : *tables)
      SetBytes(table, response->add_tables()->mutable_data());
    for (const auto& [name, tensor] : *state) {
      trainyard::v1::NamedTensor* out = response->add_optimizer_state();
      out->set_name(name);
      SetLayout(tensor, out->mutable_layout());
      SetBytes(tensor, out->mutable_data());
    }
    return grpc::Status::OK;
  }

  grpc::Status Finish(grpc::ServerContext* context, const trainyard::v1::FinishRequest* request,
                      trainyard::v1::FinishResponse*) override {
    if (grpc::Status admitted = Admit(context); !admitted.ok()) return admitted;
    const Activity activity(this);
    const int64_t generation = Config().generation;
    if (request->generation() != generation) {
      return grpc::Status(
          grpc::StatusCode::FAILED_PRECONDITION,
          absl::StrCat("generation ", request->generation(),
                       " is not this shard's attempt (generation ", generation, ")"));
    }
    absl::MutexLock lock(&mu_);
    finished_ranks_.insert(request->rank());
    return grpc::Status::OK;
  }

  // Counts a call in flight for its lifetime.
  class Activity {
   public:
    explicit Activity(Service* service) : service_(service) {
      absl::MutexLock lock(&service_->activity_mu_);
      service_->in_flight_++;
    }
    ~Activity() {
      absl::MutexLock lock(&service_->activity_mu_);
      service_->in_flight_--;
      service_->last_call_ended_ = RealClock::Get().Now();
    }

   private:
    Service* const service_;
  };

  ShardStats Stats() const {
    ShardStats stats;
    {
      absl::MutexLock lock(&stats_mu_);
      stats = stats_;
    }
    absl::MutexLock lock(&mu_);
    if (shard_ != nullptr) stats.version = shard_->version();
    return stats;
  }

  bool Quiet(absl::Duration quiet) const {
    absl::MutexLock lock(&activity_mu_);
    return in_flight_ == 0 && RealClock::Get().Now() - last_call_ended_ >= quiet;
  }

  // An asynchronous shard's parameters and optimizer state at one version, after every rank but
  // the caller has finished when asked to.
  grpc::Status Snapshot(const ParameterShard& shard, const trainyard::v1::StateRequest& request,
                        grpc::ServerContext* context, trainyard::v1::StateResponse* response) {
    if (request.generation() != Config().generation) {
      return ToGrpcStatus(shard.TakeSnapshot(request.generation()).status());
    }
    if (request.after_other_ranks()) {
      const int workers = std::max(1, Config().workers);
      const int caller = request.rank();
      absl::MutexLock lock(&mu_);
      auto others_done = [this, workers, caller]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        for (int r = 0; r < workers; ++r) {
          if (r != caller && finished_ranks_.count(r) == 0) return false;
        }
        return true;
      };
      if (!mu_.AwaitWithDeadline(absl::Condition(&others_done),
                                 absl::FromChrono(context->deadline()) - absl::Milliseconds(100))) {
        return grpc::Status(grpc::StatusCode::ABORTED,
                            absl::StrCat("ranks still training (", finished_ranks_.size(), " of ",
                                         workers - 1, " others finished)"));
      }
    }
    absl::StatusOr<ParameterShard::Snapshot> snapshot = shard.TakeSnapshot(request.generation());
    if (!snapshot.ok()) return ToGrpcStatus(snapshot.status());
    response->set_version(snapshot->version);
    for (const torch::Tensor& piece : snapshot->pieces) {
      SetBytes(piece, response->add_pieces()->mutable_data());
    }
    for (const torch::Tensor& table : snapshot->tables) {
      SetBytes(table, response->add_tables()->mutable_data());
    }
    for (const auto& [name, tensor] : snapshot->optimizer_state) {
      trainyard::v1::NamedTensor* out = response->add_optimizer_state();
      out->set_name(name);
      SetLayout(tensor, out->mutable_layout());
      SetBytes(tensor, out->mutable_data());
    }
    return grpc::Status::OK;
  }

  bool WaitUntilFinished(absl::Time deadline) {
    const int workers = std::max(1, Config().workers);
    absl::MutexLock lock(&mu_);
    auto all = [this, workers]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return static_cast<int>(finished_ranks_.size()) >= workers;
    };
    return mu_.AwaitWithDeadline(absl::Condition(&all), deadline);
  }

 private:
  void AddPushPull() {
    AddMethod(new grpc::internal::RpcServiceMethod(
        kPushPullMethod, grpc::internal::RpcMethod::NORMAL_RPC,
        new grpc::internal::RpcMethodHandler<Service, TensorFrame, TensorFrame>(
            [](Service* service, grpc::ServerContext* context, const TensorFrame* request,
               TensorFrame* response) { return service->PushPull(context, request, response); },
            this)));
  }

  void CountPush(const ParameterShard::PushResult& result, size_t bytes) {
    absl::MutexLock lock(&stats_mu_);
    stats_.pushes++;
    stats_.bytes_received += static_cast<int64_t>(bytes);
    if (result.applied) {
      stats_.staleness_sum += result.staleness;
    } else {
      stats_.stale_pushes++;
    }
  }

  void CountPull(const ParameterShard::PullResult& result, size_t bytes) {
    absl::MutexLock lock(&stats_mu_);
    stats_.pulls++;
    stats_.bytes_sent += static_cast<int64_t>(bytes);
    stats_.pull_wait_seconds += absl::ToDoubleSeconds(result.waited);
  }

  // The attempt's settings: Start's shard's, or StartEmpty's.
  const ShardConfig& Config() const {
    return shard_unowned_ != nullptr ? shard_unowned_->config() : config_;
  }

  // As Shard, DEADLINE_EXCEEDED when rank 0 has not initialised it by then.
  absl::StatusOr<ParameterShard*> InitialisedBy(absl::Time deadline) {
    ParameterShard* shard = Shard(deadline);
    if (shard == nullptr) {
      return absl::DeadlineExceededError("rank 0 did not initialise the shard in time");
    }
    return shard;
  }

  // The shard once initialised, waiting for it until `deadline`; null if it is not by then.
  ParameterShard* Shard(absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return shard_ != nullptr; };
    mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
    return shard_;
  }

  const ShardConfig config_;
  const std::string secret_;                       // empty: anyone who reaches the port
  ParameterShard* const shard_unowned_ = nullptr;  // Start's shard
  mutable absl::Mutex mu_;
  std::set<int> finished_ranks_ ABSL_GUARDED_BY(mu_);
  mutable absl::Mutex stats_mu_;
  ShardStats stats_ ABSL_GUARDED_BY(stats_mu_);
  mutable absl::Mutex activity_mu_;
  int in_flight_ ABSL_GUARDED_BY(activity_mu_) = 0;
  absl::Time last_call_ended_ ABSL_GUARDED_BY(activity_mu_) = RealClock::Get().Now();
  ParameterShard* shard_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::unique_ptr<ParameterShard> owned_ ABSL_GUARDED_BY(mu_);
};

absl::StatusOr<std::unique_ptr<PsServer>> PsServer::Start(ParameterShard* shard,
                                                          const std::string& listen,
                                                          PsServerOptions options) {
  if (options.max_message_bytes <= 0) options.max_message_bytes = MessageLimitOf(*shard);
  auto service = std::make_unique<Service>(shard, options.caller_secret);
  return Serve(std::move(service), listen, options);
}

absl::StatusOr<std::unique_ptr<PsServer>> PsServer::Start(ParameterShard* shard,
                                                          const std::string& listen,
                                                          std::string caller_secret) {
  PsServerOptions options;
  options.caller_secret = std::move(caller_secret);
  return Start(shard, listen, std::move(options));
}

absl::StatusOr<std::unique_ptr<PsServer>> PsServer::StartEmpty(ShardConfig config,
                                                               const std::string& listen,
                                                               PsServerOptions options) {
  if (options.max_message_bytes <= 0) options.max_message_bytes = ps_wire::kMaxMessageBytes;
  auto service = std::make_unique<Service>(std::move(config), options.caller_secret);
  return Serve(std::move(service), listen, options);
}

absl::StatusOr<std::unique_ptr<PsServer>> PsServer::StartEmpty(ShardConfig config,
                                                               const std::string& listen,
                                                               std::string caller_secret) {
  PsServerOptions options;
  options.caller_secret = std::move(caller_secret);
  return StartEmpty(std::move(config), listen, std::move(options));
}

absl::StatusOr<std::unique_ptr<PsServer>> PsServer::Serve(std::unique_ptr<Service> service,
                                                          const std::string& listen,
                                                          const PsServerOptions& options) {
  absl::StatusOr<ServerSecurity> security = SecurityFor(listen, options);
  if (!security.ok()) return security.status();
  std::unique_ptr<PsServer> server(new PsServer());
  server->service_ = std::move(service);
  server->tls_ = security->tls;
  server->max_message_bytes_ = std::min(options.max_message_bytes, ps_wire::kMaxMessageBytes);
  grpc::ServerBuilder builder;
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);  // a port of its own, never shared
  builder.AddListeningPort(listen, security->credentials, &server->port_);
  builder.RegisterService(server->service_.get());
  // Bounded by what the shard's parameters need: a larger message is refused by gRPC
  // (RESOURCE_EXHAUSTED) before any handler sees it.
  builder.SetMaxReceiveMessageSize(static_cast<int>(server->max_message_bytes_));
  builder.SetMaxSendMessageSize(static_cast<int>(server->max_message_bytes_));
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("parameter server: cannot listen on ", listen));
  }
  return server;
}

std::string PsServer::AddressFor(const std::string& host) const {
  const bool ipv6 = host.find(':') != std::string::npos && host.front() != '[';
  const std::string hostport =
      ipv6 ? absl::StrCat("[", host, "]:", port_) : absl::StrCat(host, ":", port_);
  return tls_ ? absl::StrCat(ps_wire::kTlsAddressPrefix, hostport) : hostport;
}

bool PsServer::WaitUntilFinished(absl::Time deadline) {
  return service_->WaitUntilFinished(deadline);
}

bool PsServer::Quiet(absl::Duration quiet) const { return service_->Quiet(quiet); }

ShardStats PsServer::Stats() const { return service_->Stats(); }

PsServer::~PsServer() {
  if (server_ != nullptr)
    server_->Shutdown(absl::ToChronoTime(RealClock::Get().Now() + absl::Seconds(1)));
}

}  // namespace trainyard::trainer
