// The trainer on a GPU: a job trains on cuda:0, its checkpoints load on a CPU and resume on the
// GPU where they stopped; a pipeline's stages train on it as one rank does; its updates never wait
// for the GPU on the host; the NCCL communicator runs every collective the trainer uses and turns a
// missing peer into an abort at its timeout. Each case skips, saying why, where LibTorch has no
// CUDA device or the trainer was built without NCCL.

#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/trainer/fake_rendezvous.h"
#include "tests/trainer/test_files.h"
#include "tests/trainer/test_tasks.h"
#include "tests/trainer/trainer_test_util.h"
#include "worker/trainer/checkpoint/checkpoint.h"
#include "worker/trainer/data/data.h"
#include "worker/trainer/data/device_feed.h"
#include "worker/trainer/loop/trainer.h"
#include "worker/trainer/model/tensors.h"
#include "worker/trainer/strategy/strategy.h"
#if TRAINYARD_WITH_NCCL
#include "worker/trainer/collective/nccl_communicator.h"
#endif
#if TRAINYARD_WITH_CUDA_FEED
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace trainyard::trainer {
namespace {

using test_files::MakeTempDir;
using test_files::StepFile;
using test_util::QuietOptions;
using test_util::ReadTensors;
using ::testing::AnyOf;

#define SKIP_WITHOUT_CUDA()                                                              \
  if (!torch::cuda::is_available())                                                      \
  GTEST_SKIP() << "no CUDA device: LibTorch " << TORCH_VERSION << " built without CUDA " \
               << "or no GPU visible"

trainyard::v1::Task GpuTask(const std::string& checkpoint_dir, int64_t max_steps) {
  trainyard::v1::Task task = test_tasks::SingleRankTask("gpujob", checkpoint_dir);
  auto& spec = *task.mutable_spec();
  spec.mutable_resources()->set_gpus_per_worker(1);
  spec.mutable_model()->set_builtin("mlp");
  spec.mutable_model()->mutable_args()->add_hidden(64);
  auto& synthetic = *spec.mutable_data()->mutable_synthetic();
  synthetic.set_samples(2048);
  synthetic.set_features(32);
  synthetic.set_classes(4);
  synthetic.set_noise(0.5);
  spec.mutable_data()->set_validation_split(0.25);
  spec.set_batch_size(64);
  spec.mutable_optimizer()->set_name("adam");
  spec.mutable_optimizer()->set_lr(0.01);
  spec.set_loss("cross_entropy");
  spec.set_max_steps(max_steps);
  spec.set_seed(11);
  spec.set_log_every_steps(1000);
  spec.mutable_checkpoint()->set_every_steps(max_steps / 2);
  return task;
}

TEST(GpuTrainingTest, AJobTrainsOnCudaAndItsCheckpointsLoadOnTheCpuAndResumeOnTheGpu) {
  SKIP_WITHOUT_CUDA();
  const std::string dir = MakeTempDir();
  trainyard::v1::Task task = GpuTask(dir, 40);
  ASSERT_TRUE(TrainingDevice(task).is_cuda());
  absl::StatusOr<TrainResult> whole = RunTrainer(task, QuietOptions());
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(whole->step, 40);
  EXPECT_LT(whole->loss, whole->first_loss);
  ASSERT_TRUE(whole->val_accuracy.has_value());
  EXPECT_GT(*whole->val_accuracy, 0.5);

  // The checkpoint holds host tensors that a CPU-only reader takes as they are.
  const std::string half = CheckpointStepUri(dir, 20);  // the checkpoint of step 20
  for (const auto& [name, tensor] : ReadTensors(StepFile(half, "model"))) {
    EXPECT_TRUE(tensor.device().is_cpu()) << name;
    EXPECT_TRUE(torch::isfinite(tensor).all().item<bool>()) << name;
  }

  // Resumed on the CPU from step 20: the second half runs there and learns on.
  const std::string cpu_dir = MakeTempDir();
  trainyard::v1::Task on_cpu = GpuTask(cpu_dir, 40);
  on_cpu.mutable_spec()->mutable_resources()->set_gpus_per_worker(0);
  on_cpu.add_resume_checkpoints("file://" + half);
  ASSERT_TRUE(TrainingDevice(on_cpu).is_cpu());
  absl::StatusOr<TrainResult> cpu = RunTrainer(on_cpu, QuietOptions());
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ(cpu->start_step, 20);
  EXPECT_EQ(cpu->step, 40);
  // Same data order and state; only the arithmetic's rounding differs between the devices.
  EXPECT_NEAR(cpu->loss, whole->loss, 1e-3 + 1e-3 * std::abs(whole->loss));

  // Resumed on the GPU from step 20: it continues where the uninterrupted run went.
  const std::string gpu_dir = MakeTempDir();
  trainyard::v1::Task on_gpu = GpuTask(gpu_dir, 40);
  on_gpu.add_resume_checkpoints("file://" + half);
  absl::StatusOr<TrainResult> resumed = RunTrainer(on_gpu, QuietOptions());
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->start_step, 20);
  EXPECT_EQ(resumed->resumed_from, "file://" + half);
  EXPECT_NEAR(resumed->loss, whole->loss, 1e-5 + 1e-5 * std::abs(whole->loss));
}

// fp16 with its loss scale, and bf16, on the GPU: both learn, stay near float32, keep float32
// parameters; the fp16 checkpoint carries the scale and resumes exactly where the run went.
TEST(GpuTrainingTest, MixedPrecisionTrainsAndFp16ResumesWithItsLossScale) {
  SKIP_WITHOUT_CUDA();
  absl::StatusOr<TrainResult> fp32 = RunTrainer(GpuTask(MakeTempDir(), 40), QuietOptions());
  ASSERT_TRUE(fp32.ok()) << fp32.status();
  for (auto precision : {trainyard::v1::BF16, trainyard::v1::FP16}) {
    const std::string dir = MakeTempDir();
    trainyard::v1::Task task = GpuTask(dir, 40);
    task.mutable_spec()->set_precision(precision);
    absl::StatusOr<TrainResult> mixed = RunTrainer(task, QuietOptions());
    ASSERT_TRUE(mixed.ok()) << mixed.status();
    EXPECT_LT(mixed->loss, mixed->first_loss) << precision;
    EXPECT_NE(mixed->loss, fp32->loss) << precision << ": autocast did not run";
    EXPECT_NEAR(mixed->loss, fp32->loss, 0.1 * std::abs(fp32->loss) + 0.02) << precision;
    for (const auto& [name, t] : ReadTensors(dir + "/final/model.safetensors")) {
      EXPECT_EQ(t.scalar_type(), torch::kFloat32) << name;
    }
    if (precision != trainyard::v1::FP16) continue;
    const std::string half = CheckpointStepUri(dir, 20);
    const std::string state = test_files::ReadFile(StepFile(half, "trainer_state"));
    EXPECT_NE(state.find("\"loss_scaler\""), std::string::npos) << state;
    trainyard::v1::Task resumed = GpuTask(MakeTempDir(), 40);
    resumed.mutable_spec()->set_precision(precision);
    resumed.add_resume_checkpoints("file://" + half);
    absl::StatusOr<TrainResult> again = RunTrainer(resumed, QuietOptions());
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->start_step, 20);
    EXPECT_NEAR(again->loss, mixed->loss, 1e-5 + 1e-5 * std::abs(mixed->loss));
  }
}

