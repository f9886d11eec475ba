// The parameter server's wire format, as a shard reads it from other processes over the network:
// a PushPull frame ([u32 header length][PushPullHeader][gradient bytes]) arriving in any cut of
// gRPC slices, read as the server reads it and pushed into a shard (two pieces, one embedding
// table); an InitRequest's tensors, made into a shard; and the replies a rank reads back. The
// first byte picks which; in a frame, the second says where the slices are cut.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "worker/trainer/ps/shard.h"
#include "worker/trainer/ps/wire.h"

namespace ps = trainyard::trainer;
namespace wire = trainyard::trainer::ps_wire;

namespace {

std::unique_ptr<ps::ParameterShard> NewShard() {
  ps::ShardConfig config;
  config.generation = 1;
  config.optimizer.set_name("sgd");
  config.optimizer.set_lr(0.1);
  absl::StatusOr<std::unique_ptr<ps::ParameterShard>> shard = ps::ParameterShard::Create(
      config, {torch::zeros({3}), torch::zeros({2, 2})}, {}, {torch::zeros({10, 2})}, {10});
  if (!shard.ok()) __builtin_trap();
  return *std::move(shard);
}

void PushPull(absl::string_view bytes, uint8_t cuts) {
  std::vector<grpc::Slice> slices;
  size_t at = 0;
  for (int i = 0; at < bytes.size(); ++i) {
    const size_t n = i < 7 && (cuts >> i & 1) ? 1 + (at * 7 + i) % 5 : bytes.size() - at;
    slices.emplace_back(bytes.data() + at, std::min(n, bytes.size() - at));
    at += slices.back().size();
  }
  grpc::ByteBuffer buffer(slices.data(), slices.size());
  wire::TensorFrame frame;
  if (!grpc::SerializationTraits<wire::TensorFrame>::Deserialize(&buffer, &frame).ok()) return;
  trainyard::v1::PushPullHeader header;
  if (!header.ParseFromString(frame.header)) return;
  std::unique_ptr<ps::ParameterShard> shard = NewShard();
  int64_t expected = 0;
  for (const auto& shape : shard->shapes()) expected += wire::ByteSize(shape);
  if (static_cast<int64_t>(frame.data_bytes) != expected) return;
  wire::SliceReader reader(frame);
  std::vector<torch::Tensor> gradients;
  for (const auto& [sizes, dtype] : shard->shapes()) {
    gradients.push_back(torch::empty(sizes, torch::TensorOptions().dtype(dtype)));
    if (!reader.Read(gradients.back().data_ptr(), gradients.back().nbytes())) __builtin_trap();
  }
  const trainyard::v1::PushRequest& push = header.push();
  absl::StatusOr<std::vector<ps::RowGradients>> rows =
      wire::RowsFrom(push.rows(), shard->table_shapes(), /*with_values=*/true);
  if (!rows.ok()) return;
  if (!shard
           ->Push(push.generation(), push.rank(), push.base_version(), gradients, push.loss(),
                  push.stop(), *rows)
           .ok()) {
    return;
  }
  std::vector<torch::Tensor> pulled;
  shard->PullShared(push.generation(), header.pull_min_version(), absl::InfinitePast(), &pulled)
      .IgnoreError();
}

void Init(absl::string_view bytes) {
  trainyard::v1::InitRequest request;
  if (!request.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) return;
  std::vector<torch::Tensor> pieces;
  for (int i = 0; i < request.layout_size() && i < request.values_size(); ++i) {
    absl::StatusOr<torch::Tensor> piece =
        wire::TensorFrom(request.layout(i), request.values(i).data(), "piece");
    if (!piece.ok()) return;
    pieces.push_back(*std::move(piece));
  }
  std::map<std::string, torch::Tensor> state;
  for (const trainyard::v1::NamedTensor& t : request.optimizer_state()) {
    absl::StatusOr<torch::Tensor> tensor = wire::TensorFrom(t.layout(), t.data(), t.name());
    if (!tensor.ok()) return;
    state[t.name()] = *std::move(tensor);
  }
  std::vector<torch::Tensor> tables;
  std::vector<int64_t> table_rows;
  for (const trainyard::v1::TableData& table : request.tables()) {
    absl::StatusOr<torch::Tensor> values = wire::TensorFrom(table.layout(), table.data(), "table");
    if (!values.ok()) return;
    tables.push_back(*std::move(values));
    table_rows.push_back(table.rows());
  }
  ps::ShardConfig config;
  config.generation = request.generation();
  config.start_version = request.version();
  config.total_steps = request.total_steps();
  config.optimizer.set_name("adam");
  config.optimizer.set_lr(0.01);
  ps::ParameterShard::Create(config, pieces, state, tables, table_rows).IgnoreError();
}

void Replies(absl::string_view bytes) {
  trainyard::v1::PushPullReply reply;
  if (!reply.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) return;
  wire::PushResultOf(reply.push());
  wire::PullResultOf(reply.pull());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const absl::string_view rest(reinterpret_cast<const char*>(data) + 2, size - 2);
  switch (data[0] % 3) {
    case 0:
      PushPull(rest, data[1]);
      break;
    case 1:
      Init(rest);
      break;
    default:
      Replies(rest);
  }
  return 0;
}
