#include "worker/trainer/ps_shard.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "worker/trainer/model.h"
#include "worker/trainer/schedule.h"

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

}  // namespace

absl::StatusOr<std::unique_ptr<ParameterShard>> ParameterShard::Create(
    ShardConfig config, std::vector<torch::Tensor> pieces,
    const std::map<std::string, torch::Tensor>& optimizer_state) {
  if (config.workers < 1) {
    return absl::InvalidArgumentError(absl::StrCat("workers must be >= 1, got ", config.workers));
  }
  if (!config.synchronous && config.max_staleness < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_staleness must be >= 0, got ", config.max_staleness));
  }
  for (size_t i = 0; i < pieces.size(); ++i) {
    torch::Tensor& piece = pieces[i];
    if (!piece.device().is_cpu() || !piece.is_floating_point()) {
      return absl::InvalidArgumentError(
          absl::StrCat("piece ", i, " is not a floating-point CPU tensor"));
    }
    piece = piece.detach().contiguous().set_requires_grad(true);
  }
  absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>> optimizer =
      BuildOptimizer(config.optimizer, pieces);
  if (!optimizer.ok()) return optimizer.status();
  if (!optimizer_state.empty()) {
    const NamedTensors named = NamePieces(pieces);
    absl::Status fits = CheckOptimizerState(**optimizer, named, optimizer_state);
    if (!fits.ok()) return fits;
    LoadOptimizerState(**optimizer, named, optimizer_state);
  }
  return std::unique_ptr<ParameterShard>(
      new ParameterShard(std::move(config), std::move(pieces), std::move(*optimizer)));
}

ParameterShard::ParameterShard(ShardConfig config, std::vector<torch::Tensor> pieces,
                               std::unique_ptr<torch::optim::Optimizer> optimizer)
    : config_(std::move(config)),
      shapes_(ShapesOf(pieces)),
      pieces_(std::move(pieces)),
      named_pieces_(NamePieces(pieces_)),
      optimizer_(std::move(optimizer)),
      version_(config_.start_version),
      pushed_(config_.workers, false),
      pending_(config_.workers),
      pending_loss_(config_.workers, 0.0) {}

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
  return OptimizerStateTensors(*optimizer_, named_pieces_);
}

absl::StatusOr<ParameterShard::Snapshot> ParameterShard::TakeSnapshot(int64_t generation) const {
  if (generation != config_.generation) return Fenced(generation, config_.generation);
  absl::MutexLock lock(&mu_);
  Snapshot snapshot;
  snapshot.version = version_;
  for (const torch::Tensor& piece : pieces_) snapshot.pieces.push_back(piece.detach().clone());
  snapshot.optimizer_state = OptimizerStateTensors(*optimizer_, named_pieces_);
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
    double loss, bool stop) {
  if (generation != config_.generation) return Fenced(generation, config_.generation);
  if (rank < 0 || rank >= config_.workers) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is not one of the ", config_.workers, " workers"));
  }
  if (absl::Status s = CheckGradients(gradients); !s.ok()) return s;
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
  pending_loss_[rank] = loss;
  pending_stop_ = pending_stop_ || stop;
  if (++pending_count_ == config_.workers) {
    double loss_sum = 0;
    for (int r = 0; r < config_.workers; ++r) loss_sum += pending_loss_[r];
    ApplyLocked(sum_, /*scale_in_place=*/true, 1.0 / config_.workers, version_);
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
  const absl::Time start = absl::Now();
  absl::MutexLock lock(&mu_);
  auto reached = [this, min_version]()
                     ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return version_ >= min_version; };
  if (!mu_.AwaitWithDeadline(absl::Condition(&reached), deadline)) {
    return absl::DeadlineExceededError(absl::StrCat(
        "version ", min_version, " was not reached in time; the shard is at ", version_));
  }
  const absl::Duration waited = absl::Now() - start;
  read(pieces_);
  return PullResult{version_, agreement_, waited};
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
