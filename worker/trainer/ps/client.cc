#include "worker/trainer/ps/client.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/client_unary_call.h>
#include <grpcpp/impl/rpc_method.h>

#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "common/rpc/grpc_status.h"
#include "worker/trainer/ps/wire.h"

namespace trainyard::trainer {

using ps_wire::kMaxMessageBytes;
using ps_wire::kPushPullMethod;
using ps_wire::kTlsAddressPrefix;
using ps_wire::MessageLimit;
using ps_wire::PullResultOf;
using ps_wire::PushResultOf;
using ps_wire::SetBytes;
using ps_wire::SetLayout;
using ps_wire::SliceReader;
using ps_wire::TensorFrame;
using ps_wire::TensorFrom;

PsClient::PsClient(const std::string& address, int shard, int64_t generation, int rank,
                   absl::Duration timeout, std::string caller_secret, const PsTls& tls)
    : address_(address),
      shard_(shard),
      generation_(generation),
      rank_(rank),
      timeout_(timeout),
      bearer_(caller_secret.empty() ? "" : "Bearer " + caller_secret),
      target_(absl::StartsWith(address, kTlsAddressPrefix)
                  ? address.substr(std::strlen(kTlsAddressPrefix))
                  : address),
      tls_(absl::StartsWith(address, kTlsAddressPrefix)),
      tls_files_(tls),
      max_message_bytes_(static_cast<int>(kMaxMessageBytes)) {
  Connect();
}

void PsClient::LimitMessages(int64_t parameter_bytes, int64_t tensors) {
  max_message_bytes_ = MessageLimit(parameter_bytes, tensors);
  Connect();
}

void PsClient::Connect() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(max_message_bytes_);
  args.SetMaxSendMessageSize(max_message_bytes_);
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  // The shard serves what it has: TLS where its agent gave it a certificate.
  if (tls_) {
    grpc::SslCredentialsOptions ssl;
    if (!tls_files_.ca_file.empty()) {
      std::ifstream in(tls_files_.ca_file, std::ios::binary);
      std::stringstream pem;
      pem << in.rdbuf();
      if (!in || pem.str().empty()) {
        channel_status_ = absl::InvalidArgumentError(
            absl::StrCat("parameter server ", shard_, " at ", address_,
                         ": cannot read the CA file ", tls_files_.ca_file));
        return;
      }
      ssl.pem_root_certs = pem.str();
    }
    credentials = grpc::SslCredentials(ssl);
    if (!tls_files_.server_name.empty()) {
      args.SetSslTargetNameOverride(tls_files_.server_name);
    }
  }
  channel_status_ = absl::OkStatus();
  channel_ = grpc::CreateCustomChannel(target_, credentials, args);
  stub_ = trainyard::v1::ParameterServer::NewStub(channel_);
}

template <typename Request, typename Response>
absl::Status PsClient::Call(grpc::Status (Stub::*rpc)(grpc::ClientContext*, const Request&,
                                                      Response*),
                            const Request& request, Response* response, const char* method) {
  if (!channel_status_.ok()) return channel_status_;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(RealClock::Get().Now() + timeout_));
  if (!bearer_.empty()) context.AddMetadata("authorization", bearer_);
  return FromGrpcStatus((stub_.get()->*rpc)(&context, request, response),
                        absl::StrCat("parameter server ", shard_, " at ", address_, ": ", method));
}

absl::Status PsClient::Init(int64_t version, int64_t total_steps,
                            const std::vector<torch::Tensor>& pieces,
                            const NamedTensors& optimizer_state,
                            const std::vector<torch::Tensor>& tables,
                            const std::vector<int64_t>& table_rows) {
  trainyard::v1::InitRequest request;
  request.set_generation(generation_);
  request.set_version(version);
  request.set_total_steps(total_steps);
  for (const torch::Tensor& p : pieces) {
    SetLayout(p, request.add_layout());
    SetBytes(p, request.add_values()->mutable_data());
  }
  for (const auto& [name, tensor] : optimizer_state) {
    trainyard::v1::NamedTensor* out = request.add_optimizer_state();
    out->set_name(name);
    SetLayout(tensor, out->mutable_layout());
    SetBytes(tensor, out->mutable_data());
  }
  for (size_t t = 0; t < tables.size(); ++t) {
    trainyard::v1::TableData* out = request.add_tables();
    out->set_rows(t < table_rows.size() ? table_rows[t] : 0);
    SetLayout(tables[t], out->mutable_layout());
    SetBytes(tables[t], out->mutable_data());
  }
  trainyard::v1::InitResponse response;
  return Call(&Stub::Init, request, &response, "init");
}

absl::Status PsClient::Finish() {
  trainyard::v1::FinishRequest request;
  request.set_generation(generation_);
  request.set_rank(rank_);
  trainyard::v1::FinishResponse response;
  return Call(&Stub::Finish, request, &response, "finish");
}

