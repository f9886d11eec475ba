#include "server/jobs/capacity.h"

#include <algorithm>
#include <cmath>

#include "server/jobs/job_manager_internal.h"
#include "server/lifecycle/job_state.h"

namespace trainyard {

int SlotsPerRank(const v1::JobSpec& spec) {
  const double cpus = spec.resources().cpus();
  const int slots = cpus > 0 ? static_cast<int>(std::ceil(cpus - 1e-9)) : 0;
  return spec.resources().gpus_per_worker() > 0 ? slots : std::max(slots, 1);
}

int GpusPerRank(const v1::JobSpec& spec) { return std::max(spec.resources().gpus_per_worker(), 0); }

int64_t MemoryPerRank(const v1::JobSpec& spec) {
  return std::max<int64_t>(spec.resources().memory_bytes(), 0);
}

int64_t MemoryOfRank(const v1::JobSpec& spec, int rank) {
  const v1::PipelineSpec& pipeline = spec.pipeline();
  if (spec.strategy() == v1::PIPELINE && pipeline.memory_bytes_size() > 0 && rank >= 0) {
    // Rank r runs stage r % stages (worker/trainer/pipeline).
    return std::max<int64_t>(pipeline.memory_bytes(rank % pipeline.memory_bytes_size()), 0);
  }
  return MemoryPerRank(spec);
}

int MinRanks(const v1::JobSpec& spec) {
  int min_ranks = 1;
  int max_ranks = 1;
  job_manager_internal::RankRange(spec, min_ranks, max_ranks);
  return min_ranks;
}

int Shards(const v1::JobSpec& spec) { return job_manager_internal::ShardCount(spec); }

int SlotsPerShard(const v1::JobSpec& spec) { return std::max(spec.parameter_servers().slots(), 1); }

int64_t MemoryPerShard(const v1::JobSpec& spec) {
  return std::max<int64_t>(spec.parameter_servers().memory_bytes(), 0);
}

TaskResources TaskUsage(const v1::JobSpec& spec, const v1::TaskInfo& t) {
  TaskResources r;
  if (t.role() == v1::TASK_ROLE_SHARD) {
    r.slots = SlotsPerShard(spec);
    r.memory_bytes = MemoryPerShard(spec);
    return r;
  }
  r.slots = SlotsPerRank(spec);
  r.gpus = GpusPerRank(spec);
  r.memory_bytes = MemoryOfRank(spec, t.rank());
  r.cpu_limit = std::max(spec.resources().cpus(), 0.0);
  return r;
}

void ForEachHolder(const JobTable& table, absl::Time now, absl::Duration stopping_hold,
                   absl::FunctionRef<void(const JobEntry& entry, bool stopping)> fn) {
  for (int64_t seq : table.attempts()) {
    const JobEntry* entry = table.FindBySeq(seq);
    if (entry == nullptr) continue;
    const v1::JobState state = entry->job.state();
    if (state == v1::SCHEDULED || state == v1::RUNNING) {
      fn(*entry, false);
    } else if ((state == v1::RESTARTING || state == v1::PENDING) &&
               now - entry->restarting_since < stopping_hold) {
      // The last attempt's ranks and shards, stopping (a pending job has none once they ended).
      fn(*entry, true);
    }
  }
  // A trainer of a cancelled or failed job holds its slots and GPUs until its agent reports it
  // gone (it may be saving during its grace period).
  for (int64_t seq : table.stopping()) {
    const JobEntry* entry = table.FindBySeq(seq);
    if (entry != nullptr && now - entry->ended < stopping_hold) fn(*entry, true);
  }
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
      const TaskResources r = TaskUsage(entry.job.spec(), t);
      u.slots += r.slots;
      u.gpus += r.gpus;
      u.memory_bytes += r.memory_bytes;
      u.task_ids.push_back(t.task_id());
    }
  };
  ForEachHolder(table, now, stopping_hold, count);
  return used;
}

}  // namespace trainyard
