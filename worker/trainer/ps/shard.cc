#include "worker/trainer/ps/shard.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "worker/trainer/data/schedule.h"
#include "worker/trainer/model/model.h"
#include "worker/trainer/model/optimizer.h"

namespace trainyard::trainer {
namespace {

std::vector<std::pair<std::vector<int64_t>, c10::ScalarType>> ShapesOf(
    const std::vector<torch::Tensor>& pieces) {
  std::vector<std::pair<std::vector<int64_t>, c10::ScalarType>> shapes;
  for (const torch::Tensor& p : pieces) shapes.emplace_back(p.sizes().vec(), p.scalar_type());
  return shapes;
}

absl::Status Fenced(int64_t generation, int64_t own) {
  return absl::FailedPreconditionError(absl::StrCat(
      "generation ", generation, " is not this shard's attempt (generation ", own, ")"));
}

NamedTensors NamePieces(const std::vector<torch::Tensor>& pieces) {
  NamedTensors named;
  for (size_t i = 0; i < pieces.size(); ++i) named.emplace_back(absl::StrCat("p", i), pieces[i]);
  return named;
}

bool IsAdam(const trainyard::v1::OptimizerSpec& spec) {
  return spec.name() == "adam" || spec.name() == "adamw";
}

}  // namespace

absl::StatusOr<std::unique_ptr<ParameterShard>> ParameterShard::Create(
    ShardConfig config, std::vector<torch::Tensor> pieces,
    const std::map<std::string, torch::Tensor>& optimizer_state, std::vector<torch::Tensor> tables,
    const std::vector<int64_t>& table_rows) {
  if (config.workers < 1) {
    return absl::InvalidArgumentError(absl::StrCat("workers must be >= 1, got ", config.workers));
  }
  if (!config.synchronous && config.max_staleness < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_staleness must be >= 0, got ", config.max_staleness));
  }
  if (config.shards < 1 || config.shard < 0 || config.shard >= config.shards) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard ", config.shard, " of ", config.shards, " does not exist"));
  }
  for (size_t i = 0; i < pieces.size(); ++i) {
    torch::Tensor& piece = pieces[i];
    if (!piece.device().is_cpu() || !piece.is_floating_point()) {
      return absl::InvalidArgumentError(
          absl::StrCat("piece ", i, " is not a floating-point CPU tensor"));
    }
    piece = piece.detach().contiguous().set_requires_grad(true);
  }
  if (table_rows.size() != tables.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(tables.size(), " tables with ", table_rows.size(), " row counts"));
  }
  std::vector<Table> owned_tables(tables.size());
  std::vector<TableShape> table_shapes;
  for (size_t t = 0; t < tables.size(); ++t) {
    const torch::Tensor& values = tables[t];
    const int64_t local = RowsOnShard(table_rows[t], config.shard, config.shards);
    if (!values.defined() || !values.device().is_cpu() || !values.is_floating_point() ||
        values.dim() != 2 || values.size(0) != local) {
      return absl::InvalidArgumentError(
          absl::StrCat("table ", t, " is not a floating-point CPU tensor of ", local,
                       " rows (the shard's of ", table_rows[t], ")"));
    }
    Table& table = owned_tables[t];
    table.values = values.detach().contiguous();
    const trainyard::v1::OptimizerSpec& spec = config.optimizer;
    if (IsAdam(spec)) {
      table.exp_avg = torch::zeros_like(table.values);
      table.exp_avg_sq = torch::zeros_like(table.values);
    } else if (spec.momentum() != 0) {
      table.momentum_buffer = torch::zeros_like(table.values);
    }
    table_shapes.push_back({table_rows[t], values.size(1), values.scalar_type()});
  }
  // "p{piece}.{field}" for the optimizer over the pieces, "t{table}.{field}" for the tables.
  std::map<std::string, torch::Tensor> piece_state;
  for (const auto& [key, tensor] : optimizer_state) {
    if (key.empty() || key[0] != 't') {
      piece_state.emplace(key, tensor);
      continue;
    }
    const size_t dot = key.find('.');
    size_t t = 0;
    if (dot == std::string::npos || !absl::SimpleAtoi(key.substr(1, dot - 1), &t) ||
        t >= owned_tables.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer state '", key, "': the shard has no such table"));
    }
    Table& table = owned_tables[t];
    const std::string field = key.substr(dot + 1);
    if (field == "step" && IsAdam(config.optimizer)) {
      if (tensor.numel() != 1 || tensor.scalar_type() != torch::kInt64) {
        return absl::InvalidArgumentError(
            absl::StrCat("optimizer state '", key, "': expected one I64 value"));
      }
      table.step = tensor.item<int64_t>();
      continue;
    }
    torch::Tensor* target = field == "momentum_buffer" ? &table.momentum_buffer
                            : field == "exp_avg"       ? &table.exp_avg
                            : field == "exp_avg_sq"    ? &table.exp_avg_sq
                                                       : nullptr;
    if (target == nullptr || !target->defined()) {
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer state '", key, "': not state of this optimizer"));
    }
    if (tensor.sizes() != table.values.sizes() ||
        tensor.scalar_type() != table.values.scalar_type()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "optimizer state '", key, "': shape or dtype differs from the table's rows"));
    }
    target->copy_(tensor);
  }
  absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>> optimizer =
      BuildOptimizer(config.optimizer, pieces);
  if (!optimizer.ok()) return optimizer.status();
  if (!piece_state.empty()) {
    const NamedTensors named = NamePieces(pieces);
    absl::Status fits = CheckOptimizerState(**optimizer, named, piece_state);
    if (!fits.ok()) return fits;
    LoadOptimizerState(**optimizer, named, piece_state);
  }
  return std::unique_ptr<ParameterShard>(
      new ParameterShard(std::move(config), std::move(pieces), std::move(*optimizer),
                         std::move(owned_tables), std::move(table_shapes)));
}