// An update queues its work without waiting for the GPU: the batch comes from pinned memory on
// the feed's copy stream and the loss stays on the device. With LibTorch's sync debug mode at
// "error", any synchronising call inside an update (a loss read, a blocking copy, a stream
// synchronise) throws, which fails the job. The first update (CUDA's lazy set-up) and what runs
// between updates (log lines, reports, validation, checkpoints) are not checked.
TEST(GpuTrainingTest, AnUpdateNeverWaitsForTheGpu) {
  SKIP_WITHOUT_CUDA();
#if !TRAINYARD_WITH_CUDA_FEED
  GTEST_SKIP() << "built without the feed's copy stream (no LibTorch with CUDA at build time)";
#else
  using c10::cuda::SyncDebugMode;
  auto sync_mode = [](SyncDebugMode mode) { c10::cuda::warning_state().set_sync_debug_mode(mode); };
  // The detector works: a loss read is a synchronising call.
  sync_mode(SyncDebugMode::L_ERROR);
  EXPECT_ANY_THROW(torch::ones({1}, torch::kCUDA).sum().item<float>());
  sync_mode(SyncDebugMode::L_DISABLED);

  trainyard::v1::Task task = GpuTask(MakeTempDir(), 30);
  TrainerOptions options = QuietOptions();
  options.report_interval = absl::Hours(1);
  int checked = 0;
  options.before_step = [&](int64_t step, int64_t attempt_start_step) {
    if (step == attempt_start_step) return;
    sync_mode(SyncDebugMode::L_ERROR);
    ++checked;
  };
  options.after_step = [&](int64_t) { sync_mode(SyncDebugMode::L_DISABLED); };
  absl::StatusOr<TrainResult> result = RunTrainer(task, options);
  sync_mode(SyncDebugMode::L_DISABLED);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(checked, 29);
  EXPECT_EQ(result->step, 30);
  EXPECT_LT(result->loss, result->first_loss);
#endif
}

