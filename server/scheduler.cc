#include "server/scheduler.h"

#include <algorithm>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace trainyard {
namespace {

// Capacity one rank of `job` takes, counted in its unit (slots or GPUs).
bool UsesGpus(const SchedJob& job) { return job.gpus_per_rank > 0; }
int UnitsPerRank(const SchedJob& job) {
  return UsesGpus(job) ? job.gpus_per_rank : std::max(job.slots_per_rank, 1);
}

struct Bin {
  const SchedWorker* worker;
  int free;      // units left in this pass
  int assigned;  // ranks of the current job placed here
};

// Places up to job.max_ranks ranks greedily over `bins` and returns the worker per rank. Each
// rank goes to the worker with the fewest ranks of this job so far, then the most free units,
// then the lowest id: distinct workers first, the emptiest first.
std::vector<std::string> Fit(const SchedJob& job, std::vector<Bin> bins) {
  const int need = UnitsPerRank(job);
  std::vector<std::string> ranks;
  while (static_cast<int>(ranks.size()) < job.max_ranks) {
    Bin* best = nullptr;
    for (Bin& b : bins) {
      if (b.free < need) continue;
      if (best == nullptr || std::make_tuple(b.assigned, -b.free, b.worker->id) <
                                 std::make_tuple(best->assigned, -best->free, best->worker->id)) {
        best = &b;
      }
    }
    if (best == nullptr) break;
    best->free -= need;
    best->assigned++;
    ranks.push_back(best->worker->id);
  }
  return ranks;
}

std::string Units(int n, bool gpus) {
  if (gpus) return absl::StrCat(n, n == 1 ? " GPU" : " GPUs");
  return absl::StrCat(n, n == 1 ? " slot" : " slots");
}

}  // namespace

ScheduleDecision Schedule(std::vector<SchedJob> jobs, const std::vector<SchedWorker>& workers) {
  std::stable_sort(jobs.begin(), jobs.end(), [](const SchedJob& a, const SchedJob& b) {
    if (a.priority != b.priority) return a.priority > b.priority;
    return a.seq < b.seq;
  });
  std::vector<Bin> free_bins;
  std::vector<Bin> empty_bins;
  std::map<std::string, std::pair<int, int>> remaining;  // worker id -> (free slots, free GPUs)
  for (const SchedWorker& w : workers) {
    if (!w.ready) continue;
    remaining[w.id] = {std::max(w.free_slots, 0), std::max(w.free_gpus, 0)};
    free_bins.push_back({&w, 0, 0});
    empty_bins.push_back({&w, 0, 0});
  }

  ScheduleDecision decision;
  std::string blocked_by;  // the first job waiting for capacity; everything after it waits too
  for (const SchedJob& job : jobs) {
    const bool gpus = UsesGpus(job);
    const int need = UnitsPerRank(job);
    for (Bin& b : empty_bins) {
      b.free = gpus ? b.worker->total_gpus : b.worker->total_slots;
      b.assigned = 0;
    }
    if (empty_bins.empty()) {
      decision.pending_reasons[job.id] =
          workers.empty() ? "no workers registered" : "no ready workers";
      continue;
    }
    // Would the job fit the whole cluster with nothing else running?
    const int fits_empty = static_cast<int>(Fit(job, empty_bins).size());
    if (fits_empty < job.min_ranks) {
      int largest = 0;
      int total = 0;
      for (const Bin& b : empty_bins) {
        largest = std::max(largest, b.free);
        total += b.free;
      }
      if (gpus && largest < need) {
        decision.pending_reasons[job.id] =
            absl::StrCat("needs ", need, " GPUs per rank; the largest worker has ", largest);
      } else {
        decision.pending_reasons[job.id] =
            absl::StrCat("needs ", job.min_ranks, " ranks of ", Units(need, gpus),
                         "; the cluster has ", Units(total, gpus));
      }
      continue;
    }
    if (!blocked_by.empty()) {
      decision.pending_reasons[job.id] =
          absl::StrCat("queued behind ", blocked_by, " (no backfill)");
      continue;
    }
    for (Bin& b : free_bins) {
      const auto& [slots, gpus_left] = remaining[b.worker->id];
      b.free = gpus ? gpus_left : slots;
      b.assigned = 0;
    }
    std::vector<std::string> ranks = Fit(job, free_bins);
    if (job.batch_size > 0) {
      // Dropping the last-placed ranks keeps the spread of the others.
      while (ranks.size() > 0 && job.batch_size % static_cast<int>(ranks.size()) != 0) {
        ranks.pop_back();
      }
    }
    if (static_cast<int>(ranks.size()) < job.min_ranks) {
      int free_total = 0;
      for (const Bin& b : free_bins) free_total += b.free;
      decision.pending_reasons[job.id] =
          absl::StrCat("waiting for capacity: needs ", Units(job.min_ranks * need, gpus), ", ",
                       free_total, " free");
      blocked_by = job.id;
      continue;
    }
    // Take the capacity so later jobs in this pass see only what is left.
    for (const std::string& worker_id : ranks) {
      auto& [slots, gpus_left] = remaining[worker_id];
      if (gpus) {
        gpus_left -= need;
      } else {
        slots -= need;
      }
    }
    decision.placements.push_back({job.id, std::move(ranks)});
  }
  return decision;
}

}  // namespace trainyard