ParameterShard::ParameterShard(ShardConfig config, std::vector<torch::Tensor> pieces,
                               std::unique_ptr<torch::optim::Optimizer> optimizer,
                               std::vector<Table> tables, std::vector<TableShape> table_shapes)
    : config_(std::move(config)),
      shapes_(ShapesOf(pieces)),
      table_shapes_(std::move(table_shapes)),
      pieces_(std::move(pieces)),
      named_pieces_(NamePieces(pieces_)),
      optimizer_(std::move(optimizer)),
      tables_(std::move(tables)),
      version_(config_.start_version),
      pushed_(config_.workers, false),
      pending_(config_.workers),
      pending_rows_(config_.workers),
      pending_loss_(config_.workers, 0.0) {}

absl::StatusOr<torch::Tensor> ParameterShard::LocalRows(int table, const torch::Tensor& ids) const {
  const TableShape& shape = table_shapes_[table];
  if (ids.scalar_type() != torch::kInt64 || ids.dim() != 1 || !ids.device().is_cpu()) {
    return absl::InvalidArgumentError(
        absl::StrCat("table ", table, ": row ids must be a 1-D int64 CPU tensor"));
  }
  if (ids.numel() == 0) return ids;
  const torch::Tensor bad = (ids < 0)
                                .logical_or_(ids >= shape.rows)
                                .logical_or_(ids.remainder(config_.shards) != config_.shard);
  if (bad.any().item<bool>()) {
    const int64_t id = ids.masked_select(bad)[0].item<int64_t>();
    return absl::InvalidArgumentError(
        absl::StrCat("table ", table, ": row ", id, " is not held by shard ", config_.shard, " of ",
                     config_.shards, " (the table has ", shape.rows, " rows)"));
  }
  return torch::div(ids, config_.shards, "floor");
}

