#include "server/capacity.h"

#include <algorithm>

#include "server/job_state.h"

namespace trainyard {

int SlotsPerRank(const v1::JobSpec& spec) { return spec.resources().gpus_per_worker() > 0 ? 0 : 1; }

int GpusPerRank(const v1::JobSpec& spec) { return std::max(spec.resources().gpus_per_worker(), 0); }

int SlotsPerShard(const v1::JobSpec& spec) { return std::max(spec.parameter_servers().slots(), 1); }

std::pair<int, int> TaskUsage(const v1::JobSpec& spec, const v1::TaskInfo& t) {
  if (t.role() == v1::TASK_ROLE_SHARD) return {SlotsPerShard(spec), 0};
  return {SlotsPerRank(spec), GpusPerRank(spec)};
}

std::map<std::string, WorkerUsage> UsedCapacity(const JobTable& table, absl::Time now,
                                                absl::Duration stopping_hold,
                                                absl::FunctionRef<bool(absl::string_view)> gone) {
  std::map<std::string, WorkerUsage> used;
  auto count = [&](const JobEntry& entry, bool skip_gone_workers) {
    for (const v1::TaskInfo& t : entry.job.tasks()) {
      if (t.generation() != entry.job.generation() || TaskEnded(t.state())) continue;
      if (skip_gone_workers && gone(t.worker_id())) continue;
      WorkerUsage& u = used[t.worker_id()];
      const auto [task_slots, task_gpus] = TaskUsage(entry.job.spec(), t);
      u.slots += task_slots;
      u.gpus += task_gpus;
      u.task_ids.push_back(t.task_id());
    }
  };
  for (int64_t seq : table.attempts()) {
    const JobEntry* entry = table.FindBySeq(seq);
    if (entry == nullptr) continue;
    const v1::JobState state = entry->job.state();
    if (state == v1::SCHEDULED || state == v1::RUNNING) {
      count(*entry, false);
    } else if ((state == v1::RESTARTING || state == v1::PENDING) &&
               now - entry->restarting_since < stopping_hold) {
      // The last attempt's ranks and shards, stopping (a pending job has none once they ended).
      count(*entry, true);
    }
  }
  // A trainer of a cancelled or failed job holds its slots and GPUs until its agent reports it
  // gone (it may be saving during its grace period).
  for (int64_t seq : table.stopping()) {
    const JobEntry* entry = table.FindBySeq(seq);
    if (entry != nullptr && now - entry->ended < stopping_hold) count(*entry, true);
  }
  return used;
}

}  // namespace trainyard
