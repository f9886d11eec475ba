// The optimizer's update alone: torch::optim's per-parameter loop against the trainer's
// multi-tensor optimizers (worker/trainer/model/optimizer.h), for-each and, where this LibTorch
// has them (2.4 and later), fused, over the parameters of the trainer's own built-in models.
//
//   optimizer_step [--models=transformer,transformer-large,mlp] [--optimizers=adamw,sgd]
//                  [--steps=50] [--rounds=7] [--threads=1]
//
// For each model and optimizer, every variant gets the same parameters and gradients (random,
// fixed); the variants take turns for --rounds rounds of --steps updates each, after a warm-up
// of 5, with the learning rate set before each update as the trainer sets it. A round's figure is
// its mean time per update; the table gives each variant's median round and its ratio to
// torch::optim's. One LibTorch thread by default: a trainer rank with one CPU slot; glibc's malloc
// keeps freed memory as in the trainer (KeepStepMemory), so that torch::optim's temporaries are
// not faulted in again every step.
// Prints a Markdown table and, last, one JSON line with every figure.

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "worker/trainer/loop/trainer.h"
#include "worker/trainer/model/model.h"
#include "worker/trainer/model/multi_tensor.h"
#include "worker/trainer/model/optimizer.h"

ABSL_FLAG(std::string, models, "transformer,transformer-large,mlp",
          "transformer (bench/transformer_step.py's: 4 layers of 128), transformer-large (8 "
          "layers of 512), mlp (bench/ddp_scaling's: 256 -> 1024 -> 1024 -> 10)");
ABSL_FLAG(std::string, optimizers, "adamw,sgd", "adamw (weight decay 0.01), sgd (momentum 0.9)");
ABSL_FLAG(int, steps, 50, "updates per round");
ABSL_FLAG(int, rounds, 7, "rounds per variant, the variants taking turns");
ABSL_FLAG(int, threads, 1, "LibTorch threads (torch::set_num_threads)");

