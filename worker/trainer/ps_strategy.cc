#include "worker/trainer/ps_strategy.h"

#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"

namespace trainyard::trainer {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

ParameterServerStrategy::ParameterServerStrategy(int rank, int world,
                                                 std::vector<std::unique_ptr<PsClient>> shards)
    : rank_(rank), world_(world), shards_(std::move(shards)) {}

absl::Status ParameterServerStrategy::Setup(Model& model) {
  std::vector<ParameterShape> shapes;
  for (const auto& [name, p] : model.NamedParameters()) {
    if (!p.requires_grad()) continue;
    if (!p.device().is_cpu() || !p.is_contiguous() ||
        (p.scalar_type() != torch::kFloat32 && p.scalar_type() != torch::kFloat64)) {
      return absl::InvalidArgumentError(
          absl::StrCat("model: parameter ", name,
                       " is not a contiguous float32 or float64 CPU tensor, which "
                       "the parameter-server strategy needs"));
    }
    params_.push_back(p);
    shapes.push_back({name, p.numel(), static_cast<int64_t>(p.element_size())});
  }
  absl::StatusOr<Partition> partition =
      PartitionParameters(shapes, static_cast<int>(shards_.size()));
  if (!partition.ok()) return partition.status();
  partition_ = *std::move(partition);
  pieces_.resize(shards_.size());
  for (int s = 0; s < static_cast<int>(shards_.size()); ++s) pieces_[s] = partition_.PiecesOf(s);
  return absl::OkStatus();
}

absl::Status ParameterServerStrategy::ForEachShard(const std::function<absl::Status(int)>& call) {
  const int n = static_cast<int>(shards_.size());
  std::vector<absl::Status> results(n);
  std::vector<std::thread> threads;
  for (int s = 1; s < n; ++s) threads.emplace_back([&, s] { results[s] = call(s); });
  if (n > 0) results[0] = call(0);
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : results) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

namespace {

// The pieces of `tensors` (one per parameter, flattened) that `pieces` name: views, no copy.
std::vector<torch::Tensor> Views(const std::vector<torch::Tensor>& tensors,
                                 const std::vector<Piece>& pieces) {
  std::vector<torch::Tensor> views;
  views.reserve(pieces.size());
  for (const Piece& piece : pieces) {
    views.push_back(tensors[piece.parameter].view(-1).narrow(0, piece.offset, piece.length));
  }
  return views;
}

}  // namespace

absl::Status ParameterServerStrategy::SyncState(Model&, int64_t start_step) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<torch::Tensor> values;
  for (const torch::Tensor& p : params_) values.push_back(p.detach());
  if (rank_ == 0) {
    absl::Status init = ForEachShard([&](int s) {
      return shards_[s]->Init(start_step, total_steps_, Views(values, pieces_[s]));
    });
    if (!init.ok()) return init;
  }
  absl::Status pulled = ForEachShard([&](int s) -> absl::Status {
    std::vector<torch::Tensor> views = Views(values, pieces_[s]);
    absl::StatusOr<ParameterShard::PullResult> result = shards_[s]->Pull(start_step, views);
    if (!result.ok()) return result.status();
    if (result->version != start_step) {
      return absl::AbortedError(absl::StrCat("rank ", rank_, " resumed at step ", start_step,
                                             ", parameter server ", s, " is at ", result->version));
    }
    return absl::OkStatus();
  });
  version_ = start_step;
  communication_seconds_ += SecondsSince(start);
  return pulled;
}

void ParameterServerStrategy::BeforeBackward(bool last_micro_batch, double update_loss,
                                             bool stop_requested) {
  if (last_micro_batch) local_ = StepAgreement{update_loss, stop_requested};
}

absl::Status ParameterServerStrategy::AfterBackward(Model&) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<torch::Tensor> grads, values;
  for (const torch::Tensor& p : params_) {
    // A parameter that got no gradient in this update contributes zeros, as in data_parallel.
    grads.push_back(p.grad().defined() ? p.grad().detach().contiguous() : torch::zeros_like(p));
    values.push_back(p.detach());
  }
  std::vector<StepAgreement> agreements(shards_.size());
  absl::Status status = ForEachShard([&](int s) -> absl::Status {
    absl::StatusOr<ParameterShard::PushResult> pushed =
        shards_[s]->Push(version_, Views(grads, pieces_[s]), local_.loss, local_.stop);
    if (!pushed.ok()) return pushed.status();
    std::vector<torch::Tensor> views = Views(values, pieces_[s]);
    absl::StatusOr<ParameterShard::PullResult> pulled = shards_[s]->Pull(version_ + 1, views);
    if (!pulled.ok()) return pulled.status();
    agreements[s] = StepAgreement{pulled->agreement.loss, pulled->agreement.stop};
    return absl::OkStatus();
  });
  communication_seconds_ += SecondsSince(start);
  if (!status.ok()) return status;
  ++version_;
  // Every shard saw every rank's loss and stop; a model too small to reach all shards leaves
  // some empty, and those still agree.
  agreed_ = agreements.empty() ? local_ : agreements[0];
  return absl::OkStatus();
}

absl::StatusOr<StepAgreement> ParameterServerStrategy::EndStep() { return agreed_; }

double ParameterServerStrategy::TakeCommunicationSeconds() {
  const double seconds = communication_seconds_;
  communication_seconds_ = 0;
  return seconds;
}

}  // namespace trainyard::trainer
