#ifndef TRAINYARD_TESTS_TRAINER_TRAINER_TEST_UTIL_H_
#define TRAINYARD_TESTS_TRAINER_TRAINER_TEST_UTIL_H_

// Helpers shared by the in-process trainer tests (they include LibTorch).

#include <torch/script.h>
#include <torch/torch.h>

#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/common/test_stores.h"
#include "tests/trainer/fake_rendezvous.h"
#include "tests/trainer/test_files.h"
#include "worker/trainer/data/data.h"
#include "worker/trainer/data/schedule.h"
#include "worker/trainer/loop/trainer.h"
#include "worker/trainer/model/model.h"

namespace trainyard::trainer::test_util {

// A synthetic dataset of `samples` samples of `features` features in 2 classes, and the plan of
// `steps` updates of `batch` samples on one rank: what the data tests feed their prefetchers.
struct SyntheticSteps {
  Dataset data;
  StepPlan plan;
};
inline SyntheticSteps MakeSyntheticSteps(int64_t samples, int64_t features, int64_t batch,
                                         int64_t steps) {
  trainyard::v1::SyntheticData synthetic;
  synthetic.set_samples(samples);
  synthetic.set_features(features);
  synthetic.set_classes(2);
  trainyard::v1::JobSpec spec;
  spec.set_batch_size(batch);
  spec.set_max_steps(steps);
  return SyntheticSteps{*MakeSyntheticDataset(synthetic, 3), *PlanSteps(spec, samples, 1)};
}

// Trainer options that print nothing, with the stores of the process environment.
inline TrainerOptions QuietOptions() {
  TrainerOptions options;
  options.stores = &EnvironmentStores();
  options.print_line = [](const std::string&) {};
  return options;
}

// Data options with the stores of the process environment.
inline DataOptions TestDataOptions() {
  DataOptions options;
  options.stores = &EnvironmentStores();
  return options;
}

// The tensors of the safetensors file at `path`; empty (and a test failure) when it cannot be read.
inline std::map<std::string, torch::Tensor> ReadTensors(const std::string& path) {
  absl::StatusOr<std::map<std::string, torch::Tensor>> tensors =
      DecodeTensors(test_files::ReadFile(path));
  EXPECT_TRUE(tensors.ok()) << path << ": " << tensors.status();
  return tensors.ok() ? *tensors : std::map<std::string, torch::Tensor>{};
}

// The same names, each with bit-identical values.
inline void ExpectSameTensors(const std::map<std::string, torch::Tensor>& a,
                              const std::map<std::string, torch::Tensor>& b) {
  ASSERT_FALSE(a.empty());
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) {
    ASSERT_TRUE(b.count(name)) << name;
    EXPECT_TRUE(torch::equal(t, b.at(name))) << name;
  }
}

// Saves a TorchScript module at `path` holding `parameters` (dotless names) and a `training`
// flag (as torch.jit.script gives every module), with `source` defining its methods, e.g.
// "def forward(self, x):\n    return x @ self.w\n". A test failure if it cannot.
inline void SaveScriptModule(const std::string& path, const NamedTensors& parameters,
                             const std::string& source) {
  try {
    torch::jit::Module module("TestModule");
    module.register_attribute("training", c10::BoolType::get(), true);
    for (const auto& [name, tensor] : parameters) {
      module.register_parameter(name, tensor, /*is_buffer=*/false);
    }
    module.define(source);
    module.save(path);
  } catch (const std::exception& e) {
    ADD_FAILURE() << path << ": " << DescribeTorchError(e);
  }
}

// Polls `condition` until it holds (true) or 30 s pass (false).
inline bool Eventually(const std::function<bool()>& condition) {
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (!condition()) {
    if (absl::Now() > give_up) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

// Runs `task` on `world` ranks, each a thread with its own RunTrainer, meeting through
// `rendezvous` (a new in-memory store when null). `customize` adjusts each rank's options.
inline std::vector<absl::StatusOr<TrainResult>> RunRanks(
    const trainyard::v1::Task& task, int world,
    const std::function<void(int, TrainerOptions&)>& customize,
    RendezvousClient* rendezvous = nullptr) {
  FakeRendezvous own;
  if (rendezvous == nullptr) rendezvous = &own;
  std::vector<absl::StatusOr<TrainResult>> results(world, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      trainyard::v1::Task rank_task = task;
      rank_task.set_rank(r);
      rank_task.set_world_size(world);
      rank_task.set_task_id(absl::StrCat(task.job_id(), ".g", task.generation(), ".r", r));
      TrainerOptions options = QuietOptions();
      options.rendezvous = rendezvous;
      if (customize) customize(r, options);
      results[r] = RunTrainer(rank_task, options);
    });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

}  // namespace trainyard::trainer::test_util

#endif  // TRAINYARD_TESTS_TRAINER_TRAINER_TEST_UTIL_H_
