#include "worker/trainer/ps_strategy.h"

#include <chrono>
#include <map>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/clock.h"

namespace trainyard::trainer {
std::string ParameterServerKey(int shard) { return absl::StrCat("ps/shard/", shard); }

ParameterServerStrategy::ParameterServerStrategy(int rank, int world,
                                                 std::vector<std::unique_ptr<PsClient>> shards,
                                                 bool synchronous)
    : rank_(rank),
      world_(world),
      synchronous_(synchronous),
      shards_(std::move(shards)),
      shard_versions_(shards_.size(), 0) {}

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
    names_.push_back(name);
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

void ParameterServerStrategy::SetOptimizer(torch::optim::Optimizer* optimizer,
                                           const NamedTensors& params) {
  optimizer_ = optimizer;
  optimizer_params_ = params;
}

namespace {

// "name.field" -> {name, field}.
std::pair<std::string, std::string> SplitStateKey(const std::string& key) {
  const size_t dot = key.rfind('.');
  if (dot == std::string::npos) return {key, ""};
  return {key.substr(0, dot), key.substr(dot + 1)};
}

}  // namespace

NamedTensors ParameterServerStrategy::ShardState(const NamedTensors& whole, int shard) const {
  std::map<std::string, std::vector<std::pair<std::string, torch::Tensor>>> by_param;
  for (const auto& [key, tensor] : whole) {
    auto [param, field] = SplitStateKey(key);
    by_param[param].emplace_back(field, tensor);
  }
  NamedTensors out;
  for (size_t k = 0; k < pieces_[shard].size(); ++k) {
    const Piece& piece = pieces_[shard][k];
    auto it = by_param.find(names_[piece.parameter]);
    if (it == by_param.end()) continue;
    for (const auto& [field, tensor] : it->second) {
      // "step" counts updates, one number per parameter; the rest are shaped like it.
      out.emplace_back(
          absl::StrCat("p", k, ".", field),
          field == "step" ? tensor : tensor.reshape(-1).narrow(0, piece.offset, piece.length));
    }
  }
  return out;
}

absl::Status ParameterServerStrategy::GatherOptimizerState(int64_t step) {
  if (!synchronous_) {
    // The last checkpoint of a run or of a stop waits for the other ranks' last updates.
    const bool last = step >= total_steps_ || local_.stop;
    std::vector<torch::Tensor> values;
    for (const torch::Tensor& p : params_) values.push_back(p.detach());
    std::vector<std::map<std::string, torch::Tensor>> states(shards_.size());
    absl::Status fetched = ForEachShard([&](int s) -> absl::Status {
      std::vector<torch::Tensor> views = Views(values, pieces_[s]);
      while (true) {
        absl::StatusOr<PsClient::SnapshotResult> snapshot = shards_[s]->Snapshot(last, views);
        // Another rank still trains (a slow one): it has its own timeouts and the job its stall
        // timeout; wait on.
        if (snapshot.status().code() == absl::StatusCode::kAborted) continue;
        if (!snapshot.ok()) return snapshot.status();
        states[s] = std::move(snapshot->optimizer_state);
        shard_versions_[s] = snapshot->version;
        return absl::OkStatus();
      }
    });
    if (!fetched.ok()) return fetched;
    return optimizer_ == nullptr ? absl::OkStatus() : LoadShardStates(states);
  }
  if (optimizer_ == nullptr) return absl::OkStatus();
  std::vector<absl::StatusOr<std::map<std::string, torch::Tensor>>> fetched_states(shards_.size());
  absl::Status fetched = ForEachShard([&](int s) {
    fetched_states[s] = shards_[s]->State(step);
    return fetched_states[s].status();
  });
  if (!fetched.ok()) return fetched;
  std::vector<std::map<std::string, torch::Tensor>> states;
  for (auto& state : fetched_states) states.push_back(*std::move(state));
  return LoadShardStates(states);
}

absl::Status ParameterServerStrategy::LoadShardStates(
    std::vector<std::map<std::string, torch::Tensor>>& states) {
  std::map<std::string, torch::Tensor> whole;
  for (int s = 0; s < static_cast<int>(shards_.size()); ++s) {
    for (const auto& [key, tensor] : states[s]) {
      auto [piece_name, field] = SplitStateKey(key);
      size_t k = 0;
      if (piece_name.size() < 2 || !absl::SimpleAtoi(piece_name.substr(1), &k) ||
          k >= pieces_[s].size()) {
        return absl::InternalError(
            absl::StrCat("parameter server ", s, " sent optimizer state '", key, "'"));
      }
      const Piece& piece = pieces_[s][k];
      const torch::Tensor& param = params_[piece.parameter];
      const std::string name = absl::StrCat(names_[piece.parameter], ".", field);
      if (field == "step") {
        whole[name] = tensor;
        continue;
      }
      torch::Tensor& target = whole[name];
      if (!target.defined()) target = torch::zeros_like(param, tensor.scalar_type());
      if (tensor.numel() != piece.length) {
        return absl::InternalError(absl::StrCat("parameter server ", s, ": optimizer state '", key,
                                                "' has ", tensor.numel(), " elements, its piece ",
                                                piece.length));
      }
      target.view(-1).narrow(0, piece.offset, piece.length).copy_(tensor.reshape(-1));
    }
  }
  absl::Status fits = CheckOptimizerState(*optimizer_, optimizer_params_, whole);
  if (!fits.ok()) return absl::InternalError(absl::StrCat("parameter servers: ", fits.message()));
  LoadOptimizerState(*optimizer_, optimizer_params_, whole);
  return absl::OkStatus();
}

absl::Status ParameterServerStrategy::SyncState(Model&, int64_t start_step) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<torch::Tensor> values;
  for (const torch::Tensor& p : params_) values.push_back(p.detach());
  if (rank_ == 0) {
    // The state the trainer restored from the checkpoint resumed from (none when fresh).
    const NamedTensors whole = optimizer_ != nullptr
                                   ? OptimizerStateTensors(*optimizer_, optimizer_params_)
                                   : NamedTensors{};
    absl::Status init = ForEachShard([&](int s) {
      return shards_[s]->Init(start_step, total_steps_, Views(values, pieces_[s]),
                              ShardState(whole, s));
    });
    if (!init.ok()) return init;
  }
  absl::Status pulled = ForEachShard([&](int s) -> absl::Status {
    std::vector<torch::Tensor> views = Views(values, pieces_[s]);
    absl::StatusOr<ParameterShard::PullResult> result = shards_[s]->Pull(start_step, views);
    if (!result.ok()) return result.status();
    // Asynchronous shards move on as soon as any rank pushes.
    if (synchronous_ ? result->version != start_step : result->version < start_step) {
      return absl::AbortedError(absl::StrCat("rank ", rank_, " resumed at step ", start_step,
                                             ", parameter server ", s, " is at ", result->version));
    }
    shard_versions_[s] = result->version;
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

absl::Status ParameterServerStrategy::AfterBackwardAsync() {
  const auto start = std::chrono::steady_clock::now();
  std::vector<torch::Tensor> grads, values;
  for (const torch::Tensor& p : params_) {
    grads.push_back(p.grad().defined() ? p.grad().detach().contiguous() : torch::zeros_like(p));
    values.push_back(p.detach());
  }
  std::vector<int> stale(shards_.size(), 0);
  absl::Status status = ForEachShard([&](int s) -> absl::Status {
    absl::StatusOr<ParameterShard::PushResult> pushed =
        shards_[s]->Push(shard_versions_[s], Views(grads, pieces_[s]), local_.loss, local_.stop);
    if (!pushed.ok()) return pushed.status();
    stale[s] = pushed->applied ? 0 : 1;
    std::vector<torch::Tensor> views = Views(values, pieces_[s]);
    // Whatever the shard holds now: no waiting for the other ranks.
    absl::StatusOr<ParameterShard::PullResult> pulled = shards_[s]->Pull(0, views);
    if (!pulled.ok()) return pulled.status();
    shard_versions_[s] = pulled->version;
    return absl::OkStatus();
  });
  communication_seconds_ += SecondsSince(start);
  if (!status.ok()) return status;
  for (int n : stale) stale_pushes_ += n;
  ++version_;
  agreed_ = local_;  // each rank stops on its own request
  return absl::OkStatus();
}

absl::Status ParameterServerStrategy::AfterBackward(Model&) {
  if (!synchronous_) return AfterBackwardAsync();
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

absl::Status ParameterServerStrategy::Finish() {
  return ForEachShard([this](int s) { return shards_[s]->Finish(); });
}

double ParameterServerStrategy::TakeCommunicationSeconds() {
  const double seconds = communication_seconds_;
  communication_seconds_ = 0;
  return seconds;
}

}  // namespace trainyard::trainer
