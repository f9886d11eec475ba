#include "worker/trainer/model/multi_tensor.h"

#include <cmath>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace trainyard::trainer {
namespace {

using Kernels = OptimizerOptions::Kernels;
using TensorVec = std::vector<torch::Tensor>;

// One param group's scalars as tensors on its parameters' device.
struct GroupScalars {
  torch::Tensor lr;    // float64, 0-dim: what the for-each arithmetic divides, as the host's double
  torch::Tensor lr32;  // float32, 0-dim: what the fused kernels read
  // Step count -> a float32 0-dim tensor holding it (the fused kernels read float32 counts, as
  // PyTorch keeps them: exact up to 2^24 steps). Parameters with equal counts share one, so that
  // the bias corrections are computed once per count rather than once per parameter.
  std::map<int64_t, torch::Tensor> counts;
};

[[noreturn]] void RefuseInCapture(const char* what) {
  throw std::runtime_error(std::string("optimizer: ") + what +
                           " while a CUDA graph is being captured (take a step before capturing)");
}

// Whether the fused kernels take these lists: one device (CPU or CUDA) and one floating dtype,
// each parameter dense, and every list's tensor at an index laid out as the parameter there (the
// kernels walk the tensors as flat arrays).
bool FusedFits(const std::vector<const TensorVec*>& lists) {
  if (!kHasFusedOptimizers) return false;
  const TensorVec& params = *lists[0];
  if (params.empty()) return false;
  const torch::Device device = params[0].device();
  const torch::ScalarType dtype = params[0].scalar_type();
  if (!device.is_cpu() && !device.is_cuda()) return false;
  if (dtype != torch::kFloat && dtype != torch::kDouble && dtype != torch::kHalf &&
      dtype != torch::kBFloat16) {
    return false;
  }
  for (size_t i = 0; i < params.size(); ++i) {
    const torch::Tensor& p = params[i];
    if (p.device() != device || p.scalar_type() != dtype || p.is_sparse() ||
        !p.is_non_overlapping_and_dense()) {
      return false;
    }
    for (const TensorVec* list : lists) {
      const torch::Tensor& t = (*list)[i];
      if (t.device() != device || t.scalar_type() != dtype || t.strides() != p.strides() ||
          t.sizes() != p.sizes()) {
        return false;
      }
    }
  }
  return true;
}

// The group's scalars, made on `device` the first time.
GroupScalars& ScalarsOf(std::vector<GroupScalars>& all, size_t group, const torch::Device& device) {
  if (all.size() <= group) all.resize(group + 1);
  GroupScalars& s = all[group];
  if (!s.lr.defined()) {
    s.lr = torch::zeros({}, torch::TensorOptions().dtype(torch::kDouble).device(device));
    s.lr32 = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat).device(device));
  }
  return s;
}

void WriteLr(GroupScalars& s, double lr) {
  s.lr.fill_(lr);
  s.lr32.fill_(lr);
}

// Advances the device counts of parameters whose host counts are `before` by one and returns each
// parameter's count tensor (holding before + 1 once the queued work has run). While capturing the
// map keeps its keys (a capture runs nothing; BeforeReplay moves them) and nothing is made.
TensorVec AdvanceCounts(GroupScalars& s, const std::vector<int64_t>& before,
                        const torch::Device& device, bool capturing) {
  std::map<int64_t, torch::Tensor> advanced;  // by the count before the step
  for (int64_t h : before) {
    if (advanced.count(h) != 0) continue;
    auto it = s.counts.find(h);
    torch::Tensor t;
    if (it != s.counts.end()) {
      t = it->second;
    } else {
      if (capturing) RefuseInCapture("a new step count");
      t = torch::full({}, static_cast<double>(h),
                      torch::TensorOptions().dtype(torch::kFloat).device(device));
    }
    t.add_(1);
    advanced.emplace(h, t);
  }
  if (capturing) {
    // Only the counts the graph advances stay, so that BeforeReplay moves exactly those.
    std::map<int64_t, torch::Tensor> kept;
    for (const auto& [h, t] : advanced) kept.emplace(h, t);
    s.counts = std::move(kept);
  } else {
    s.counts.clear();
    for (const auto& [h, t] : advanced) s.counts.emplace(h + 1, t);
  }
  TensorVec out;
  out.reserve(before.size());
  for (int64_t h : before) out.push_back(advanced.at(h));
  return out;
}

