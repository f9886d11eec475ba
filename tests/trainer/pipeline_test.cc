// Pipeline parallelism, with every rank a thread of this test: stages of the built-in transformer
// connected by Gloo through an in-memory rendezvous, against the whole model trained on the same
// global batches in one process (the method of PyTorch's own pipelining tests); and the Gloo
// communicator's point-to-point messages.

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "common/storage/checkpoint_layout.h"
#include "common/storage/object_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/trainer/fake_rendezvous.h"
#include "tests/trainer/test_files.h"
#include "tests/trainer/test_tasks.h"
#include "tests/trainer/trainer_test_util.h"
#include "worker/trainer/checkpoint/checkpoint.h"
#include "worker/trainer/collective/gloo_communicator.h"
#include "worker/trainer/model/model.h"
#include "worker/trainer/model/optimizer.h"
#include "worker/trainer/model/transformer.h"
#include "worker/trainer/pipeline/plan.h"
#include "worker/trainer/pipeline/strategy.h"

namespace trainyard::trainer::pipeline {
namespace {

using ::testing::HasSubstr;

// Runs fn(rank) on one thread per rank.
void OnEveryRank(int world, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) threads.emplace_back(fn, r);
  for (std::thread& t : threads) t.join();
}

// Messages between two ranks arrive whole and in order, both ways at once, while a third rank
// sends to one of them: sends never wait for the receiver's own receives.
TEST(PointToPointTest, MessagesArriveInOrderBothWaysAtOnce) {
  FakeRendezvous rendezvous;
  constexpr int kWorld = 3;
  std::vector<std::vector<double>> got(kWorld);
  OnEveryRank(kWorld, [&](int rank) {
    GlooOptions options;
    options.timeout = absl::Seconds(20);
    options.point_to_point = true;
    absl::StatusOr<std::unique_ptr<Communicator>> c =
        NewGlooCommunicator(rank, kWorld, rendezvous, options);
    ASSERT_TRUE(c.ok()) << c.status();
    Communicator& comm = **c;
    // Large enough that a send cannot complete before the peer reads: 4 MiB each.
    constexpr int64_t kNumel = 1 << 20;
    std::vector<std::unique_ptr<Work>> sends;
    auto message = [&](int from, int to, int i) {
      return torch::full({kNumel}, static_cast<float>(100 * from + 10 * to + i));
    };
    if (rank < 2) {
      const int peer = 1 - rank;
      for (int i = 0; i < 3; ++i) sends.push_back(comm.SendAsync(message(rank, peer, i), peer));
      for (int i = 0; i < 3; ++i) {
        torch::Tensor in = torch::empty({kNumel});
        ASSERT_TRUE(comm.Recv(in, peer).ok());
        EXPECT_TRUE(torch::equal(in, message(peer, rank, i))) << rank << " message " << i;
        got[rank].push_back(in[kNumel - 1].item<double>());
      }
      if (rank == 1) {
        torch::Tensor in = torch::empty({kNumel});
        ASSERT_TRUE(comm.Recv(in, 2).ok());
        EXPECT_TRUE(torch::equal(in, message(2, 1, 0)));
      }
    } else {
      sends.push_back(comm.SendAsync(message(2, 1, 0), 1));
    }
    for (const auto& send : sends) EXPECT_TRUE(send->Wait().ok());
    // A tensor of the wrong kind is refused, and a communicator without point-to-point says so.
    EXPECT_EQ(comm.Recv(torch::empty({2, 2}).t(), (rank + 1) % kWorld).code(),
              absl::StatusCode::kInvalidArgument);
  });
  EXPECT_THAT(got[0], ::testing::ElementsAre(100 + 0, 100 + 1, 100 + 2));
  EXPECT_THAT(got[1], ::testing::ElementsAre(10, 11, 12));

  FakeRendezvous plain_rendezvous;
  OnEveryRank(2, [&](int rank) {
    absl::StatusOr<std::unique_ptr<Communicator>> c =
        NewGlooCommunicator(rank, 2, plain_rendezvous, GlooOptions());
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ((*c)->Recv(torch::empty({1}), 1 - rank).code(), absl::StatusCode::kUnimplemented);
  });
}

// A receive that nothing answers ends with DEADLINE_EXCEEDED within the timeout, never a hang.
TEST(PointToPointTest, AReceiveNobodyAnswersTimesOut) {
  FakeRendezvous rendezvous;
  absl::Notification given_up;
  OnEveryRank(2, [&](int rank) {
    GlooOptions options;
    options.timeout = absl::Seconds(1);
    options.point_to_point = true;
    absl::StatusOr<std::unique_ptr<Communicator>> c =
        NewGlooCommunicator(rank, 2, rendezvous, options);
    ASSERT_TRUE(c.ok()) << c.status();
    if (rank == 0) {
      absl::Status status = (*c)->Recv(torch::empty({4}), 1);
      EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
      EXPECT_THAT(status.message(), HasSubstr("receive"));
      given_up.Notify();
    } else {
      // Rank 1 keeps its connections open until rank 0 has given up.
      given_up.WaitForNotification();
    }
  });
}

struct Case {
  int stages = 2;
  int replicas = 1;
  const char* schedule = "1f1b";
  const char* optimizer = "sgd";
  bool tied = true;
};

std::string Name(const Case& c) {
  return absl::StrCat(c.stages, " stages x ", c.replicas, " replicas, ", c.schedule, ", ",
                      c.optimizer, c.tied ? ", tied" : ", untied");
}

trainyard::v1::ModelArgs Args(bool tied) {
  trainyard::v1::ModelArgs args;
  args.add_vocab(32);
  args.set_context(8);
  args.set_layers(2);  // 4 layers: embeddings, 2 blocks, head
  args.set_dim(16);
  args.set_heads(2);
  args.set_tie_embeddings(tied);
  return args;
}

trainyard::v1::OptimizerSpec Optimizer(const std::string& name) {
  trainyard::v1::OptimizerSpec spec;
  spec.set_name(name);
  if (name == "sgd") {
    spec.set_lr(0.1);
    spec.set_momentum(0.9);
  } else {
    spec.set_lr(0.001);
    spec.set_weight_decay(0.01);
    spec.set_beta1(0.9);
    spec.set_beta2(0.999);
    spec.set_eps(1e-8);
  }
  return spec;
}

constexpr int kSteps = 20;
constexpr int64_t kBatch = 8;
constexpr int kMicrobatches = 2;
constexpr int64_t kSeed = 7;

// The batches of every update: token windows of context + 1, the same for every run.
std::vector<torch::Tensor> Batches() {
  torch::manual_seed(11);
  std::vector<torch::Tensor> batches;
  for (int s = 0; s < kSteps; ++s) batches.push_back(torch::randint(0, 32, {kBatch, 9}));
  return batches;
}

torch::Tensor Loss(const torch::Tensor& out, const torch::Tensor& labels) {
  return torch::nn::functional::cross_entropy(out.reshape({-1, out.size(2)}), labels.reshape({-1}));
}

// The whole model trained on each global batch at once: the reference.
std::map<std::string, torch::Tensor> TrainWhole(const Case& c) {
  std::unique_ptr<Model> model;
  {
    absl::MutexLock lock(&ModelBuildMutex());
    model = *BuildTransformer(Args(c.tied), kSeed, 31);
  }
  NamedTensors params = model->NamedParameters();
  std::vector<torch::Tensor> tensors;
  for (auto& [name, p] : params) tensors.push_back(p);
  std::unique_ptr<torch::optim::Optimizer> optimizer =
      *BuildOptimizer(Optimizer(c.optimizer), tensors);
  for (const torch::Tensor& batch : Batches()) {
    optimizer->zero_grad();
    Loss(model->Forward(batch.narrow(1, 0, 8)), batch.narrow(1, 1, 8)).backward();
    optimizer->step();
  }
  std::map<std::string, torch::Tensor> out;
  for (auto& [name, p] : params) out[name] = p.detach().clone();
  return out;
}

// The same updates through a pipeline of c.stages stages and c.replicas replicas: each rank's
// parameters after the last update, by rank.
std::vector<std::map<std::string, torch::Tensor>> TrainPipeline(const Case& c,
                                                                std::vector<double>* losses) {
  const int world = c.stages * c.replicas;
  FakeRendezvous rendezvous;
  std::vector<std::map<std::string, torch::Tensor>> out(static_cast<size_t>(world));
  const std::vector<torch::Tensor> batches = Batches();
  std::vector<int> counts = *PartitionLayers(TransformerLayerBytes(Args(c.tied)), c.stages,
                                             c.stages == 2 ? "balanced" : "uniform");
  const std::vector<LayerRange> ranges = StageRanges(counts);
  OnEveryRank(world, [&](int rank) {
    const Topology t = *TopologyOf(rank, world, c.stages);
    GlooOptions options;
    options.timeout = absl::Seconds(60);
    options.point_to_point = true;
    std::unique_ptr<Communicator> all = *NewGlooCommunicator(rank, world, rendezvous, options);
    std::unique_ptr<Communicator> copies;
    if (c.replicas > 1) {
      options.point_to_point = false;
      options.key_prefix = absl::StrCat("stage", t.stage, "/");
      copies = *NewGlooCommunicator(t.replica, c.replicas, rendezvous, options);
    }
    PipelineStrategy strategy(
        t, *ParseSchedule(c.schedule), kMicrobatches,
        c.tied ? std::vector<std::string>{"wte.weight"} : std::vector<std::string>(), ranges,
        std::move(all), std::move(copies));
    std::unique_ptr<Model> model;
    {
      absl::MutexLock lock(&ModelBuildMutex());
      const LayerRange& mine = ranges[static_cast<size_t>(t.stage)];
      model = *BuildTransformerLayers(Args(c.tied), kSeed, 31, mine.first, mine.end);
    }
    ASSERT_TRUE(strategy.Setup(*model).ok());
    ASSERT_TRUE(strategy.SyncState(*model, 0).ok());
    NamedTensors params = model->NamedParameters();
    std::vector<torch::Tensor> tensors;
    for (auto& [name, p] : params) tensors.push_back(p);
    std::unique_ptr<torch::optim::Optimizer> optimizer =
        *BuildOptimizer(Optimizer(c.optimizer), tensors);
    const int64_t share = kBatch / c.replicas;
    for (const torch::Tensor& batch : batches) {
      optimizer->zero_grad();
      const torch::Tensor mine = batch.narrow(0, t.replica * share, share);
      absl::Status status = strategy.RunPasses(*model, mine.narrow(1, 0, 8), mine.narrow(1, 1, 8),
                                               Loss, /*stop_requested=*/false);
      if (status.ok()) status = strategy.AfterBackward(*model);
      ASSERT_TRUE(status.ok()) << Name(c) << " rank " << rank << ": " << status;
      optimizer->step();
      absl::StatusOr<StepAgreement> agreed = strategy.EndStep();
      ASSERT_TRUE(agreed.ok()) << agreed.status();
      if (rank == 0 && losses != nullptr) losses->push_back(agreed->loss.item<double>());
    }
    for (auto& [name, p] : params) out[static_cast<size_t>(rank)][name] = p.detach().clone();
  });
  return out;
}

// For 2 and 4 stages, GPipe and 1F1B, with and without replicas, SGD with momentum and AdamW:
// every parameter after 20 updates within 1e-5 of the whole model's, every parameter held by
// exactly one stage (the tied embedding by the first and the last, identical to the bit), and
// the copies of a stage identical to the bit.
TEST(PipelineTest, TwentyUpdatesMatchTheWholeModel) {
  std::vector<Case> cases;
  for (int stages : {2, 4}) {
    for (int replicas : {1, 2}) {
      for (const char* schedule : {"gpipe", "1f1b"}) {
        for (const char* optimizer : {"sgd", "adamw"}) {
          cases.push_back({stages, replicas, schedule, optimizer, true});
        }
      }
    }
  }
  cases.push_back({2, 1, "1f1b", "adamw", false});
  std::map<std::string, std::map<std::string, torch::Tensor>> whole;
  for (const Case& c : cases) {
    SCOPED_TRACE(Name(c));
    const std::string key = absl::StrCat(c.optimizer, c.tied);
    if (whole.count(key) == 0) whole[key] = TrainWhole(c);
    const std::map<std::string, torch::Tensor>& expected = whole[key];
    const std::vector<std::map<std::string, torch::Tensor>> ranks = TrainPipeline(c, nullptr);
    std::map<std::string, int> holders;
    double worst = 0;
    for (int rank = 0; rank < c.stages * c.replicas; ++rank) {
      const std::map<std::string, torch::Tensor>& mine = ranks[static_cast<size_t>(rank)];
      const std::map<std::string, torch::Tensor>& first_copy =
          ranks[static_cast<size_t>(rank % c.stages)];
      for (const auto& [name, p] : mine) {
        ASSERT_EQ(expected.count(name), 1u) << name;
        worst = std::max(worst, (p - expected.at(name)).abs().max().item<double>());
        EXPECT_TRUE(torch::equal(p, first_copy.at(name))) << name << " differs between copies";
        if (rank < c.stages) ++holders[name];
      }
    }
    std::printf("%s: largest difference from the whole model %.3g\n", Name(c).c_str(), worst);
    EXPECT_LE(worst, 1e-5);
    EXPECT_GT(worst, 0.0) << "bit-identical results would suggest no pipeline ran";
    for (const auto& [name, p] : expected) {
      EXPECT_EQ(holders[name], c.tied && name == "wte.weight" ? 2 : 1) << name;
    }
    if (c.tied) {
      EXPECT_TRUE(torch::equal(ranks[0].at("wte.weight"),
                               ranks[static_cast<size_t>(c.stages - 1)].at("wte.weight")));
    }
    // Training moved the parameters: the comparison is not between initial values.
    std::unique_ptr<Model> initial;
    {
      absl::MutexLock lock(&ModelBuildMutex());
      initial = *BuildTransformer(Args(c.tied), kSeed, 31);
    }
    for (const auto& [name, p] : initial->NamedParameters()) {
      EXPECT_GT((p - expected.at(name)).abs().max().item<double>(), 1e-4) << name;
    }
  }
}

// The loss every rank agrees on is the mean over the replicas' last stages, and it falls.
TEST(PipelineTest, EveryRankAgreesOnTheFallingLoss) {
  std::vector<double> losses;
  TrainPipeline({4, 2, "1f1b", "adamw", true}, &losses);
  ASSERT_EQ(losses.size(), static_cast<size_t>(kSteps));
  EXPECT_NEAR(losses.front(), std::log(32.0), 0.3);  // an untrained model guesses uniformly
  EXPECT_LT(losses.back(), losses.front());
}

// What the stages hold: layers named as in the whole model and initialised alike, the tied
// embedding's copy on the last stage equal to the first stage's, hidden states between them.
TEST(PipelineTest, StagesHoldTheWholeModelsLayersByName) {
  const trainyard::v1::ModelArgs args = Args(true);
  absl::MutexLock lock(&ModelBuildMutex());
  std::unique_ptr<Model> whole = *BuildTransformer(args, kSeed, 31);
  std::map<std::string, torch::Tensor> by_name;
  for (auto& [name, p] : whole->NamedParameters()) by_name[name] = p;
  std::unique_ptr<Model> head = *BuildTransformerLayers(args, kSeed, 31, 2, 4);
  std::vector<std::string> names;
  for (auto& [name, p] : head->NamedParameters()) {
    names.push_back(name);
    EXPECT_TRUE(torch::equal(p, by_name.at(name))) << name;
  }
  EXPECT_THAT(names, ::testing::Contains("wte.weight"));
  EXPECT_THAT(names, ::testing::Contains("h.1.attn.weight"));
  EXPECT_THAT(names, ::testing::Not(::testing::Contains("h.0.attn.weight")));
  EXPECT_EQ(head->Forward(torch::zeros({3, 5, 16})).sizes(), (std::vector<int64_t>{3, 5, 32}));
  std::unique_ptr<Model> front = *BuildTransformerLayers(args, kSeed, 31, 0, 2);
  EXPECT_EQ(front->Forward(torch::zeros({3, 5}, torch::kLong)).sizes(),
            (std::vector<int64_t>{3, 5, 16}));
  EXPECT_EQ(front->ExportToFile(test_files::MakeTempDir() + "/model.safetensors").code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(BuildTransformerLayers(args, kSeed, 31, 3, 5).status().message(),
              HasSubstr("pipeline.partition: layers [3, 5) are not a range of the model's 4"));
  EXPECT_EQ(TransformerLayerBytes(args).size(), 4u);
}

// ---- whole runs: RunTrainer on every rank ----

// Makes `spec` a pipeline of `stages` x `replicas` in kMicrobatches micro-batches.
void SetPipeline(trainyard::v1::JobSpec& spec, int stages, int replicas, const char* schedule) {
  spec.set_strategy(trainyard::v1::PIPELINE);
  spec.mutable_pipeline()->set_stages(stages);
  spec.mutable_pipeline()->set_microbatches(kMicrobatches);
  spec.mutable_pipeline()->set_schedule(schedule);
  spec.mutable_pipeline()->set_partition("balanced");
  spec.mutable_workers()->set_min(stages * replicas);
  spec.mutable_workers()->set_max(stages * replicas);
}

// The task of a transformer job on the token shards in `data_dir`, checkpointing every 10 of its
// 20 steps under `checkpoint_dir`: single, or a pipeline of `stages` stages and `replicas`.
trainyard::v1::Task RunTask(const std::string& data_dir, const std::string& checkpoint_dir,
                            int stages, int replicas, const char* schedule = "1f1b") {
  trainyard::v1::Task task = test_tasks::SingleRankTask("lm", checkpoint_dir);
  trainyard::v1::JobSpec& spec = *task.mutable_spec();
  if (stages > 0) SetPipeline(spec, stages, replicas, schedule);
  spec.mutable_model()->set_builtin("transformer");
  *spec.mutable_model()->mutable_args() = Args(true);
  spec.mutable_data()->set_tokens(data_dir + "/text-*.safetensors");
  spec.mutable_data()->set_validation_split(0.1f);
  spec.set_batch_size(static_cast<int32_t>(kBatch));
  spec.set_max_steps(kSteps);
  spec.set_seed(kSeed);
  spec.set_log_every_steps(10);
  *spec.mutable_optimizer() = Optimizer("sgd");
  spec.mutable_checkpoint()->set_every_steps(10);
  return task;
}

// Token shards of a text with some structure to learn: 1,200 ids below 32.
std::string WriteTokens() {
  const std::string dir = test_files::MakeTempDir();
  torch::manual_seed(3);
  const torch::Tensor noise = torch::randint(0, 4, {1200});
  const torch::Tensor ids = (torch::arange(1200) % 28 + noise).to(torch::kUInt8);
  const std::string bytes = *EncodeTensors({{"tokens", ids}}, {});
  std::FILE* f = std::fopen((dir + "/text-0.safetensors").c_str(), "wb");
  std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
  return dir;
}

// Runs `task` on its ranks; rank 0's result (a test failure if any rank fails).
TrainResult RunAll(const trainyard::v1::Task& task) {
  const int world = std::max(1, task.spec().workers().max());
  std::vector<absl::StatusOr<TrainResult>> results = test_util::RunRanks(task, world, {});
  for (int r = 0; r < world; ++r) {
    EXPECT_TRUE(results[static_cast<size_t>(r)].ok())
        << "rank " << r << ": " << results[static_cast<size_t>(r)].status();
  }
  return results[0].ok() ? *results[0] : TrainResult();
}

std::map<std::string, torch::Tensor> Exported(const std::string& checkpoint_dir) {
  return test_util::ReadTensors(
      absl::StrCat(checkpoint_dir, "/", kFinalModelFolder, "/model.safetensors"));
}

void ExpectNear(const std::map<std::string, torch::Tensor>& a,
                const std::map<std::string, torch::Tensor>& b, double tolerance) {
  ASSERT_FALSE(a.empty());
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) {
    ASSERT_EQ(b.count(name), 1u) << name;
    EXPECT_LE((t - b.at(name)).abs().max().item<double>(), tolerance) << name;
  }
}

// A 2 x 2 pipeline job ends where the single job ends (loss, validation, exported model); each
// stage wrote its own layers into the one checkpoint of a step, which a single job and a pipeline
// of 4 stages resume from and end where the uninterrupted job ends.
TEST(PipelineRunTest, StagesCheckpointTogetherAndResumeOnOtherStageCounts) {
  const std::string data = WriteTokens();
  const std::string single_dir = test_files::MakeTempDir();
  const TrainResult single = RunAll(RunTask(data, single_dir, 0, 1));
  ASSERT_TRUE(single.val_loss.has_value());

  const std::string pipe_dir = test_files::MakeTempDir();
  const TrainResult piped = RunAll(RunTask(data, pipe_dir, 2, 2));
  EXPECT_EQ(piped.step, kSteps);
  EXPECT_NEAR(piped.loss, single.loss, 1e-5);
  EXPECT_LT(piped.loss, piped.first_loss);
  ASSERT_TRUE(piped.val_loss.has_value());
  EXPECT_NEAR(*piped.val_loss, *single.val_loss, 1e-5);
  EXPECT_NEAR(*piped.val_accuracy, *single.val_accuracy, 1e-9);
  ExpectNear(Exported(pipe_dir), Exported(single_dir), 1e-5);

  // Step 10's folder: each stage's objects, one manifest over them, the layout recorded.
  const std::string step10 = CheckpointStepUri("file://" + pipe_dir, 10);
  for (const char* name :
       {"model.stage-0-g1.safetensors", "model.stage-1-g1.safetensors",
        "optimizer.stage-1-g1.safetensors", "PART-1-g1.json", "MANIFEST.g1.json"}) {
    EXPECT_TRUE(test_files::FileExists(absl::StrCat(pipe_dir, "/step-000000000010/", name)))
        << name;
  }
  std::shared_ptr<ObjectStore> store = *EnvironmentStores().Open("file://" + pipe_dir);
  absl::StatusOr<LoadedCheckpoint> ckpt = ReadCheckpoint(*store, step10);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ(ckpt->model.size(), Exported(single_dir).size());
  EXPECT_EQ(ckpt->state.step, 10);
  EXPECT_THAT(ckpt->state.pipeline, HasSubstr("\"stages\":2"));

  // Resumed at step 10 by a single job and by 4 stages, 1 replica.
  for (int stages : {0, 4}) {
    SCOPED_TRACE(absl::StrCat("resumed on ", stages, " stages"));
    const std::string dir = test_files::MakeTempDir();
    trainyard::v1::Task task = RunTask(data, dir, stages, 1, "gpipe");
    task.set_generation(2);
    task.add_resume_checkpoints(step10);
    const TrainResult resumed = RunAll(task);
    EXPECT_EQ(resumed.start_step, 10);
    EXPECT_NEAR(resumed.loss, single.loss, 1e-5);
    ExpectNear(Exported(dir), Exported(single_dir), 1e-5);
  }
}

// A job on a TorchScript classifier written by examples/write_torchscript_model.py (`module`),
// on synthetic data: single, or a pipeline of `stages` x `replicas` with `counts` layers each
// (empty: balanced).
trainyard::v1::Task ScriptTask(const std::string& module, const std::string& checkpoint_dir,
                               int stages, int replicas, const char* schedule,
                               const std::vector<int>& counts = {}) {
  trainyard::v1::Task task = test_tasks::SingleRankTask("script", checkpoint_dir);
  trainyard::v1::JobSpec& spec = *task.mutable_spec();
  if (stages > 0) {
    SetPipeline(spec, stages, replicas, schedule);
    for (int c : counts) spec.mutable_pipeline()->add_partition_counts(c);
  }
  spec.mutable_model()->set_torchscript("file://" + module);
  trainyard::v1::SyntheticData& data = *spec.mutable_data()->mutable_synthetic();
  data.set_samples(400);
  data.set_features(8);
  data.set_classes(3);
  data.set_noise(1.0f);
  spec.mutable_data()->set_validation_split(0.1f);
  spec.set_batch_size(16);
  spec.set_max_steps(kSteps);
  spec.set_seed(kSeed);
  spec.set_log_every_steps(10);
  *spec.mutable_optimizer() = Optimizer("sgd");
  spec.mutable_checkpoint()->set_every_steps(10);
  return task;
}

std::map<std::string, torch::Tensor> ExportedScript(const std::string& checkpoint_dir) {
  std::map<std::string, torch::Tensor> out;
  torch::jit::Module module =
      torch::jit::load(absl::StrCat(checkpoint_dir, "/", kFinalModelFolder, "/model.pt"));
  for (const auto& p : module.named_parameters(true)) out[p.name] = p.value;
  return out;
}

// A single job on the TorchScript `module` resumed from step 10 of the pipeline job that
// checkpointed under `pipe_dir`; its checkpoint folder is `*dir`.
TrainResult ResumeSingleFrom(const std::string& module, const std::string& pipe_dir,
                             std::string* dir) {
  *dir = test_files::MakeTempDir();
  trainyard::v1::Task resume = ScriptTask(module, *dir, 0, 1, "1f1b");
  resume.set_generation(2);
  resume.add_resume_checkpoints(CheckpointStepUri("file://" + pipe_dir, 10));
  return RunAll(resume);
}

// Writes `script` into `dir` and runs it with /usr/bin/python3 and `argument`; false when it
// fails.
bool RunPython(const std::string& dir, const std::string& script, const std::string& argument) {
  {
    std::ofstream out(dir + "/write.py");
    out << script;
  }
  return std::system(("/usr/bin/python3 " + dir + "/write.py " + argument).c_str()) == 0;
}

// A TorchScript torch.nn.Sequential splits into stages by its children (Linear, ReLU, Linear,
// ReLU, Linear): 2 stages x 2 replicas with 1F1B and 3 stages with GPipe and counts given end
// where the single job on the same module ends, with the same exported model.pt; a single job
// resumes from the pipeline's checkpoint (the same tensor names). A module that is not a
// Sequential is refused naming the field.
TEST(PipelineRunTest, ATorchScriptSequentialTrainsInStagesAsTheWholeModuleDoes) {
  const std::string python = "/usr/bin/python3";
  if (std::system((python + " -c 'import torch' 2>/dev/null").c_str()) != 0) {
    GTEST_SKIP() << "needs /usr/bin/python3 with torch to write the module";
  }
  const char* source = std::getenv("TRAINYARD_SOURCE_DIR");
  const std::string writer =
      absl::StrCat(source != nullptr ? source : ".", "/examples/write_torchscript_model.py");
  const std::string dir = test_files::MakeTempDir();
  const std::string common = " --inputs 8 --hidden 16 16 --classes 3 --seed 4 >/dev/null";
  ASSERT_EQ(
      std::system(
          (python + " " + writer + " --out " + dir + "/seq.pt --sequential" + common).c_str()),
      0);
  ASSERT_EQ(std::system((python + " " + writer + " --out " + dir + "/cls.pt" + common).c_str()), 0);

  const std::string single_dir = test_files::MakeTempDir();
  const TrainResult single = RunAll(ScriptTask(dir + "/seq.pt", single_dir, 0, 1, "1f1b"));
  ASSERT_TRUE(single.val_loss.has_value());
  EXPECT_LT(single.loss, single.first_loss);

  struct Case {
    int stages, replicas;
    const char* schedule;
    std::vector<int> counts;
  };
  std::string pipe_dir;
  for (const Case& c : {Case{2, 2, "1f1b", {}}, Case{3, 1, "gpipe", {2, 1, 2}}}) {
    SCOPED_TRACE(absl::StrCat(c.stages, " stages x ", c.replicas, " ", c.schedule));
    const std::string ckpt = test_files::MakeTempDir();
    const TrainResult piped =
        RunAll(ScriptTask(dir + "/seq.pt", ckpt, c.stages, c.replicas, c.schedule, c.counts));
    EXPECT_EQ(piped.step, kSteps);
    EXPECT_NEAR(piped.loss, single.loss, 1e-5);
    ASSERT_TRUE(piped.val_loss.has_value());
    EXPECT_NEAR(*piped.val_loss, *single.val_loss, 1e-5);
    std::map<std::string, torch::Tensor> exported = ExportedScript(ckpt);
    EXPECT_EQ(exported.size(), 6u);
    ExpectNear(exported, ExportedScript(single_dir), 1e-5);
    if (pipe_dir.empty()) pipe_dir = ckpt;
  }

  std::string resumed_dir;
  const TrainResult resumed = ResumeSingleFrom(dir + "/seq.pt", pipe_dir, &resumed_dir);
  EXPECT_EQ(resumed.start_step, 10);
  EXPECT_NEAR(resumed.loss, single.loss, 1e-5);

  trainyard::v1::Task not_sequential = ScriptTask(dir + "/cls.pt", "", 2, 1, "1f1b");
  std::vector<absl::StatusOr<TrainResult>> refused = test_util::RunRanks(not_sequential, 2, {});
  EXPECT_EQ(refused[0].status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused[0].status().message(), HasSubstr("model.torchscript: a pipeline splits"));
}

// A Sequential whose fifth layer shares the first one's weight (Linear 8->16, Tanh, Linear
// 16->8, Tanh, Linear 8->16 with layer 0's weight, Tanh, Linear 16->3): split so that the two
// layers fall in the first and last stages (2 x 2 with 1F1B, 3 stages with GPipe) or in one
// stage, it trains as the whole module does (the gradients of the copies summed between the
// stages), exports the same model, and a single job resumes from its checkpoint, the weight
// under its one name (0.weight). A split that would tie a middle stage is refused naming
// model.torchscript.
TEST(PipelineRunTest, ATorchScriptSequentialsTiedWeightTrainsAsInTheWholeModule) {
  const std::string python = "/usr/bin/python3";
  if (std::system((python + " -c 'import torch' 2>/dev/null").c_str()) != 0) {
    GTEST_SKIP() << "needs /usr/bin/python3 with torch to write the module";
  }
  const std::string dir = test_files::MakeTempDir();
  const std::string module = dir + "/tied.pt";
  const std::string write =
      "import sys, torch\n"
      "from torch import nn\n"
      "torch.manual_seed(4)\n"
      "a, b, c, d = nn.Linear(8, 16), nn.Linear(16, 8), nn.Linear(8, 16), nn.Linear(16, 3)\n"
      "c.weight = a.weight\n"
      "torch.jit.script(nn.Sequential(a, nn.Tanh(), b, nn.Tanh(), c, nn.Tanh(), d))"
      ".save(sys.argv[1])\n";
  ASSERT_TRUE(RunPython(dir, write, module));

  const std::string single_dir = test_files::MakeTempDir();
  const TrainResult single = RunAll(ScriptTask(module, single_dir, 0, 1, "1f1b"));
  ASSERT_TRUE(single.val_loss.has_value());
  EXPECT_LT(single.loss, single.first_loss);
  const std::map<std::string, torch::Tensor> single_model = ExportedScript(single_dir);

  struct Case {
    int stages, replicas;
    const char* schedule;
    std::vector<int> counts;
  };
  std::string pipe_dir;
  for (const Case& c :
       {Case{2, 2, "1f1b", {2, 5}}, Case{3, 1, "gpipe", {2, 2, 3}}, Case{2, 1, "gpipe", {5, 2}}}) {
    SCOPED_TRACE(absl::StrCat(c.stages, " stages x ", c.replicas, " ", c.schedule, " ",
                              absl::StrJoin(c.counts, "/")));
    const std::string ckpt = test_files::MakeTempDir();
    const TrainResult piped =
        RunAll(ScriptTask(module, ckpt, c.stages, c.replicas, c.schedule, c.counts));
    EXPECT_EQ(piped.step, kSteps);
    EXPECT_NEAR(piped.loss, single.loss, 1e-5);
    ASSERT_TRUE(piped.val_loss.has_value());
    EXPECT_NEAR(*piped.val_loss, *single.val_loss, 1e-5);
    std::map<std::string, torch::Tensor> exported = ExportedScript(ckpt);
    ExpectNear(exported, single_model, 1e-5);
    // Still one tensor in the exported module.
    EXPECT_TRUE(torch::equal(exported.at("0.weight"), exported.at("4.weight")));
    if (pipe_dir.empty()) pipe_dir = ckpt;
  }
  // The weight trained: not what the module started with.
  EXPECT_GT((single_model.at("0.weight") -
             torch::jit::load(module).attr("0").toModule().attr("weight").toTensor())
                .abs()
                .max()
                .item<double>(),
            1e-3);

  std::string resumed_dir;
  const TrainResult resumed = ResumeSingleFrom(module, pipe_dir, &resumed_dir);
  EXPECT_EQ(resumed.start_step, 10);
  EXPECT_NEAR(resumed.loss, single.loss, 1e-5);

  trainyard::v1::Task middle = ScriptTask(module, "", 3, 1, "1f1b", {2, 3, 2});
  std::vector<absl::StatusOr<TrainResult>> refused = test_util::RunRanks(middle, 3, {});
  EXPECT_EQ(refused[0].status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      refused[0].status().message(),
      HasSubstr("model.torchscript: layers 0, 4 share 0.weight, which would tie stages 0, 1"));
}

// The exported files of a model.stages job (final/stages/<i>.pt), their parameters named as the
// whole model names them ("<i>.<name>").
std::map<std::string, torch::Tensor> ExportedStages(const std::string& checkpoint_dir, int files) {
  std::map<std::string, torch::Tensor> out;
  for (int i = 0; i < files; ++i) {
    torch::jit::Module module = torch::jit::load(
        absl::StrCat(checkpoint_dir, "/", kFinalModelFolder, "/stages/", i, ".pt"));
    for (const auto& p : module.named_parameters(true)) out[absl::StrCat(i, ".", p.name)] = p.value;
  }
  return out;
}

// A model in four TorchScript files (model.stages: Linear 8->16 and Tanh in a Sequential, two
// residual blocks of a module class of their own, Linear 16->3) trains as the one module
// Sequential(*files) does: as a single job chaining the files, as 4 stages of one file each
// (GPipe) and as 2 stages x 2 replicas grouping them by their archives' bytes (1F1B): the same
// losses, and each file exported as final/stages/<i>.pt with the whole module's trained
// parameters. The whole module resumes from the pipeline's checkpoint (the same tensor names). A
// missing file is NOT_FOUND naming its place in model.stages.
TEST(PipelineRunTest, AModelInTorchScriptFilesTrainsAsTheOneModuleOfThemDoes) {
  const std::string python = "/usr/bin/python3";
  if (std::system((python + " -c 'import torch' 2>/dev/null").c_str()) != 0) {
    GTEST_SKIP() << "needs /usr/bin/python3 with torch to write the modules";
  }
  const std::string dir = test_files::MakeTempDir();
  const std::string write =
      "import sys, torch\n"
      "from torch import nn\n"
      "torch.manual_seed(4)\n"
      "class Residual(nn.Module):\n"
      "    def __init__(self):\n"
      "        super().__init__()\n"
      "        self.norm, self.fc = nn.LayerNorm(16), nn.Linear(16, 16)\n"
      "    def forward(self, x):\n"
      "        return x + torch.tanh(self.fc(self.norm(x)))\n"
      "parts = [nn.Sequential(nn.Linear(8, 16), nn.Tanh()), Residual(), Residual(),\n"
      "         nn.Linear(16, 3)]\n"
      "for i, p in enumerate(parts):\n"
      "    torch.jit.script(p).save(f'{sys.argv[1]}/part{i}.pt')\n"
      "torch.jit.script(nn.Sequential(*parts)).save(f'{sys.argv[1]}/whole.pt')\n";
  ASSERT_TRUE(RunPython(dir, write, dir));
  auto with_files = [&](trainyard::v1::Task task, int missing = -1) {
    trainyard::v1::ModelSpec& model = *task.mutable_spec()->mutable_model();
    model.clear_torchscript();
    for (int i = 0; i < 4; ++i) {
      model.add_stages(absl::StrCat("file://", dir, i == missing ? "/none" : "/part", i, ".pt"));
    }
    return task;
  };

  const std::string whole_dir = test_files::MakeTempDir();
  const TrainResult whole = RunAll(ScriptTask(dir + "/whole.pt", whole_dir, 0, 1, "1f1b"));
  ASSERT_TRUE(whole.val_loss.has_value());
  EXPECT_LT(whole.loss, whole.first_loss);
  const std::map<std::string, torch::Tensor> whole_model = ExportedScript(whole_dir);
  ASSERT_EQ(whole_model.size(), 12u);
  // What the files are compared with trained: not what the last file started with.
  EXPECT_GT(
      (whole_model.at("3.weight") - torch::jit::load(dir + "/part3.pt").attr("weight").toTensor())
          .abs()
          .max()
          .item<double>(),
      1e-3);

  struct Case {
    int stages, replicas;
    const char* schedule;
  };
  std::string pipe_dir;
  for (const Case& c : {Case{0, 1, "1f1b"}, Case{4, 1, "gpipe"}, Case{2, 2, "1f1b"}}) {
    SCOPED_TRACE(absl::StrCat(c.stages, " stages x ", c.replicas, " ", c.schedule));
    const std::string ckpt = test_files::MakeTempDir();
    const TrainResult run =
        RunAll(with_files(ScriptTask(dir + "/whole.pt", ckpt, c.stages, c.replicas, c.schedule)));
    EXPECT_EQ(run.step, kSteps);
    EXPECT_NEAR(run.loss, whole.loss, 1e-5);
    ASSERT_TRUE(run.val_loss.has_value());
    EXPECT_NEAR(*run.val_loss, *whole.val_loss, 1e-5);
    EXPECT_EQ(run.model_uri, absl::StrCat("file://", ckpt, "/", kFinalModelFolder, "/stages"));
    ExpectNear(ExportedStages(ckpt, 4), whole_model, 1e-5);
    if (c.replicas > 1) pipe_dir = ckpt;
  }

  std::string resumed_dir;
  const TrainResult resumed = ResumeSingleFrom(dir + "/whole.pt", pipe_dir, &resumed_dir);
  EXPECT_EQ(resumed.start_step, 10);
  EXPECT_NEAR(resumed.loss, whole.loss, 1e-5);
  ExpectNear(ExportedScript(resumed_dir), whole_model, 1e-5);

  std::vector<absl::StatusOr<TrainResult>> missing =
      test_util::RunRanks(with_files(ScriptTask(dir + "/whole.pt", "", 0, 1, "1f1b"), 2), 1, {});
  EXPECT_EQ(missing[0].status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing[0].status().message(), HasSubstr("model.stages[2]: "));
}

}  // namespace
}  // namespace trainyard::trainer::pipeline
