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

namespace trainyard {
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

// What a job takes of a queue's quota at its smallest: its minimum ranks and every shard.
struct Demand {
  int slots = 0;
  int gpus = 0;
};
Demand MinDemand(const SchedJob& job) {
  return {job.min_ranks * RankSlots(job) + Shards(job) * ShardSlots(job),
          job.min_ranks * RankGpus(job)};
}

// A queue during one pass.
struct QueueState {
  SchedQueue queue;  // limits as applied (negative: none)
  int used_slots = 0;
  int used_gpus = 0;
  std::vector<const SchedJob*> pending;  // priority, then submission order
  size_t next = 0;                       // the first not yet decided
  bool tried_preemption = false;         // this pass
  bool Within(int limit, int used, int more) const { return limit < 0 || used + more <= limit; }
  // Whether `more` fits the quota alone, and the quota plus borrowing.
  bool FitsQuota(int slots, int gpus) const {
    return Within(queue.quota_slots, used_slots, slots) &&
           Within(queue.quota_gpus, used_gpus, gpus);
  }
  bool FitsLimit(int slots, int gpus, bool preemptible) const {
    return Within(QueueLimit(queue.quota_slots, queue.borrow_slots, preemptible), used_slots,
                  slots) &&
           Within(QueueLimit(queue.quota_gpus, queue.borrow_gpus, preemptible), used_gpus, gpus);
  }
  bool OverQuota() const {
    return (queue.quota_slots >= 0 && used_slots > queue.quota_slots) ||
           (queue.quota_gpus >= 0 && used_gpus > queue.quota_gpus);
  }
};

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

}  // namespace

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
  const SchedPolicy& policy = context.policy;
  std::vector<Bin> free_bins;  // what is free now, less what this pass placed
  std::vector<Bin> empty_bins;
  std::map<std::string, size_t> bin_of;
  int cluster_slots = 0;
  int cluster_gpus = 0;
  for (const SchedWorker& w : workers) {
    if (!w.ready) continue;
    // A worker that did not say its memory is not limited by it.
    const bool said = w.total_memory > 0;
    bin_of[w.id] = free_bins.size();
    free_bins.push_back({&w, std::max(w.free_slots, 0), std::max(w.free_gpus, 0),
                         said ? std::max<int64_t>(w.free_memory, 0) : kUnknownMemory});
    empty_bins.push_back({&w, w.total_slots, w.total_gpus, said ? w.total_memory : kUnknownMemory});
    cluster_slots += w.total_slots;
    cluster_gpus += w.total_gpus;
  }
  // What stopping jobs hold: free once their ranks have saved and stopped.
  std::vector<Bin> coming = free_bins;
  for (Bin& b : coming) {
    b.free_slots = b.free_gpus = 0;
    b.free_memory = b.free_memory < kUnknownMemory ? 0 : kUnknownMemory;
  }

  // The queues, the default one's quota being what the others leave.
  std::map<std::string, QueueState> queues;
  int listed_slots = 0;
  int listed_gpus = 0;
  for (const SchedQueue& q : context.queues) {
    queues[q.name].queue = q;
    if (q.name == kDefaultQueue) continue;
    listed_slots += q.quota_slots < 0 ? cluster_slots : q.quota_slots;
    listed_gpus += q.quota_gpus < 0 ? cluster_gpus : q.quota_gpus;
  }
  if (!queues.count(kDefaultQueue)) {
    SchedQueue& q = queues[kDefaultQueue].queue;
    q.name = kDefaultQueue;
    q.quota_slots = context.queues.empty() ? -1 : std::max(cluster_slots - listed_slots, 0);
    q.quota_gpus = context.queues.empty() ? -1 : std::max(cluster_gpus - listed_gpus, 0);
  }
  auto queue_of = [&](const std::string& name) -> QueueState& {
    auto it = queues.find(name);
    return it != queues.end() ? it->second : queues[kDefaultQueue];
  };
  std::vector<SchedRunning> running = context.running;
  for (SchedRunning& r : running) {
    if (r.stopping) {
      AddTasks(r.tasks, coming, bin_of, 1);
    } else {
      Hold(queue_of(r.queue), r.tasks, 1);
    }
  }
  std::stable_sort(jobs.begin(), jobs.end(), [](const SchedJob& a, const SchedJob& b) {
    if (a.priority != b.priority) return a.priority > b.priority;
    return a.seq < b.seq;
  });
  for (const SchedJob& job : jobs) queue_of(job.queue).pending.push_back(&job);

  ScheduleDecision decision;
  for (const auto& [name, q] : queues) {
    decision.queues[name] = {q.queue.quota_slots, q.queue.quota_gpus, 0, 0,
                             static_cast<int>(q.pending.size())};
  }
  // Whether a job of a shape fits the empty cluster (empty) or why not: jobs of a sweep share a
  // few shapes, so a long queue costs one lookup per job, not a placement over every worker.
  std::map<std::tuple<int, int, int, int, int64_t, int, int, int, int64_t, std::string>,
           std::string>
      fits_empty;
  // The reservation: the job it is for, and the capacity projected at its start, less what jobs
  // placed ahead of it by backfill still hold then.
  std::optional<SchedJob> reserved;
  std::vector<Bin> reserve_bins;
  std::vector<SchedTask> reserved_tasks;  // where it will run
  bool reserved_start_known = false;
  std::string queued_behind;
  const QueueState* reserved_queue = nullptr;
  // "queued behind big-3", and " of queue nlp" when another queue's job holds the line.
  auto behind = [&](const QueueState& queue) {
    if (reserved_queue == nullptr || reserved_queue == &queue || queues.size() < 2) {
      return queued_behind;
    }
    return absl::StrCat(queued_behind, " of queue ", reserved_queue->queue.name);
  };
  auto share = [&](const QueueState& q) {
    const double slots = cluster_slots > 0 ? double(q.used_slots) / cluster_slots : 0;
    const double gpus = cluster_gpus > 0 ? double(q.used_gpus) / cluster_gpus : 0;
    return std::max(slots, gpus) / std::max(q.queue.weight, 1e-9);
  };
  // The job that held the reservation last pass keeps it (goes first) until it starts, unless a
  // job of higher priority now waits before it: otherwise the reservation would move between
  // gangs as shares change, keeping capacity idle for each in turn and starting none.
  const SchedJob* sticky = nullptr;
  if (!context.reserved_for.empty()) {
    for (const SchedJob& job : jobs) {
      if (job.id == context.reserved_for) sticky = &job;
    }
    if (sticky != nullptr) {
      for (const SchedJob& job : jobs) {
        const bool rival =
            policy.fair_share ? &queue_of(job.queue) == &queue_of(sticky->queue) : true;
        if (rival && job.priority > sticky->priority) sticky = nullptr;
        if (sticky == nullptr) break;
      }
    }
  }
  bool sticky_done = sticky == nullptr;
  std::vector<const SchedJob*> order;
  // What becomes of one job, taken in order: placed, preempting, holding the reservation or
  // waiting with a reason.
  auto decide = [&](const SchedJob& job, QueueState& queue) {
    std::string& reason = decision.pending_reasons[job.id];
    if (empty_bins.empty()) {
      reason = workers.empty() ? "no workers registered" : "no ready workers";
      decision.unfit.push_back(job.id);
      return;
    }
    // Would the job fit the whole cluster with nothing else running?
    const std::string runtimes = absl::StrCat(
        job.runtimes.has_value() ? absl::StrCat("=", absl::StrJoin(*job.runtimes, ",")) : "", "|",
        absl::StrJoin(job.rank_memory, ","));
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
      reason = cached->second;
      decision.unfit.push_back(job.id);
      return;
    }
    if (reserved.has_value() && !policy.backfill) {
      reason = behind(queue) + " (no backfill)";
      return;
    }
    for (Bin& b : free_bins) b.ranks = b.shards = 0;
    const std::optional<SchedJob> capped = WithinQueue(job, queue);
    std::optional<Fit> fit;
    if (capped.has_value()) fit = Place(*capped, free_bins);
    if (fit.has_value() && reserved.has_value()) {
      // Backfill: only if the reserved job still starts when it would: this one ends first, or
      // the reserved job still fits at its start without what this one holds.
      const bool ends_before = job.runtime_ms > 0 && reserved_start_known &&
                               context.now_ms + job.runtime_ms <= decision.reserved_start_ms;
      auto leaves_room = [&](const Fit& f) -> std::optional<std::vector<Bin>> {
        std::vector<Bin> after = reserve_bins;
        std::vector<Bin> scratch = free_bins;
        AddTasks(TasksOf(*capped, Take(*capped, f, scratch)), after, bin_of, -1);
        for (Bin& b : after) b.ranks = b.shards = 0;
        if (!Place(*reserved, after).has_value()) return std::nullopt;
        return after;
      };
      if (!ends_before) {
        std::optional<std::vector<Bin>> after = leaves_room(*fit);
        if (!after.has_value()) {
          // Greedy placement went where the reserved job will run: try around it.
          std::vector<Bin> around = free_bins;
          AddTasks(reserved_tasks, around, bin_of, -1);
          for (Bin& b : around) {
            b.free_slots = std::max(b.free_slots, 0);
            b.free_gpus = std::max(b.free_gpus, 0);
            b.free_memory = std::max<int64_t>(b.free_memory, 0);
          }
          if (std::optional<Fit> other = Place(*capped, around); other.has_value()) {
            after = leaves_room(*other);
            if (after.has_value()) fit = std::move(other);
          }
        }
        if (!after.has_value()) {
          reason = behind(queue) + " (running now would delay it)";
          return;
        }
        reserve_bins = *std::move(after);
      }
    }
    if (fit.has_value()) {
      Placement placement = Take(*capped, *fit, free_bins);
      Hold(queue, TasksOf(*capped, placement), 1);
      decision.pending_reasons.erase(job.id);
      decision.placements.push_back(std::move(placement));
      return;
    }
    // Preemption: stop what it may stop, fewest and least disturbing first. The head of each
    // queue tries, once a pass (a long line costs one search per queue, not one per job).
    if (policy.preemption && !queue.tried_preemption) {
      queue.tried_preemption = true;
      struct Victim {
        SchedRunning* job;
        bool borrowed;
      };
      std::vector<Victim> candidates;
      const Demand need = MinDemand(job);
      for (SchedRunning& r : running) {
        if (r.stopping || !r.preemptible || r.protected_until_ms > context.now_ms) continue;
        QueueState& rq = queue_of(r.queue);
        if (&rq == &queue) {
          if (r.priority < job.priority) candidates.push_back({&r, false});
        } else if (rq.OverQuota()) {
          candidates.push_back({&r, true});
        }
      }
      // Nothing to search when even every candidate stopped would not make room.
      if (!candidates.empty()) {
        std::vector<Bin> all = WithComing(free_bins, coming);
        for (const Victim& v : candidates) AddTasks(v.job->tasks, all, bin_of, 1);
        SchedJob smallest = job;
        smallest.max_ranks = smallest.min_ranks;
        if (!Place(smallest, all).has_value()) candidates.clear();
      }
      std::stable_sort(candidates.begin(), candidates.end(), [](const Victim& a, const Victim& b) {
        return std::make_tuple(!a.borrowed, a.job->priority, a.job->tasks.size(),
                               -a.job->checkpoint_ms, -a.job->seq) <
               std::make_tuple(!b.borrowed, b.job->priority, b.job->tasks.size(),
                               -b.job->checkpoint_ms, -b.job->seq);
      });
      // Whether stopping `chosen` reclaims no more than other queues borrow: each of those queues
      // stays over its quota without any one of its victims (jobs are whole: the last may cross).
      auto legal = [&](const std::vector<SchedRunning*>& chosen) {
        std::map<QueueState*, std::vector<const SchedRunning*>> by_queue;
        for (SchedRunning* r : chosen) {
          if (&queue_of(r->queue) != &queue) by_queue[&queue_of(r->queue)].push_back(r);
        }
        for (const auto& [q, victims] : by_queue) {
          QueueState left = *q;
          for (const SchedRunning* r : victims) Hold(left, r->tasks, -1);
          for (const SchedRunning* r : victims) {
            QueueState back = left;
            Hold(back, r->tasks, 1);
            if (!back.OverQuota()) return false;
          }
        }
        return true;
      };
      // Whether the job fits with `chosen` stopped: the capacity, its queue's limit, and other
      // queues' victims only for a job within its own queue's quota.
      auto fits_without = [&](const std::vector<SchedRunning*>& chosen) -> std::optional<Fit> {
        if (!legal(chosen)) return std::nullopt;
        std::vector<Bin> plan = WithComing(free_bins, coming);
        QueueState mine = queue;
        bool borrowed = false;
        for (SchedRunning* r : chosen) {
          AddTasks(r->tasks, plan, bin_of, 1);
          if (&queue_of(r->queue) == &queue) {
            Hold(mine, r->tasks, -1);
          } else {
            borrowed = true;
          }
        }
        if (borrowed && !mine.FitsQuota(need.slots, need.gpus)) return std::nullopt;
        const std::optional<SchedJob> c = WithinQueue(job, mine);
        if (!c.has_value()) return std::nullopt;
        return Place(*c, plan);
      };
      std::vector<SchedRunning*> chosen;
      std::optional<Fit> planned = fits_without(chosen);
      // One victim that suffices alone, the first in that order, disturbs fewest gangs; else
      // victims in that order until it fits.
      for (const Victim& v : candidates) {
        if (planned.has_value()) break;
        if (std::optional<Fit> f = fits_without({v.job}); f.has_value()) {
          chosen = {v.job};
          planned = std::move(f);
        }
      }
      for (const Victim& v : candidates) {
        if (planned.has_value()) break;
        chosen.push_back(v.job);
        if (!legal(chosen)) {
          chosen.pop_back();
          continue;
        }
        planned = fits_without(chosen);
      }
      if (planned.has_value()) {
        // Never more gangs than needed: drop any victim it fits without, the last chosen first.
        for (size_t i = chosen.size(); i-- > 0;) {
          std::vector<SchedRunning*> fewer = chosen;
          fewer.erase(fewer.begin() + i);
          if (std::optional<Fit> f = fits_without(fewer); f.has_value()) {
            chosen = std::move(fewer);
            planned = std::move(f);
          }
        }
        std::vector<std::string> names;
        for (SchedRunning* r : chosen) {
          QueueState& rq = queue_of(r->queue);
          std::string why =
              &rq == &queue ? absl::StrCat("for ", job.id, " (priority ", job.priority, " over ",
                                           r->priority, " in queue ", queue.queue.name, ")")
                            : absl::StrCat("for ", job.id, " of queue ", queue.queue.name,
                                           ", which reclaims its quota from queue ", rq.queue.name);
          decision.preemptions.push_back({r->id, job.id, std::move(why)});
          names.push_back(r->id);
          r->stopping = true;
          Hold(rq, r->tasks, -1);
          AddTasks(r->tasks, coming, bin_of, 1);
        }
        // The job will take the capacity coming free, then what is free: hold it so that no job
        // behind takes it meanwhile.
        std::vector<Bin> plan = WithComing(free_bins, coming);
        const std::optional<SchedJob> c = WithinQueue(job, queue);
        const Placement p = Take(*c, *planned, plan);
        const std::vector<SchedTask> tasks = TasksOf(*c, p);
        for (const SchedTask& t : tasks) {
          Bin& from_coming = coming[bin_of.at(t.worker)];
          Bin& from_free = free_bins[bin_of.at(t.worker)];
          const int slots = std::min(t.slots, from_coming.free_slots);
          const int gpus = std::min(t.gpus, from_coming.free_gpus);
          from_coming.free_slots -= slots;
          from_coming.free_gpus -= gpus;
          from_free.free_slots -= t.slots - slots;
          from_free.free_gpus -= t.gpus - gpus;
          if (from_coming.free_memory < kUnknownMemory) {
            const int64_t memory = std::min(t.memory, from_coming.free_memory);
            from_coming.free_memory -= memory;
            from_free.free_memory -= t.memory - memory;
          }
        }
        Hold(queue, tasks, 1);
        reason = names.empty()
                     ? "waiting for stopping jobs to free its capacity"
                     : absl::StrCat("preempting ", absl::StrJoin(names, ", "),
                                    ": they save at a step they agree on and stop, then it starts");
        return;
      }
    }
    if (!capped.has_value()) {
      reason = QuotaReason(job, queue);
      return;
    }
    if (reserved.has_value()) {
      reason = behind(queue);
      return;
    }
    // The head of the line: why it waits, and a reservation at the earliest time it fits.
    int free_slots = 0;
    int free_gpus = 0;
    int64_t free_memory = 0;
    for (const Bin& b : free_bins) {
      if (!RunsOn(job, *b.worker)) continue;
      free_slots += b.free_slots;
      free_gpus += b.free_gpus;
      if (b.free_memory < kUnknownMemory) free_memory += b.free_memory;
    }
    const Demand need = MinDemand(job);
    int64_t need_memory = Shards(job) * ShardMemory(job);
    for (int k = 0; k < job.min_ranks; ++k) need_memory += RankMemoryAt(job, k);
    // One kind of capacity needs no unit after what is free: "needs 3 slots, 2 free".
    const bool one_kind =
        !UsesMemory(job) && (!UsesGpus(job) || (Shards(job) == 0 && RankSlots(job) == 0));
    const std::string free = one_kind ? absl::StrCat(UsesGpus(job) ? free_gpus : free_slots)
                                      : Capacity(job, free_slots, free_gpus, free_memory);
    reason = absl::StrCat("waiting for capacity: needs ",
                          Capacity(job, need.slots, need.gpus, need_memory), ", ", free, " free");
    reserved = *capped;
    decision.reserved_for = job.id;
    queued_behind = absl::StrCat("queued behind ", job.id);
    reserved_queue = &queue;
    // The capacity at each time a running job ends, the earliest first; what never ends by a
    // known time comes last (the reservation then has no start time, but still its workers).
    reserve_bins = WithComing(free_bins, coming);
    std::vector<const SchedRunning*> ending;
    for (const SchedRunning& r : running) {
      if (!r.stopping) ending.push_back(&r);
    }
    std::stable_sort(
        ending.begin(), ending.end(), [](const SchedRunning* a, const SchedRunning* b) {
          return (a->end_ms > 0 ? a->end_ms : INT64_MAX) < (b->end_ms > 0 ? b->end_ms : INT64_MAX);
        });
    int64_t start = context.now_ms;
    bool known = true;
    for (size_t i = 0; i <= ending.size(); ++i) {
      for (Bin& b : reserve_bins) b.ranks = b.shards = 0;
      if (Place(*capped, reserve_bins).has_value()) break;
      if (i == ending.size()) break;
      AddTasks(ending[i]->tasks, reserve_bins, bin_of, 1);
      known = known && ending[i]->end_ms > 0;
      start = std::max(start, ending[i]->end_ms);
    }
    decision.reserved_start_ms = known ? start : 0;
    reserved_start_known = known;
    for (Bin& b : reserve_bins) b.ranks = b.shards = 0;
    if (std::optional<Fit> f = Place(*capped, reserve_bins); f.has_value()) {
      std::vector<Bin> scratch = reserve_bins;
      reserved_tasks = TasksOf(*capped, Take(*capped, *f, scratch));
    }
  };
  for (;;) {
    if (!sticky_done) {
      sticky_done = true;
      QueueState& queue = queue_of(sticky->queue);
      order.push_back(sticky);
      decide(*sticky, queue);
      continue;
    }
    // The next job: fair share between the queues' heads, or priority and order across all.
    QueueState* pick = nullptr;
    std::tuple<int, double, int, int64_t> best;
    for (auto& [name, q] : queues) {
      if (q.next >= q.pending.size()) continue;
      const SchedJob& head = *q.pending[q.next];
      std::tuple<int, double, int, int64_t> key{0, 0.0, -head.priority, head.seq};
      if (policy.fair_share) {
        const Demand d = MinDemand(head);
        key = {q.FitsQuota(d.slots, d.gpus) ? 0 : 1, share(q), -head.priority, head.seq};
      }
      if (pick == nullptr || key < best) {
        pick = &q;
        best = key;
      }
    }
    if (pick == nullptr) break;
    QueueState& queue = *pick;
    const SchedJob& job = *queue.pending[queue.next++];
    if (&job == sticky) continue;  // decided first
    order.push_back(&job);
    decide(job, queue);
  }
  const std::set<std::string> unfit(decision.unfit.begin(), decision.unfit.end());
  for (const SchedJob* job : order) {
    if (decision.pending_reasons.count(job->id) && !unfit.count(job->id)) {
      decision.waiting.push_back(job->id);
    }
  }
  for (const auto& [name, q] : queues) {
    decision.queues[name].used_slots = q.used_slots;
    decision.queues[name].used_gpus = q.used_gpus;
  }
  return decision;
}

}  // namespace trainyard