// After a replay's worth of steps: every count one higher.
void MoveCounts(GroupScalars& s) {
  std::map<int64_t, torch::Tensor> moved;
  for (auto& [h, t] : s.counts) moved.emplace(h + 1, std::move(t));
  s.counts = std::move(moved);
}

// On the CPU the for-each operations are a loop over the tensors, operation after operation: over
// every parameter at once, each operation would walk memory the one before has pushed out of the
// cache, where torch::optim's loop finishes a parameter while it is cached (on a 2-core EPYC, a
// 25 M-parameter transformer's AdamW update took 1.27 times torch::optim's so; docs/benchmarks.md).
// The CPU therefore takes the parameters in runs of about this many bytes (a larger parameter
// alone), each of which stays in a core's L2 cache through the update's operations; a GPU takes
// them all at once (its multi-tensor kernels launch once per operation).
constexpr int64_t kCpuRunBytes = 256 << 10;

std::vector<std::pair<size_t, size_t>> Runs(const TensorVec& params) {
  if (params.empty()) return {};
  if (!params[0].device().is_cpu()) return {{0, params.size()}};
  std::vector<std::pair<size_t, size_t>> out;
  size_t begin = 0;
  int64_t bytes = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const int64_t size = params[i].numel() * static_cast<int64_t>(params[i].element_size());
    if (i > begin && bytes + size > kCpuRunBytes) {
      out.emplace_back(begin, i);
      begin = i;
      bytes = 0;
    }
    bytes += size;
  }
  out.emplace_back(begin, params.size());
  return out;
}

template <typename T>
std::vector<T> Part(const std::vector<T>& v, std::pair<size_t, size_t> run) {
  if (v.empty()) return {};
  return std::vector<T>(v.begin() + static_cast<std::ptrdiff_t>(run.first),
                        v.begin() + static_cast<std::ptrdiff_t>(run.second));
}

// p += -lr * d, with lr a host double (the scalar alpha of torch::optim's p.add_(d_p, -lr)) or the
// group's device tensor.
void AddScaled(TensorVec& params, const TensorVec& d, double lr, const GroupScalars* device_lr) {
  if (device_lr == nullptr) {
    at::_foreach_add_(params, d, -lr);
    return;
  }
  // p + (-1 * d) * lr: the product and sum of p.add_(d, -lr), with lr read on the device.
  for (size_t i = 0; i < params.size(); ++i) params[i].addcmul_(d[i], device_lr->lr, -1);
}

// ---- SGD ----

class MultiTensorSgd final : public torch::optim::SGD, public MultiTensorUpdate {
 public:
  MultiTensorSgd(std::vector<torch::Tensor> parameters, torch::optim::SGDOptions options,
                 Kernels kernels, bool device_scalars)
      : torch::optim::SGD(std::move(parameters), options),
        kernels_(kernels),
        device_scalars_(device_scalars) {}

  torch::Tensor step(LossClosure closure = nullptr) override {
    torch::NoGradGuard no_grad;
    torch::Tensor loss;
    if (closure != nullptr) {
      at::AutoGradMode enable_grad(true);
      loss = closure();
    }
    used_fused_ = false;
    for (size_t g = 0; g < param_groups_.size(); ++g) StepGroup(g);
    return loss;
  }

  std::string kernels() const override {
    return used_fused_ || (!stepped_ && WantFused()) ? "fused" : "foreach";
  }
  bool device_scalars() const override { return device_scalars_; }
  void set_capturing(bool capturing) override { capturing_ = capturing; }
  void BeforeReplay() override {
    for (size_t g = 0; g < scalars_.size() && g < param_groups_.size(); ++g) {
      if (scalars_[g].lr.defined()) WriteLr(scalars_[g], param_groups_[g].options().get_lr());
    }
  }

 private:
  bool WantFused() const { return kHasFusedOptimizers && kernels_ != Kernels::kForEach; }

