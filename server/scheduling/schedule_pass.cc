#include "server/scheduling/schedule_pass.h"

#include <algorithm>
#include <climits>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace trainyard::scheduling {

using placement::AddTasks;
using placement::Bin;
using placement::Fit;
using placement::kUnknownMemory;
using placement::Place;
using placement::RankMemoryAt;
using placement::RankSlots;
using placement::RunsOn;
using placement::ShardMemory;
using placement::Shards;
using placement::Take;
using placement::TasksOf;
using placement::UsesGpus;
using placement::UsesMemory;
using placement::WithComing;

SchedulePass::SchedulePass(std::vector<SchedJob> jobs, const std::vector<SchedWorker>& workers,
                           const SchedContext& context)
    : jobs_(std::move(jobs)),
      workers_(workers),
      context_(context),
      policy_(context.policy),
      running_(context.running) {
  ReadWorkers();
  ReadQueues();
}

void SchedulePass::ReadWorkers() {
  for (const SchedWorker& w : workers_) {
    if (!w.ready) continue;
    // A worker that did not say its memory is not limited by it.
    const bool said = w.total_memory > 0;
    bin_of_[w.id] = free_bins_.size();
    free_bins_.push_back({&w, std::max(w.free_slots, 0), std::max(w.free_gpus, 0),
                          said ? std::max<int64_t>(w.free_memory, 0) : kUnknownMemory});
    empty_bins_.push_back(
        {&w, w.total_slots, w.total_gpus, said ? w.total_memory : kUnknownMemory});
    cluster_slots_ += w.total_slots;
    cluster_gpus_ += w.total_gpus;
  }
  coming_ = free_bins_;
  for (Bin& b : coming_) {
    b.free_slots = b.free_gpus = 0;
    b.free_memory = b.free_memory < kUnknownMemory ? 0 : kUnknownMemory;
  }
}

void SchedulePass::ReadQueues() {
  int listed_slots = 0;
  int listed_gpus = 0;
  for (const SchedQueue& q : context_.queues) {
    queues_[q.name].queue = q;
    if (q.name == kDefaultQueue) continue;
    listed_slots += q.quota_slots < 0 ? cluster_slots_ : q.quota_slots;
    listed_gpus += q.quota_gpus < 0 ? cluster_gpus_ : q.quota_gpus;
  }
  if (!queues_.count(kDefaultQueue)) {
    SchedQueue& q = queues_[kDefaultQueue].queue;
    q.name = kDefaultQueue;
    q.quota_slots = context_.queues.empty() ? -1 : std::max(cluster_slots_ - listed_slots, 0);
    q.quota_gpus = context_.queues.empty() ? -1 : std::max(cluster_gpus_ - listed_gpus, 0);
  }
  for (SchedRunning& r : running_) {
    if (r.stopping) {
      AddTasks(r.tasks, coming_, bin_of_, 1);
    } else {
      Hold(QueueOf(r.queue), r.tasks, 1);
    }
  }
  std::stable_sort(jobs_.begin(), jobs_.end(), [](const SchedJob& a, const SchedJob& b) {
    if (a.priority != b.priority) return a.priority > b.priority;
    return a.seq < b.seq;
  });
  for (const SchedJob& job : jobs_) QueueOf(job.queue).pending.push_back(&job);
  for (const auto& [name, q] : queues_) {
    decision_.queues[name] = {q.queue.quota_slots, q.queue.quota_gpus, 0, 0,
                              static_cast<int>(q.pending.size())};
  }
}

QueueState& SchedulePass::QueueOf(const std::string& name) {
  auto it = queues_.find(name);
  return it != queues_.end() ? it->second : queues_[kDefaultQueue];
}

double SchedulePass::Share(const QueueState& q) const {
  const double slots = cluster_slots_ > 0 ? double(q.used_slots) / cluster_slots_ : 0;
  const double gpus = cluster_gpus_ > 0 ? double(q.used_gpus) / cluster_gpus_ : 0;
  return std::max(slots, gpus) / std::max(q.queue.weight, 1e-9);
}

