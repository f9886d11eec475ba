#ifndef TRAINYARD_WORKER_TRAINER_PS_WIRE_H_
#define TRAINYARD_WORKER_TRAINER_PS_WIRE_H_

// The parameter server's wire format, shared by its server (server.h) and its client (client.h):
// the PushPull frame and its gRPC codec, and the tensors, rows and results of the other calls in
// their protobuf messages (proto/trainyard/v1/ps_service.proto). No gRPC service or stub here.

#include <grpcpp/grpcpp.h>
#include <torch/torch.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "trainyard/v1/ps_service.pb.h"
#include "worker/trainer/ps/shard.h"

namespace trainyard::trainer::ps_wire {

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

// The PushPull method's full name, registered by the server and called by the client.
inline constexpr char kPushPullMethod[] = "/trainyard.v1.ParameterServer/PushPull";

// How a shard publishes the address of a server that speaks TLS ("tls:HOST:PORT"); a plain
// "HOST:PORT" speaks plaintext. The client follows what the shard serves.
inline constexpr char kTlsAddressPrefix[] = "tls:";

// gRPC's largest message (its limits are ints), and protobuf's: the ceiling of every limit below.
inline constexpr int64_t kMaxMessageBytes = std::numeric_limits<int32_t>::max();
// What a message carries beyond its tensors' bytes: its header, and per tensor a layout and a
// name (a few dozen bytes each; counted generously).
inline constexpr int64_t kMessageOverheadBytes = int64_t{64} << 10;
inline constexpr int64_t kTensorOverheadBytes = 256;
// The optimizer's state per parameter, at most: Adam's two moments (SGD's momentum is one).
inline constexpr int64_t kStateTensorsPerParameter = 2;

// The largest message a shard and its ranks exchange, for a shard that holds `parameter_bytes`
// (its pieces and its rows of the tables, their ids counted at 8 bytes a row) in `tensors`
// tensors: Init, State and Snapshot carry the parameters with up to kStateTensorsPerParameter
// tensors of state like them, a push, a pull or rows less. At least kMessageOverheadBytes, at
// most kMaxMessageBytes.
int MessageLimit(int64_t parameter_bytes, int64_t tensors);

// The bytes of a piece of `shape`; -1 for a shape no piece can have (a negative dimension, or more
// bytes than an int64 counts), which no data's size matches.
int64_t ByteSize(const ParameterShard::PieceShape& shape);
// A tensor's shape and dtype ("F32", "F64", "I64") into `layout`, and its bytes into `out`.
void SetLayout(const torch::Tensor& t, trainyard::v1::PieceLayout* layout);
void SetBytes(const torch::Tensor& t, std::string* out);
// A copy of the tensor `layout` and `data` describe; INVALID_ARGUMENT naming `what` when they
// do not fit each other.
absl::StatusOr<torch::Tensor> TensorFrom(const trainyard::v1::PieceLayout& layout,
                                         const std::string& data, const std::string& what);
// The row entries of a request by table (`tables` of them; undefined where none came): ids as
// int64 [k] and, `with_values`, the rows as [k, dim] of the table's dtype, both viewing the
// request's bytes. INVALID_ARGUMENT for a table that does not exist, one given twice, or bytes
// that do not fit.
absl::StatusOr<std::vector<RowGradients>> RowsFrom(
    const google::protobuf::RepeatedPtrField<trainyard::v1::Rows>& entries,
    const std::vector<ParameterShard::TableShape>& tables, bool with_values);
// The results of a push and a pull in their messages, and back.
void SetPushResponse(const ParameterShard::PushResult& result, trainyard::v1::PushResponse* out);
void SetPullResponse(const ParameterShard::PullResult& result, trainyard::v1::PullResponse* out);
ParameterShard::PushResult PushResultOf(const trainyard::v1::PushResponse& response);
ParameterShard::PullResult PullResultOf(const trainyard::v1::PullResponse& response);

}  // namespace trainyard::trainer::ps_wire

// gRPC's codec for frames: sends the header and then each tensor's memory as a slice of its own;
// receives into gRPC's slices without copying.
template <>
class grpc::SerializationTraits<trainyard::trainer::ps_wire::TensorFrame> {
 public:
  static grpc::Status Serialize(const trainyard::trainer::ps_wire::TensorFrame& frame,
                                grpc::ByteBuffer* buffer, bool* own_buffer);
  static grpc::Status Deserialize(grpc::ByteBuffer* buffer,
                                  trainyard::trainer::ps_wire::TensorFrame* frame);
};

#endif  // TRAINYARD_WORKER_TRAINER_PS_WIRE_H_
