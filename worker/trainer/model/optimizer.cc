#include "worker/trainer/model/optimizer.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/trainer/model/multi_tensor.h"

namespace trainyard::trainer {
namespace {

enum class OptimizerKind { kSgd, kAdam, kAdamW, kOther };

OptimizerKind KindOf(const torch::optim::Optimizer& optimizer) {
  if (dynamic_cast<const torch::optim::SGD*>(&optimizer)) return OptimizerKind::kSgd;
  if (dynamic_cast<const torch::optim::Adam*>(&optimizer)) return OptimizerKind::kAdam;
  if (dynamic_cast<const torch::optim::AdamW*>(&optimizer)) return OptimizerKind::kAdamW;
  return OptimizerKind::kOther;
}

}  // namespace

absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>> BuildOptimizer(
    const trainyard::v1::OptimizerSpec& spec, const std::vector<torch::Tensor>& parameters,
    const OptimizerOptions& options) {
  if (!(spec.lr() > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("optimizer.lr: must be > 0, got ", spec.lr()));
  }
  const double beta1 = (spec.beta1() == 0 && spec.beta2() == 0) ? 0.9 : spec.beta1();
  const double beta2 = spec.beta2() == 0 ? 0.999 : spec.beta2();
  const double eps = spec.eps() == 0 ? 1e-8 : spec.eps();
  const bool device_scalars =
      options.device_scalars.value_or(!parameters.empty() && parameters.front().device().is_cuda());
  const OptimizerOptions::Kernels kernels = options.kernels;
  try {
    if (spec.name() == "sgd" || spec.name().empty()) {
      if (spec.nesterov() && spec.momentum() <= 0) {
        return absl::InvalidArgumentError("optimizer.nesterov: needs momentum > 0");
      }
      return MakeMultiTensorSgd(parameters,
                                torch::optim::SGDOptions(spec.lr())
                                    .momentum(spec.momentum())
                                    .nesterov(spec.nesterov())
                                    .weight_decay(spec.weight_decay()),
                                kernels, device_scalars);
    }
    if (spec.name() == "adam") {
      return MakeMultiTensorAdam(parameters,
                                 torch::optim::AdamOptions(spec.lr())
                                     .betas({beta1, beta2})
                                     .eps(eps)
                                     .weight_decay(spec.weight_decay()),
                                 kernels, device_scalars);
    }
    if (spec.name() == "adamw") {
      return MakeMultiTensorAdamW(parameters,
                                  torch::optim::AdamWOptions(spec.lr())
                                      .betas({beta1, beta2})
                                      .eps(eps)
                                      .weight_decay(spec.weight_decay()),
                                  kernels, device_scalars);
    }
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("optimizer: ", DescribeTorchError(e)));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("optimizer.name: unknown optimizer '", spec.name(), "' (sgd, adam, adamw)"));
}

void SetLearningRate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

NamedTensors OptimizerStateTensors(const torch::optim::Optimizer& optimizer,
                                   const NamedTensors& parameters, bool share) {
  NamedTensors out;
  const auto& state = optimizer.state();
  auto add = [&out, share](const std::string& name, const char* field, const torch::Tensor& t) {
    if (t.defined()) out.emplace_back(absl::StrCat(name, ".", field), ToHost(t, share));
  };
  for (const auto& [name, p] : parameters) {
    auto it = state.find(StateKey(p));
    if (it == state.end()) continue;
    const torch::optim::OptimizerParamState* s = it->second.get();
    if (auto* sgd = dynamic_cast<const torch::optim::SGDParamState*>(s)) {
      add(name, "momentum_buffer", sgd->momentum_buffer());
    } else if (auto* adam = dynamic_cast<const torch::optim::AdamParamState*>(s)) {
      add(name, "exp_avg", adam->exp_avg());
      add(name, "exp_avg_sq", adam->exp_avg_sq());
      add(name, "max_exp_avg_sq", adam->max_exp_avg_sq());
      add(name, "step", torch::tensor({adam->step()}, torch::kInt64));
    } else if (auto* adamw = dynamic_cast<const torch::optim::AdamWParamState*>(s)) {
      add(name, "exp_avg", adamw->exp_avg());
      add(name, "exp_avg_sq", adamw->exp_avg_sq());
      add(name, "max_exp_avg_sq", adamw->max_exp_avg_sq());
      add(name, "step", torch::tensor({adamw->step()}, torch::kInt64));
    }
  }
  return out;
}

