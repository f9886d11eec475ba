#ifndef TRAINYARD_SERVER_SCHEDULING_PLACEMENT_H_
#define TRAINYARD_SERVER_SCHEDULING_PLACEMENT_H_

// Where a job's ranks and shards fit: what one task of a job takes, the workers' free capacity
// as bins, gang placement over them and what a placement takes from them. The scheduler's
// passes (scheduler.cc) decide which jobs to place; this decides where.

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "server/scheduling/scheduler.h"

namespace trainyard::placement {

// The free memory of a worker that did not say how much it has: more than any task reserves.
inline constexpr int64_t kUnknownMemory = int64_t{1} << 60;

// What one rank and one shard of `job` take.
inline bool UsesGpus(const SchedJob& job) { return job.gpus_per_rank > 0; }
inline int RankSlots(const SchedJob& job) {
  return UsesGpus(job) ? std::max(job.slots_per_rank, 0) : std::max(job.slots_per_rank, 1);
}
// Rank `rank`'s memory, and the most any rank takes.
inline int64_t RankMemoryAt(const SchedJob& job, size_t rank) {
  return std::max<int64_t>(
      rank < job.rank_memory.size() ? job.rank_memory[rank] : job.memory_per_rank, 0);
}
inline int64_t RankMemory(const SchedJob& job) {
  int64_t most = std::max<int64_t>(job.memory_per_rank, 0);
  for (int64_t m : job.rank_memory) most = std::max(most, m);
  return most;
}
inline int64_t ShardMemory(const SchedJob& job) {
  return std::max<int64_t>(job.memory_per_shard, 0);
}
inline bool UsesMemory(const SchedJob& job) {
  return RankMemory(job) > 0 || (job.shards > 0 && ShardMemory(job) > 0);
}
inline int RankGpus(const SchedJob& job) { return UsesGpus(job) ? job.gpus_per_rank : 0; }
inline int ShardSlots(const SchedJob& job) { return std::max(job.slots_per_shard, 1); }
inline int Shards(const SchedJob& job) { return std::max(job.shards, 0); }

struct Bin {
  const SchedWorker* worker;
  int free_slots;
  int free_gpus;
  int64_t free_memory;
  int ranks = 0;   // ranks of the current job placed here
  int shards = 0;  // shards of the current job placed here
};

// Whether the worker's trainer can run the job's models.
inline bool RunsOn(const SchedJob& job, const SchedWorker& worker) {
  if (!job.runtimes.has_value()) return true;
  return std::find(job.runtimes->begin(), job.runtimes->end(), worker.runtime) !=
         job.runtimes->end();
}

struct Fit {
  std::vector<size_t> ranks;   // bin per rank
  std::vector<size_t> shards;  // bin per shard
};

// The most ranks (between min_ranks and max_ranks, dividing the batch) that fit together with
// every shard, or nullopt.
std::optional<Fit> Place(const SchedJob& job, const std::vector<Bin>& bins);

// Adds (sign 1) or removes (-1) what `tasks` hold to the bins of their workers.
void AddTasks(const std::vector<SchedTask>& tasks, std::vector<Bin>& bins,
              const std::map<std::string, size_t>& bin_of, int sign);

// Takes what `fit` places from `bins`, and returns the placement.
Placement Take(const SchedJob& job, const Fit& fit, std::vector<Bin>& bins);

// The tasks a placement makes, as a running job holds them.
std::vector<SchedTask> TasksOf(const SchedJob& job, const Placement& p);

// What is free now plus what stopping jobs hold: the capacity once their ranks have stopped.
std::vector<Bin> WithComing(const std::vector<Bin>& free_bins, const std::vector<Bin>& coming);

}  // namespace trainyard::placement

#endif  // TRAINYARD_SERVER_SCHEDULING_PLACEMENT_H_
