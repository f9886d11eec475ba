#include "worker/trainer/ps/wire.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace trainyard::trainer::ps_wire {
namespace {

std::string DtypeName(c10::ScalarType dtype) {
  return dtype == torch::kFloat64 ? "F64" : dtype == torch::kInt64 ? "I64" : "F32";
}

absl::StatusOr<c10::ScalarType> ParseDtype(const std::string& name) {
  if (name == "F32") return torch::kFloat32;
  if (name == "F64") return torch::kFloat64;
  if (name == "I64") return torch::kInt64;
  return absl::InvalidArgumentError(absl::StrCat("dtype '", name, "'"));
}

}  // namespace

int MessageLimit(int64_t parameter_bytes, int64_t tensors) {
  const int64_t copies = 1 + kStateTensorsPerParameter;
  // Saturates rather than overflows: anything near the ceiling is the ceiling.
  const int64_t ceiling = kMaxMessageBytes;
  const int64_t bytes = std::max<int64_t>(parameter_bytes, 0);
  const int64_t count = std::max<int64_t>(tensors, 0);
  if (bytes > ceiling / copies || count > ceiling / (copies * kTensorOverheadBytes)) {
    return static_cast<int>(ceiling);
  }
  const int64_t limit = copies * (bytes + count * kTensorOverheadBytes) + kMessageOverheadBytes;
  return static_cast<int>(std::min(limit, ceiling));
}

int64_t ByteSize(const ParameterShard::PieceShape& shape) {
  int64_t n = c10::elementSize(shape.second);
  // The shape's extent with its empty dimensions counted as one: LibTorch derives strides from
  // it (in int64, whose values past 2^61 LibTorch 1.13 takes for symbols), so an empty dimension
  // must not hide what the others multiply to.
  int64_t extent = n;
  for (int64_t d : shape.first) {
    // A shape from the wire may claim anything: negative, or more bytes than exist.
    if (d < 0 || __builtin_mul_overflow(n, d, &n) ||
        __builtin_mul_overflow(extent, std::max<int64_t>(d, 1), &extent)) {
      return -1;
    }
  }
  return n;
}

void SetLayout(const torch::Tensor& t, trainyard::v1::PieceLayout* layout) {
  for (int64_t d : t.sizes()) layout->add_shape(d);
  layout->set_dtype(DtypeName(t.scalar_type()));
}

void SetBytes(const torch::Tensor& t, std::string* out) {
  const torch::Tensor c = t.detach().contiguous();
  out->assign(static_cast<const char*>(c.data_ptr()), c.numel() * c.element_size());
}

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

}  // namespace trainyard::trainer::ps_wire

grpc::Status grpc::SerializationTraits<trainyard::trainer::ps_wire::TensorFrame>::Serialize(
    const trainyard::trainer::ps_wire::TensorFrame& frame, grpc::ByteBuffer* buffer,
    bool* own_buffer) {
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

grpc::Status grpc::SerializationTraits<trainyard::trainer::ps_wire::TensorFrame>::Deserialize(
    grpc::ByteBuffer* buffer, trainyard::trainer::ps_wire::TensorFrame* frame) {
  const size_t total = buffer->Length();
  grpc::Status dumped = buffer->Dump(&frame->slices);
  buffer->Clear();
  if (!dumped.ok()) return dumped;
  trainyard::trainer::ps_wire::SliceReader reader(frame->slices, 0, 0);
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