absl::Status CheckOptimizerState(const torch::optim::Optimizer& optimizer,
                                 const NamedTensors& parameters,
                                 const std::map<std::string, torch::Tensor>& state) {
  const OptimizerKind kind = KindOf(optimizer);
  std::map<std::string, torch::Tensor> by_name(parameters.begin(), parameters.end());
  for (const auto& [key, tensor] : state) {
    const size_t dot = key.rfind('.');
    const std::string param = dot == std::string::npos ? key : key.substr(0, dot);
    const std::string field = dot == std::string::npos ? "" : key.substr(dot + 1);
    auto it = by_name.find(param);
    if (it == by_name.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer state '", key, "': the model has no parameter '", param, "'"));
    }
    const bool sgd_field = field == "momentum_buffer";
    const bool adam_field =
        field == "exp_avg" || field == "exp_avg_sq" || field == "max_exp_avg_sq" || field == "step";
    if ((kind == OptimizerKind::kSgd && !sgd_field) ||
        ((kind == OptimizerKind::kAdam || kind == OptimizerKind::kAdamW) && !adam_field)) {
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer state '", key, "': not state of this optimizer"));
    }
    if (field == "step") {
      if (tensor.numel() != 1 || tensor.scalar_type() != torch::kInt64) {
        return absl::InvalidArgumentError(
            absl::StrCat("optimizer state '", key, "': expected one I64 value"));
      }
    } else if (tensor.sizes() != it->second.sizes() ||
               tensor.scalar_type() != it->second.scalar_type()) {
      return absl::InvalidArgumentError(absl::StrCat("optimizer state '", key,
                                                     "': shape or dtype differs from the "
                                                     "parameter"));
    }
  }
  if (kind == OptimizerKind::kAdam || kind == OptimizerKind::kAdamW) {
    for (const auto& [name, p] : parameters) {
      const int present = state.count(name + ".exp_avg") + state.count(name + ".exp_avg_sq") +
                          state.count(name + ".step");
      if (present != 0 && present != 3) {
        return absl::InvalidArgumentError(
            absl::StrCat("optimizer state of '", name, "': incomplete"));
      }
    }
  }
  return absl::OkStatus();
}

void LoadOptimizerState(torch::optim::Optimizer& optimizer, const NamedTensors& parameters,
                        const std::map<std::string, torch::Tensor>& state) {
  const OptimizerKind kind = KindOf(optimizer);
  auto& out = optimizer.state();
  out.clear();
  for (const auto& [name, p] : parameters) {
    auto get = [&state, &name = name, &p = p](const char* field) -> torch::Tensor {
      auto it = state.find(absl::StrCat(name, ".", field));
      return it == state.end() ? torch::Tensor() : CopyTo(it->second, p.device());
    };
    if (kind == OptimizerKind::kSgd) {
      torch::Tensor buf = get("momentum_buffer");
      if (!buf.defined()) continue;
      auto s = std::make_unique<torch::optim::SGDParamState>();
      s->momentum_buffer(buf);
      out[StateKey(p)] = std::move(s);
    } else if (kind == OptimizerKind::kAdam || kind == OptimizerKind::kAdamW) {
      torch::Tensor step = get("step");
      if (!step.defined()) continue;
      torch::Tensor max_sq = get("max_exp_avg_sq");
      if (kind == OptimizerKind::kAdam) {
        auto s = std::make_unique<torch::optim::AdamParamState>();
        s->step(step.item<int64_t>());
        s->exp_avg(get("exp_avg"));
        s->exp_avg_sq(get("exp_avg_sq"));
        if (max_sq.defined()) s->max_exp_avg_sq(max_sq);
        out[StateKey(p)] = std::move(s);
      } else {
        auto s = std::make_unique<torch::optim::AdamWParamState>();
        s->step(step.item<int64_t>());
        s->exp_avg(get("exp_avg"));
        s->exp_avg_sq(get("exp_avg_sq"));
        if (max_sq.defined()) s->max_exp_avg_sq(max_sq);
        out[StateKey(p)] = std::move(s);
      }
    }
  }
}

}  // namespace trainyard::trainer