absl::Status ParameterShard::CheckRows(const std::vector<RowGradients>& rows) const {
  if (rows.size() > table_shapes_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "row gradients for ", rows.size(), " tables; the shard has ", table_shapes_.size()));
  }
  for (size_t t = 0; t < rows.size(); ++t) {
    const RowGradients& r = rows[t];
    if (!r.ids.defined() || r.ids.numel() == 0) continue;
    absl::StatusOr<torch::Tensor> local = LocalRows(static_cast<int>(t), r.ids);
    if (!local.ok()) return local.status();
    const TableShape& shape = table_shapes_[t];
    if (!r.grads.defined() || r.grads.dim() != 2 || r.grads.size(0) != r.ids.size(0) ||
        r.grads.size(1) != shape.dim || r.grads.scalar_type() != shape.dtype ||
        !r.grads.device().is_cpu()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table ", t, ": the gradients of ", r.ids.size(0), " rows must be [", r.ids.size(0), ", ",
          shape.dim, "] ", c10::toString(shape.dtype), " on the CPU"));
    }
  }
  return absl::OkStatus();
}

void ParameterShard::ApplyRowsLocked(const std::vector<RowGradients>& rows, double scale,
                                     int64_t step) {
  if (tables_.empty()) return;
  torch::NoGradGuard no_grad;
  const trainyard::v1::OptimizerSpec& spec = config_.optimizer;
  const double lr = LearningRateAt(spec, step, config_.total_steps);
  const double wd = spec.weight_decay();
  for (size_t t = 0; t < tables_.size(); ++t) {
    Table& table = tables_[t];
    ++table.step;
    if (t >= rows.size() || !rows[t].ids.defined() || rows[t].ids.numel() == 0) continue;
    // Repeated rows are summed first (the optimizer sees one gradient per row).
    const torch::Tensor local = torch::div(rows[t].ids, config_.shards, "floor");
    auto [unique, inverse] = at::_unique(local, /*sorted=*/true, /*return_inverse=*/true);
    torch::Tensor g = torch::zeros({unique.size(0), table.values.size(1)}, table.values.options())
                          .index_add_(0, inverse, rows[t].grads)
                          .mul_(scale);
    torch::Tensor p = table.values.index_select(0, unique);
    if (IsAdam(spec)) {
      const double beta1 = (spec.beta1() == 0 && spec.beta2() == 0) ? 0.9 : spec.beta1();
      const double beta2 = spec.beta2() == 0 ? 0.999 : spec.beta2();
      const double eps = spec.eps() == 0 ? 1e-8 : spec.eps();
      if (wd != 0 && spec.name() == "adamw") p.mul_(1 - lr * wd);
      if (wd != 0 && spec.name() == "adam") g.add_(p, wd);
      torch::Tensor m = table.exp_avg.index_select(0, unique).mul_(beta1).add_(g, 1 - beta1);
      torch::Tensor v =
          table.exp_avg_sq.index_select(0, unique).mul_(beta2).addcmul_(g, g, 1 - beta2);
      table.exp_avg.index_copy_(0, unique, m);
      table.exp_avg_sq.index_copy_(0, unique, v);
      const double bias1 = 1 - std::pow(beta1, static_cast<double>(table.step));
      const double bias2 = 1 - std::pow(beta2, static_cast<double>(table.step));
      p.addcdiv_(m, v.sqrt_().div_(std::sqrt(bias2)).add_(eps), -lr / bias1);
    } else {
      if (wd != 0) g.add_(p, wd);
      if (spec.momentum() != 0) {
        torch::Tensor buf =
            table.momentum_buffer.index_select(0, unique).mul_(spec.momentum()).add_(g);
        table.momentum_buffer.index_copy_(0, unique, buf);
        g = spec.nesterov() ? g.add_(buf, spec.momentum()) : buf;
      }
      p.add_(g, -lr);
    }
    table.values.index_copy_(0, unique, p);
  }
}

NamedTensors ParameterShard::TableStateLocked() const {
  NamedTensors out;
  for (size_t t = 0; t < tables_.size(); ++t) {
    const Table& table = tables_[t];
    if (table.step == 0) continue;  // no update yet: no state, as torch's optimizers
    auto add = [&](const char* field, const torch::Tensor& tensor) {
      if (tensor.defined()) out.emplace_back(absl::StrCat("t", t, ".", field), tensor.clone());
    };
    add("momentum_buffer", table.momentum_buffer);
    add("exp_avg", table.exp_avg);
    add("exp_avg_sq", table.exp_avg_sq);
    if (IsAdam(config_.optimizer)) add("step", torch::tensor({table.step}, torch::kInt64));
  }
  return out;
}