std::string SchedulePass::Behind(const QueueState& queue) const {
  if (reserved_queue_ == nullptr || reserved_queue_ == &queue || queues_.size() < 2) {
    return queued_behind_;
  }
  return absl::StrCat(queued_behind_, " of queue ", reserved_queue_->queue.name);
}

// The job that held the reservation last pass keeps it (goes first) until it starts, unless a
// job of higher priority now waits before it: otherwise the reservation would move between gangs
// as shares change, keeping capacity idle for each in turn and starting none.
const SchedJob* SchedulePass::Sticky() {
  if (context_.reserved_for.empty()) return nullptr;
  const SchedJob* sticky = nullptr;
  for (const SchedJob& job : jobs_) {
    if (job.id == context_.reserved_for) sticky = &job;
  }
  if (sticky == nullptr) return nullptr;
  for (const SchedJob& job : jobs_) {
    const bool rival = policy_.fair_share ? &QueueOf(job.queue) == &QueueOf(sticky->queue) : true;
    if (rival && job.priority > sticky->priority) return nullptr;
  }
  return sticky;
}

// Fair share between the queues' heads (those within their quota first, then the smallest
// weighted share), or priority and order across all.
QueueState* SchedulePass::NextQueue() {
  QueueState* pick = nullptr;
  std::tuple<int, double, int, int64_t> best;
  for (auto& [name, q] : queues_) {
    if (q.next >= q.pending.size()) continue;
    const SchedJob& head = *q.pending[q.next];
    std::tuple<int, double, int, int64_t> key{0, 0.0, -head.priority, head.seq};
    if (policy_.fair_share) {
      const Demand d = MinDemand(head);
      key = {q.FitsQuota(d.slots, d.gpus) ? 0 : 1, Share(q), -head.priority, head.seq};
    }
    if (pick == nullptr || key < best) {
      pick = &q;
      best = key;
    }
  }
  return pick;
}

ScheduleDecision SchedulePass::Run() {
  const SchedJob* sticky = Sticky();
  if (sticky != nullptr) {
    order_.push_back(sticky);
    Decide(*sticky, QueueOf(sticky->queue));
  }
  for (QueueState* queue = NextQueue(); queue != nullptr; queue = NextQueue()) {
    const SchedJob& job = *queue->pending[queue->next++];
    if (&job == sticky) continue;  // decided first
    order_.push_back(&job);
    Decide(job, *queue);
  }
  const std::set<std::string> unfit(decision_.unfit.begin(), decision_.unfit.end());
  for (const SchedJob* job : order_) {
    if (decision_.pending_reasons.count(job->id) && !unfit.count(job->id)) {
      decision_.waiting.push_back(job->id);
    }
  }
  for (const auto& [name, q] : queues_) {
    decision_.queues[name].used_slots = q.used_slots;
    decision_.queues[name].used_gpus = q.used_gpus;
  }
  return std::move(decision_);
}

void SchedulePass::Decide(const SchedJob& job, QueueState& queue) {
  std::string& reason = decision_.pending_reasons[job.id];
  if (!Admit(job, reason)) return;
  if (reserved_.has_value() && !policy_.backfill) {
    reason = Behind(queue) + " (no backfill)";
    return;
  }
  const std::optional<SchedJob> capped = WithinQueue(job, queue);
  if (PlaceNow(job, capped, queue, reason)) return;
  if (policy_.preemption && !queue.tried_preemption && Preempt(job, queue, reason)) return;
  if (!capped.has_value()) {
    reason = QuotaReason(job, queue);
    return;
  }
  if (reserved_.has_value()) {
    reason = Behind(queue);
    return;
  }
  Reserve(job, *capped, queue, reason);
}

