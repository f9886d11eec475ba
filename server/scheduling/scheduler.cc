#include "server/scheduling/scheduler.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/byte_size.h"
#include "server/scheduling/placement.h"
#include "server/scheduling/schedule_pass.h"

namespace trainyard {
namespace scheduling {
namespace {

using placement::AddTasks;
using placement::Bin;
using placement::Fit;
using placement::kUnknownMemory;
using placement::Place;
using placement::RankGpus;
using placement::RankMemory;
using placement::RankMemoryAt;
using placement::RankSlots;
using placement::RunsOn;
using placement::ShardMemory;
using placement::Shards;
using placement::ShardSlots;
using placement::Take;
using placement::TasksOf;
using placement::UsesGpus;
using placement::UsesMemory;
using placement::WithComing;

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

}  // namespace

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

Demand MinDemand(const SchedJob& job) {
  return {job.min_ranks * RankSlots(job) + Shards(job) * ShardSlots(job),
          job.min_ranks * RankGpus(job)};
}

// The job with at most as many ranks as its queue lets it have now; nullopt if not even its
// minimum.
std::optional<SchedJob> WithinQueue(const SchedJob& job, const QueueState& q) {
  if (!q.FitsLimit(MinDemand(job).slots, MinDemand(job).gpus, job.preemptible)) {
    return std::nullopt;
  }
  SchedJob capped = job;
  while (capped.max_ranks > capped.min_ranks &&
         !q.FitsLimit(capped.max_ranks * RankSlots(job) + Shards(job) * ShardSlots(job),
                      capped.max_ranks * RankGpus(job), job.preemptible)) {
    capped.max_ranks--;
  }
  return capped;
}

// "queue team-a is at its limit: it holds 4 slots of 2 slots of quota + 2 borrowed; the job needs
// 1".
std::string QuotaReason(const SchedJob& job, const QueueState& q) {
  const Demand d = MinDemand(job);
  const bool slots =
      !q.Within(QueueLimit(q.queue.quota_slots, q.queue.borrow_slots, job.preemptible),
                q.used_slots, d.slots);
  const char* unit = slots ? "slots" : "GPUs";
  std::string out = absl::StrCat(
      "queue ", q.queue.name, " is at its limit: it holds ", slots ? q.used_slots : q.used_gpus,
      " ", unit, " of ",
      QueueAllowance(slots ? q.queue.quota_slots : q.queue.quota_gpus,
                     slots ? q.queue.borrow_slots : q.queue.borrow_gpus, job.preemptible, unit),
      "; the job needs ", slots ? d.slots : d.gpus);
  if (!job.preemptible) absl::StrAppend(&out, " (not preemptible: within the quota only)");
  return out;
}

void Hold(QueueState& q, const std::vector<SchedTask>& tasks, int sign) {
  for (const SchedTask& t : tasks) {
    q.used_slots += sign * t.slots;
    q.used_gpus += sign * t.gpus;
  }
}

}  // namespace scheduling

int QueueLimit(int quota, int borrow, bool preemptible) {
  if (!preemptible) return quota;
  return quota < 0 || borrow < 0 ? -1 : quota + borrow;
}

std::string QueueAllowance(int quota, int borrow, bool preemptible, absl::string_view unit) {
  std::string out = absl::StrCat(quota, " ", unit, " of quota");
  if (preemptible && borrow > 0) absl::StrAppend(&out, " + ", borrow, " borrowed");
  return out;
}

ScheduleDecision Schedule(std::vector<SchedJob> jobs, const std::vector<SchedWorker>& workers,
                          const SchedContext& context) {
  return scheduling::SchedulePass(std::move(jobs), workers, context).Run();
}

}  // namespace trainyard