void ParameterShard::AddToSumLocked(const std::vector<torch::Tensor>& gradients) {
  torch::NoGradGuard no_grad;
  if (sum_.empty()) {
    for (const torch::Tensor& g : gradients) sum_.push_back(torch::empty_like(g));
  }
  for (size_t i = 0; i < gradients.size(); ++i) {
    if (summed_ == 0) {
      sum_[i].copy_(gradients[i]);
    } else {
      sum_[i].add_(gradients[i]);
    }
  }
  ++summed_;
}

absl::StatusOr<NamedTensors> ParameterShard::OptimizerState(int64_t generation,
                                                            int64_t version) const {
  if (generation != config_.generation) return Fenced(generation, config_.generation);
  absl::MutexLock lock(&mu_);
  if (version != version_) {
    return absl::FailedPreconditionError(absl::StrCat("optimizer state of version ", version,
                                                      " asked for; the shard is at ", version_));
  }
  NamedTensors state = OptimizerStateTensors(*optimizer_, named_pieces_);
  for (auto& entry : TableStateLocked()) state.push_back(std::move(entry));
  return state;
}

absl::StatusOr<std::vector<torch::Tensor>> ParameterShard::Tables(int64_t generation,
                                                                  int64_t version) const {
  if (generation != config_.generation) return Fenced(generation, config_.generation);
  absl::MutexLock lock(&mu_);
  if (version != version_) {
    return absl::FailedPreconditionError(
        absl::StrCat("tables of version ", version, " asked for; the shard is at ", version_));
  }
  std::vector<torch::Tensor> tables;
  for (const Table& table : tables_) tables.push_back(table.values.clone());
  return tables;
}

absl::StatusOr<ParameterShard::Snapshot> ParameterShard::TakeSnapshot(int64_t generation) const {
  if (generation != config_.generation) return Fenced(generation, config_.generation);
  absl::MutexLock lock(&mu_);
  Snapshot snapshot;
  snapshot.version = version_;
  for (const torch::Tensor& piece : pieces_) snapshot.pieces.push_back(piece.detach().clone());
  for (const Table& table : tables_) snapshot.tables.push_back(table.values.clone());
  snapshot.optimizer_state = OptimizerStateTensors(*optimizer_, named_pieces_);
  for (auto& entry : TableStateLocked()) snapshot.optimizer_state.push_back(std::move(entry));
  return snapshot;
}

int64_t ParameterShard::version() const {
  absl::MutexLock lock(&mu_);
  return version_;
}

int64_t ParameterShard::stale_pushes() const {
  absl::MutexLock lock(&mu_);
  return stale_pushes_;
}

absl::Status ParameterShard::CheckGradients(const std::vector<torch::Tensor>& gradients) const {
  if (gradients.size() != shapes_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(gradients.size(), " gradients for ", shapes_.size(), " pieces"));
  }
  for (size_t i = 0; i < gradients.size(); ++i) {
    const auto& [sizes, dtype] = shapes_[i];
    if (!gradients[i].defined() || gradients[i].sizes() != c10::IntArrayRef(sizes) ||
        gradients[i].scalar_type() != dtype || !gradients[i].device().is_cpu()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the gradient of piece ", i, " does not match the piece (shape ",
                       c10::str(c10::IntArrayRef(sizes)), ", ", c10::toString(dtype), ", CPU)"));
    }
  }
  return absl::OkStatus();
}

void ParameterShard::ApplyLocked(std::vector<torch::Tensor>& sum, bool scale_in_place, double scale,
                                 int64_t step) {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < pieces_.size(); ++i) {
    pieces_[i].mutable_grad() = scale_in_place ? sum[i].mul_(scale) : sum[i].mul(scale);
  }
  SetLearningRate(*optimizer_, LearningRateAt(config_.optimizer, step, config_.total_steps));
  optimizer_->step();
}