bool SchedulePass::Admit(const SchedJob& job, std::string& reason) {
  if (empty_bins_.empty()) {
    reason = workers_.empty() ? "no workers registered" : "no ready workers";
    decision_.unfit.push_back(job.id);
    return false;
  }
  const std::string runtimes = absl::StrCat(
      job.runtimes.has_value() ? absl::StrCat("=", absl::StrJoin(*job.runtimes, ",")) : "", "|",
      absl::StrJoin(job.rank_memory, ","));
  const auto shape = std::make_tuple(
      job.min_ranks, job.max_ranks, job.slots_per_rank, job.gpus_per_rank, job.memory_per_rank,
      job.batch_size, job.shards, job.slots_per_shard, job.memory_per_shard, runtimes);
  auto cached = fits_empty_.find(shape);
  if (cached == fits_empty_.end()) {
    cached =
        fits_empty_
            .emplace(shape, Place(job, empty_bins_).has_value() ? std::string()
                                                                : UnfitReason(job, empty_bins_))
            .first;
  }
  if (!cached->second.empty()) {
    reason = cached->second;
    decision_.unfit.push_back(job.id);
    return false;
  }
  return true;
}

std::optional<SchedulePass::Bins> SchedulePass::LeavesRoom(const SchedJob& capped,
                                                           const Fit& fit) const {
  Bins after = reserve_bins_;
  Bins scratch = free_bins_;
  AddTasks(TasksOf(capped, Take(capped, fit, scratch)), after, bin_of_, -1);
  for (Bin& b : after) b.ranks = b.shards = 0;
  if (!Place(*reserved_, after).has_value()) return std::nullopt;
  return after;
}

bool SchedulePass::PlaceNow(const SchedJob& job, const std::optional<SchedJob>& capped,
                            QueueState& queue, std::string& reason) {
  for (Bin& b : free_bins_) b.ranks = b.shards = 0;
  std::optional<Fit> fit;
  if (capped.has_value()) fit = Place(*capped, free_bins_);
  if (!fit.has_value()) return false;
  if (reserved_.has_value()) {
    // Backfill: only if the reserved job still starts when it would: this one ends first, or the
    // reserved job still fits at its start without what this one holds.
    const bool ends_before = job.runtime_ms > 0 && reserved_start_known_ &&
                             context_.now_ms + job.runtime_ms <= decision_.reserved_start_ms;
    if (!ends_before) {
      std::optional<Bins> after = LeavesRoom(*capped, *fit);
      if (!after.has_value()) {
        // Greedy placement went where the reserved job will run: try around it.
        Bins around = free_bins_;
        AddTasks(reserved_tasks_, around, bin_of_, -1);
        for (Bin& b : around) {
          b.free_slots = std::max(b.free_slots, 0);
          b.free_gpus = std::max(b.free_gpus, 0);
          b.free_memory = std::max<int64_t>(b.free_memory, 0);
        }
        if (std::optional<Fit> other = Place(*capped, around); other.has_value()) {
          after = LeavesRoom(*capped, *other);
          if (after.has_value()) fit = std::move(other);
        }
      }
      if (!after.has_value()) {
        reason = Behind(queue) + " (running now would delay it)";
        return true;
      }
      reserve_bins_ = *std::move(after);
    }
  }
  Placement placement = Take(*capped, *fit, free_bins_);
  Hold(queue, TasksOf(*capped, placement), 1);
  decision_.pending_reasons.erase(job.id);
  decision_.placements.push_back(std::move(placement));
  return true;
}

