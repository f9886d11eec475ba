#ifndef TRAINYARD_SERVER_SCHEDULER_H_
#define TRAINYARD_SERVER_SCHEDULER_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace trainyard {

// What the scheduler needs to know about a pending job.
struct SchedJob {
  std::string id;
  int priority = 0;
  int64_t seq = 0;    // submission order
  int min_ranks = 1;  // gang: place at least this many ranks at once, or none
  int max_ranks = 1;
  int slots_per_rank = 1;  // a CPU rank takes at least 1; a GPU rank may take 0
  int gpus_per_rank = 0;
  int64_t memory_per_rank = 0;  // bytes reserved per rank (resources.memory); 0 = none
  // When > 0 the rank count must divide it (the global batch is split evenly across ranks): an
  // elastic job gets the largest such count that fits, never fewer than min_ranks.
  int batch_size = 0;
  // Parameter-server shards placed with the ranks, all or nothing, each taking slots_per_shard
  // slots (never GPUs).
  int shards = 0;
  int slots_per_shard = 1;
  int64_t memory_per_shard = 0;
  // Set: only workers whose `runtime` is one of these can run it (its models need operators some
  // LibTorch lacks), and `runtime_reason` says why it waits when no ready worker can.
  std::optional<std::vector<std::string>> runtimes;
  std::string runtime_reason;
};

// A worker's capacity. Only READY workers take new ranks.
struct SchedWorker {
  std::string id;
  bool ready = true;
  int total_slots = 0;
  int total_gpus = 0;
  int free_slots = 0;
  int free_gpus = 0;
  // Memory its tasks may reserve; 0 = the agent did not say (memory then places nothing there
  // that reserves some).
  int64_t total_memory = 0;
  int64_t free_memory = 0;
  std::string runtime;  // what its trainer runs, as SchedJob::runtimes names it; empty: unknown
};

struct Placement {
  std::string job_id;
  std::vector<std::string> rank_workers;   // rank i runs on rank_workers[i]
  std::vector<std::string> shard_workers;  // shard i runs on shard_workers[i]
};

struct ScheduleDecision {
  std::vector<Placement> placements;
  // Why each pending job that was not placed is still waiting.
  absl::flat_hash_map<std::string, std::string> pending_reasons;
  // Those of them that cannot run on the cluster as it is, even empty (too large, or no ready
  // worker at all): nothing but a change of workers can place them.
  std::vector<std::string> unfit;
};

// Pure placement policy; no state, no clock, thread-compatible.
//
// A job with `runtimes` set goes only to workers whose runtime is among them, and counts only
// their capacity.
// Jobs go in order of priority (higher first), then submission order. A job is placed with as
// many ranks as fit between min_ranks and max_ranks and all its shards, all in one decision (gang
// scheduling); ranks spread over distinct workers where possible, most free capacity first, and
// shards likewise over what the ranks left, fewest shards of the job per worker first. A job too
// large for the whole cluster, even empty, is skipped with a reason and does not hold up others. A
// job that would fit an empty cluster but not the capacity free now blocks every job after it:
// there is no backfilling, so small jobs cannot starve a large one by always taking the capacity it
// waits for.
ScheduleDecision Schedule(std::vector<SchedJob> jobs, const std::vector<SchedWorker>& workers);

}  // namespace trainyard

#endif  // TRAINYARD_SERVER_SCHEDULER_H_
