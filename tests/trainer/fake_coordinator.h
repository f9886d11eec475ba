#ifndef TRAINYARD_TESTS_TRAINER_FAKE_COORDINATOR_H_
#define TRAINYARD_TESTS_TRAINER_FAKE_COORDINATOR_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/storage/checkpoint_layout.h"
#include "worker/trainer/coordinator/coordinator_client.h"

namespace trainyard::trainer {

// Records what a trainer reports; retires every committed checkpoint but the newest keep_last,
// their step folders taken from `checkpoint_uri` as the coordinator derives them.
// Tests may make calls fail (an outage, a refusal) through the hooks. Thread-safe.
class FakeCoordinator final : public CoordinatorClient {
 public:
  // Called with the 1-based number of the call (of that method) before it takes effect; a
  // non-OK status is returned instead. Set before the trainer runs.
  using FailHook = std::function<absl::Status(int call)>;

  explicit FakeCoordinator(int keep_last, std::string checkpoint_uri = "")
      : keep_last_(keep_last), checkpoint_uri_(std::move(checkpoint_uri)) {}

  void set_commit_hook(FailHook hook) {
    absl::MutexLock lock(&mu_);
    commit_hook_ = std::move(hook);
  }
  void set_progress_hook(FailHook hook) {
    absl::MutexLock lock(&mu_);
    progress_hook_ = std::move(hook);
  }

  absl::Status ReportProgress(const trainyard::v1::JobProgress& progress) override {
    FailHook hook;
    int call;
    {
      absl::MutexLock lock(&mu_);
      call = ++progress_calls_;
      hook = progress_hook_;
    }
    // Outside the lock: a hook may block or call back into this object.
    if (hook) {
      absl::Status status = hook(call);
      if (!status.ok()) return status;
    }
    absl::MutexLock lock(&mu_);
    progress_.push_back(progress);
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<std::string>> CommitCheckpoint(int64_t step, int64_t size_bytes,
                                                            absl::Time save_started) override {
    FailHook hook;
    int call;
    {
      absl::MutexLock lock(&mu_);
      call = ++commit_calls_;
      hook = commit_hook_;
    }
    if (hook) {
      absl::Status status = hook(call);
      if (!status.ok()) return status;
    }
    absl::MutexLock lock(&mu_);
    committed_.push_back({step, CheckpointStepUri(checkpoint_uri_, step)});
    std::vector<std::string> retired;
    while (static_cast<int>(committed_.size() - retired_count_) > keep_last_) {
      retired.push_back(committed_[retired_count_++].second);
    }
    return retired;
  }
  absl::Status ReportModel(const std::string& uri) override {
    absl::MutexLock lock(&mu_);
    model_uri_ = uri;
    return absl::OkStatus();
  }
  absl::Status ReportEvent(const std::string& message) override {
    absl::MutexLock lock(&mu_);
    events_.push_back(message);
    return absl::OkStatus();
  }

  std::vector<std::pair<int64_t, std::string>> committed() {
    absl::MutexLock lock(&mu_);
    return committed_;
  }
  std::vector<int64_t> committed_steps() {
    absl::MutexLock lock(&mu_);
    std::vector<int64_t> steps;
    for (const auto& [step, uri] : committed_) steps.push_back(step);
    return steps;
  }
  int commit_calls() {
    absl::MutexLock lock(&mu_);
    return commit_calls_;
  }
  std::vector<trainyard::v1::JobProgress> progress() {
    absl::MutexLock lock(&mu_);
    return progress_;
  }
  int progress_calls() {
    absl::MutexLock lock(&mu_);
    return progress_calls_;
  }
  std::string model_uri() {
    absl::MutexLock lock(&mu_);
    return model_uri_;
  }
  std::vector<std::string> events() {
    absl::MutexLock lock(&mu_);
    return events_;
  }

 private:
  const int keep_last_;
  const std::string checkpoint_uri_;
  absl::Mutex mu_;
  FailHook commit_hook_ ABSL_GUARDED_BY(mu_);
  FailHook progress_hook_ ABSL_GUARDED_BY(mu_);
  int commit_calls_ ABSL_GUARDED_BY(mu_) = 0;
  int progress_calls_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::pair<int64_t, std::string>> committed_ ABSL_GUARDED_BY(mu_);
  size_t retired_count_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<trainyard::v1::JobProgress> progress_ ABSL_GUARDED_BY(mu_);
  std::string model_uri_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> events_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trainyard::trainer

#endif  // TRAINYARD_TESTS_TRAINER_FAKE_COORDINATOR_H_