  void StepGroup(size_t g) {
    torch::optim::OptimizerParamGroup& group = param_groups_[g];
    const auto& o = static_cast<const torch::optim::SGDOptions&>(group.options());
    const double momentum = o.momentum();
    TensorVec params, grads, bufs;    // stepped with their momentum buffer (or without one)
    TensorVec new_params, new_grads;  // their first step with momentum: the buffer is made
    for (const torch::Tensor& p : group.params()) {
      if (!p.grad().defined()) continue;
      if (momentum != 0) {
        auto it = state_.find(StateKey(p));
        if (it == state_.end()) {
          new_params.push_back(p);
          new_grads.push_back(p.grad());
          continue;
        }
        bufs.push_back(static_cast<torch::optim::SGDParamState&>(*it->second).momentum_buffer());
      }
      params.push_back(p);
      grads.push_back(p.grad());
    }
    if (params.empty() && new_params.empty()) return;
    stepped_ = true;
    const torch::Device device = (params.empty() ? new_params : params)[0].device();
    GroupScalars* device_lr = nullptr;
    if (device_scalars_) {
      device_lr = &ScalarsOf(scalars_, g, device);
      if (!capturing_) WriteLr(*device_lr, o.lr());
    } else if (capturing_) {
      RefuseInCapture("a host learning rate");
    }
    if (!new_params.empty()) {
      if (capturing_) RefuseInCapture("a new momentum buffer");
      TensorVec new_bufs;
      for (const auto& run : Runs(new_params)) {
        TensorVec p = Part(new_params, run);
        for (torch::Tensor& b : FirstStep(p, Part(new_grads, run), o, device_lr)) {
          new_bufs.push_back(std::move(b));
        }
      }
      for (size_t i = 0; i < new_params.size(); ++i) {
        auto s = std::make_unique<torch::optim::SGDParamState>();
        s->momentum_buffer(new_bufs[i]);
        state_[StateKey(new_params[i])] = std::move(s);
      }
    }
    if (params.empty()) return;
    if (WantFused() &&
        FusedFits(momentum != 0 ? std::vector<const TensorVec*>{&params, &grads, &bufs}
                                : std::vector<const TensorVec*>{&params, &grads})) {
      Fused(params, grads, bufs, o, device_lr);
      used_fused_ = true;
      return;
    }
    for (const auto& run : Runs(params)) {
      TensorVec p = Part(params, run), b = Part(bufs, run);
      ForEach(p, Part(grads, run), b, o, device_lr);
    }
  }

  // torch::optim::SGD: d_p = grad + wd * p; buf = momentum * buf + (1 - dampening) * d_p;
  // d_p = nesterov ? d_p + momentum * buf : buf; p -= lr * d_p.
  static void ForEach(TensorVec& params, const TensorVec& grads, TensorVec& bufs,
                      const torch::optim::SGDOptions& o, const GroupScalars* device_lr) {
    TensorVec d = o.weight_decay() != 0 ? at::_foreach_add(grads, params, o.weight_decay()) : grads;
    if (o.momentum() != 0) {
      at::_foreach_mul_(bufs, o.momentum());
      at::_foreach_add_(bufs, d, 1 - o.dampening());
      d = o.nesterov() ? at::_foreach_add(d, bufs, o.momentum()) : bufs;
    }
    AddScaled(params, d, o.lr(), device_lr);
  }

  // The first step with momentum: the buffer starts as the step's d_p (torch::optim clones it).
  static TensorVec FirstStep(TensorVec& params, const TensorVec& grads,
                             const torch::optim::SGDOptions& o, const GroupScalars* device_lr) {
    TensorVec d = o.weight_decay() != 0 ? at::_foreach_add(grads, params, o.weight_decay()) : grads;
    TensorVec bufs;
    bufs.reserve(d.size());
    for (const torch::Tensor& t : d) bufs.push_back(torch::clone(t).detach());
    if (o.nesterov()) d = at::_foreach_add(d, bufs, o.momentum());
    AddScaled(params, o.nesterov() ? d : bufs, o.lr(), device_lr);
    return bufs;
  }

  static void Fused(TensorVec& params, const TensorVec& grads, TensorVec& bufs,
                    const torch::optim::SGDOptions& o, const GroupScalars* device_lr) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
    if (device_lr != nullptr) {
      at::_fused_sgd_(params, grads, bufs, o.weight_decay(), o.momentum(), device_lr->lr32,
                      o.dampening(), o.nesterov(), /*maximize=*/false, /*is_first_step=*/false);
    } else {
      at::_fused_sgd_(params, grads, bufs, o.weight_decay(), o.momentum(), o.lr(), o.dampening(),
                      o.nesterov(), /*maximize=*/false, /*is_first_step=*/false);
    }
#else
    throw std::logic_error("fused SGD: not in this LibTorch");
#endif
  }

  const Kernels kernels_;
  const bool device_scalars_;
  bool capturing_ = false;
  bool used_fused_ = false;
  bool stepped_ = false;
  std::vector<GroupScalars> scalars_;
};