bool SchedulePass::Legal(const std::vector<SchedRunning*>& chosen, const QueueState& queue) {
  // Each queue whose jobs are stopped stays over its quota without any one of its victims (jobs
  // are whole: the last may cross).
  std::map<QueueState*, std::vector<const SchedRunning*>> by_queue;
  for (SchedRunning* r : chosen) {
    if (&QueueOf(r->queue) != &queue) by_queue[&QueueOf(r->queue)].push_back(r);
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
}

// The capacity, its queue's limit, and other queues' victims only for a job within its own
// queue's quota.
std::optional<Fit> SchedulePass::FitsWithout(const SchedJob& job, const QueueState& queue,
                                             const Demand& need,
                                             const std::vector<SchedRunning*>& chosen) {
  if (!Legal(chosen, queue)) return std::nullopt;
  Bins plan = WithComing(free_bins_, coming_);
  QueueState mine = queue;
  bool borrowed = false;
  for (SchedRunning* r : chosen) {
    AddTasks(r->tasks, plan, bin_of_, 1);
    if (&QueueOf(r->queue) == &queue) {
      Hold(mine, r->tasks, -1);
    } else {
      borrowed = true;
    }
  }
  if (borrowed && !mine.FitsQuota(need.slots, need.gpus)) return std::nullopt;
  const std::optional<SchedJob> c = WithinQueue(job, mine);
  if (!c.has_value()) return std::nullopt;
  return Place(*c, plan);
}

// The head of each queue tries, once a pass (a long line costs one search per queue, not one per
// job).
bool SchedulePass::Preempt(const SchedJob& job, QueueState& queue, std::string& reason) {
  queue.tried_preemption = true;
  struct Victim {
    SchedRunning* job;
    bool borrowed;
  };
  std::vector<Victim> candidates;
  const Demand need = MinDemand(job);
  for (SchedRunning& r : running_) {
    if (r.stopping || !r.preemptible || r.protected_until_ms > context_.now_ms) continue;
    QueueState& rq = QueueOf(r.queue);
    if (&rq == &queue) {
      if (r.priority < job.priority) candidates.push_back({&r, false});
    } else if (rq.OverQuota()) {
      candidates.push_back({&r, true});
    }
  }
  // Nothing to search when even every candidate stopped would not make room.
  if (!candidates.empty()) {
    Bins all = WithComing(free_bins_, coming_);
    for (const Victim& v : candidates) AddTasks(v.job->tasks, all, bin_of_, 1);
    SchedJob smallest = job;
    smallest.max_ranks = smallest.min_ranks;
    if (!Place(smallest, all).has_value()) candidates.clear();
  }
  // Fewest and least disturbing first: borrowed capacity, low priority, small gangs, a recent
  // checkpoint, the newest.
  std::stable_sort(candidates.begin(), candidates.end(), [](const Victim& a, const Victim& b) {
    return std::make_tuple(!a.borrowed, a.job->priority, a.job->tasks.size(), -a.job->checkpoint_ms,
                           -a.job->seq) < std::make_tuple(!b.borrowed, b.job->priority,
                                                          b.job->tasks.size(),
                                                          -b.job->checkpoint_ms, -b.job->seq);
  });
  std::vector<SchedRunning*> chosen;
  std::optional<Fit> planned = FitsWithout(job, queue, need, chosen);
  // One victim that suffices alone, the first in that order, disturbs fewest gangs; else victims
  // in that order until it fits.
  for (const Victim& v : candidates) {
    if (planned.has_value()) break;
    if (std::optional<Fit> f = FitsWithout(job, queue, need, {v.job}); f.has_value()) {
      chosen = {v.job};
      planned = std::move(f);
    }
  }
  for (const Victim& v : candidates) {
    if (planned.has_value()) break;
    chosen.push_back(v.job);
    if (!Legal(chosen, queue)) {
      chosen.pop_back();
      continue;
    }
    planned = FitsWithout(job, queue, need, chosen);
  }
  if (!planned.has_value()) return false;
  // Never more gangs than needed: drop any victim it fits without, the last chosen first.
  for (size_t i = chosen.size(); i-- > 0;) {
    std::vector<SchedRunning*> fewer = chosen;
    fewer.erase(fewer.begin() + i);
    if (std::optional<Fit> f = FitsWithout(job, queue, need, fewer); f.has_value()) {
      chosen = std::move(fewer);
      planned = std::move(f);
    }
  }
  StopFor(job, queue, *planned, chosen, reason);
  return true;
}

void SchedulePass::StopFor(const SchedJob& job, QueueState& queue, const Fit& planned,
                           const std::vector<SchedRunning*>& chosen, std::string& reason) {
  std::vector<std::string> names;
  for (SchedRunning* r : chosen) {
    QueueState& rq = QueueOf(r->queue);
    std::string why = &rq == &queue
                          ? absl::StrCat("for ", job.id, " (priority ", job.priority, " over ",
                                         r->priority, " in queue ", queue.queue.name, ")")
                          : absl::StrCat("for ", job.id, " of queue ", queue.queue.name,
                                         ", which reclaims its quota from queue ", rq.queue.name);
    decision_.preemptions.push_back({r->id, job.id, std::move(why)});
    names.push_back(r->id);
    r->stopping = true;
    Hold(rq, r->tasks, -1);
    AddTasks(r->tasks, coming_, bin_of_, 1);
  }
  // The job will take the capacity coming free, then what is free: hold it so that no job behind
  // takes it meanwhile.
  Bins plan = WithComing(free_bins_, coming_);
  const std::optional<SchedJob> c = WithinQueue(job, queue);
  const Placement p = Take(*c, planned, plan);
  const std::vector<SchedTask> tasks = TasksOf(*c, p);
  for (const SchedTask& t : tasks) {
    Bin& from_coming = coming_[bin_of_.at(t.worker)];
    Bin& from_free = free_bins_[bin_of_.at(t.worker)];
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
  reason = names.empty() ? "waiting for stopping jobs to free its capacity"
                         : absl::StrCat("preempting ", absl::StrJoin(names, ", "),
                                        ": they save at a step they agree on and stop, then it "
                                        "starts");
}

void SchedulePass::Reserve(const SchedJob& job, const SchedJob& capped, QueueState& queue,
                           std::string& reason) {
  int free_slots = 0;
  int free_gpus = 0;
  int64_t free_memory = 0;
  for (const Bin& b : free_bins_) {
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
  reserved_ = capped;
  decision_.reserved_for = job.id;
  queued_behind_ = absl::StrCat("queued behind ", job.id);
  reserved_queue_ = &queue;
  // The capacity at each time a running job ends, the earliest first; what never ends by a known
  // time comes last (the reservation then has no start time, but still its workers).
  reserve_bins_ = WithComing(free_bins_, coming_);
  std::vector<const SchedRunning*> ending;
  for (const SchedRunning& r : running_) {
    if (!r.stopping) ending.push_back(&r);
  }
  std::stable_sort(ending.begin(), ending.end(), [](const SchedRunning* a, const SchedRunning* b) {
    return (a->end_ms > 0 ? a->end_ms : INT64_MAX) < (b->end_ms > 0 ? b->end_ms : INT64_MAX);
  });
  int64_t start = context_.now_ms;
  bool known = true;
  for (size_t i = 0; i <= ending.size(); ++i) {
    for (Bin& b : reserve_bins_) b.ranks = b.shards = 0;
    if (Place(capped, reserve_bins_).has_value()) break;
    if (i == ending.size()) break;
    AddTasks(ending[i]->tasks, reserve_bins_, bin_of_, 1);
    known = known && ending[i]->end_ms > 0;
    start = std::max(start, ending[i]->end_ms);
  }
  decision_.reserved_start_ms = known ? start : 0;
  reserved_start_known_ = known;
  for (Bin& b : reserve_bins_) b.ranks = b.shards = 0;
  if (std::optional<Fit> f = Place(capped, reserve_bins_); f.has_value()) {
    Bins scratch = reserve_bins_;
    reserved_tasks_ = TasksOf(capped, Take(capped, *f, scratch));
  }
}

}  // namespace trainyard::scheduling
