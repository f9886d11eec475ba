#ifndef TRAINYARD_SERVER_SCHEDULING_SCHEDULER_H_
#define TRAINYARD_SERVER_SCHEDULING_SCHEDULER_H_

// Room scheduling/: pure placement policy (gang placement, queue order, fair share, preemption,
// backfill) over plain structs; it calls no other room of the coordinator and holds no state.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"

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
  // Set: rank i reserves rank_memory[i] instead (a pipeline's memory per stage).
  std::vector<int64_t> rank_memory;
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
  // The queue it was submitted to (empty: the default queue) and whether it may be preempted for
  // another job (`preemptible: false` runs only within its queue's quota).
  std::string queue;
  bool preemptible = true;
  // How long it runs once placed, when known (max_runtime, or what is left of a job that ran
  // before at the speed it ran): backfill runs a job ahead of the reserved one only when it
  // ends before the reservation or does not touch its capacity. 0: unknown.
  int64_t runtime_ms = 0;
};

// A queue: a share of the cluster, in slots and GPUs, that its jobs may use whatever others
// submit (their quota), more when others leave capacity idle (borrowing, up to a limit; taken
// back by preemption when its owner needs it), and a weight for fair share between queues that
// compete for the same capacity. Negative quotas and limits: no limit.
struct SchedQueue {
  std::string name;
  int quota_slots = -1;
  int quota_gpus = -1;
  int borrow_slots = -1;
  int borrow_gpus = -1;
  double weight = 1;
};

// One task of a running job: where it runs and what it holds there.
struct SchedTask {
  std::string worker;
  int slots = 0;
  int gpus = 0;
  int64_t memory = 0;
};

// A job that holds capacity now.
struct SchedRunning {
  std::string id;
  std::string queue;
  int priority = 0;
  int64_t seq = 0;
  bool preemptible = true;
  std::vector<SchedTask> tasks;
  // When it ends at the latest, as far as known (0: unknown); what a reservation counts on.
  int64_t end_ms = 0;
  // When it last committed a checkpoint (0: never): the most recently checkpointed victim
  // loses least time to its save.
  int64_t checkpoint_ms = 0;
  // Already told to stop (preempted, restarting, ended): its capacity comes free by itself, and it
  // is not chosen as a victim again.
  bool stopping = false;
  // Not preempted before this time (0: no such protection): a job the scheduler preempted runs a
  // while after it resumes, so that reclaims and priorities cannot bounce it back and forth.
  int64_t protected_until_ms = 0;
};

// The policies on top of gang placement, each of which can be turned off (bench/scheduler_sim
// compares them).
struct SchedPolicy {
  bool backfill = true;
  bool fair_share = true;
  bool preemption = true;
};

// Everything besides the pending jobs and the workers.
struct SchedContext {
  int64_t now_ms = 0;
  // The queues; a job of a queue not listed is in the default queue, whose quota is what the
  // listed queues' quotas leave of the cluster (all of it when none is listed).
  std::vector<SchedQueue> queues;
  std::vector<SchedRunning> running;
  SchedPolicy policy;
  // The job the last pass reserved for (ScheduleDecision::reserved_for): it keeps the
  // reservation, deciding first, until it starts or a job of higher priority comes before it.
  std::string reserved_for;
};

// The most a queue's jobs may hold of one resource: quota plus borrowing limit, or the quota
// alone for a job that is not preemptible (negative: no limit).
int QueueLimit(int quota, int borrow, bool preemptible);
// "4 slots of quota + 2 borrowed": that limit in words, for a quota and borrowing limit of at
// least 0.
std::string QueueAllowance(int quota, int borrow, bool preemptible, absl::string_view unit);

// The name of the queue a job with no queue goes to.
inline constexpr char kDefaultQueue[] = "default";

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

// A running job the scheduler stops (every rank saves at a step they agree on) so that `for_job`
// can run; it goes back to its queue and resumes where it saved.
struct Preemption {
  std::string victim;
  std::string for_job;
  std::string reason;  // "for job-9 (priority 10 over 0 in queue default)"
};

// A queue's quota (as the scheduler applies it: the default queue's is what the others leave) and
// what its jobs hold and wait for after a pass.
struct QueueUsage {
  int quota_slots = 0;  // -1: no limit
  int quota_gpus = 0;
  int used_slots = 0;  // running and placed by this pass, less what is stopping
  int used_gpus = 0;
  int pending = 0;
};

struct ScheduleDecision {
  std::vector<Placement> placements;
  std::map<std::string, QueueUsage> queues;  // every queue listed, and the default one
  std::vector<Preemption> preemptions;
  // The job at the head of the line that does not fit now: capacity is held for it, and jobs
  // behind it run first only when that does not delay it. Its start, where every job it waits
  // for has a known end (0: unknown).
  std::string reserved_for;
  int64_t reserved_start_ms = 0;
  // Why each pending job that was not placed is still waiting.
  absl::flat_hash_map<std::string, std::string> pending_reasons;
  // Those of them that cannot run on the cluster as it is, even empty (too large, or no ready
  // worker at all): nothing but a change of workers can place them.
  std::vector<std::string> unfit;
  // The jobs that wait and could run on this cluster, in the order the pass considered them:
  // their places in line.
  std::vector<std::string> waiting;
};

// Pure placement policy; no state, no clock (the time is `context.now_ms`), thread-compatible.
//
// Placement: a job is placed with as many ranks as fit between min_ranks and max_ranks and all
// its shards, all in one decision (gang scheduling); ranks spread over distinct workers where
// possible, most free capacity first, and shards likewise over what the ranks left, fewest shards
// of the job per worker first. A job with `runtimes` set goes only to workers whose runtime is
// among them, and counts only their capacity. A job too large for the whole cluster, even empty,
// is skipped with a reason (`unfit`) and holds up no one.
//
// Order: within a queue, priority (higher first) then submission order. Between queues, jobs that
// fit their queue's quota go before jobs that would borrow, and among those the queue with the
// lowest dominant share (its larger fraction of the cluster's slots or GPUs, over its weight)
// goes first, one job at a time (fair share; off: priority then submission order across queues).
// A job beyond its queue's quota plus borrowing limit waits.
//
// Preemption: a job that does not fit now may stop running jobs of its own queue with a lower
// priority, and, when it fits its queue's quota, jobs that other queues run beyond theirs
// (borrowed capacity first, then the lowest priority, the smallest gangs, the most recently
// checkpointed), never more than it needs and never a job that is not preemptible. It then
// waits for them to save and stop; capacity already stopping counts as coming free.
//
// Reservation and backfill: the first job that still does not fit holds a reservation: the
// earliest time it fits once running jobs end (their end_ms), on the workers it would then use.
// A job behind it runs now only if that does not delay it: it ends before the reservation, or the
// reserved job still fits at its time without the capacity this one takes. Without backfill, every
// job behind the first that waits for capacity waits too.
ScheduleDecision Schedule(std::vector<SchedJob> jobs, const std::vector<SchedWorker>& workers,
                          const SchedContext& context);
inline ScheduleDecision Schedule(std::vector<SchedJob> jobs,
                                 const std::vector<SchedWorker>& workers) {
  return Schedule(std::move(jobs), workers, SchedContext{});
}

}  // namespace trainyard

#endif  // TRAINYARD_SERVER_SCHEDULING_SCHEDULER_H_
