#ifndef TRAINYARD_TESTS_SERVER_TEST_UTIL_H_
#define TRAINYARD_TESTS_SERVER_TEST_UTIL_H_

#include <cstdlib>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "trainyard/v1/job.pb.h"

namespace trainyard {

// A fresh empty directory under the test's temp dir, removed by the destructor.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TEST_TMPDIR");
    std::string pattern = absl::StrCat(base != nullptr ? base : "/tmp", "/trainyard-server-XXXXXX");
    path_ = mkdtemp(pattern.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A small valid spec: mlp on synthetic data.
inline trainyard::v1::JobSpec TestSpec(const std::string& name, int min_workers = 1,
                                       int max_workers = 1, int gpus = 0, int priority = 0) {
  trainyard::v1::JobSpec spec;
  spec.set_name(name);
  spec.set_strategy(max_workers > 1 || min_workers > 1 ? trainyard::v1::DATA_PARALLEL
                                                       : trainyard::v1::SINGLE);
  spec.mutable_workers()->set_min(min_workers);
  spec.mutable_workers()->set_max(max_workers);
  spec.mutable_resources()->set_gpus_per_worker(gpus);
  spec.mutable_model()->set_builtin("mlp");
  spec.mutable_model()->mutable_args()->set_inputs(4);
  spec.mutable_model()->mutable_args()->add_hidden(8);
  spec.mutable_model()->mutable_args()->set_classes(2);
  spec.mutable_data()->mutable_synthetic()->set_samples(64);
  spec.mutable_data()->mutable_synthetic()->set_features(4);
  spec.mutable_data()->mutable_synthetic()->set_classes(2);
  spec.set_batch_size(48);
  spec.set_max_steps(10);
  spec.set_priority(priority);
  return spec;
}

}  // namespace trainyard

#endif  // TRAINYARD_TESTS_SERVER_TEST_UTIL_H_
