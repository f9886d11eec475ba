#ifndef TRAINYARD_TESTS_AGENT_FAKE_PROCESS_LAUNCHER_H_
#define TRAINYARD_TESTS_AGENT_FAKE_PROCESS_LAUNCHER_H_

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "worker/agent/process_launcher.h"

namespace trainyard::testing {

// Records launches and signals; processes end when the test says so. Thread-safe.
class FakeProcessLauncher final : public ProcessLauncher {
 public:
  struct Launched {
    SubprocessOptions options;
    int64_t pid = 0;
    std::vector<int> signals;
    std::optional<ExitInfo> exit;  // set by Exit; reported once by PollExit
    bool reaped = false;
  };

  absl::StatusOr<int64_t> Launch(const SubprocessOptions& options) override {
    absl::MutexLock lock(&mu_);
    if (!fail_with_.ok()) return fail_with_;
    const int64_t pid = next_pid_++;
    launched_.push_back({options, pid, {}, std::nullopt, false});
    return pid;
  }
  absl::Status Signal(int64_t pid, int signal) override {
    std::function<void(int64_t, int)> hook;
    {
      absl::MutexLock lock(&mu_);
      hook = on_signal_;
    }
    if (hook) hook(pid, signal);
    absl::MutexLock lock(&mu_);
    Launched* p = Find(pid);
    if (p == nullptr) return absl::NotFoundError("no such pid");
    p->signals.push_back(signal);
    if (signal == 9 && !p->exit.has_value() && !unkillable_) p->exit = ExitInfo{137, 9};
    return absl::OkStatus();
  }
  absl::StatusOr<std::optional<ExitInfo>> PollExit(int64_t pid) override {
    absl::MutexLock lock(&mu_);
    Launched* p = Find(pid);
    if (p == nullptr || p->reaped) return absl::FailedPreconditionError("not a child");
    if (!p->exit.has_value()) return std::optional<ExitInfo>();
    p->reaped = true;
    return p->exit;
  }

  // Makes the process end as given.
  void Exit(int64_t pid, ExitInfo exit) {
    absl::MutexLock lock(&mu_);
    Find(pid)->exit = exit;
  }
  // Called at each Signal, before it takes effect (without the lock held): lets a test see what
  // the process would find at that moment.
  void OnSignal(std::function<void(int64_t pid, int signal)> hook) {
    absl::MutexLock lock(&mu_);
    on_signal_ = std::move(hook);
  }
  // SIGKILL no longer ends processes (a process stuck in the kernel).
  void MakeUnkillable() {
    absl::MutexLock lock(&mu_);
    unkillable_ = true;
  }
  void FailLaunches(absl::Status status) {
    absl::MutexLock lock(&mu_);
    fail_with_ = status;
  }
  std::vector<Launched> launched() const {
    absl::MutexLock lock(&mu_);
    return launched_;
  }

 private:
  Launched* Find(int64_t pid) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (Launched& p : launched_) {
      if (p.pid == pid) return &p;
    }
    return nullptr;
  }

  mutable absl::Mutex mu_;
  int64_t next_pid_ ABSL_GUARDED_BY(mu_) = 1000;
  std::vector<Launched> launched_ ABSL_GUARDED_BY(mu_);
  absl::Status fail_with_ ABSL_GUARDED_BY(mu_);
  std::function<void(int64_t, int)> on_signal_ ABSL_GUARDED_BY(mu_);
  bool unkillable_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace trainyard::testing

#endif  // TRAINYARD_TESTS_AGENT_FAKE_PROCESS_LAUNCHER_H_
