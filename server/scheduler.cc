#include "server/scheduler.h"

#include <algorithm>
#include <map>
#include <optional>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/byte_size.h"

namespace trainyard {
namespace {

// The free memory of a worker that did not say how much it has: more than any task reserves.
constexpr int64_t kUnknownMemory = int64_t{1} << 60;

// What one rank and one shard of `job` take.
bool UsesGpus(const SchedJob& job) { return job.gpus_per_rank > 0; }
int RankSlots(const SchedJob& job) {
  return UsesGpus(job) ? std::max(job.slots_per_rank, 0) : std::max(job.slots_per_rank, 1);
}
int64_t RankMemory(const SchedJob& job) { return std::max<int64_t>(job.memory_per_rank, 0); }
int64_t ShardMemory(const SchedJob& job) { return std::max<int64_t>(job.memory_per_shard, 0); }
bool UsesMemory(const SchedJob& job) {
  return RankMemory(job) > 0 || (job.shards > 0 && ShardMemory(job) > 0);
}
int RankGpus(const SchedJob& job) { return UsesGpus(job) ? job.gpus_per_rank : 0; }
int ShardSlots(const SchedJob& job) { return std::max(job.slots_per_shard, 1); }
int Shards(const SchedJob& job) { return std::max(job.shards, 0); }

struct Bin {
  const SchedWorker* worker;
  int free_slots;
  int free_gpus;
  int64_t free_memory;
  int ranks = 0;   // ranks of the current job placed here
  int shards = 0;  // shards of the current job placed here
};

// Whether the worker's trainer can run the job's models.
bool RunsOn(const SchedJob& job, const SchedWorker& worker) {
  if (!job.runtimes.has_value()) return true;
  return std::find(job.runtimes->begin(), job.runtimes->end(), worker.runtime) !=
         job.runtimes->end();
}

// Places up to `count` ranks greedily over `bins` (taking their capacity) and returns the bin of
// each. Each rank goes to the worker with the fewest ranks of this job so far, then the most free
// units of the rank's kind, then the lowest id: distinct workers first, the emptiest first.
std::vector<size_t> FitRanks(const SchedJob& job, int count, std::vector<Bin>& bins) {
  const int slots = RankSlots(job);
  const int gpus = RankGpus(job);
  const int64_t memory = RankMemory(job);
  const bool by_gpus = UsesGpus(job);
  std::vector<size_t> placed;
  while (static_cast<int>(placed.size()) < count) {
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

struct Fit {
  std::vector<size_t> ranks;   // bin per rank
  std::vector<size_t> shards;  // bin per shard
};

// The most ranks (between min_ranks and max_ranks, dividing the batch) that fit together with
// every shard, or nullopt.
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

std::string Units(int n, absl::string_view one, absl::string_view many) {
  return absl::StrCat(n, " ", n == 1 ? one : many);
}
std::string Slots(int n) { return Units(n, "slot", "slots"); }
std::string Gpus(int n) { return Units(n, "GPU", "GPUs"); }

// "1 slot", "2 GPUs", "2 GPUs, 4 slots and 8.0 GiB": what one task takes.
std::string TaskNeeds(int slots, int gpus, int64_t memory) {
  std::vector<std::string> parts;
  if (gpus > 0) parts.push_back(Gpus(gpus));
  if (slots > 0 || gpus == 0) parts.push_back(Slots(slots));
  if (memory > 0) parts.push_back(HumanBytes(memory));
  if (parts.size() == 1) return parts[0];
  const std::string last = parts.back();
  parts.pop_back();
  return absl::StrCat(absl::StrJoin(parts, ", "), " and ", last);
}

// "2 ranks of 1 slot and 2 parameter-server shards of 1 slot".
std::string Needs(const SchedJob& job) {
  std::string out = absl::StrCat(job.min_ranks, " ranks of ",
                                 UsesGpus(job) && RankSlots(job) == 0 && RankMemory(job) == 0
                                     ? Gpus(RankGpus(job))
                                     : TaskNeeds(RankSlots(job), RankGpus(job), RankMemory(job)));
  if (Shards(job) > 0) {
    absl::StrAppend(&out, " and ",
                    Units(Shards(job), "parameter-server shard", "parameter-server shards"), " of ",
                    TaskNeeds(ShardSlots(job), 0, ShardMemory(job)));
  }
  return out;
}

// "3 slots", "4 GPUs", "4 GPUs and 3 slots" or "3 slots and 12.0 GiB": the kinds of capacity the
// job uses.
std::string Capacity(const SchedJob& job, int slots, int gpus, int64_t memory) {
  const bool uses_slots = !UsesGpus(job) || Shards(job) > 0 || RankSlots(job) > 0;
  std::string out = !UsesGpus(job) ? Slots(slots)
                    : uses_slots   ? absl::StrCat(Gpus(gpus), " and ", Slots(slots))
                                   : Gpus(gpus);
  if (UsesMemory(job)) {
    absl::StrAppend(&out, UsesGpus(job) && uses_slots ? ", " : " and ", HumanBytes(memory),
                    " of memory");
  }
  return out;
}

// Why a job that does not fit the whole cluster, even empty, waits.
std::string UnfitReason(const SchedJob& job, const std::vector<Bin>& empty_bins) {
  int largest_gpus = 0;
  int64_t largest_memory = 0;
  int total_slots = 0;
  int total_gpus = 0;
  int64_t total_memory = 0;
  bool any = false;
  for (const Bin& b : empty_bins) {
    if (!RunsOn(job, *b.worker)) continue;
    any = true;
    largest_gpus = std::max(largest_gpus, b.free_gpus);
    largest_memory = std::max(largest_memory, b.free_memory);
    total_slots += b.free_slots;
    total_gpus += b.free_gpus;
    if (b.free_memory < kUnknownMemory) total_memory += b.free_memory;
  }
  if (!any) {
    return job.runtime_reason.empty() ? "no ready worker can run its model" : job.runtime_reason;
  }
  if (UsesGpus(job) && largest_gpus < RankGpus(job)) {
    return absl::StrCat("needs ", RankGpus(job), " GPUs per rank; the largest worker has ",
                        largest_gpus);
  }
  const int64_t task_memory = std::max(RankMemory(job), Shards(job) > 0 ? ShardMemory(job) : 0);
  if (task_memory > largest_memory) {
    return absl::StrCat("needs ", HumanBytes(task_memory), " of memory per ",
                        RankMemory(job) >= task_memory ? "rank" : "parameter-server shard",
                        "; the largest worker offers ", HumanBytes(largest_memory));
  }
  return absl::StrCat("needs ", Needs(job), "; the cluster has ",
                      Capacity(job, total_slots, total_gpus, total_memory));
}

}  // namespace

ScheduleDecision Schedule(std::vector<SchedJob> jobs, const std::vector<SchedWorker>& workers) {
  std::stable_sort(jobs.begin(), jobs.end(), [](const SchedJob& a, const SchedJob& b) {
    if (a.priority != b.priority) return a.priority > b.priority;
    return a.seq < b.seq;
  });
  std::vector<Bin> free_bins;  // what is free now, less what this pass placed
  std::vector<Bin> empty_bins;
  for (const SchedWorker& w : workers) {
    if (!w.ready) continue;
    // A worker that did not say its memory is not limited by it.
    const bool said = w.total_memory > 0;
    free_bins.push_back({&w, std::max(w.free_slots, 0), std::max(w.free_gpus, 0),
                         said ? std::max<int64_t>(w.free_memory, 0) : kUnknownMemory});
    empty_bins.push_back({&w, w.total_slots, w.total_gpus, said ? w.total_memory : kUnknownMemory});
  }

  ScheduleDecision decision;
  std::string blocked_by;  // the first job waiting for capacity; everything after it waits too
  // Whether a job of a shape fits the empty cluster (empty) or why not: jobs of a sweep share a
  // few shapes, so a long queue costs one lookup per job, not a placement over every worker.
  std::map<std::tuple<int, int, int, int, int64_t, int, int, int, int64_t, std::string>,
           std::string>
      fits_empty;
  std::string queued_behind;  // "queued behind JOB (no backfill)", once there is a blocker
  for (const SchedJob& job : jobs) {
    if (empty_bins.empty()) {
      decision.pending_reasons[job.id] =
          workers.empty() ? "no workers registered" : "no ready workers";
      decision.unfit.push_back(job.id);
      continue;
    }
    // Would the job fit the whole cluster with nothing else running?
    const std::string runtimes =
        job.runtimes.has_value() ? absl::StrCat("=", absl::StrJoin(*job.runtimes, ",")) : "";
    const auto shape = std::make_tuple(
        job.min_ranks, job.max_ranks, job.slots_per_rank, job.gpus_per_rank, job.memory_per_rank,
        job.batch_size, job.shards, job.slots_per_shard, job.memory_per_shard, runtimes);
    auto cached = fits_empty.find(shape);
    if (cached == fits_empty.end()) {
      cached =
          fits_empty
              .emplace(shape, Place(job, empty_bins).has_value() ? std::string()
                                                                 : UnfitReason(job, empty_bins))
              .first;
    }
    if (!cached->second.empty()) {
      decision.pending_reasons[job.id] = cached->second;
      decision.unfit.push_back(job.id);
      continue;
    }
    if (!blocked_by.empty()) {
      decision.pending_reasons[job.id] = queued_behind;
      continue;
    }
    for (Bin& b : free_bins) b.ranks = b.shards = 0;
    std::optional<Fit> fit = Place(job, free_bins);
    if (!fit.has_value()) {
      int free_slots = 0;
      int free_gpus = 0;
      int64_t free_memory = 0;
      for (const Bin& b : free_bins) {
        if (!RunsOn(job, *b.worker)) continue;
        free_slots += b.free_slots;
        free_gpus += b.free_gpus;
        if (b.free_memory < kUnknownMemory) free_memory += b.free_memory;
      }
      const int need_slots = job.min_ranks * RankSlots(job) + Shards(job) * ShardSlots(job);
      const int need_gpus = job.min_ranks * RankGpus(job);
      const int64_t need_memory = job.min_ranks * RankMemory(job) + Shards(job) * ShardMemory(job);
      // One kind of capacity needs no unit after what is free: "needs 3 slots, 2 free".
      const bool one_kind =
          !UsesMemory(job) && (!UsesGpus(job) || (Shards(job) == 0 && RankSlots(job) == 0));
      const std::string free = one_kind ? absl::StrCat(UsesGpus(job) ? free_gpus : free_slots)
                                        : Capacity(job, free_slots, free_gpus, free_memory);
      decision.pending_reasons[job.id] =
          absl::StrCat("waiting for capacity: needs ",
                       Capacity(job, need_slots, need_gpus, need_memory), ", ", free, " free");
      blocked_by = job.id;
      queued_behind = absl::StrCat("queued behind ", blocked_by, " (no backfill)");
      continue;
    }
    // Take the capacity so later jobs in this pass see only what is left.
    Placement placement;
    placement.job_id = job.id;
    for (size_t i : fit->ranks) {
      free_bins[i].free_slots -= RankSlots(job);
      free_bins[i].free_gpus -= RankGpus(job);
      free_bins[i].free_memory -= RankMemory(job);
      placement.rank_workers.push_back(free_bins[i].worker->id);
    }
    for (size_t i : fit->shards) {
      free_bins[i].free_slots -= ShardSlots(job);
      free_bins[i].free_memory -= ShardMemory(job);
      placement.shard_workers.push_back(free_bins[i].worker->id);
    }
    decision.placements.push_back(std::move(placement));
  }
  return decision;
}

}  // namespace trainyard