absl::StatusOr<std::map<std::string, torch::Tensor>> PsClient::DecodeState(
    const google::protobuf::RepeatedPtrField<trainyard::v1::NamedTensor>& tensors) const {
  std::map<std::string, torch::Tensor> state;
  for (const trainyard::v1::NamedTensor& t : tensors) {
    absl::StatusOr<torch::Tensor> tensor =
        TensorFrom(t.layout(), t.data(), absl::StrCat("optimizer state ", t.name()));
    if (!tensor.ok()) {
      return absl::InternalError(
          absl::StrCat("parameter server ", shard_, ": ", tensor.status().message()));
    }
    state[t.name()] = *std::move(tensor);
  }
  return state;
}

absl::Status PsClient::CopyPieces(
    const google::protobuf::RepeatedPtrField<trainyard::v1::TensorData>& data,
    std::vector<torch::Tensor>& pieces) const {
  if (data.size() != static_cast<int>(pieces.size())) {
    return absl::InternalError(absl::StrCat("parameter server ", shard_, " sent ", data.size(),
                                            " pieces, expected ", pieces.size()));
  }
  for (size_t i = 0; i < pieces.size(); ++i) {
    const std::string& bytes = data.Get(static_cast<int>(i)).data();
    torch::Tensor& piece = pieces[i];
    if (!piece.is_contiguous() || !piece.device().is_cpu() ||
        static_cast<int64_t>(bytes.size()) != piece.numel() * piece.element_size()) {
      return absl::InternalError(absl::StrCat("parameter server ", shard_, ": piece ", i, " has ",
                                              bytes.size(), " bytes, expected ",
                                              piece.numel() * piece.element_size()));
    }
    std::memcpy(piece.data_ptr(), bytes.data(), bytes.size());
  }
  return absl::OkStatus();
}

absl::StatusOr<PsClient::StateResult> PsClient::DecodeStateResponse(
    const trainyard::v1::StateResponse& response, const std::vector<torch::Tensor>& tables) const {
  StateResult result;
  absl::StatusOr<std::map<std::string, torch::Tensor>> state =
      DecodeState(response.optimizer_state());
  if (!state.ok()) return state.status();
  result.optimizer_state = *std::move(state);
  result.tables = tables;
  if (absl::Status copied = CopyPieces(response.tables(), result.tables); !copied.ok()) {
    return copied;
  }
  result.version = response.version();
  return result;
}

absl::StatusOr<PsClient::StateResult> PsClient::State(int64_t version,
                                                      const std::vector<torch::Tensor>& tables) {
  trainyard::v1::StateRequest request;
  request.set_generation(generation_);
  request.set_version(version);
  trainyard::v1::StateResponse response;
  absl::Status status = Call(&Stub::State, request, &response, "state");
  if (!status.ok()) return status;
  return DecodeStateResponse(response, tables);
}

absl::StatusOr<PsClient::StateResult> PsClient::Snapshot(bool after_other_ranks,
                                                         std::vector<torch::Tensor>& pieces,
                                                         const std::vector<torch::Tensor>& tables) {
  trainyard::v1::StateRequest request;
  request.set_generation(generation_);
  request.set_snapshot(true);
  request.set_after_other_ranks(after_other_ranks);
  request.set_rank(rank_);
  trainyard::v1::StateResponse response;
  absl::Status status = Call(&Stub::State, request, &response, "snapshot");
  if (!status.ok()) return status;
  if (absl::Status copied = CopyPieces(response.pieces(), pieces); !copied.ok()) return copied;
  return DecodeStateResponse(response, tables);
}

void PsClient::FillPush(int64_t base_version, double loss, bool stop,
                        const std::vector<RowGradients>& rows,
                        trainyard::v1::PushRequest& request) const {
  request.set_generation(generation_);
  request.set_rank(rank_);
  request.set_base_version(base_version);
  request.set_loss(loss);
  request.set_stop(stop);
  for (size_t t = 0; t < rows.size(); ++t) {
    if (!rows[t].ids.defined() || rows[t].ids.numel() == 0) continue;
    trainyard::v1::Rows* out = request.add_rows();
    out->set_table(static_cast<int>(t));
    SetBytes(rows[t].ids, out->mutable_ids());
    SetBytes(rows[t].grads, out->mutable_values());
  }
}

