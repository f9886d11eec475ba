#include "worker/trainer/ps_service.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/client_unary_call.h>
#include <grpcpp/impl/rpc_method.h>
#include <grpcpp/impl/rpc_service_method.h>
#include <grpcpp/support/method_handler.h>
#include <openssl/crypto.h>

#include <cstring>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"

namespace trainyard::trainer {

// A PushPull message (see ps_service.proto): [u32 little-endian header length][header][tensor
// bytes]. Sent, the tensors' bytes are gRPC slices over the tensors' own memory (each slice
// keeps its tensor alive), so nothing is copied into the message; received, the bytes stay in
// gRPC's slices until a SliceReader copies them, in order, to where they belong.
struct TensorFrame {
  std::string header;
  std::vector<torch::Tensor> tensors;  // to send: contiguous CPU tensors

  // Received: gRPC's slices, and where and how many tensor bytes follow the header.
  std::vector<grpc::Slice> slices;
  size_t data_slice = 0;
  size_t data_offset = 0;
  size_t data_bytes = 0;
};

// Reads a run of slices in order.
class SliceReader {
 public:
  SliceReader(const std::vector<grpc::Slice>& slices, size_t slice, size_t offset)
      : slices_(slices), slice_(slice), offset_(offset) {}
  explicit SliceReader(const TensorFrame& frame)
      : SliceReader(frame.slices, frame.data_slice, frame.data_offset) {}

  // Copies the next `n` bytes to `dst`; false when fewer are left.
  bool Read(void* dst, size_t n) {
    char* out = static_cast<char*>(dst);
    while (n > 0) {
      if (slice_ >= slices_.size()) return false;
      const size_t take = std::min(slices_[slice_].size() - offset_, n);
      std::memcpy(out, slices_[slice_].begin() + offset_, take);
      out += take;
      n -= take;
      offset_ += take;
      if (offset_ == slices_[slice_].size()) {
        ++slice_;
        offset_ = 0;
      }
    }
    return true;
  }
  size_t slice() const { return slice_; }
  size_t offset() const { return offset_; }

 private:
  const std::vector<grpc::Slice>& slices_;
  size_t slice_;
  size_t offset_;
};

}  // namespace trainyard::trainer

template <>
class grpc::SerializationTraits<trainyard::trainer::TensorFrame> {
 public:
  static grpc::Status Serialize(const trainyard::trainer::TensorFrame& frame,
                                grpc::ByteBuffer* buffer, bool* own_buffer) {
    std::vector<grpc::Slice> slices;
    std::string head(4 + frame.header.size(), '\0');
    const uint32_t length = static_cast<uint32_t>(frame.header.size());
    for (int i = 0; i < 4; ++i) head[i] = static_cast<char>((length >> (8 * i)) & 0xff);
    std::memcpy(head.data() + 4, frame.header.data(), frame.header.size());
    slices.emplace_back(head);
    for (const torch::Tensor& t : frame.tensors) {
      const size_t bytes = static_cast<size_t>(t.numel()) * t.element_size();
      if (bytes == 0) continue;
      auto* keep = new torch::Tensor(t);
      slices.emplace_back(
          keep->data_ptr(), bytes, [](void* p) { delete static_cast<torch::Tensor*>(p); }, keep);
    }
    grpc::ByteBuffer out(slices.data(), slices.size());
    buffer->Swap(&out);
    *own_buffer = true;
    return grpc::Status::OK;
  }

  static grpc::Status Deserialize(grpc::ByteBuffer* buffer,
                                  trainyard::trainer::TensorFrame* frame) {
    const size_t total = buffer->Length();
    grpc::Status dumped = buffer->Dump(&frame->slices);
    buffer->Clear();
    if (!dumped.ok()) return dumped;
    trainyard::trainer::SliceReader reader(frame->slices, 0, 0);
    unsigned char head[4];
    if (total < 4 || !reader.Read(head, 4)) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "parameter-server frame: no header");
    }
    const uint32_t length =
        head[0] | (head[1] << 8) | (head[2] << 16) | (static_cast<uint32_t>(head[3]) << 24);
    if (length > total - 4) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "parameter-server frame: header longer than the message");
    }
    frame->header.resize(length);
    reader.Read(frame->header.data(), length);
    frame->data_slice = reader.slice();
    frame->data_offset = reader.offset();
    frame->data_bytes = total - 4 - length;
    return grpc::Status::OK;
  }
};

