#include "worker/trainer/ps/strategy.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "worker/trainer/model/optimizer.h"

namespace trainyard::trainer {
std::string ParameterServerKey(int shard) { return absl::StrCat("ps/shard/", shard); }

ParameterServerStrategy::ParameterServerStrategy(int rank, int world,
                                                 std::vector<std::unique_ptr<PsClient>> shards,
                                                 bool synchronous, std::unique_ptr<Strategy> dense)
    : rank_(rank),
      world_(world),
      synchronous_(synchronous),
      dense_(std::move(dense)),
      shards_(std::move(shards)),
      shard_versions_(shards_.size(), 0) {}

absl::Status ParameterServerStrategy::Setup(Model& model) {
  auto check = [](const std::string& name, const torch::Tensor& p) -> absl::Status {
    if (!p.device().is_cpu() || !p.is_contiguous() ||
        (p.scalar_type() != torch::kFloat32 && p.scalar_type() != torch::kFloat64)) {
      return absl::InvalidArgumentError(
          absl::StrCat("model: parameter ", name,
                       " is not a contiguous float32 or float64 CPU tensor, which "
                       "the parameter-server strategy needs"));
    }
    return absl::OkStatus();
  };
  std::map<std::string, torch::Tensor> by_name;
  for (const auto& [name, p] : model.NamedParameters()) by_name[name] = p;
  std::set<std::string> table_names;
  for (const Model::EmbeddingTable& table : model.EmbeddingTables()) {
    auto it = by_name.find(table.parameter);
    if (it == by_name.end() || it->second.dim() != 2 || !it->second.requires_grad()) {
      return absl::InvalidArgumentError(absl::StrCat("model: embedding table ", table.parameter,
                                                     " is not a trainable 2-D parameter"));
    }
    if (absl::Status ok = check(table.parameter, it->second); !ok.ok()) return ok;
    tables_.push_back(Table{it->second, table.parameter, table.field});
    table_names.insert(table.parameter);
  }
  if (dense_ != nullptr) {
    if (tables_.empty()) {
      return absl::InvalidArgumentError(
          "parameter_servers.dense: allreduce keeps the embedding tables on the shards, and "
          "this model has none (embedding_mlp has them); use strategy: data_parallel");
    }
    if (auto* dp = dynamic_cast<DataParallelStrategy*>(dense_.get())) dp->LeaveOut(table_names);
    if (absl::Status ok = dense_->Setup(model); !ok.ok()) return ok;
  }
  std::vector<ParameterShape> shapes;
  for (const auto& [name, p] : model.NamedParameters()) {
    if (!p.requires_grad() || table_names.count(name) > 0 || dense_ != nullptr) continue;
    if (absl::Status ok = check(name, p); !ok.ok()) return ok;
    params_.push_back(p);
    names_.push_back(name);
    shapes.push_back({name, p.numel(), static_cast<int64_t>(p.element_size())});
  }
  absl::StatusOr<Partition> partition =
      PartitionParameters(shapes, static_cast<int>(shards_.size()));
  if (!partition.ok()) return partition.status();
  partition_ = *std::move(partition);
  shapes_ = std::move(shapes);
  pieces_.resize(shards_.size());
  for (int s = 0; s < static_cast<int>(shards_.size()); ++s) {
    pieces_[s] = partition_.PiecesOf(s);
    // What the shard's messages carry at most: its pieces and its rows of the tables.
    int64_t bytes = partition_.shard_bytes[s];
    for (size_t t = 0; t < tables_.size(); ++t) {
      const torch::Tensor& param = tables_[t].param;
      const int64_t row = param.size(1) * static_cast<int64_t>(param.element_size()) + 8;  // id
      bytes += RowsOnShard(param.size(0), s, static_cast<int>(shards_.size())) * row;
    }
    shards_[s]->LimitMessages(bytes, static_cast<int64_t>(pieces_[s].size() + tables_.size()));
  }
  if (!tables_.empty()) {
    model.SetRowLookup([this](int t, const torch::Tensor& ids) { return LookUp(t, ids); });
  }
  return absl::OkStatus();
}

torch::Tensor ParameterServerStrategy::TableSlice(int t, int s) const {
  const torch::Tensor& param = tables_[t].param;
  return param.detach().slice(0, s, param.size(0), static_cast<int64_t>(shards_.size()));
}

std::vector<torch::Tensor> ParameterServerStrategy::TableBuffers(int s) const {
  std::vector<torch::Tensor> buffers;
  for (size_t t = 0; t < tables_.size(); ++t) {
    buffers.push_back(
        torch::empty_like(TableSlice(static_cast<int>(t), s), torch::MemoryFormat::Contiguous));
  }
  return buffers;
}

std::vector<ParameterServerStrategy::ShardRows> ParameterServerStrategy::SplitByShard(
    const torch::Tensor& ids) const {
  const int64_t n = static_cast<int64_t>(shards_.size());
  std::vector<ShardRows> split(shards_.size());
  const torch::Tensor owner = n > 1 ? ids.remainder(n) : torch::Tensor();
  for (int64_t s = 0; s < n; ++s) {
    ShardRows& rows = split[s];
    rows.positions =
        n > 1 ? owner.eq(s).nonzero().squeeze(1) : torch::arange(ids.size(0), ids.options());
    rows.ids = n > 1 ? ids.index_select(0, rows.positions) : ids;
  }
  return split;
}

absl::StatusOr<std::vector<torch::Tensor>> ParameterServerStrategy::PullTableRows(
    const std::vector<torch::Tensor>& ids, int64_t min_version, std::vector<int64_t>* versions) {
  std::vector<torch::Tensor> rows(tables_.size());
  std::vector<std::vector<ShardRows>> split(tables_.size());
  for (size_t t = 0; t < tables_.size(); ++t) {
    if (!ids[t].defined()) continue;
    rows[t] = torch::empty({ids[t].size(0), tables_[t].param.size(1)},
                           tables_[t].param.options().requires_grad(false));
    split[t] = SplitByShard(ids[t]);
  }
  absl::Status pulled = ForEachShard([&](int s) -> absl::Status {
    std::vector<torch::Tensor> shard_ids(tables_.size()), buffers(tables_.size());
    bool any = false;
    for (size_t t = 0; t < tables_.size(); ++t) {
      if (!ids[t].defined() || split[t][s].ids.numel() == 0) continue;
      shard_ids[t] = split[t][s].ids;
      buffers[t] = torch::empty({shard_ids[t].size(0), rows[t].size(1)}, rows[t].options());
      any = true;
    }
    // Synchronous, a shard this batch has no rows on is still asked, for nothing but its
    // version: this rank may not push for a version its shard has not reached (its peers may not
    // have pushed the last one yet), which it would, a step ahead, without this wait.
    if (!any && min_version == 0) return absl::OkStatus();
    absl::StatusOr<ParameterShard::PullResult> result =
        shards_[s]->PullRows(min_version, shard_ids, buffers);
    if (!result.ok()) return result.status();
    if (versions != nullptr) (*versions)[s] = result->version;
    // Each shard's rows go to their own positions: the threads write disjoint rows.
    for (size_t t = 0; t < tables_.size(); ++t) {
      if (buffers[t].defined()) rows[t].index_copy_(0, split[t][s].positions, buffers[t]);
    }
    return absl::OkStatus();
  });
  if (!pulled.ok()) return pulled;
  return rows;
}

absl::Status ParameterServerStrategy::BeforeForward(const torch::Tensor& categorical) {
  if (tables_.empty()) return absl::OkStatus();
  if (!categorical.defined()) {
    return absl::InvalidArgumentError("the model's embedding tables need categorical ids");
  }
  const auto start = MonotonicNow();
  std::vector<MicroRows> micro(tables_.size());
  std::vector<torch::Tensor> ids(tables_.size());
  for (size_t t = 0; t < tables_.size(); ++t) {
    const torch::Tensor column = categorical.select(1, tables_[t].field).contiguous();
    auto [unique, inverse] = at::_unique(column, /*sorted=*/true, /*return_inverse=*/true);
    micro[t].ids = unique;
    micro[t].inverse = inverse;
    ids[t] = unique;
  }
  // dense: allreduce, asynchronous: an update's rows are as old as the first micro-batch's pull.
  const bool base = dense_ != nullptr && !synchronous_ && micro_.empty();
  absl::StatusOr<std::vector<torch::Tensor>> rows =
      PullTableRows(ids, synchronous_ ? version_ : 0, base ? &shard_versions_ : nullptr);
  communication_seconds_ += SecondsSince(start);
  if (!rows.ok()) return rows.status();
  for (size_t t = 0; t < tables_.size(); ++t) micro[t].rows = (*rows)[t].requires_grad_(true);
  micro_.push_back(std::move(micro));
  return absl::OkStatus();
}

torch::Tensor ParameterServerStrategy::LookUp(int t, const torch::Tensor& ids) {
  // Outside a training step (validation): the model's own table, which BeforeEvaluate updated.
  if (micro_.empty()) return torch::embedding(tables_[t].param, ids);
  const MicroRows& micro = micro_.back()[t];
  TORCH_CHECK(micro.inverse.numel() == ids.numel(),
              "embedding rows were pulled for another micro-batch");
  return torch::embedding(micro.rows, micro.inverse);
}

std::vector<std::vector<RowGradients>> ParameterServerStrategy::TakeRowGradients() {
  std::vector<std::vector<RowGradients>> by_shard(shards_.size(),
                                                  std::vector<RowGradients>(tables_.size()));
  if (micro_.empty()) return by_shard;
  torch::NoGradGuard no_grad;
  for (size_t t = 0; t < tables_.size(); ++t) {
    std::vector<torch::Tensor> ids, grads;
    for (const std::vector<MicroRows>& micro : micro_) {
      const MicroRows& m = micro[t];
      ids.push_back(m.ids);
      grads.push_back(m.rows.grad().defined() ? m.rows.grad() : torch::zeros_like(m.rows));
    }
    // Rows repeated over micro-batches are summed by the shard.
    const torch::Tensor all_ids = ids.size() == 1 ? ids[0] : torch::cat(ids);
    const torch::Tensor all_grads = grads.size() == 1 ? grads[0] : torch::cat(grads);
    std::vector<ShardRows> split = SplitByShard(all_ids);
    for (size_t s = 0; s < shards_.size(); ++s) {
      if (split[s].ids.numel() == 0) continue;
      by_shard[s][t] = RowGradients{
          split[s].ids,
          shards_.size() == 1 ? all_grads : all_grads.index_select(0, split[s].positions)};
    }
  }
  micro_.clear();
  return by_shard;
}

absl::Status ParameterServerStrategy::BeforeEvaluate(const torch::Tensor& categorical) {
  if (tables_.empty() || !categorical.defined()) return absl::OkStatus();
  const auto start = MonotonicNow();
  std::vector<torch::Tensor> ids(tables_.size());
  for (size_t t = 0; t < tables_.size(); ++t) {
    ids[t] = std::get<0>(
        at::_unique(categorical.select(1, tables_[t].field).contiguous(), /*sorted=*/true));
  }
  absl::StatusOr<std::vector<torch::Tensor>> rows = PullTableRows(ids, synchronous_ ? version_ : 0);
  communication_seconds_ += SecondsSince(start);
  if (!rows.ok()) return rows.status();
  torch::NoGradGuard no_grad;
  for (size_t t = 0; t < tables_.size(); ++t) {
    tables_[t].param.detach().index_copy_(0, ids[t], (*rows)[t]);
  }
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
  const int64_t n = static_cast<int64_t>(shards_.size());
  for (size_t t = 0; t < tables_.size(); ++t) {
    auto it = by_param.find(tables_[t].name);
    if (it == by_param.end()) continue;
    for (const auto& [field, tensor] : it->second) {
      out.emplace_back(absl::StrCat("t", t, ".", field),
                       field == "step" ? tensor : tensor.slice(0, shard, tensor.size(0), n));
    }
  }
  return out;
}

absl::Status ParameterServerStrategy::GatherOptimizerState(int64_t step) {
  if (optimizer_ == nullptr && tables_.empty() && synchronous_) return absl::OkStatus();
  // The last checkpoint of a run or of a stop waits for the other ranks' last updates
  // (asynchronous mode).
  const bool last = step >= end_step_ || local_.stop;
  std::vector<torch::Tensor> values;
  for (const torch::Tensor& p : params_) values.push_back(p.detach());
  std::vector<std::map<std::string, torch::Tensor>> states(shards_.size());
  absl::Status fetched = ForEachShard([&](int s) -> absl::Status {
    absl::StatusOr<PsClient::StateResult> state;
    if (synchronous_) {
      if (dense_ != nullptr) {
        // dense: allreduce does not wait for the shards after a push (the next row pull does),
        // and the all-reduce may end before another rank's push arrives: wait for the update.
        std::vector<torch::Tensor> none;
        absl::StatusOr<ParameterShard::PullResult> reached = shards_[s]->Pull(step, none);
        if (!reached.ok()) return reached.status();
      }
      state = shards_[s]->State(step, TableBuffers(s));
    } else {
      std::vector<torch::Tensor> views = Views(values, pieces_[s]);
      while (true) {
        state = shards_[s]->Snapshot(last, views, TableBuffers(s));
        // Another rank still trains (a slow one): it has its own timeouts and the job its stall
        // timeout; wait on.
        if (state.status().code() != absl::StatusCode::kAborted) break;
      }
    }
    if (!state.ok()) return state.status();
    states[s] = std::move(state->optimizer_state);
    if (!synchronous_) shard_versions_[s] = state->version;
    torch::NoGradGuard no_grad;
    for (size_t t = 0; t < tables_.size(); ++t) {
      TableSlice(static_cast<int>(t), s).copy_(state->tables[t]);
    }
    return absl::OkStatus();
  });
  if (!fetched.ok()) return fetched;
  tables_version_ = step;
  return optimizer_ == nullptr ? absl::OkStatus() : LoadShardStates(states);
}

absl::Status ParameterServerStrategy::GatherModel(int64_t step) {
  if (tables_.empty() || tables_version_ == step) return absl::OkStatus();
  return GatherOptimizerState(step);
}

absl::Status ParameterServerStrategy::LoadShardStates(
    std::vector<std::map<std::string, torch::Tensor>>& states) {
  std::map<std::string, torch::Tensor> whole;
  if (dense_ != nullptr) {
    // The ranks' own optimizer holds the state of the layers they all-reduce.
    std::set<std::string> table_names;
    for (const Table& table : tables_) table_names.insert(table.name);
    for (auto& [key, tensor] : OptimizerStateTensors(*optimizer_, optimizer_params_)) {
      if (table_names.count(SplitStateKey(key).first) == 0) whole[key] = std::move(tensor);
    }
  }
  for (int s = 0; s < static_cast<int>(shards_.size()); ++s) {
    for (const auto& [key, tensor] : states[s]) {
      auto [piece_name, field] = SplitStateKey(key);
      size_t k = 0;
      if (!piece_name.empty() && piece_name[0] == 't' && !tables_.empty()) {
        if (!absl::SimpleAtoi(piece_name.substr(1), &k) || k >= tables_.size()) {
          return absl::InternalError(
              absl::StrCat("parameter server ", s, " sent optimizer state '", key, "'"));
        }
        const Table& table = tables_[k];
        const std::string name = absl::StrCat(table.name, ".", field);
        if (field == "step") {
          whole[name] = tensor;
          continue;
        }
        torch::Tensor& target = whole[name];
        if (!target.defined()) target = torch::zeros_like(table.param, tensor.scalar_type());
        torch::Tensor rows =
            target.slice(0, s, target.size(0), static_cast<int64_t>(shards_.size()));
        if (tensor.sizes() != rows.sizes()) {
          return absl::InternalError(absl::StrCat("parameter server ", s, ": optimizer state '",
                                                  key, "' does not fit its rows of ", table.name));
        }
        rows.copy_(tensor);
        continue;
      }
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

absl::Status ParameterServerStrategy::SyncState(Model& model, int64_t start_step) {
  if (dense_ != nullptr) {
    if (absl::Status synced = dense_->SyncState(model, start_step); !synced.ok()) return synced;
  }
  const auto start = MonotonicNow();
  std::vector<torch::Tensor> values;
  for (const torch::Tensor& p : params_) values.push_back(p.detach());
  if (rank_ == 0) {
    // The state the trainer restored from the checkpoint resumed from (none when fresh).
    const NamedTensors whole = optimizer_ != nullptr
                                   ? OptimizerStateTensors(*optimizer_, optimizer_params_)
                                   : NamedTensors{};
    std::vector<int64_t> table_rows;
    for (const Table& table : tables_) table_rows.push_back(table.param.size(0));
    absl::Status init = ForEachShard([&](int s) {
      std::vector<torch::Tensor> tables;
      for (size_t t = 0; t < tables_.size(); ++t) {
        tables.push_back(TableSlice(static_cast<int>(t), s).contiguous());
      }
      return shards_[s]->Init(start_step, total_steps_, Views(values, pieces_[s]),
                              ShardState(whole, s), tables, table_rows);
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

void ParameterServerStrategy::BeforeBackward(bool last_micro_batch,
                                             const torch::Tensor& update_loss,
                                             bool stop_requested) {
  if (dense_ != nullptr) dense_->BeforeBackward(last_micro_batch, update_loss, stop_requested);
  if (last_micro_batch) local_ = ShardAgreement{update_loss.item<double>(), stop_requested};
}

std::optional<int64_t> ParameterServerStrategy::UpdatesApplied() const {
  if (synchronous_ || dense_ != nullptr || shard_versions_.empty()) return std::nullopt;
  return *std::max_element(shard_versions_.begin(), shard_versions_.end());
}

absl::Status ParameterServerStrategy::AfterBackwardHybrid(Model& model) {
  const auto start = MonotonicNow();
  const std::vector<std::vector<RowGradients>> rows = TakeRowGradients();
  std::vector<int> stale(shards_.size(), 0);
  // Every rank pushes to every shard, rows or not: a synchronous shard's update waits for all.
  absl::Status status = ForEachShard([&](int s) -> absl::Status {
    absl::StatusOr<ParameterShard::PushResult> pushed = shards_[s]->Push(
        synchronous_ ? version_ : shard_versions_[s], {}, local_.loss, local_.stop, rows[s]);
    if (!pushed.ok()) return pushed.status();
    stale[s] = pushed->applied ? 0 : 1;
    shard_versions_[s] = pushed->version;
    return absl::OkStatus();
  });
  communication_seconds_ += SecondsSince(start);
  if (!status.ok()) return status;
  for (int n : stale) stale_pushes_ += n;
  ++version_;
  return dense_->AfterBackward(model);
}

absl::Status ParameterServerStrategy::AfterBackwardAsync() {
  const auto start = MonotonicNow();
  std::vector<torch::Tensor> grads, values;
  for (const torch::Tensor& p : params_) {
    grads.push_back(p.grad().defined() ? p.grad().detach().contiguous() : torch::zeros_like(p));
    values.push_back(p.detach());
  }
  std::vector<int> stale(shards_.size(), 0);
  const std::vector<std::vector<RowGradients>> rows = TakeRowGradients();
  absl::Status status = ForEachShard([&](int s) -> absl::Status {
    std::vector<torch::Tensor> views = Views(values, pieces_[s]);
    // Then whatever the shard holds: no waiting for the other ranks.
    absl::StatusOr<PsClient::PushPullResult> exchanged =
        shards_[s]->PushPull(shard_versions_[s], Views(grads, pieces_[s]), local_.loss, local_.stop,
                             rows[s], /*min_version=*/0, views);
    if (!exchanged.ok()) return exchanged.status();
    stale[s] = exchanged->push.applied ? 0 : 1;
    shard_versions_[s] = exchanged->pull.version;
    return absl::OkStatus();
  });
  communication_seconds_ += SecondsSince(start);
  if (!status.ok()) return status;
  for (int n : stale) stale_pushes_ += n;
  ++version_;
  agreed_ = local_;  // each rank stops on its own request
  return absl::OkStatus();
}

absl::Status ParameterServerStrategy::AfterBackward(Model& model) {
  if (dense_ != nullptr) return AfterBackwardHybrid(model);
  if (!synchronous_) return AfterBackwardAsync();
  const auto start = MonotonicNow();
  std::vector<torch::Tensor> grads, values;
  for (const torch::Tensor& p : params_) {
    // A parameter that got no gradient in this update contributes zeros, as in data_parallel.
    grads.push_back(p.grad().defined() ? p.grad().detach().contiguous() : torch::zeros_like(p));
    values.push_back(p.detach());
  }
  std::vector<ShardAgreement> agreements(shards_.size());
  const std::vector<std::vector<RowGradients>> rows = TakeRowGradients();
  absl::Status status = ForEachShard([&](int s) -> absl::Status {
    std::vector<torch::Tensor> views = Views(values, pieces_[s]);
    absl::StatusOr<PsClient::PushPullResult> exchanged =
        shards_[s]->PushPull(version_, Views(grads, pieces_[s]), local_.loss, local_.stop, rows[s],
                             /*min_version=*/version_ + 1, views);
    if (!exchanged.ok()) return exchanged.status();
    agreements[s] = exchanged->pull.agreement;
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

std::string ParameterServerStrategy::Layout() const {
  nlohmann::json layout;
  layout["shards"] = shards_.size();
  layout["mode"] = synchronous_ ? "sync" : "async";
  layout["dense"] = dense_ != nullptr ? "allreduce" : "shards";
  layout["partition"] = nlohmann::json::parse(PartitionToJson(partition_, shapes_));
  layout["tables"] = nlohmann::json::array();
  for (const Table& table : tables_) {
    layout["tables"].push_back({{"parameter", table.name},
                                {"rows", table.param.size(0)},
                                {"dim", table.param.size(1)},
                                {"row_to_shard", "row % shards"}});
  }
  return layout.dump();
}

absl::StatusOr<StepAgreement> ParameterServerStrategy::EndStep() {
  if (dense_ != nullptr) return dense_->EndStep();
  return StepAgreement{torch::tensor(agreed_.loss, torch::kDouble), agreed_.stop};
}

absl::Status ParameterServerStrategy::Finish() {
  return ForEachShard([this](int s) { return shards_[s]->Finish(); });
}

double ParameterServerStrategy::TakeCommunicationSeconds() {
  const double seconds =
      communication_seconds_ + (dense_ != nullptr ? dense_->TakeCommunicationSeconds() : 0);
  communication_seconds_ = 0;
  return seconds;
}

}  // namespace trainyard::trainer