absl::StatusOr<PsClient::PushPullResult> PsClient::PushPull(
    int64_t base_version, const std::vector<torch::Tensor>& gradients, double loss, bool stop,
    const std::vector<RowGradients>& rows, int64_t min_version,
    std::vector<torch::Tensor>& pieces) {
  if (!channel_status_.ok()) return channel_status_;
  trainyard::v1::PushPullHeader header;
  FillPush(base_version, loss, stop, rows, *header.mutable_push());
  header.set_pull_min_version(min_version);
  TensorFrame request;
  request.header = header.SerializeAsString();
  for (const torch::Tensor& g : gradients) request.tensors.push_back(g.contiguous());
  TensorFrame response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(RealClock::Get().Now() + timeout_));
  if (!bearer_.empty()) context.AddMetadata("authorization", bearer_);
  const grpc::internal::RpcMethod method(kPushPullMethod, grpc::internal::RpcMethod::NORMAL_RPC,
                                         channel_);
  const std::string what =
      absl::StrCat("parameter server ", shard_, " at ", address_, ": push-pull");
  absl::Status status = FromGrpcStatus(grpc::internal::BlockingUnaryCall<TensorFrame, TensorFrame>(
                                           channel_.get(), method, &context, request, &response),
                                       what);
  if (!status.ok()) return status;
  trainyard::v1::PushPullReply reply;
  if (!reply.ParseFromString(response.header)) {
    return absl::InternalError(absl::StrCat(what, ": the reply's header does not parse"));
  }
  int64_t expected = 0;
  for (const torch::Tensor& piece : pieces) {
    if (!piece.is_contiguous() || !piece.device().is_cpu()) {
      return absl::InternalError(absl::StrCat(what, ": pieces must be contiguous CPU tensors"));
    }
    expected += piece.nbytes();
  }
  if (static_cast<int64_t>(response.data_bytes) != expected) {
    return absl::InternalError(absl::StrCat(what, ": ", response.data_bytes,
                                            " bytes of parameters for pieces of ", expected));
  }
  SliceReader reader(response);
  for (torch::Tensor& piece : pieces) reader.Read(piece.data_ptr(), piece.nbytes());
  PushPullResult result;
  result.push = PushResultOf(reply.push());
  result.pull = PullResultOf(reply.pull());
  return result;
}

absl::StatusOr<ParameterShard::PushResult> PsClient::Push(
    int64_t base_version, const std::vector<torch::Tensor>& gradients, double loss, bool stop,
    const std::vector<RowGradients>& rows) {
  trainyard::v1::PushRequest request;
  FillPush(base_version, loss, stop, rows, request);
  for (const torch::Tensor& g : gradients) {
    const torch::Tensor c = g.contiguous();
    request.add_gradients()->set_data(static_cast<const char*>(c.data_ptr()),
                                      c.numel() * c.element_size());
  }
  trainyard::v1::PushResponse response;
  absl::Status status = Call(&Stub::Push, request, &response, "push");
  if (!status.ok()) return status;
  return PushResultOf(response);
}

absl::StatusOr<ParameterShard::PullResult> PsClient::Pull(int64_t min_version,
                                                          std::vector<torch::Tensor>& pieces) {
  trainyard::v1::PullRequest request;
  request.set_generation(generation_);
  request.set_min_version(min_version);
  request.set_rank(rank_);
  trainyard::v1::PullResponse response;
  absl::Status status = Call(&Stub::Pull, request, &response, "pull");
  if (!status.ok()) return status;
  if (absl::Status copied = CopyPieces(response.pieces(), pieces); !copied.ok()) return copied;
  return PullResultOf(response);
}

absl::StatusOr<ParameterShard::PullResult> PsClient::PullRows(int64_t min_version,
                                                              const std::vector<torch::Tensor>& ids,
                                                              std::vector<torch::Tensor>& rows) {
  trainyard::v1::PullRowsRequest request;
  request.set_generation(generation_);
  request.set_min_version(min_version);
  request.set_rank(rank_);
  std::vector<int> asked;  // the tables asked for, in request order
  for (size_t t = 0; t < ids.size(); ++t) {
    if (!ids[t].defined() || ids[t].numel() == 0) continue;
    trainyard::v1::Rows* entry = request.add_rows();
    entry->set_table(static_cast<int>(t));
    SetBytes(ids[t], entry->mutable_ids());
    asked.push_back(static_cast<int>(t));
  }
  trainyard::v1::PullRowsResponse response;
  absl::Status status = Call(&Stub::PullRows, request, &response, "pull rows");
  if (!status.ok()) return status;
  if (response.rows_size() != static_cast<int>(asked.size())) {
    return absl::InternalError(absl::StrCat("parameter server ", shard_, " sent rows of ",
                                            response.rows_size(), " tables, expected ",
                                            asked.size()));
  }
  for (const trainyard::v1::Rows& entry : response.rows()) {
    const int t = entry.table();
    if (t < 0 || t >= static_cast<int>(rows.size()) || !ids[t].defined() || ids[t].numel() == 0) {
      return absl::InternalError(
          absl::StrCat("parameter server ", shard_, " sent rows of table ", t, ", not asked for"));
    }
    torch::Tensor& target = rows[t];
    if (!target.is_contiguous() ||
        static_cast<int64_t>(entry.values().size()) != target.numel() * target.element_size()) {
      return absl::InternalError(absl::StrCat(
          "parameter server ", shard_, ": table ", t, " rows have ", entry.values().size(),
          " bytes, expected ", target.numel() * target.element_size()));
    }
    std::memcpy(target.data_ptr(), entry.values().data(), entry.values().size());
  }
  ParameterShard::PullResult result;
  result.version = response.version();
  return result;
}

}  // namespace trainyard::trainer
