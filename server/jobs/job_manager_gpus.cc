// GPUs that their agents took out of service: what the coordinator knows of them, and an admin's
// return of one.

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/log.h"
#include "server/jobs/job_manager.h"

namespace trainyard {

void JobManager::GpuFaultsChangedLocked(const std::string& worker_id) {
  const WorkerRecord* record = workers_.Find(worker_id);
  if (record == nullptr) return;
  std::vector<std::string> faults;
  for (const v1::GpuFault& f : record->info.gpu_faults()) {
    faults.push_back(absl::StrCat("GPU ", f.index(), " (", f.reason(), ")"));
  }
  if (faults.empty()) {
    LogInfo("worker ", worker_id, ": every GPU in service");
  } else {
    LogWarning("worker ", worker_id, ": out of service: ", absl::StrJoin(faults, ", "));
  }
  if (absl::Status s = PersistWorkerLocked(worker_id); !s.ok()) {
    LogWarning("worker ", worker_id, ": GPU faults not written: ", s.ToString());
  }
  ClusterChangedLocked();
  RequestTickLocked();
}

std::vector<int> JobManager::GpuReturnsLocked(const WorkerRecord& record) {
  std::vector<int> out;
  auto returns = gpu_returns_.find(record.info.id());
  if (returns == gpu_returns_.end()) return out;
  const absl::Time now = clock_.Now();
  for (auto it = returns->second.begin(); it != returns->second.end();) {
    bool faulty = false;
    for (const v1::GpuFault& f : record.info.gpu_faults()) faulty |= f.index() == it->first;
    // Back in service, or the agent had its chance: the admin sees which in `workers`.
    if (!faulty || now - it->second > kGpuReturnFor) {
      it = returns->second.erase(it);
      continue;
    }
    out.push_back(it->first);
    ++it;
  }
  if (returns->second.empty()) gpu_returns_.erase(returns);
  return out;
}

absl::StatusOr<v1::Worker> JobManager::ReturnGpu(absl::string_view worker_id, int index) {
  absl::MutexLock lock(&mu_);
  const WorkerRecord* record = workers_.Find(worker_id);
  if (record == nullptr) {
    return absl::NotFoundError(absl::StrCat("worker '", worker_id, "' unknown"));
  }
  if (record->info.state() == v1::LOST) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", worker_id, " is LOST: its agent checks its GPUs when it starts"));
  }
  if (index < 0 || index >= record->info.gpus()) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", worker_id, " has ", record->info.gpus(), " GPUs: no GPU ", index));
  }
  bool faulty = false;
  for (const v1::GpuFault& f : record->info.gpu_faults()) faulty |= f.index() == index;
  if (!faulty) {
    return absl::FailedPreconditionError(
        absl::StrCat("GPU ", index, " of worker ", worker_id, " is in service"));
  }
  gpu_returns_[std::string(worker_id)][index] = clock_.Now();
  LogInfo("worker ", worker_id, ": GPU ", index,
          " returned by an admin: its agent checks it again");
  workers_.BumpVersion(worker_id);
  WakeWorkerLocked(std::string(worker_id));
  return WorkerViewLocked(*record, UsedCapacityLocked());
}

}  // namespace trainyard
