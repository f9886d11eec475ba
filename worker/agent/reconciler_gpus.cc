// The reconciler's GPUs: which are free and in service, and the tasks on a GPU that failed.

#include <signal.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/log.h"
#include "worker/agent/reconciler.h"

namespace trainyard {

int Reconciler::FreeGpus() const {
  absl::MutexLock lock(&mu_);
  int free = 0;
  for (size_t i = 0; i < gpu_used_.size(); ++i) {
    free += !gpu_used_[i] && GpuInService(static_cast<int>(i));
  }
  return free;
}

int Reconciler::GpusInUse() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(std::count(gpu_used_.begin(), gpu_used_.end(), true));
}

std::map<int, v1::TaskStatus> Reconciler::GpuTasks() const {
  absl::MutexLock lock(&mu_);
  std::map<int, v1::TaskStatus> tasks;
  for (const auto& [id, record] : records_) {
    if (!record.running) continue;
    for (int gpu : record.gpus) tasks[gpu] = record.status;
  }
  return tasks;
}

std::vector<int> Reconciler::TaskGpus(const std::string& task_id) const {
  absl::MutexLock lock(&mu_);
  auto it = records_.find(task_id);
  if (it == records_.end() || !it->second.running) return {};
  return it->second.gpus;
}

std::string Reconciler::NoGpusMessage(int needed) const {
  int free = 0;
  std::vector<int> out;
  for (size_t i = 0; i < gpu_used_.size(); ++i) {
    if (!GpuInService(static_cast<int>(i))) {
      out.push_back(static_cast<int>(i));
    } else if (!gpu_used_[i]) {
      ++free;
    }
  }
  std::string message = absl::StrCat("needs ", needed, " GPUs but only ", free, " of ",
                                     gpu_used_.size(), " are free on this worker");
  if (!out.empty()) {
    absl::StrAppend(&message, " (", out.size() == 1 ? "GPU " : "GPUs ", absl::StrJoin(out, ", "),
                    out.size() == 1 ? " is" : " are",
                    " out of service after a failed health check or a GPU error)");
  }
  return message;
}

int Reconciler::StopForGpuFault(int gpu, const std::string& reason) {
  absl::MutexLock lock(&mu_);
  int killed = 0;
  const absl::Time now = clock_.Now();
  for (auto& [id, record] : records_) {
    if (!record.running || record.reaped || record.killed) continue;
    if (std::find(record.gpus.begin(), record.gpus.end(), gpu) == record.gpus.end()) continue;
    KeepRecordAtStop(record);
    record.stop_cause = StopCause::kGpuFault;
    record.fault_gpu = gpu;
    record.gpu_fault = reason;
    record.killed = true;
    record.kill_at = now;
    LogWarning("killing task ", id, " (pid ", record.status.pid(), "): GPU ", gpu,
               " failed: ", reason);
    absl::Status status = launcher_.Signal(record.status.pid(), SIGKILL);
    if (!status.ok()) LogWarning("cannot kill task ", id, ": ", status.message());
    ++killed;
  }
  return killed;
}

void Reconciler::AttributeEndToGpuFault(const std::string& task_id, int gpu,
                                        const std::string& reason) {
  absl::MutexLock lock(&mu_);
  auto it = records_.find(task_id);
  if (it == records_.end() || !it->second.running) return;
  it->second.fault_after_exit = std::make_pair(gpu, reason);
}

void Reconciler::ApplyFaultAfterExit(const Ended& e, Record& record) {
  if (!record.fault_after_exit.has_value() || record.stop_cause != StopCause::kNone) return;
  if (e.exit.exit_code == 0 && e.exit.signal == 0) return;  // it finished: its GPU failed after
  record.stop_cause = StopCause::kGpuFault;
  record.fault_gpu = record.fault_after_exit->first;
  record.gpu_fault = record.fault_after_exit->second;
}

}  // namespace trainyard
