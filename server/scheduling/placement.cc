#include "server/scheduling/placement.h"

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace trainyard::placement {
namespace {

// Places up to `count` ranks greedily over `bins` (taking their capacity) and returns the bin of
// each. Each rank goes to the worker with the fewest ranks of this job so far, then the most free
// units of the rank's kind, then the lowest id: distinct workers first, the emptiest first.
std::vector<size_t> FitRanks(const SchedJob& job, int count, std::vector<Bin>& bins) {
  const int slots = RankSlots(job);
  const int gpus = RankGpus(job);
  const bool by_gpus = UsesGpus(job);
  std::vector<size_t> placed;
  while (static_cast<int>(placed.size()) < count) {
    const int64_t memory = RankMemoryAt(job, placed.size());
    std::optional<size_t> best;
    for (size_t i = 0; i < bins.size(); ++i) {
      const Bin& b = bins[i];
      if (b.free_slots < slots || b.free_gpus < gpus || b.free_memory < memory ||
          !RunsOn(job, *b.worker)) {
        continue;
      }
      const int free = by_gpus ? b.free_gpus : b.free_slots;
      const Bin& o = bins[best.value_or(i)];
      const int other_free = by_gpus ? o.free_gpus : o.free_slots;
      if (!best.has_value() || std::make_tuple(b.ranks, -free, b.worker->id) <
                                   std::make_tuple(o.ranks, -other_free, o.worker->id)) {
        best = i;
      }
    }
    if (!best.has_value()) break;
    Bin& b = bins[*best];
    b.free_slots -= slots;
    b.free_gpus -= gpus;
    b.free_memory -= memory;
    b.ranks++;
    placed.push_back(*best);
  }
  return placed;
}

// Places the job's shards likewise: fewest shards of this job, then fewest of its ranks, then
// most free slots, then the lowest id.
std::vector<size_t> FitShards(const SchedJob& job, std::vector<Bin>& bins) {
  const int slots = ShardSlots(job);
  const int64_t memory = ShardMemory(job);
  std::vector<size_t> placed;
  while (static_cast<int>(placed.size()) < Shards(job)) {
    std::optional<size_t> best;
    for (size_t i = 0; i < bins.size(); ++i) {
      const Bin& b = bins[i];
      if (b.free_slots < slots || b.free_memory < memory || !RunsOn(job, *b.worker)) continue;
      const Bin& o = bins[best.value_or(i)];
      if (!best.has_value() ||
          std::make_tuple(b.shards, b.ranks, -b.free_slots, b.worker->id) <
              std::make_tuple(o.shards, o.ranks, -o.free_slots, o.worker->id)) {
        best = i;
      }
    }
    if (!best.has_value()) break;
    Bin& b = bins[*best];
    b.free_slots -= slots;
    b.free_memory -= memory;
    b.shards++;
    placed.push_back(*best);
  }
  return placed;
}

}  // namespace

std::optional<Fit> Place(const SchedJob& job, const std::vector<Bin>& bins) {
  std::vector<Bin> scratch = bins;
  const std::vector<size_t> greedy = FitRanks(job, job.max_ranks, scratch);
  // Fewer ranks are a prefix of the same greedy order: dropping the last-placed ones keeps the
  // spread of the others and may leave room for the shards.
  for (int n = static_cast<int>(greedy.size()); n >= std::max(job.min_ranks, 1); --n) {
    if (job.batch_size > 0 && job.batch_size % n != 0) continue;
    scratch = bins;
    Fit fit;
    fit.ranks = FitRanks(job, n, scratch);
    fit.shards = FitShards(job, scratch);
    if (static_cast<int>(fit.shards.size()) == Shards(job)) return fit;
  }
  return std::nullopt;
}

void AddTasks(const std::vector<SchedTask>& tasks, std::vector<Bin>& bins,
              const std::map<std::string, size_t>& bin_of, int sign) {
  for (const SchedTask& t : tasks) {
    auto it = bin_of.find(t.worker);
    if (it == bin_of.end()) continue;  // not ready: nothing goes there anyway
    Bin& b = bins[it->second];
    b.free_slots += sign * t.slots;
    b.free_gpus += sign * t.gpus;
    if (b.free_memory < kUnknownMemory) b.free_memory += sign * t.memory;
  }
}

Placement Take(const SchedJob& job, const Fit& fit, std::vector<Bin>& bins) {
  Placement placement;
  placement.job_id = job.id;
  for (size_t k = 0; k < fit.ranks.size(); ++k) {
    Bin& b = bins[fit.ranks[k]];
    b.free_slots -= RankSlots(job);
    b.free_gpus -= RankGpus(job);
    b.free_memory -= RankMemoryAt(job, k);
    placement.rank_workers.push_back(b.worker->id);
  }
  for (size_t i : fit.shards) {
    bins[i].free_slots -= ShardSlots(job);
    bins[i].free_memory -= ShardMemory(job);
    placement.shard_workers.push_back(bins[i].worker->id);
  }
  return placement;
}

std::vector<SchedTask> TasksOf(const SchedJob& job, const Placement& p) {
  std::vector<SchedTask> tasks;
  for (size_t k = 0; k < p.rank_workers.size(); ++k) {
    tasks.push_back({p.rank_workers[k], RankSlots(job), RankGpus(job), RankMemoryAt(job, k)});
  }
  for (const std::string& w : p.shard_workers) {
    tasks.push_back({w, ShardSlots(job), 0, ShardMemory(job)});
  }
  return tasks;
}

std::vector<Bin> WithComing(const std::vector<Bin>& free_bins, const std::vector<Bin>& coming) {
  std::vector<Bin> out = free_bins;
  for (size_t i = 0; i < out.size(); ++i) {
    out[i].free_slots += coming[i].free_slots;
    out[i].free_gpus += coming[i].free_gpus;
    if (out[i].free_memory < kUnknownMemory) out[i].free_memory += coming[i].free_memory;
    out[i].ranks = out[i].shards = 0;
  }
  return out;
}

}  // namespace trainyard::placement