// ---- Adam and AdamW ----

// One group's tensors for an Adam step: the parameters with a gradient and their state.
struct AdamLists {
  TensorVec params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs;
};

struct AdamHyper {
  double lr = 0, beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0;
  bool amsgrad = false;
  bool decoupled = false;  // AdamW: p *= 1 - lr * weight_decay, instead of grad += wd * p
};

// torch::optim::Adam's arithmetic over all parameters, `counts` being each parameter's step
// count after this step (host integers).
void AdamForEach(AdamLists& l, const AdamHyper& h, const std::vector<int64_t>& counts) {
  if (h.decoupled && h.weight_decay != 0) at::_foreach_mul_(l.params, 1 - h.lr * h.weight_decay);
  const TensorVec grads = !h.decoupled && h.weight_decay != 0
                              ? at::_foreach_add(l.grads, l.params, h.weight_decay)
                              : l.grads;
  at::_foreach_mul_(l.exp_avgs, h.beta1);
  at::_foreach_add_(l.exp_avgs, grads, 1 - h.beta1);
  at::_foreach_mul_(l.exp_avg_sqs, h.beta2);
  at::_foreach_addcmul_(l.exp_avg_sqs, grads, grads, 1 - h.beta2);
  if (h.amsgrad) at::_foreach_maximum_(l.max_exp_avg_sqs, l.exp_avg_sqs);
  TensorVec denoms = at::_foreach_sqrt(h.amsgrad ? l.max_exp_avg_sqs : l.exp_avg_sqs);
  std::vector<c10::Scalar> bias2_sqrt, neg_step_size;
  for (int64_t step : counts) {
    const double bias_correction1 = 1 - std::pow(h.beta1, step);
    const double bias_correction2 = 1 - std::pow(h.beta2, step);
    bias2_sqrt.emplace_back(std::sqrt(bias_correction2));
    neg_step_size.emplace_back(-(h.lr / bias_correction1));
  }
  at::_foreach_div_(denoms, bias2_sqrt);
  at::_foreach_add_(denoms, h.eps);
  at::_foreach_addcdiv_(l.params, l.exp_avgs, denoms, neg_step_size);
}

// The same with the learning rate and the counts read on the device (float64 arithmetic there on
// the host's formulas, each result cast to the parameters' float32 where the host's scalar is).
void AdamForEachOnDevice(AdamLists& l, const AdamHyper& h, const GroupScalars& s,
                         const TensorVec& counts) {
  // The bias corrections once per distinct count tensor.
  struct Corrections {
    torch::Tensor bias2_sqrt, neg_step_size;
  };
  std::map<const c10::TensorImpl*, Corrections> by_count;
  for (const torch::Tensor& c : counts) {
    if (by_count.count(c.unsafeGetTensorImpl()) != 0) continue;
    const torch::Tensor step = c.to(torch::kDouble);
    const torch::Tensor bias_correction1 = 1 - torch::pow(h.beta1, step);
    const torch::Tensor bias_correction2 = 1 - torch::pow(h.beta2, step);
    by_count[c.unsafeGetTensorImpl()] = {bias_correction2.sqrt(), -(s.lr / bias_correction1)};
  }
  if (h.decoupled && h.weight_decay != 0) {
    const torch::Tensor factor = 1 - s.lr * h.weight_decay;
    for (torch::Tensor& p : l.params) p.mul_(factor);
  }
  const TensorVec grads = !h.decoupled && h.weight_decay != 0
                              ? at::_foreach_add(l.grads, l.params, h.weight_decay)
                              : l.grads;
  at::_foreach_mul_(l.exp_avgs, h.beta1);
  at::_foreach_add_(l.exp_avgs, grads, 1 - h.beta1);
  at::_foreach_mul_(l.exp_avg_sqs, h.beta2);
  at::_foreach_addcmul_(l.exp_avg_sqs, grads, grads, 1 - h.beta2);
  if (h.amsgrad) at::_foreach_maximum_(l.max_exp_avg_sqs, l.exp_avg_sqs);
  TensorVec denoms = at::_foreach_sqrt(h.amsgrad ? l.max_exp_avg_sqs : l.exp_avg_sqs);
  for (size_t i = 0; i < denoms.size(); ++i) {
    const Corrections& c = by_count.at(counts[i].unsafeGetTensorImpl());
    denoms[i].div_(c.bias2_sqrt).add_(h.eps);
    // p + (-step_size * m) / denom, as p.addcdiv_(m, denom, -step_size) computes it.
    l.params[i].addcdiv_(l.exp_avgs[i] * c.neg_step_size, denoms[i]);
  }
}

