#ifndef TRAINYARD_TESTS_TRAINER_TRAINER_TEST_UTIL_H_
#define TRAINYARD_TESTS_TRAINER_TRAINER_TEST_UTIL_H_

// Helpers shared by the in-process trainer tests (they include LibTorch).

#include <torch/torch.h>

#include <functional>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/trainer/test_files.h"
#include "worker/trainer/model.h"
#include "worker/trainer/trainer.h"

namespace trainyard::trainer::test_util {

// Trainer options that print nothing.
inline TrainerOptions QuietOptions() {
  TrainerOptions options;
  options.print_line = [](const std::string&) {};
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

// Polls `condition` until it holds (true) or 30 s pass (false).
inline bool Eventually(const std::function<bool()>& condition) {
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (!condition()) {
    if (absl::Now() > give_up) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

}  // namespace trainyard::trainer::test_util

#endif  // TRAINYARD_TESTS_TRAINER_TRAINER_TEST_UTIL_H_