// The feed's copies land on the GPU intact and in order, with or without Prefetch between them.
TEST(GpuTrainingTest, TheFeedBringsEachBatchToTheGpuIntact) {
  SKIP_WITHOUT_CUDA();
  const auto [data, plan] = test_util::MakeSyntheticSteps(4096, 64, 512, 24);
  BatchPrefetcher expected(data, plan, 9, true, 0, 1, 0, 24, 2);
  BatchPrefetcher source(data, plan, 9, true, 0, 1, 0, 24, 2);
  const std::unique_ptr<DeviceFeed> feed = MakeDeviceFeed(source, torch::Device(torch::kCUDA, 0));
  for (int64_t step = 0; step < 24; ++step) {
    std::optional<Batch> batch = feed->Next();
    std::optional<Batch> want = expected.Next();
    ASSERT_TRUE(batch.has_value() && want.has_value());
    ASSERT_TRUE(batch->features.is_cuda());
    // Work on the current stream, as a step's would be, before the check reads it back.
    torch::Tensor doubled = batch->features * 2;
    if (step % 3 != 0) feed->Prefetch();
    EXPECT_TRUE(torch::equal(doubled.cpu(), want->features * 2)) << step;
    EXPECT_TRUE(torch::equal(batch->labels.cpu(), want->labels)) << step;
  }
  EXPECT_FALSE(feed->Next().has_value());
}

// A transformer job whose 2 stages (and 2 x 2: replicas too) run on the GPU, their activations
// and gradients going through host memory over Gloo: it ends where the same job on one rank of
// the GPU ends, loss and exported parameters.
trainyard::v1::Task GpuLanguageTask(const std::string& tokens, const std::string& checkpoint_dir,
                                    int stages, int replicas) {
  trainyard::v1::Task task = test_tasks::SingleRankTask("gpupipe", checkpoint_dir);
  auto& spec = *task.mutable_spec();
  spec.mutable_resources()->set_gpus_per_worker(1);
  if (stages > 0) {
    spec.set_strategy(trainyard::v1::PIPELINE);
    spec.mutable_pipeline()->set_stages(stages);
    spec.mutable_pipeline()->set_microbatches(2);
    spec.mutable_pipeline()->set_schedule("1f1b");
    spec.mutable_pipeline()->set_partition("balanced");
    spec.mutable_workers()->set_min(stages * replicas);
    spec.mutable_workers()->set_max(stages * replicas);
  }
  spec.mutable_model()->set_builtin("transformer");
  auto& args = *spec.mutable_model()->mutable_args();
  args.add_vocab(32);
  args.set_context(8);
  args.set_layers(2);
  args.set_dim(16);
  args.set_heads(2);
  args.set_tie_embeddings(true);
  spec.mutable_data()->set_tokens(tokens);
  spec.mutable_data()->set_validation_split(0.1f);
  spec.set_batch_size(8);
  spec.set_max_steps(20);
  spec.set_seed(7);
  spec.set_log_every_steps(10);
  spec.mutable_optimizer()->set_name("sgd");
  spec.mutable_optimizer()->set_lr(0.1);
  spec.mutable_optimizer()->set_momentum(0.9);
  spec.mutable_checkpoint()->set_every_steps(10);
  return task;
}