namespace trainyard::trainer {
namespace {

constexpr char kPushPullMethod[] = "/trainyard.v1.ParameterServer/PushPull";

// Pieces are a few MiB each and a shard may hold gigabytes: no message limit of gRPC's own.
constexpr int kUnlimited = -1;

int64_t ByteSize(const ParameterShard::PieceShape& shape) {
  int64_t n = c10::elementSize(shape.second);
  for (int64_t d : shape.first) n *= d;
  return n;
}

std::string DtypeName(c10::ScalarType dtype) {
  return dtype == torch::kFloat64 ? "F64" : dtype == torch::kInt64 ? "I64" : "F32";
}

absl::StatusOr<c10::ScalarType> ParseDtype(const std::string& name) {
  if (name == "F32") return torch::kFloat32;
  if (name == "F64") return torch::kFloat64;
  if (name == "I64") return torch::kInt64;
  return absl::InvalidArgumentError(absl::StrCat("dtype '", name, "'"));
}

void SetLayout(const torch::Tensor& t, trainyard::v1::PieceLayout* layout) {
  for (int64_t d : t.sizes()) layout->add_shape(d);
  layout->set_dtype(DtypeName(t.scalar_type()));
}

void SetBytes(const torch::Tensor& t, std::string* out) {
  const torch::Tensor c = t.detach().contiguous();
  out->assign(static_cast<const char*>(c.data_ptr()), c.numel() * c.element_size());
}

// A copy of the tensor `layout` and `data` describe; INVALID_ARGUMENT naming `what` when they
// do not fit each other.
absl::StatusOr<torch::Tensor> TensorFrom(const trainyard::v1::PieceLayout& layout,
                                         const std::string& data, const std::string& what) {
  absl::StatusOr<c10::ScalarType> dtype = ParseDtype(layout.dtype());
  if (!dtype.ok())
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", dtype.status().message()));
  const ParameterShard::PieceShape shape{
      std::vector<int64_t>(layout.shape().begin(), layout.shape().end()), *dtype};
  if (static_cast<int64_t>(data.size()) != ByteSize(shape)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " has ", data.size(), " bytes, its layout ", ByteSize(shape)));
  }
  return torch::from_blob(const_cast<char*>(data.data()), shape.first,
                          torch::TensorOptions().dtype(*dtype))
      .clone();
}

// The row entries of a request by table (`tables` of them; undefined where none came): ids as
// int64 [k] and, `with_values`, the rows as [k, dim] of the table's dtype, both viewing the
// request's bytes. INVALID_ARGUMENT for a table that does not exist, one given twice, or bytes
// that do not fit.
absl::StatusOr<std::vector<RowGradients>> RowsFrom(
    const google::protobuf::RepeatedPtrField<trainyard::v1::Rows>& entries,
    const std::vector<ParameterShard::TableShape>& tables, bool with_values) {
  std::vector<RowGradients> rows(tables.size());
  for (const trainyard::v1::Rows& entry : entries) {
    const int t = entry.table();
    if (t < 0 || t >= static_cast<int>(tables.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("rows of table ", t, "; the shard has ", tables.size(), " tables"));
    }
    if (rows[t].ids.defined()) {
      return absl::InvalidArgumentError(absl::StrCat("rows of table ", t, " given twice"));
    }
    if (entry.ids().size() % sizeof(int64_t) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("table ", t, ": ", entry.ids().size(), " bytes of int64 row ids"));
    }
    const int64_t k = static_cast<int64_t>(entry.ids().size() / sizeof(int64_t));
    rows[t].ids = torch::from_blob(const_cast<char*>(entry.ids().data()), {k},
                                   torch::TensorOptions().dtype(torch::kInt64));
    if (!with_values) continue;
    const ParameterShard::TableShape& shape = tables[t];
    const int64_t expected = k * shape.dim * static_cast<int64_t>(c10::elementSize(shape.dtype));
    if (static_cast<int64_t>(entry.values().size()) != expected) {
      return absl::InvalidArgumentError(absl::StrCat("table ", t, ": ", entry.values().size(),
                                                     " bytes for ", k, " rows of ", shape.dim, " ",
                                                     c10::toString(shape.dtype)));
    }
    rows[t].grads = torch::from_blob(const_cast<char*>(entry.values().data()), {k, shape.dim},
                                     torch::TensorOptions().dtype(shape.dtype));
  }
  return rows;
}

