// The speed paths on a GPU: the whole step as a CUDA graph gives the eager step's losses bit for
// bit over 100 steps (float32 and bf16, MLP and the built-in transformer, a learning rate that
// moves every step), and the multi-tensor optimizers on CUDA, for-each and fused, stay with
// torch::optim's. Each case skips, saying why, where LibTorch has no CUDA device or the trainer
// was built without CUDA graphs.

#include <torch/torch.h>

#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/storage/checkpoint_layout.h"
#include "gtest/gtest.h"
#include "tests/trainer/test_files.h"
#include "tests/trainer/test_tasks.h"
#include "tests/trainer/trainer_test_util.h"
#include "worker/trainer/loop/trainer.h"
#include "worker/trainer/model/multi_tensor.h"
#include "worker/trainer/model/optimizer.h"
#include "worker/trainer/model/tensors.h"

namespace trainyard::trainer {
namespace {

using test_files::MakeTempDir;
using test_util::QuietOptions;
using test_util::ReadTensors;

#define SKIP_WITHOUT_CUDA()                                                              \
  if (!torch::cuda::is_available())                                                      \
  GTEST_SKIP() << "no CUDA device: LibTorch " << TORCH_VERSION << " built without CUDA " \
               << "or no GPU visible"

constexpr int kSteps = 100;

trainyard::v1::Task MlpTask(const std::string& dir) {
  trainyard::v1::Task task = test_tasks::SingleRankTask("graphjob", dir);
  auto& spec = *task.mutable_spec();
  spec.mutable_resources()->set_gpus_per_worker(1);
  spec.mutable_model()->set_builtin("mlp");
  spec.mutable_model()->mutable_args()->add_hidden(256);
  spec.mutable_model()->mutable_args()->add_hidden(256);
  auto& synthetic = *spec.mutable_data()->mutable_synthetic();
  synthetic.set_samples(8192);
  synthetic.set_features(64);
  synthetic.set_classes(8);
  synthetic.set_noise(0.5);
  spec.mutable_data()->set_validation_split(0.1f);
  spec.mutable_data()->mutable_validation()->set_every_steps(25);
  spec.set_batch_size(128);
  spec.mutable_optimizer()->set_name("adamw");
  spec.mutable_optimizer()->set_lr(0.003);
  spec.mutable_optimizer()->set_weight_decay(0.01);
  spec.mutable_optimizer()->mutable_schedule()->set_name("cosine");
  spec.mutable_optimizer()->mutable_schedule()->set_warmup_steps(10);
  spec.set_max_steps(kSteps);
  spec.set_seed(5);
  spec.set_log_every_steps(1);
  spec.mutable_checkpoint()->set_every_steps(50);
  return task;
}

trainyard::v1::Task TransformerTask(const std::string& tokens, const std::string& dir) {
  trainyard::v1::Task task = test_tasks::SingleRankTask("graphlm", dir);
  auto& spec = *task.mutable_spec();
  spec.mutable_resources()->set_gpus_per_worker(1);
  spec.mutable_model()->set_builtin("transformer");
  auto& args = *spec.mutable_model()->mutable_args();
  args.add_vocab(32);
  args.set_context(16);
  args.set_layers(2);
  args.set_dim(32);
  args.set_heads(2);
  args.set_tie_embeddings(true);
  spec.mutable_data()->set_tokens(tokens);
  spec.set_batch_size(16);
  spec.set_accumulate_steps(2);
  spec.mutable_optimizer()->set_name("sgd");
  spec.mutable_optimizer()->set_lr(0.05);
  spec.mutable_optimizer()->set_momentum(0.9);
  spec.mutable_optimizer()->set_nesterov(true);
  spec.set_max_steps(kSteps);
  spec.set_seed(7);
  spec.set_log_every_steps(1);
  return task;
}

struct Trained {
  std::vector<std::string> losses;  // each step's "step=N ... loss=L" as printed
  TrainResult result;
  std::map<std::string, torch::Tensor> exported;
};

// The run of `task` with cuda_graph `graph`: its per-step losses and exported parameters.
Trained Train(trainyard::v1::Task task, const std::string& dir, bool graph) {
  task.mutable_spec()->set_cuda_graph(graph);
  Trained out;
  TrainerOptions options = QuietOptions();
  options.print_line = [&out](const std::string& line) {
    if (line.rfind("step=", 0) == 0 && line.find(" loss=") != std::string::npos) {
      out.losses.push_back(line.substr(0, line.find(" lr=")));
    }
  };
  absl::StatusOr<TrainResult> result = RunTrainer(task, options);
  EXPECT_TRUE(result.ok()) << result.status();
  if (result.ok()) out.result = *result;
  out.exported = ReadTensors(dir + "/final/model.safetensors");
  return out;
}

void ExpectSameRun(const Trained& eager, const Trained& graph) {
  ASSERT_EQ(eager.losses.size(), static_cast<size_t>(kSteps));
  EXPECT_EQ(eager.losses, graph.losses);
  EXPECT_EQ(eager.result.graph_replays, 0);
  // Warm-up steps run eagerly, then every step replays the graph.
  EXPECT_GE(graph.result.graph_replays, kSteps - 5);
  ASSERT_EQ(eager.exported.size(), graph.exported.size());
  for (const auto& [name, t] : eager.exported) {
    EXPECT_TRUE(torch::equal(t, graph.exported.at(name))) << name;
  }
}

TEST(StepGraphGpuTest, AGraphedMlpTrainsAsTheEagerOneBitForBit) {
  SKIP_WITHOUT_CUDA();
#if !TRAINYARD_WITH_CUDA_GRAPH
  GTEST_SKIP() << "built without CUDA graphs (no LibTorch with CUDA at build time)";
#endif
  for (auto precision : {trainyard::v1::FP32, trainyard::v1::TF32, trainyard::v1::BF16}) {
    SCOPED_TRACE(trainyard::v1::Precision_Name(precision));
    const std::string eager_dir = MakeTempDir(), graph_dir = MakeTempDir();
    trainyard::v1::Task eager_task = MlpTask(eager_dir), graph_task = MlpTask(graph_dir);
    eager_task.mutable_spec()->set_precision(precision);
    graph_task.mutable_spec()->set_precision(precision);
    const Trained eager = Train(eager_task, eager_dir, false);
    const Trained graph = Train(graph_task, graph_dir, true);
    ExpectSameRun(eager, graph);
    // Its checkpoint of step 50 resumes (eagerly, then in a graph of its own) to the same end.
    trainyard::v1::Task resumed = MlpTask(MakeTempDir());
    resumed.mutable_spec()->set_precision(precision);
    resumed.mutable_spec()->set_cuda_graph(true);
    resumed.add_resume_checkpoints("file://" + CheckpointStepUri(graph_dir, 50));
    absl::StatusOr<TrainResult> again = RunTrainer(resumed, QuietOptions());
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->start_step, 50);
    EXPECT_EQ(again->loss, graph.result.loss);
  }
}

TEST(StepGraphGpuTest, AGraphedTransformerWithMicroBatchesTrainsAsTheEagerOne) {
  SKIP_WITHOUT_CUDA();
#if !TRAINYARD_WITH_CUDA_GRAPH
  GTEST_SKIP() << "built without CUDA graphs (no LibTorch with CUDA at build time)";
#endif
  const std::string data = MakeTempDir();
  {
    torch::manual_seed(3);
    const torch::Tensor ids =
        (torch::arange(20000) % 28 + torch::randint(0, 4, {20000})).to(torch::kUInt8);
    const std::string bytes = *EncodeTensors({{"tokens", ids}}, {});
    std::FILE* f = std::fopen((data + "/text-0.safetensors").c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::fwrite(bytes.data(), 1, bytes.size(), f);
    std::fclose(f);
  }
  const std::string tokens = data + "/text-*.safetensors";
  const std::string eager_dir = MakeTempDir(), graph_dir = MakeTempDir();
  const Trained eager = Train(TransformerTask(tokens, eager_dir), eager_dir, false);
  const Trained graph = Train(TransformerTask(tokens, graph_dir), graph_dir, true);
  ExpectSameRun(eager, graph);
}

// The optimizers on CUDA tensors: for-each and fused, host and device scalars, against
// torch::optim on the same device. CUDA's kernels round differently from torch::optim's (a
// division by a host scalar is a multiplication by its reciprocal there; the fused kernels fold
// the step size in double precision): a few float32 roundings per update.
TEST(StepGraphGpuTest, TheOptimizersOnCudaStayWithTorchOptim) {
  SKIP_WITHOUT_CUDA();
  using Kernels = OptimizerOptions::Kernels;
  for (const char* name : {"sgd", "adam", "adamw"}) {
    for (const OptimizerOptions& options :
         {OptimizerOptions{Kernels::kForEach, false}, OptimizerOptions{Kernels::kForEach, true},
          OptimizerOptions{Kernels::kFused, false}, OptimizerOptions{Kernels::kFused, true}}) {
      SCOPED_TRACE(absl::StrCat(name, " kernels ", static_cast<int>(options.kernels),
                                " device scalars ", *options.device_scalars));
      torch::manual_seed(1);
      std::vector<torch::Tensor> ours = {torch::randn({64, 32}, torch::kCUDA),
                                         torch::randn({64}, torch::kCUDA)};
      std::vector<torch::Tensor> theirs;
      for (torch::Tensor& p : ours) {
        p.requires_grad_(true);
        theirs.push_back(p.detach().clone().requires_grad_(true));
      }
      trainyard::v1::OptimizerSpec spec;
      spec.set_name(name);
      spec.set_lr(0.01);
      spec.set_momentum(std::string(name) == "sgd" ? 0.9 : 0);
      spec.set_weight_decay(0.01);
      std::unique_ptr<torch::optim::Optimizer> a = *BuildOptimizer(spec, ours, options);
      std::unique_ptr<torch::optim::Optimizer> b;
      if (std::string(name) == "sgd") {
        b = std::make_unique<torch::optim::SGD>(
            theirs, torch::optim::SGDOptions(0.01).momentum(0.9).weight_decay(0.01));
      } else if (std::string(name) == "adam") {
        b = std::make_unique<torch::optim::Adam>(
            theirs, torch::optim::AdamOptions(0.01).weight_decay(0.01));
      } else {
        b = std::make_unique<torch::optim::AdamW>(
            theirs, torch::optim::AdamWOptions(0.01).weight_decay(0.01));
      }
      for (int step = 0; step < 30; ++step) {
        for (size_t i = 0; i < ours.size(); ++i) {
          torch::Tensor g = torch::randn_like(ours[i]);
          ours[i].mutable_grad() = g.clone();
          theirs[i].mutable_grad() = g.clone();
        }
        SetLearningRate(*a, 0.01 / (1 + step));
        SetLearningRate(*b, 0.01 / (1 + step));
        a->step();
        b->step();
      }
      for (size_t i = 0; i < ours.size(); ++i) {
        EXPECT_TRUE(torch::allclose(ours[i], theirs[i], 1e-5, 1e-6))
            << (ours[i] - theirs[i]).abs().max().item<double>();
      }
      const bool fused = options.kernels == Kernels::kFused && kHasFusedOptimizers;
      EXPECT_EQ(AsMultiTensorUpdate(*a)->kernels(), fused ? "fused" : "foreach");
    }
  }
}

}  // namespace
}  // namespace trainyard::trainer