void AdamFused(AdamLists& l, const AdamHyper& h, const TensorVec& counts,
               const GroupScalars* device_lr) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  const TensorVec none;
  const TensorVec& maxes = h.amsgrad ? l.max_exp_avg_sqs : none;
  auto run = [&](const auto& lr) {
    if (h.decoupled) {
      at::_fused_adamw_(l.params, l.grads, l.exp_avgs, l.exp_avg_sqs, maxes, counts, lr, h.beta1,
                        h.beta2, h.weight_decay, h.eps, h.amsgrad, /*maximize=*/false);
    } else {
      at::_fused_adam_(l.params, l.grads, l.exp_avgs, l.exp_avg_sqs, maxes, counts, lr, h.beta1,
                       h.beta2, h.weight_decay, h.eps, h.amsgrad, /*maximize=*/false);
    }
  };
  if (device_lr != nullptr) {
    run(device_lr->lr32);
  } else {
    run(h.lr);
  }
#else
  throw std::logic_error("fused Adam: not in this LibTorch");
#endif
}

// Adam (kDecoupled false) or AdamW over torch::optim's class of that name.
template <typename Base, typename Options, typename State, bool kDecoupled>
class MultiTensorAdamT final : public Base, public MultiTensorUpdate {
 public:
  MultiTensorAdamT(std::vector<torch::Tensor> parameters, Options options, Kernels kernels,
                   bool device_scalars)
      : Base(std::move(parameters), options), kernels_(kernels), device_scalars_(device_scalars) {}

  torch::Tensor step(torch::optim::Optimizer::LossClosure closure = nullptr) override {
    torch::NoGradGuard no_grad;
    torch::Tensor loss;
    if (closure != nullptr) {
      at::AutoGradMode enable_grad(true);
      loss = closure();
    }
    used_fused_ = false;
    // A capture's parameters replace any earlier one's; an eager step ends replays.
    captured_.assign(capturing_ ? this->param_groups_.size() : 0, {});
    for (size_t g = 0; g < this->param_groups_.size(); ++g) StepGroup(g);
    return loss;
  }

  std::string kernels() const override {
    return used_fused_ || (!stepped_ && WantFused()) ? "fused" : "foreach";
  }
  bool device_scalars() const override { return device_scalars_; }
  void set_capturing(bool capturing) override { capturing_ = capturing; }
  void BeforeReplay() override {
    for (size_t g = 0; g < scalars_.size() && g < this->param_groups_.size(); ++g) {
      if (scalars_[g].lr.defined()) {
        WriteLr(scalars_[g], this->param_groups_[g].options().get_lr());
      }
      // Only the counts the capture advanced: a group that stepped nothing there keeps its own.
      if (g < captured_.size() && !captured_[g].empty()) MoveCounts(scalars_[g]);
    }
    for (const std::vector<State*>& group : captured_) {
      for (State* s : group) s->step(s->step() + 1);
    }
  }

 private:
  bool WantFused() const { return kHasFusedOptimizers && kernels_ != Kernels::kForEach; }

