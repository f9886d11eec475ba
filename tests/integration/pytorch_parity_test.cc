// A TorchScript model written by PyTorch, trained by Trainyard and by the same loop in PyTorch on
// the same data: the per-step losses agree.

#include <sys/wait.h>

#include <cmath>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/uri.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster.h"

namespace trainyard::testing {
namespace {

constexpr char kPython[] = "/usr/bin/python3";

// Runs a command to completion; its exit status and combined output.
std::pair<int, std::string> RunCommand(const std::vector<std::string>& argv,
                                       const std::string& log) {
  Process process(argv, log);
  std::optional<int> status = process.Wait(absl::Seconds(120));
  int code = status.has_value() && WIFEXITED(*status) ? WEXITSTATUS(*status) : -1;
  return {code, process.Log()};
}

TEST(PyTorchParityTest, PerStepLossesMatchPyTorch) {
  if (!std::filesystem::exists(kPython)) GTEST_SKIP() << "no " << kPython;
  TempDir dir;
  const std::string model = dir.path() + "/model.pt";
  const std::string data_dir = dir.path() + "/data";
  auto [model_rc, model_out] =
      RunCommand({kPython, SourceDir() + "/examples/write_torchscript_model.py", "--out", model,
                  "--inputs", "12", "--hidden", "24", "--classes", "3", "--seed", "5"},
                 dir.path() + "/model.log");
  ASSERT_EQ(model_rc, 0) << model_out;
  auto [data_rc, data_out] = RunCommand(
      {kPython, SourceDir() + "/examples/write_dataset.py", "--out-dir", data_dir, "--samples",
       "320", "--features", "12", "--classes", "3", "--files", "2", "--seed", "9"},
      dir.path() + "/data.log");
  ASSERT_EQ(data_rc, 0) << data_out;

  constexpr int kSteps = 25;  // more than one epoch of 10 batches
  Cluster cluster;
  auto submitted = cluster.Submit(absl::StrCat(R"(
name: parity
model: {torchscript: )",
                                               model, R"(}
data: {train: ")",
                                               data_dir, R"(/*.safetensors", shuffle: false}
batch_size: 32
optimizer: {name: sgd, lr: 0.05, momentum: 0.9}
loss: cross_entropy
max_steps: )",
                                               kSteps, R"(
log_every_steps: 1
)"));
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  auto job = cluster.WaitForFinal(submitted->id());
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->state(), v1::SUCCEEDED) << job->reason();
  auto logs = cluster.Logs(job->id());
  ASSERT_TRUE(logs.ok());
  std::map<int64_t, double> ours = ParseStepLosses(*logs);

  // The exported model is TorchScript that PyTorch loads, holding the trained parameters.
  auto exported = LocalPath(job->model_uri());
  ASSERT_TRUE(exported.ok()) << job->model_uri();
  ASSERT_TRUE(absl::EndsWith(*exported, "model.pt")) << *exported;
  auto [ref_rc, ref_out] = RunCommand(
      {kPython, SourceDir() + "/tests/integration/reference_train.py", "--model", model, "--data",
       data_dir + "/*.safetensors", "--batch", "32", "--steps", std::to_string(kSteps), "--lr",
       "0.05", "--momentum", "0.9", "--compare-with", *exported},
      dir.path() + "/reference.log");
  ASSERT_EQ(ref_rc, 0) << ref_out;
  std::map<int64_t, double> reference = ParseStepLosses(ref_out);
  ASSERT_EQ(reference.size(), static_cast<size_t>(kSteps)) << ref_out;
  ASSERT_EQ(ours.size(), static_cast<size_t>(kSteps)) << *logs;
  for (const auto& [step, loss] : reference) {
    ASSERT_EQ(ours.count(step), 1u) << step;
    EXPECT_NEAR(ours[step], loss, 1e-4) << "step " << step;
  }
  const size_t diff_at = ref_out.find("max_param_diff=");
  ASSERT_NE(diff_at, std::string::npos) << ref_out;
  EXPECT_LT(std::stod(ref_out.substr(diff_at + 15)), 1e-4) << ref_out;
  // The losses moved: a loop that trained nothing would not pass by accident.
  EXPECT_LT(reference.rbegin()->second, reference.begin()->second);
}

}  // namespace
}  // namespace trainyard::testing