// The results of a push and a pull in their messages, and back.
void SetPushResponse(const ParameterShard::PushResult& result, trainyard::v1::PushResponse* out) {
  out->set_version(result.version);
  out->set_staleness(result.staleness);
  out->set_applied(result.applied);
}

void SetPullResponse(const ParameterShard::PullResult& result, trainyard::v1::PullResponse* out) {
  out->set_version(result.version);
  out->set_loss(result.agreement.loss);
  out->set_stop(result.agreement.stop);
}

ParameterShard::PushResult PushResultOf(const trainyard::v1::PushResponse& response) {
  return ParameterShard::PushResult{response.version(), response.staleness(), response.applied()};
}

ParameterShard::PullResult PullResultOf(const trainyard::v1::PullResponse& response) {
  ParameterShard::PullResult result;
  result.version = response.version();
  result.agreement = ShardAgreement{response.loss(), response.stop()};
  return result;
}

}  // namespace

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
  // is refused before anything is read or changed.
  grpc::Status Admit(const grpc::ServerContext* context) const {
    if (secret_.empty()) return grpc::Status::OK;
    const auto& metadata = context->client_metadata();
    auto it = metadata.find("authorization");
    const std::string expected = "Bearer " + secret_;
    if (it != metadata.end() && it->second.size() == expected.size() &&
        CRYPTO_memcmp(it->second.data(), expected.data(), expected.size()) == 0) {
      return grpc::Status::OK;
    }
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "this parameter server serves only the ranks of its own attempt");
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
      service_->last_call_ended_ = absl::Now();
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
    return in_flight_ == 0 && absl::Now() - last_call_ended_ >= quiet;
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
  absl::Time last_call_ended_ ABSL_GUARDED_BY(activity_mu_) = absl::Now();
  ParameterShard* shard_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::unique_ptr<ParameterShard> owned_ ABSL_GUARDED_BY(mu_);
};

absl::StatusOr<std::unique_ptr<PsServer>> PsServer::Start(ParameterShard* shard,
                                                          const std::string& listen,
                                                          std::string caller_secret) {
  return Serve(std::make_unique<Service>(shard, std::move(caller_secret)), listen);
}

absl::StatusOr<std::unique_ptr<PsServer>> PsServer::StartEmpty(ShardConfig config,
                                                               const std::string& listen,
                                                               std::string caller_secret) {
  return Serve(std::make_unique<Service>(std::move(config), std::move(caller_secret)), listen);
}

absl::StatusOr<std::unique_ptr<PsServer>> PsServer::Serve(std::unique_ptr<Service> service,
                                                          const std::string& listen) {
  std::unique_ptr<PsServer> server(new PsServer());
  server->service_ = std::move(service);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &server->port_);
  builder.RegisterService(server->service_.get());
  builder.SetMaxReceiveMessageSize(kUnlimited);
  builder.SetMaxSendMessageSize(kUnlimited);
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("parameter server: cannot listen on ", listen));
  }
  return server;
}

bool PsServer::WaitUntilFinished(absl::Time deadline) {
  return service_->WaitUntilFinished(deadline);
}

bool PsServer::Quiet(absl::Duration quiet) const { return service_->Quiet(quiet); }

ShardStats PsServer::Stats() const { return service_->Stats(); }

PsServer::~PsServer() {
  if (server_ != nullptr) server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
}

PsClient::PsClient(const std::string& address, int shard, int64_t generation, int rank,
                   absl::Duration timeout, std::string caller_secret)
    : address_(address),
      shard_(shard),
      generation_(generation),
      rank_(rank),
      timeout_(timeout),
      bearer_(caller_secret.empty() ? "" : "Bearer " + caller_secret) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kUnlimited);
  args.SetMaxSendMessageSize(kUnlimited);
  channel_ = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  stub_ = trainyard::v1::ParameterServer::NewStub(channel_);
}

template <typename Request, typename Response>
absl::Status PsClient::Call(grpc::Status (Stub::*rpc)(grpc::ClientContext*, const Request&,
                                                      Response*),
                            const Request& request, Response* response, const char* method) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout_));
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
  trainyard::v1::PushPullHeader header;
  FillPush(base_version, loss, stop, rows, *header.mutable_push());
  header.set_pull_min_version(min_version);
  TensorFrame request;
  request.header = header.SerializeAsString();
  for (const torch::Tensor& g : gradients) request.tensors.push_back(g.contiguous());
  TensorFrame response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout_));
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