TEST(GpuPipelineTest, StagesOnTheGpuTrainAsOneRankOfItDoes) {
  SKIP_WITHOUT_CUDA();
  const std::string data = MakeTempDir();
  {
    torch::manual_seed(3);
    const torch::Tensor ids =
        (torch::arange(1200) % 28 + torch::randint(0, 4, {1200})).to(torch::kUInt8);
    const std::string bytes = *EncodeTensors({{"tokens", ids}}, {});
    std::FILE* f = std::fopen((data + "/text-0.safetensors").c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::fwrite(bytes.data(), 1, bytes.size(), f);
    std::fclose(f);
  }
  const std::string tokens = data + "/text-*.safetensors";
  const std::string single_dir = MakeTempDir();
  trainyard::v1::Task single_task = GpuLanguageTask(tokens, single_dir, 0, 1);
  ASSERT_TRUE(TrainingDevice(single_task).is_cuda());
  absl::StatusOr<TrainResult> single = RunTrainer(single_task, QuietOptions());
  ASSERT_TRUE(single.ok()) << single.status();
  EXPECT_LT(single->loss, single->first_loss);
  const auto reference = ReadTensors(single_dir + "/final/model.safetensors");
  ASSERT_FALSE(reference.empty());
  for (const auto& [stages, replicas] : {std::pair<int, int>{2, 1}, std::pair<int, int>{2, 2}}) {
    SCOPED_TRACE(absl::StrCat(stages, " stages x ", replicas));
    const std::string dir = MakeTempDir();
    std::vector<absl::StatusOr<TrainResult>> ranks =
        test_util::RunRanks(GpuLanguageTask(tokens, dir, stages, replicas), stages * replicas, {});
    for (const absl::StatusOr<TrainResult>& r : ranks) ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(ranks[0]->step, 20);
    EXPECT_NEAR(ranks[0]->loss, single->loss, 1e-4);
    const auto exported = ReadTensors(dir + "/final/model.safetensors");
    ASSERT_EQ(exported.size(), reference.size());
    for (const auto& [name, t] : reference) {
      EXPECT_LE((exported.at(name) - t).abs().max().item<double>(), 1e-4) << name;
    }
  }
}

#if TRAINYARD_WITH_NCCL
TEST(NcclGpuTest, AGroupOfOneRunsEveryCollectiveTheTrainerUses) {
  SKIP_WITHOUT_CUDA();
  FakeRendezvous rendezvous;
  absl::StatusOr<std::unique_ptr<Communicator>> comm =
      NewNcclCommunicator(0, 1, rendezvous, absl::Seconds(30), absl::Seconds(30));
  ASSERT_TRUE(comm.ok()) << comm.status();
  EXPECT_EQ((*comm)->backend(), "nccl");
  const torch::Device cuda(torch::kCUDA, 0);

  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMax}) {
    for (torch::Dtype dtype : {torch::kFloat32, torch::kFloat64}) {
      torch::Tensor a = torch::arange(1000, torch::TensorOptions(dtype).device(cuda));
      torch::Tensor b = torch::full({7, 3}, 2.5, torch::TensorOptions(dtype).device(cuda));
      torch::Tensor a0 = a.clone(), b0 = b.clone();
      std::unique_ptr<Work> work = (*comm)->AllReduceAsync({a, b}, op);
      ASSERT_TRUE(work->Wait().ok());
      EXPECT_TRUE(a.equal(a0)) << "a group of one reduces to itself";
      EXPECT_TRUE(b.equal(b0));
    }
  }
  torch::Tensor ids = torch::arange(5, torch::TensorOptions(torch::kInt64).device(cuda));
  ASSERT_TRUE((*comm)->Broadcast({ids}, 0).ok());
  EXPECT_EQ(ids.sum().item<int64_t>(), 10);
  ASSERT_TRUE((*comm)->Barrier().ok());

  // A CPU tensor is not NCCL's: refused, not silently copied.
  absl::Status cpu = (*comm)->AllReduceAsync({torch::ones({3})}, ReduceOp::kSum)->Wait();
  EXPECT_EQ(cpu.code(), absl::StatusCode::kInvalidArgument) << cpu;
}

TEST(NcclGpuTest, APeerThatNeverComesAbortsAtTheTimeout) {
  SKIP_WITHOUT_CUDA();
  FakeRendezvous rendezvous;
  const absl::Time start = absl::Now();
  // Rank 0 of two: rank 1 never joins, so the non-blocking init stays in progress.
  absl::StatusOr<std::unique_ptr<Communicator>> comm =
      NewNcclCommunicator(0, 2, rendezvous, absl::Seconds(3),
                          /*connect_timeout=*/absl::Seconds(3));
  const absl::Duration took = absl::Now() - start;
  ASSERT_FALSE(comm.ok());
  EXPECT_THAT(comm.status().code(),
              AnyOf(absl::StatusCode::kDeadlineExceeded, absl::StatusCode::kUnavailable))
      << comm.status();
  EXPECT_LT(took, absl::Seconds(30)) << "the abort took " << took;
}
#else
TEST(NcclGpuTest, BuiltWithoutNccl) {
  GTEST_SKIP() << "built without NCCL (nccl.h or the CUDA runtime not found at configure time)";
}
#endif  // TRAINYARD_WITH_NCCL

}  // namespace
}  // namespace trainyard::trainer
