// The device's fast paths (worker/trainer/model/device_modes.h): which a job gets, decided on any
// machine, and what the trainer does with them on the CPU (tf32 is fp32 there; a CUDA graph is
// refused naming its field).

#include "worker/trainer/model/device_modes.h"

#include <ATen/Context.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/trainer/test_tasks.h"
#include "tests/trainer/trainer_test_util.h"
#include "worker/trainer/loop/step_graph.h"
#include "worker/trainer/loop/trainer.h"
#include "worker/trainer/model/model.h"
#include "worker/trainer/model/optimizer.h"

namespace trainyard::trainer {
namespace {

using ::testing::HasSubstr;

trainyard::v1::JobSpec SpecWith(const std::string& memory_format,
                                trainyard::v1::Precision precision, bool cuda_graph) {
  trainyard::v1::JobSpec spec;
  spec.mutable_model()->set_memory_format(memory_format);
  spec.set_precision(precision);
  spec.set_cuda_graph(cuda_graph);
  return spec;
}

DeviceFacts Facts(bool cuda, bool convolutional, bool static_shapes) {
  DeviceFacts facts;
  facts.cuda = cuda;
  facts.convolutional = convolutional;
  facts.static_shapes = static_shapes;
  return facts;
}

TEST(DeviceModesTest, AGpuGetsChannelsLastAndAutotuningForConvolutionsByDefault) {
  const trainyard::v1::JobSpec spec = SpecWith("auto", trainyard::v1::FP32, false);
  absl::StatusOr<DeviceModes> conv = ChooseDeviceModes(spec, Facts(true, true, true));
  ASSERT_TRUE(conv.ok()) << conv.status();
  EXPECT_TRUE(conv->channels_last);
  EXPECT_TRUE(conv->cudnn_benchmark);
  EXPECT_FALSE(conv->tf32);
  EXPECT_FALSE(conv->cuda_graph);
  // Shapes that change: no autotuning (each new shape would be timed again).
  EXPECT_FALSE(ChooseDeviceModes(spec, Facts(true, true, false))->cudnn_benchmark);
  // No convolution: neither.
  absl::StatusOr<DeviceModes> mlp = ChooseDeviceModes(spec, Facts(true, false, true));
  EXPECT_FALSE(mlp->channels_last);
  EXPECT_FALSE(mlp->cudnn_benchmark);
  // The default as the coordinator stores it (empty only in a task made by hand) alike.
  EXPECT_TRUE(ChooseDeviceModes(SpecWith("", trainyard::v1::FP32, false), Facts(true, true, true))
                  ->channels_last);
  // contiguous keeps the model as built.
  EXPECT_FALSE(
      ChooseDeviceModes(SpecWith("contiguous", trainyard::v1::FP32, false), Facts(true, true, true))
          ->channels_last);
}

TEST(DeviceModesTest, ACpuGetsNoneOfThemUnlessAsked) {
  for (trainyard::v1::Precision precision : {trainyard::v1::FP32, trainyard::v1::TF32}) {
    absl::StatusOr<DeviceModes> modes =
        ChooseDeviceModes(SpecWith("auto", precision, false), Facts(false, true, true));
    ASSERT_TRUE(modes.ok());
    EXPECT_FALSE(modes->channels_last);
    EXPECT_FALSE(modes->cudnn_benchmark);
    EXPECT_FALSE(modes->tf32);  // tf32 on a CPU is fp32
  }
  // Asked for by name, channels_last holds on a CPU too (as before the default became auto).
  EXPECT_TRUE(ChooseDeviceModes(SpecWith("channels_last", trainyard::v1::FP32, false),
                                Facts(false, true, true))
                  ->channels_last);
}

TEST(DeviceModesTest, Tf32OnAGpu) {
  EXPECT_TRUE(
      ChooseDeviceModes(SpecWith("auto", trainyard::v1::TF32, false), Facts(true, false, true))
          ->tf32);
  EXPECT_FALSE(
      ChooseDeviceModes(SpecWith("auto", trainyard::v1::BF16, false), Facts(true, false, true))
          ->tf32);
}

TEST(DeviceModesTest, RefusalsNameTheirField) {
  absl::Status no_conv = ChooseDeviceModes(SpecWith("channels_last", trainyard::v1::FP32, false),
                                           Facts(true, false, true))
                             .status();
  EXPECT_EQ(no_conv.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(no_conv.message(), HasSubstr("model.memory_format: channels_last"));
  absl::Status unknown =
      ChooseDeviceModes(SpecWith("nhwc", trainyard::v1::FP32, false), Facts(true, true, true))
          .status();
  EXPECT_THAT(unknown.message(), HasSubstr("model.memory_format: unknown"));
  absl::Status on_cpu =
      ChooseDeviceModes(SpecWith("auto", trainyard::v1::FP32, true), Facts(false, false, true))
          .status();
  EXPECT_EQ(on_cpu.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(on_cpu.message(), HasSubstr("cuda_graph: this rank trains on the CPU"));
  absl::Status shapes =
      ChooseDeviceModes(SpecWith("auto", trainyard::v1::FP32, true), Facts(true, false, false))
          .status();
  EXPECT_THAT(shapes.message(), HasSubstr("cuda_graph: the micro-batches"));
  absl::StatusOr<DeviceModes> graph =
      ChooseDeviceModes(SpecWith("auto", trainyard::v1::FP32, true), Facts(true, false, true));
  ASSERT_TRUE(graph.ok());
  EXPECT_TRUE(graph->cuda_graph);
}

TEST(DeviceModesTest, ApplySetsLibTorchsSwitchesBothWays) {
  at::Context& context = at::globalContext();
  const bool tf32_blas = context.allowTF32CuBLAS();
  const bool benchmark = context.benchmarkCuDNN();
  DeviceModes on;
  on.tf32 = true;
  on.cudnn_benchmark = true;
  ApplyDeviceModes(on);
  EXPECT_TRUE(context.allowTF32CuBLAS());
  EXPECT_TRUE(context.allowTF32CuDNN());
  EXPECT_TRUE(context.benchmarkCuDNN());
  ApplyDeviceModes(DeviceModes());
  EXPECT_FALSE(context.allowTF32CuBLAS());
  EXPECT_FALSE(context.benchmarkCuDNN());
  context.setAllowTF32CuBLAS(tf32_blas);
  context.setBenchmarkCuDNN(benchmark);
}

TEST(DeviceModesTest, TheCnnTakesItsImagesChannelsLast) {
  trainyard::v1::ModelSpec spec;
  spec.set_builtin("cnn");
  spec.mutable_args()->set_channels(3);
  spec.mutable_args()->set_height(8);
  spec.mutable_args()->set_width(8);
  absl::StatusOr<std::unique_ptr<Model>> cnn = BuildModel(spec, 1, 3 * 8 * 8, 4);
  ASSERT_TRUE(cnn.ok()) << cnn.status();
  EXPECT_TRUE(HasConvolutions(**cnn));
  torch::manual_seed(3);
  const torch::Tensor x = torch::rand({5, 3 * 8 * 8});
  const torch::Tensor before = (*cnn)->Forward(x).detach();
  ASSERT_TRUE(ApplyMemoryFormat(**cnn, /*channels_last=*/true).ok());
  for (const auto& [name, p] : (*cnn)->NamedParameters()) {
    if (p.dim() == 4) {
      EXPECT_TRUE(p.is_contiguous(torch::MemoryFormat::ChannelsLast)) << name;
    }
  }
  // The same function of its input, whatever the layout of weights and images.
  const torch::Tensor after = (*cnn)->Forward(x).detach();
  EXPECT_TRUE(torch::allclose(before, after, 1e-5, 1e-6));

  trainyard::v1::ModelSpec mlp_spec;
  mlp_spec.set_builtin("mlp");
  absl::StatusOr<std::unique_ptr<Model>> mlp = BuildModel(mlp_spec, 1, 8, 2);
  ASSERT_TRUE(mlp.ok());
  EXPECT_FALSE(HasConvolutions(**mlp));
  EXPECT_TRUE(ApplyMemoryFormat(**mlp, /*channels_last=*/false).ok());
  EXPECT_EQ(ApplyMemoryFormat(**mlp, /*channels_last=*/true).code(),
            absl::StatusCode::kInvalidArgument);
}

trainyard::v1::Task MlpTask(int64_t steps) {
  trainyard::v1::Task task = test_tasks::SingleRankTask("modes", "");
  auto& spec = *task.mutable_spec();
  spec.mutable_model()->set_builtin("mlp");
  spec.mutable_model()->mutable_args()->add_hidden(16);
  auto& synthetic = *spec.mutable_data()->mutable_synthetic();
  synthetic.set_samples(240);
  synthetic.set_features(8);
  synthetic.set_classes(3);
  synthetic.set_noise(0.5);
  spec.set_batch_size(16);
  spec.mutable_optimizer()->set_name("adamw");
  spec.mutable_optimizer()->set_lr(0.01);
  spec.set_max_steps(steps);
  spec.set_seed(7);
  return task;
}

// On a CPU, tf32 is fp32: the same losses, bit for bit.
TEST(DeviceModesTest, Tf32TrainsOnTheCpuAsFp32Does) {
  std::vector<std::string> lines[2];
  for (int i = 0; i < 2; ++i) {
    trainyard::v1::Task task = MlpTask(12);
    task.mutable_spec()->set_precision(i == 0 ? trainyard::v1::FP32 : trainyard::v1::TF32);
    task.mutable_spec()->set_log_every_steps(1);
    TrainerOptions options = test_util::QuietOptions();
    options.print_line = [&lines, i](const std::string& line) {
      if (line.rfind("step=", 0) == 0) lines[i].push_back(line.substr(0, line.find(" lr=")));
    };
    absl::StatusOr<TrainResult> result = RunTrainer(task, options);
    ASSERT_TRUE(result.ok()) << result.status();
  }
  ASSERT_EQ(lines[0].size(), 12u);
  EXPECT_EQ(lines[0], lines[1]);
}

// A task made by hand (no coordinator to refuse it) with cuda_graph on a CPU rank fails before
// its first step, naming the field; the graph itself needs a GPU and device scalars.
TEST(DeviceModesTest, ACudaGraphOnTheCpuIsRefusedBeforeAnyStep) {
  trainyard::v1::Task task = MlpTask(5);
  task.mutable_spec()->set_cuda_graph(true);
  int64_t steps = 0;
  TrainerOptions options = test_util::QuietOptions();
  options.after_step = [&steps](int64_t) { ++steps; };
  absl::Status status = RunTrainer(task, options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("cuda_graph"));
  EXPECT_EQ(steps, 0);

  std::vector<torch::Tensor> params = {torch::zeros({2}, torch::requires_grad())};
  trainyard::v1::OptimizerSpec sgd;
  sgd.set_name("sgd");
  sgd.set_lr(0.1);
  std::unique_ptr<torch::optim::Optimizer> host = *BuildOptimizer(sgd, params);
  absl::Status cpu = MakeStepGraph(torch::kCPU, *AsMultiTensorUpdate(*host)).status();
  EXPECT_EQ(cpu.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(cpu.message(), HasSubstr("not a GPU"));
  absl::Status host_scalars =
      MakeStepGraph(torch::Device(torch::kCUDA, 0), *AsMultiTensorUpdate(*host)).status();
  EXPECT_EQ(host_scalars.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(host_scalars.message(), HasSubstr("on the host"));
#if !TRAINYARD_WITH_CUDA_GRAPH
  std::unique_ptr<torch::optim::Optimizer> device =
      *BuildOptimizer(sgd, params, {OptimizerOptions::Kernels::kAuto, true});
  absl::Status unbuilt =
      MakeStepGraph(torch::Device(torch::kCUDA, 0), *AsMultiTensorUpdate(*device)).status();
  EXPECT_EQ(unbuilt.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(unbuilt.message(), HasSubstr("cuda_graph"));
#endif
}

}  // namespace
}  // namespace trainyard::trainer