absl::StatusOr<ParameterShard::PushResult> ParameterShard::Push(
    int64_t generation, int rank, int64_t base_version, const std::vector<torch::Tensor>& gradients,
    double loss, bool stop, const std::vector<RowGradients>& rows) {
  if (generation != config_.generation) return Fenced(generation, config_.generation);
  if (rank < 0 || rank >= config_.workers) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is not one of the ", config_.workers, " workers"));
  }
  if (absl::Status s = CheckGradients(gradients); !s.ok()) return s;
  if (absl::Status s = CheckRows(rows); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  PushResult result;
  if (!config_.synchronous) {
    result.staleness = version_ - base_version;
    if (result.staleness < 0) {
      return absl::FailedPreconditionError(absl::StrCat("rank ", rank, " pushed from version ",
                                                        base_version, ", ahead of the shard's ",
                                                        version_));
    }
    if (result.staleness > config_.max_staleness) {
      ++stale_pushes_;
      result.applied = false;
      result.version = version_;
      return result;
    }
    // W pushes make one step of the schedule, as one synchronous update of W ranks does.
    const int64_t step =
        config_.start_version + (version_ - config_.start_version) / config_.workers;
    // The gradients are the caller's: scaled into new tensors.
    std::vector<torch::Tensor> scaled = gradients;
    ApplyLocked(scaled, /*scale_in_place=*/false, 1.0 / config_.workers, step);
    ApplyRowsLocked(rows, 1.0 / config_.workers, step);
    ++version_;
    result.version = version_;
    return result;
  }

  if (base_version != version_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", rank, " pushed for version ", base_version, "; the shard is at ", version_));
  }
  if (pushed_[rank]) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", rank, " pushed twice for version ", version_));
  }
  pushed_[rank] = true;
  // Summed in rank order whatever order the pushes come in (the same sum on every run): a push
  // that is next in that order goes straight into the sum, an early one waits as a copy.
  if (rank == summed_) {
    AddToSumLocked(gradients);
    while (summed_ < config_.workers && !pending_[summed_].empty()) {
      AddToSumLocked(pending_[summed_]);
      pending_[summed_ - 1].clear();
    }
  } else {
    pending_[rank].reserve(gradients.size());
    for (const torch::Tensor& g : gradients) pending_[rank].push_back(g.clone());
  }
  if (!tables_.empty()) {
    pending_rows_[rank].clear();
    for (const RowGradients& r : rows) {
      pending_rows_[rank].push_back(r.ids.defined() && r.ids.numel() > 0
                                        ? RowGradients{r.ids.clone(), r.grads.clone()}
                                        : RowGradients{});
    }
  }
  pending_loss_[rank] = loss;
  pending_stop_ = pending_stop_ || stop;
  if (++pending_count_ == config_.workers) {
    double loss_sum = 0;
    for (int r = 0; r < config_.workers; ++r) loss_sum += pending_loss_[r];
    ApplyLocked(sum_, /*scale_in_place=*/true, 1.0 / config_.workers, version_);
    if (!tables_.empty()) {
      // Every rank's rows of each table, in rank order; ApplyRowsLocked sums repeated ones.
      std::vector<RowGradients> combined(tables_.size());
      for (size_t t = 0; t < tables_.size(); ++t) {
        std::vector<torch::Tensor> ids, grads;
        for (auto& by_rank : pending_rows_) {
          if (t < by_rank.size() && by_rank[t].ids.defined()) {
            ids.push_back(by_rank[t].ids);
            grads.push_back(by_rank[t].grads);
          }
        }
        if (!ids.empty()) combined[t] = RowGradients{torch::cat(ids), torch::cat(grads)};
      }
      ApplyRowsLocked(combined, 1.0 / config_.workers, version_);
      for (auto& by_rank : pending_rows_) by_rank.clear();
    }
    agreement_ = ShardAgreement{loss_sum / config_.workers, pending_stop_};
    std::fill(pushed_.begin(), pushed_.end(), false);
    summed_ = 0;
    pending_count_ = 0;
    pending_stop_ = false;
    ++version_;
  }
  result.version = version_;
  return result;
}

