// The multi-tensor optimizers of worker/trainer/model/optimizer.h against torch::optim's own SGD,
// Adam and AdamW on the CPU: the same parameters and state after many steps (bit for bit for the
// for-each kernels, which keep torch::optim's order of arithmetic, on host scalars and on tensor
// scalars alike), checkpoints of either kind loading into the other, and the bookkeeping a CUDA
// graph's replays rely on.

#include "worker/trainer/model/optimizer.h"

#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/trainer/model/multi_tensor.h"

namespace trainyard::trainer {
namespace {

using ::testing::HasSubstr;
using Kernels = OptimizerOptions::Kernels;

constexpr int kSteps = 25;

// One LibTorch thread, as a trainer rank of one slot has: with two, each of the updates' small
// operations meets OpenMP's barrier, which on a busy 2-core machine made this test 14 times slower
// (20 s against 1.5 s with LibTorch 2.6).
const bool kOneThread = [] {
  torch::set_num_threads(1);
  return true;
}();
// Where a parameter gets its first gradient: torch::optim skips parameters without one (no
// state, no step), so that this one's Adam count stays behind the others' and its SGD momentum
// buffer is made while the others' exist.
constexpr int kLateStep = 6;

// Parameters shaped as models have them: a matrix, a bias, a convolution's kernel kept
// channels-last, and one that gets gradients only from kLateStep on; and one larger than the runs
// the CPU takes parameters in (320 KiB), between the others, so that the update takes three.
NamedTensors MakeParameters() {
  torch::manual_seed(11);
  NamedTensors out = {
      {"w", torch::randn({16, 8})},
      {"large", torch::randn({320, 256}) * 0.1},
      {"b", torch::randn({16})},
      {"conv", torch::randn({4, 3, 3, 3}).contiguous(torch::MemoryFormat::ChannelsLast)},
      {"late", torch::randn({5, 3})},
  };
  for (auto& [name, p] : out) p.requires_grad_(true);
  return out;
}

NamedTensors Copy(const NamedTensors& params) {
  NamedTensors out;
  for (const auto& [name, p] : params) {
    out.emplace_back(name, p.detach().clone().requires_grad_(true));
  }
  return out;
}

std::vector<torch::Tensor> TensorsOf(const NamedTensors& params) {
  std::vector<torch::Tensor> out;
  for (const auto& [name, p] : params) out.push_back(p);
  return out;
}

// The gradients of update `step`: drawn from the step alone, laid out as the parameter (as
// autograd lays them out), written in place after the first (as zero_grad(false) keeps them).
void SetGradients(NamedTensors& params, int step) {
  torch::manual_seed(1000 + step);
  for (auto& [name, p] : params) {
    torch::Tensor g = torch::randn(p.sizes()) * (name == "b" ? 3.0 : 0.5);
    if (name == "late" && step < kLateStep) continue;
    if (!p.grad().defined()) p.mutable_grad() = torch::empty_like(p);
    p.mutable_grad().copy_(g);
  }
}

// The trainer's learning rate moves every step (a warm-up then a decay), as SetLearningRate
// gives it.
double LrAt(int step, double base) { return base * (step < 5 ? (step + 1) / 5.0 : 1.0 / step); }

struct Case {
  std::string name;
  trainyard::v1::OptimizerSpec spec;
  std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor>)> reference;
};

trainyard::v1::OptimizerSpec Spec(const std::string& name, double lr) {
  trainyard::v1::OptimizerSpec spec;
  spec.set_name(name);
  spec.set_lr(lr);
  return spec;
}

std::vector<Case> Cases() {
  using torch::optim::AdamOptions;
  using torch::optim::AdamWOptions;
  using torch::optim::SGDOptions;
  std::vector<Case> cases;
  auto sgd = [&](const std::string& name, double momentum, bool nesterov, double wd) {
    trainyard::v1::OptimizerSpec spec = Spec("sgd", 0.1);
    spec.set_momentum(momentum);
    spec.set_nesterov(nesterov);
    spec.set_weight_decay(wd);
    cases.push_back({name, spec, [=](std::vector<torch::Tensor> p) {
                       return std::make_unique<torch::optim::SGD>(
                           p,
                           SGDOptions(0.1).momentum(momentum).nesterov(nesterov).weight_decay(wd));
                     }});
  };
  sgd("sgd", 0, false, 0);
  sgd("sgd-weight-decay", 0, false, 0.01);
  sgd("sgd-momentum", 0.9, false, 0);
  sgd("sgd-nesterov-weight-decay", 0.9, true, 0.001);
  auto adam = [&](const std::string& name, const std::string& kind, double wd) {
    trainyard::v1::OptimizerSpec spec = Spec(kind, 0.01);
    spec.set_weight_decay(wd);
    spec.set_beta1(0.9);
    spec.set_beta2(0.99);
    spec.set_eps(1e-6);
    cases.push_back({name, spec, [=](std::vector<torch::Tensor> p) {
                       std::unique_ptr<torch::optim::Optimizer> out;
                       if (kind == "adam") {
                         out = std::make_unique<torch::optim::Adam>(
                             p, AdamOptions(0.01).betas({0.9, 0.99}).eps(1e-6).weight_decay(wd));
                       } else {
                         out = std::make_unique<torch::optim::AdamW>(
                             p, AdamWOptions(0.01).betas({0.9, 0.99}).eps(1e-6).weight_decay(wd));
                       }
                       return out;
                     }});
  };
  adam("adam", "adam", 0);
  adam("adam-weight-decay", "adam", 0.01);
  adam("adamw", "adamw", 0);
  adam("adamw-weight-decay", "adamw", 0.05);
  return cases;
}

// Runs `optimizer` over `params` for steps [first, end).
void Train(torch::optim::Optimizer& optimizer, NamedTensors& params, double base_lr, int first,
           int end) {
  for (int step = first; step < end; ++step) {
    SetGradients(params, step);
    SetLearningRate(optimizer, LrAt(step, base_lr));
    optimizer.step();
  }
}

// Parameters and optimizer state (OptimizerStateTensors, what checkpoints hold) of two runs:
// equal bit for bit, or within `rtol` (and rtol / 10 absolute) when it is not 0.
void ExpectSame(const NamedTensors& a_params, torch::optim::Optimizer& a,
                const NamedTensors& b_params, torch::optim::Optimizer& b, double rtol) {
  NamedTensors a_all = a_params, b_all = b_params;
  for (auto& entry : OptimizerStateTensors(a, a_params)) a_all.push_back(entry);
  for (auto& entry : OptimizerStateTensors(b, b_params)) b_all.push_back(entry);
  ASSERT_EQ(a_all.size(), b_all.size());
  for (size_t i = 0; i < a_all.size(); ++i) {
    SCOPED_TRACE(a_all[i].first);
    ASSERT_EQ(a_all[i].first, b_all[i].first);
    const torch::Tensor x = a_all[i].second.detach(), y = b_all[i].second.detach();
    ASSERT_EQ(x.sizes(), y.sizes());
    ASSERT_EQ(x.strides(), y.strides());
    if (rtol == 0 || x.scalar_type() == torch::kInt64) {
      EXPECT_TRUE(torch::equal(x, y))
          << "largest difference " << (x - y).abs().max().item<double>();
    } else {
      EXPECT_TRUE(torch::allclose(x, y, rtol, rtol / 10))
          << "largest difference " << (x - y).abs().max().item<double>();
    }
  }
}

struct Mode {
  std::string name;
  OptimizerOptions options;
  bool exact;  // bit for bit with torch::optim on the CPU
};

std::vector<Mode> Modes() {
  return {
      {"foreach", {Kernels::kForEach, false}, true},
      {"foreach-device-scalars", {Kernels::kForEach, true}, true},
      // Where this LibTorch has no fused kernels they fall back to for-each: exact again.
      {"fused", {Kernels::kFused, false}, !kHasFusedOptimizers},
      {"fused-device-scalars", {Kernels::kFused, true}, !kHasFusedOptimizers},
  };
}

// The fused kernels compute the same formulas in one pass and in another order (a lerp for the
// first moment, the bias-corrected step size folded in double precision, an FMA where
// torch::optim rounds twice): a few float32 roundings apart per update (about 1e-7 relative).
// Over kSteps updates of these well-conditioned parameters that stays far below 1e-5.
constexpr double kFusedRtol = 1e-5;

TEST(MultiTensorOptimizerTest, EqualsTorchOptimAfterManySteps) {
  for (const Case& c : Cases()) {
    for (const Mode& mode : Modes()) {
      SCOPED_TRACE(c.name + " " + mode.name);
      NamedTensors ours = MakeParameters();
      NamedTensors theirs = Copy(ours);
      absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>> optimizer =
          BuildOptimizer(c.spec, TensorsOf(ours), mode.options);
      ASSERT_TRUE(optimizer.ok()) << optimizer.status();
      std::unique_ptr<torch::optim::Optimizer> reference = c.reference(TensorsOf(theirs));
      Train(**optimizer, ours, c.spec.lr(), 0, kSteps);
      Train(*reference, theirs, c.spec.lr(), 0, kSteps);
      ExpectSame(ours, **optimizer, theirs, *reference, mode.exact ? 0 : kFusedRtol);
      // The parameters did move: an optimizer that did nothing would match nothing above, but
      // say so plainly.
      EXPECT_FALSE(torch::equal(ours[0].second, MakeParameters()[0].second));
    }
  }
}

// Checkpoints hold "<param>.<field>" tensors whatever wrote them: state torch::optim made
// (checkpoints written before these optimizers) loads into them and they go on exactly as
// torch::optim would, and theirs loads into torch::optim.
TEST(MultiTensorOptimizerTest, CheckpointStateCrossesBothWays) {
  for (const Case& c : Cases()) {
    SCOPED_TRACE(c.name);
    NamedTensors old_params = MakeParameters();
    std::unique_ptr<torch::optim::Optimizer> old = c.reference(TensorsOf(old_params));
    Train(*old, old_params, c.spec.lr(), 0, 10);
    NamedTensors saved = OptimizerStateTensors(*old, old_params);
    const std::map<std::string, torch::Tensor> state(saved.begin(), saved.end());

    NamedTensors ours = Copy(old_params);
    std::unique_ptr<torch::optim::Optimizer> optimizer =
        *BuildOptimizer(c.spec, TensorsOf(ours), {Kernels::kForEach, false});
    ASSERT_TRUE(CheckOptimizerState(*optimizer, ours, state).ok());
    LoadOptimizerState(*optimizer, ours, state);
    Train(*optimizer, ours, c.spec.lr(), 10, kSteps);
    Train(*old, old_params, c.spec.lr(), 10, kSteps);
    ExpectSame(ours, *optimizer, old_params, *old, 0);

    // And back: ours saved, torch::optim resumed.
    NamedTensors ours_saved = OptimizerStateTensors(*optimizer, ours);
    const std::map<std::string, torch::Tensor> state2(ours_saved.begin(), ours_saved.end());
    NamedTensors theirs = Copy(ours);
    std::unique_ptr<torch::optim::Optimizer> reference = c.reference(TensorsOf(theirs));
    ASSERT_TRUE(CheckOptimizerState(*reference, theirs, state2).ok());
    LoadOptimizerState(*reference, theirs, state2);
    Train(*reference, theirs, c.spec.lr(), kSteps, kSteps + 5);
    Train(*optimizer, ours, c.spec.lr(), kSteps, kSteps + 5);
    ExpectSame(ours, *optimizer, theirs, *reference, 0);
  }
}

// A resumed optimizer with device scalars takes its step counts from the loaded state, not from
// the tensors it held before the load.
TEST(MultiTensorOptimizerTest, DeviceCountsFollowLoadedState) {
  trainyard::v1::OptimizerSpec spec = Spec("adam", 0.01);
  NamedTensors ours = MakeParameters();
  NamedTensors theirs = Copy(ours);
  std::unique_ptr<torch::optim::Optimizer> optimizer =
      *BuildOptimizer(spec, TensorsOf(ours), {Kernels::kForEach, true});
  std::unique_ptr<torch::optim::Optimizer> reference =
      *BuildOptimizer(spec, TensorsOf(theirs), {Kernels::kForEach, false});
  Train(*optimizer, ours, 0.01, 0, 3);  // its device counts now hold 3
  Train(*reference, theirs, 0.01, 0, 12);
  NamedTensors saved = OptimizerStateTensors(*reference, theirs);
  const std::map<std::string, torch::Tensor> state(saved.begin(), saved.end());
  for (size_t i = 0; i < ours.size(); ++i) {
    torch::NoGradGuard no_grad;
    ours[i].second.copy_(theirs[i].second);
  }
  LoadOptimizerState(*optimizer, ours, state);
  Train(*optimizer, ours, 0.01, 12, 20);
  Train(*reference, theirs, 0.01, 12, 20);
  ExpectSame(ours, *optimizer, theirs, *reference, 0);
}

TEST(MultiTensorOptimizerTest, SaysWhichKernelsItUses) {
  NamedTensors params = MakeParameters();
  std::unique_ptr<torch::optim::Optimizer> automatic =
      *BuildOptimizer(Spec("adamw", 0.01), TensorsOf(params));
  MultiTensorUpdate* update = AsMultiTensorUpdate(*automatic);
  ASSERT_NE(update, nullptr);
  EXPECT_EQ(update->kernels(), kHasFusedOptimizers ? "fused" : "foreach");
  EXPECT_FALSE(update->device_scalars());  // CPU parameters: host scalars by default
  Train(*automatic, params, 0.01, 0, 2);
  EXPECT_EQ(update->kernels(), kHasFusedOptimizers ? "fused" : "foreach");
  std::unique_ptr<torch::optim::Optimizer> foreach =
      *BuildOptimizer(Spec("sgd", 0.1), TensorsOf(params), {Kernels::kForEach, std::nullopt});
  EXPECT_EQ(AsMultiTensorUpdate(*foreach)->kernels(), "foreach");
  torch::optim::SGD plain(TensorsOf(params), torch::optim::SGDOptions(0.1));
  EXPECT_EQ(AsMultiTensorUpdate(plain), nullptr);
}

// A CUDA graph replays the kernels of one captured step(): the learning rate and the counts must
// come from tensors that BeforeReplay moves, and the host counts (what checkpoints hold) must
// advance once per replay. The trainer's order on a GPU is: capture, then BeforeReplay and a
// replay for every update, the first included. On the CPU a capture is not recorded but run, so
// here the capture is the first update's replay: its learning rate is written before it
// (BeforeReplay before any capture writes only that), its bookkeeping after it; every later
// update is BeforeReplay then step() in capture mode, which runs the kernels a replay would
// without touching host state. The result must be torch::optim's.
TEST(MultiTensorOptimizerTest, EmulatedReplaysEqualTorchOptim) {
  for (const Case& c : Cases()) {
    SCOPED_TRACE(c.name);
    NamedTensors ours = MakeParameters();
    NamedTensors theirs = Copy(ours);
    std::unique_ptr<torch::optim::Optimizer> optimizer =
        *BuildOptimizer(c.spec, TensorsOf(ours), {Kernels::kForEach, true});
    std::unique_ptr<torch::optim::Optimizer> reference = c.reference(TensorsOf(theirs));
    MultiTensorUpdate& update = *AsMultiTensorUpdate(*optimizer);
    // Warm-up: every parameter gets its state eagerly (the late one too) before the capture.
    Train(*optimizer, ours, c.spec.lr(), 0, kLateStep + 1);
    Train(*reference, theirs, c.spec.lr(), 0, kLateStep + 1);
    update.set_capturing(true);
    for (int step = kLateStep + 1; step < kSteps; ++step) {
      SetGradients(ours, step);
      SetLearningRate(*optimizer, LrAt(step, c.spec.lr()));
      update.BeforeReplay();
      optimizer->step();
      if (step == kLateStep + 1) update.BeforeReplay();  // the capture's own replay's
    }
    update.set_capturing(false);
    Train(*reference, theirs, c.spec.lr(), kLateStep + 1, kSteps);
    ExpectSame(ours, *optimizer, theirs, *reference, 0);
  }
}

TEST(MultiTensorOptimizerTest, CaptureRefusesWhatAReplayCouldNotRepeat) {
  trainyard::v1::OptimizerSpec spec = Spec("adam", 0.01);
  NamedTensors params = MakeParameters();
  SetGradients(params, 0);
  // No state yet: the capture would make it, and every replay would make it again.
  std::unique_ptr<torch::optim::Optimizer> fresh =
      *BuildOptimizer(spec, TensorsOf(params), {Kernels::kForEach, true});
  AsMultiTensorUpdate(*fresh)->set_capturing(true);
  try {
    fresh->step();
    ADD_FAILURE() << "step() made state while capturing";
  } catch (const std::exception& e) {
    EXPECT_THAT(e.what(), HasSubstr("CUDA graph"));
  }
  // Host scalars: a replay would repeat the learning rate of the capture.
  std::unique_ptr<torch::optim::Optimizer> host =
      *BuildOptimizer(spec, TensorsOf(params), {Kernels::kForEach, false});
  host->step();
  AsMultiTensorUpdate(*host)->set_capturing(true);
  EXPECT_THROW(host->step(), std::exception);
}

}  // namespace
}  // namespace trainyard::trainer