  void StepGroup(size_t g) {
    torch::optim::OptimizerParamGroup& group = this->param_groups_[g];
    const auto& o = static_cast<const Options&>(group.options());
    AdamHyper h;
    h.lr = o.lr();
    h.beta1 = std::get<0>(o.betas());
    h.beta2 = std::get<1>(o.betas());
    h.eps = o.eps();
    h.weight_decay = o.weight_decay();
    h.amsgrad = o.amsgrad();
    h.decoupled = kDecoupled;
    AdamLists l;
    std::vector<State*> states;
    std::vector<int64_t> before;
    for (const torch::Tensor& p : group.params()) {
      if (!p.grad().defined()) continue;
      State& s = StateFor(p, h.amsgrad);
      l.params.push_back(p);
      l.grads.push_back(p.grad());
      l.exp_avgs.push_back(s.exp_avg());
      l.exp_avg_sqs.push_back(s.exp_avg_sq());
      if (h.amsgrad) l.max_exp_avg_sqs.push_back(s.max_exp_avg_sq());
      states.push_back(&s);
      before.push_back(s.step());
    }
    if (l.params.empty()) return;
    stepped_ = true;
    const torch::Device device = l.params[0].device();
    std::vector<const TensorVec*> lists = {&l.params, &l.grads, &l.exp_avgs, &l.exp_avg_sqs};
    if (h.amsgrad) lists.push_back(&l.max_exp_avg_sqs);
    const bool fused = WantFused() && FusedFits(lists);
    GroupScalars* s = nullptr;
    if (fused || device_scalars_) s = &ScalarsOf(scalars_, g, device);
    if (device_scalars_) {
      if (!capturing_) WriteLr(*s, h.lr);
    } else if (capturing_) {
      RefuseInCapture("a host learning rate");
    }
    TensorVec counts;
    if (s != nullptr) counts = AdvanceCounts(*s, before, device, capturing_);
    if (capturing_) {
      captured_[g] = states;
    } else {
      for (State* state : states) state->step(state->step() + 1);
    }
    if (fused) {
      AdamFused(l, h, counts, device_scalars_ ? s : nullptr);
      used_fused_ = true;
    } else {
      std::vector<int64_t> after = before;
      for (int64_t& step : after) ++step;
      for (const auto& run : Runs(l.params)) {
        AdamLists part = {Part(l.params, run), Part(l.grads, run), Part(l.exp_avgs, run),
                          Part(l.exp_avg_sqs, run), Part(l.max_exp_avg_sqs, run)};
        if (device_scalars_) {
          AdamForEachOnDevice(part, h, *s, Part(counts, run));
        } else {
          AdamForEach(part, h, Part(after, run));
        }
      }
    }
  }

  // The parameter's state, made as torch::optim makes it on its first step.
  State& StateFor(const torch::Tensor& p, bool amsgrad) {
    auto key = StateKey(p);
    auto it = this->state_.find(key);
    if (it != this->state_.end()) return static_cast<State&>(*it->second);
    if (capturing_) RefuseInCapture("new optimizer state");
    auto s = std::make_unique<State>();
    s->step(0);
    s->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
    s->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
    if (amsgrad) s->max_exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
    State& out = *s;
    this->state_[key] = std::move(s);
    return out;
  }

  const Kernels kernels_;
  const bool device_scalars_;
  bool capturing_ = false;
  bool used_fused_ = false;
  bool stepped_ = false;
  std::vector<GroupScalars> scalars_;
  // Per group, the states of the parameters the capture stepped (BeforeReplay advances them).
  std::vector<std::vector<State*>> captured_;
};

using MultiTensorAdam = MultiTensorAdamT<torch::optim::Adam, torch::optim::AdamOptions,
                                         torch::optim::AdamParamState, false>;
using MultiTensorAdamW = MultiTensorAdamT<torch::optim::AdamW, torch::optim::AdamWOptions,
                                          torch::optim::AdamWParamState, true>;

}  // namespace

std::unique_ptr<torch::optim::Optimizer> MakeMultiTensorSgd(std::vector<torch::Tensor> parameters,
                                                            torch::optim::SGDOptions options,
                                                            Kernels kernels, bool device_scalars) {
  return std::make_unique<MultiTensorSgd>(std::move(parameters), options, kernels, device_scalars);
}

std::unique_ptr<torch::optim::Optimizer> MakeMultiTensorAdam(std::vector<torch::Tensor> parameters,
                                                             torch::optim::AdamOptions options,
                                                             Kernels kernels, bool device_scalars) {
  return std::make_unique<MultiTensorAdam>(std::move(parameters), options, kernels, device_scalars);
}

std::unique_ptr<torch::optim::Optimizer> MakeMultiTensorAdamW(std::vector<torch::Tensor> parameters,
                                                              torch::optim::AdamWOptions options,
                                                              Kernels kernels,
                                                              bool device_scalars) {
  return std::make_unique<MultiTensorAdamW>(std::move(parameters), options, kernels,
                                            device_scalars);
}

MultiTensorUpdate* AsMultiTensorUpdate(torch::optim::Optimizer& optimizer) {
  return dynamic_cast<MultiTensorUpdate*>(&optimizer);
}

}  // namespace trainyard::trainer