namespace trainyard::trainer {
namespace {

using Clock = std::chrono::steady_clock;

trainyard::v1::ModelSpec ModelSpecOf(const std::string& name) {
  trainyard::v1::ModelSpec spec;
  trainyard::v1::ModelArgs& args = *spec.mutable_args();
  if (name == "mlp") {
    spec.set_builtin("mlp");
    args.set_inputs(256);
    args.add_hidden(1024);
    args.add_hidden(1024);
    args.set_classes(10);
    return spec;
  }
  spec.set_builtin("transformer");
  const bool large = name == "transformer-large";
  args.add_vocab(256);
  args.set_dim(large ? 512 : 128);
  args.set_context(large ? 256 : 128);
  args.set_layers(large ? 8 : 4);
  args.set_heads(large ? 8 : 4);
  args.set_mlp_ratio(4);
  args.set_tie_embeddings(true);
  return spec;
}

struct Variant {
  std::string name;
  std::function<std::unique_ptr<torch::optim::Optimizer>(const std::vector<torch::Tensor>&)> make;
};

std::vector<Variant> VariantsOf(const std::string& optimizer) {
  trainyard::v1::OptimizerSpec spec;
  spec.set_name(optimizer);
  spec.set_lr(optimizer == "sgd" ? 0.01 : 0.001);
  if (optimizer == "sgd") spec.set_momentum(0.9);
  if (optimizer == "adamw") spec.set_weight_decay(0.01);
  std::vector<Variant> out;
  out.push_back({"torch::optim", [spec](const std::vector<torch::Tensor>& p) {
                   std::unique_ptr<torch::optim::Optimizer> o;
                   if (spec.name() == "sgd") {
                     o = std::make_unique<torch::optim::SGD>(
                         p, torch::optim::SGDOptions(spec.lr()).momentum(spec.momentum()));
                   } else {
                     o = std::make_unique<torch::optim::AdamW>(
                         p, torch::optim::AdamWOptions(spec.lr()).weight_decay(0.01));
                   }
                   return o;
                 }});
  auto ours = [spec](OptimizerOptions::Kernels kernels) {
    return [spec, kernels](const std::vector<torch::Tensor>& p) {
      return *BuildOptimizer(spec, p, {kernels, false});
    };
  };
  out.push_back({"foreach", ours(OptimizerOptions::Kernels::kForEach)});
  if (kHasFusedOptimizers) out.push_back({"fused", ours(OptimizerOptions::Kernels::kFused)});
  return out;
}

// One variant's own copy of the parameters, with gradients.
struct Setup {
  std::vector<torch::Tensor> params;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  double lr = 0;
};

double Round(Setup& s, int steps) {
  const Clock::time_point start = Clock::now();
  for (int i = 0; i < steps; ++i) {
    SetLearningRate(*s.optimizer, s.lr * (1.0 - 1e-4 * i));  // as the trainer's schedule does
    s.optimizer->step();
  }
  return std::chrono::duration<double>(Clock::now() - start).count() / steps;
}

int Main() {
  torch::set_num_threads(absl::GetFlag(FLAGS_threads));
  KeepStepMemory();  // glibc's malloc thresholds as the trainer sets them
  const int steps = absl::GetFlag(FLAGS_steps);
  const int rounds = absl::GetFlag(FLAGS_rounds);
  std::string json = "{";
  std::printf("LibTorch %s, %d thread(s), %d rounds of %d updates (median round)\n\n",
              TORCH_VERSION, absl::GetFlag(FLAGS_threads), rounds, steps);
  std::printf(
      "| model | parameters | optimizer | variant | ms per update | speed-up over torch::optim "
      "|\n");
  std::printf("| --- | ---: | --- | --- | ---: | ---: |\n");
  const std::vector<std::string> models = absl::StrSplit(absl::GetFlag(FLAGS_models), ',');
  const std::vector<std::string> optimizers = absl::StrSplit(absl::GetFlag(FLAGS_optimizers), ',');
  for (const std::string& model_name : models) {
    absl::StatusOr<std::unique_ptr<Model>> model = BuildModel(ModelSpecOf(model_name), 1, 256, 256);
    if (!model.ok()) {
      std::fprintf(stderr, "%s: %s\n", model_name.c_str(), model.status().ToString().c_str());
      return 1;
    }
    const NamedTensors named = (*model)->NamedParameters();
    int64_t count = 0;
    for (const auto& [name, p] : named) count += p.numel();
    for (const std::string& optimizer : optimizers) {
      std::vector<Variant> variants = VariantsOf(optimizer);
      std::vector<Setup> setups(variants.size());
      torch::manual_seed(5);
      std::vector<torch::Tensor> grads;
      for (const auto& [name, p] : named) grads.push_back(torch::randn_like(p) * 0.01);
      for (size_t v = 0; v < variants.size(); ++v) {
        for (size_t i = 0; i < named.size(); ++i) {
          torch::Tensor p = named[i].second.detach().clone().requires_grad_(true);
          p.mutable_grad() = grads[i].clone();
          setups[v].params.push_back(p);
        }
        setups[v].optimizer = variants[v].make(setups[v].params);
        setups[v].lr = optimizer == "sgd" ? 0.01 : 0.001;
        Round(setups[v], 5);  // state made, caches warm
      }
      std::vector<std::vector<double>> times(variants.size());
      for (int r = 0; r < rounds; ++r) {
        for (size_t v = 0; v < variants.size(); ++v) times[v].push_back(Round(setups[v], steps));
      }
      double reference = 0;
      for (size_t v = 0; v < variants.size(); ++v) {
        std::vector<double>& t = times[v];
        std::sort(t.begin(), t.end());
        const double median = t[t.size() / 2];
        if (v == 0) reference = median;
        std::printf("| %s | %lld | %s | %s | %.3f | %.2f |\n", model_name.c_str(),
                    static_cast<long long>(count), optimizer.c_str(), variants[v].name.c_str(),
                    median * 1e3, reference / median);
        absl::StrAppendFormat(&json, "%s\"%s/%s/%s\": %.6f", json.size() > 1 ? ", " : "",
                              model_name, optimizer, variants[v].name, median * 1e3);
      }
    }
  }
  std::printf("\n%s}\n", json.c_str());
  return 0;
}

}  // namespace
}  // namespace trainyard::trainer

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return trainyard::trainer::Main();
}