absl::StatusOr<ParameterShard::PullResult> ParameterShard::PullWith(
    int64_t generation, int64_t min_version, absl::Time deadline,
    const std::function<void(const std::vector<torch::Tensor>&)>& read) {
  if (generation != config_.generation) return Fenced(generation, config_.generation);
  absl::MutexLock lock(&mu_);
  absl::StatusOr<absl::Duration> waited = AwaitVersionLocked(min_version, deadline);
  if (!waited.ok()) return waited.status();
  read(pieces_);
  return PullResult{version_, agreement_, *waited};
}

absl::StatusOr<absl::Duration> ParameterShard::AwaitVersionLocked(int64_t min_version,
                                                                  absl::Time deadline) {
  const absl::Time start = RealClock::Get().Now();
  auto reached = [this, min_version]()
                     ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return version_ >= min_version; };
  if (!mu_.AwaitWithDeadline(absl::Condition(&reached), deadline)) {
    return absl::DeadlineExceededError(absl::StrCat(
        "version ", min_version, " was not reached in time; the shard is at ", version_));
  }
  return RealClock::Get().Now() - start;
}

absl::StatusOr<ParameterShard::PullResult> ParameterShard::PullRowsWith(
    int64_t generation, int64_t min_version, absl::Time deadline,
    const std::vector<torch::Tensor>& ids, const RowReader& read) {
  if (generation != config_.generation) return Fenced(generation, config_.generation);
  if (ids.size() > table_shapes_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rows of ", ids.size(), " tables asked for; the shard has ", table_shapes_.size()));
  }
  std::vector<torch::Tensor> local(ids.size());
  for (size_t t = 0; t < ids.size(); ++t) {
    if (!ids[t].defined() || ids[t].numel() == 0) continue;
    absl::StatusOr<torch::Tensor> rows = LocalRows(static_cast<int>(t), ids[t]);
    if (!rows.ok()) return rows.status();
    local[t] = *std::move(rows);
  }
  absl::MutexLock lock(&mu_);
  absl::StatusOr<absl::Duration> waited = AwaitVersionLocked(min_version, deadline);
  if (!waited.ok()) return waited.status();
  for (size_t t = 0; t < local.size(); ++t) {
    if (local[t].defined()) read(static_cast<int>(t), tables_[t].values, local[t]);
  }
  return PullResult{version_, agreement_, *waited};
}

absl::StatusOr<ParameterShard::PullResult> ParameterShard::PullShared(
    int64_t generation, int64_t min_version, absl::Time deadline, std::vector<torch::Tensor>* out) {
  return PullWith(generation, min_version, deadline,
                  [this, out](const std::vector<torch::Tensor>& pieces)
                      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                        if (shared_version_ != version_) {
                          shared_.clear();
                          for (const torch::Tensor& piece : pieces) {
                            shared_.push_back(piece.detach().clone());
                          }
                          shared_version_ = version_;
                        }
                        *out = shared_;
                      });
}

absl::StatusOr<ParameterShard::PullResult> ParameterShard::PullRows(
    int64_t generation, int64_t min_version, const std::vector<torch::Tensor>& ids,
    std::vector<torch::Tensor>* out, absl::Time deadline) {
  out->assign(ids.size(), torch::Tensor());
  return PullRowsWith(generation, min_version, deadline, ids,
                      [out](int table, const torch::Tensor& values, const torch::Tensor& local) {
                        (*out)[table] = values.index_select(0, local);
                      });
}

absl::StatusOr<ParameterShard::PullResult> ParameterShard::Pull(int64_t generation,
                                                                int64_t min_version,
                                                                std::vector<torch::Tensor>* out,
                                                                absl::Time deadline) {
  return PullWith(generation, min_version, deadline,
                  [out](const std::vector<torch::Tensor>& pieces) {
                    out->resize(pieces.size());
                    for (size_t i = 0; i < pieces.size(); ++i) {
                      torch::Tensor& target = (*out)[i];
                      if (!target.defined() || target.sizes() != pieces[i].sizes() ||
                          target.scalar_type() != pieces[i].scalar_type()) {
                        target = torch::empty_like(pieces[i], torch::MemoryFormat::Contiguous);
                      }
                      target.copy_(pieces[i].detach());
                    }
                  });
}

}  // namespace trainyard::trainer
