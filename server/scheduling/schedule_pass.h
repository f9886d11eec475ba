#ifndef TRAINYARD_SERVER_SCHEDULING_SCHEDULE_PASS_H_
#define TRAINYARD_SERVER_SCHEDULING_SCHEDULE_PASS_H_

// One pass of the scheduler (Schedule in scheduler.h), as named passes over one context: the
// capacity and the queues read once; then, job by job in queue order (fair share between the
// queues' heads, else priority), admission (does it fit the empty cluster at all), placement now
// (with backfill behind a reservation), preemption, and the reservation for the head of the
// line. Internal to scheduling/: scheduler.cc holds the reasons' words and the queues' limits.

#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "server/scheduling/placement.h"
#include "server/scheduling/scheduler.h"

namespace trainyard::scheduling {

// What a job takes of a queue's quota at its smallest: its minimum ranks and every shard.
struct Demand {
  int slots = 0;
  int gpus = 0;
};
Demand MinDemand(const SchedJob& job);

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
std::optional<SchedJob> WithinQueue(const SchedJob& job, const QueueState& q);
// "queue team-a is at its limit: it holds 4 slots of 2 slots of quota + 2 borrowed; the job
// needs 1".
std::string QuotaReason(const SchedJob& job, const QueueState& q);
// Adds (sign 1) or removes (-1) what `tasks` hold to the queue's use.
void Hold(QueueState& q, const std::vector<SchedTask>& tasks, int sign);
// Why a job that does not fit the whole cluster, even empty, waits.
std::string UnfitReason(const SchedJob& job, const std::vector<placement::Bin>& empty_bins);
// "3 slots", "4 GPUs and 3 slots, 12.0 GiB of memory": the kinds of capacity the job uses.
std::string Capacity(const SchedJob& job, int slots, int gpus, int64_t memory);

class SchedulePass {
 public:
  SchedulePass(std::vector<SchedJob> jobs, const std::vector<SchedWorker>& workers,
               const SchedContext& context);
  ScheduleDecision Run();

 private:
  using Bins = std::vector<placement::Bin>;

  // The capacity: free now, when empty, and coming free from stopping jobs.
  void ReadWorkers();
  // The queues (the default one's quota being what the others leave), what running jobs hold of
  // them, and the pending jobs in each, by priority then submission.
  void ReadQueues();
  QueueState& QueueOf(const std::string& name);
  // The job that held the reservation last pass, unless one of higher priority now waits before
  // it; null when none.
  const SchedJob* Sticky();
  // Queue order: the queue whose head goes next, null when every queue is done.
  QueueState* NextQueue();
  double Share(const QueueState& q) const;
  // "queued behind big-3", and " of queue nlp" when another queue's job holds the line.
  std::string Behind(const QueueState& queue) const;

  // What becomes of one job: placed, preempting, holding the reservation or waiting with a
  // reason.
  void Decide(const SchedJob& job, QueueState& queue);
  // Admission: whether the job could run on the whole cluster with nothing else running;
  // otherwise the reason, and the job is unfit.
  bool Admit(const SchedJob& job, std::string& reason);
  // Placement now, behind a reservation only where it does not delay it (backfill): true when
  // placed or refused with the reason set; false to go on (preemption, reservation).
  bool PlaceNow(const SchedJob& job, const std::optional<SchedJob>& capped, QueueState& queue,
                std::string& reason);
  // The reservation's capacity with `capped` placed at `fit` too, where the reserved job still
  // fits; nullopt where it would not.
  std::optional<Bins> LeavesRoom(const SchedJob& capped, const placement::Fit& fit) const;
  // Preemption: stops the fewest, least disturbing jobs that make room; true when it did (the
  // reason set).
  bool Preempt(const SchedJob& job, QueueState& queue, std::string& reason);
  // Whether stopping `chosen` reclaims no more than other queues borrow.
  bool Legal(const std::vector<SchedRunning*>& chosen, const QueueState& queue);
  // Where the job fits with `chosen` stopped, within its queue's limits.
  std::optional<placement::Fit> FitsWithout(const SchedJob& job, const QueueState& queue,
                                            const Demand& need,
                                            const std::vector<SchedRunning*>& chosen);
  // Stops `chosen` for `job` and holds what it will take (`planned`) from the capacity coming
  // free, then from what is free.
  void StopFor(const SchedJob& job, QueueState& queue, const placement::Fit& planned,
               const std::vector<SchedRunning*>& chosen, std::string& reason);
  // The head of the line: why it waits, and a reservation at the earliest time it fits.
  void Reserve(const SchedJob& job, const SchedJob& capped, QueueState& queue, std::string& reason);

  std::vector<SchedJob> jobs_;
  const std::vector<SchedWorker>& workers_;
  const SchedContext& context_;
  const SchedPolicy& policy_;

  Bins free_bins_;  // what is free now, less what this pass placed
  Bins empty_bins_;
  Bins coming_;  // what stopping jobs hold: free once their ranks have saved and stopped
  std::map<std::string, size_t> bin_of_;
  int cluster_slots_ = 0;
  int cluster_gpus_ = 0;
  std::map<std::string, QueueState> queues_;
  std::vector<SchedRunning> running_;
  ScheduleDecision decision_;
  std::vector<const SchedJob*> order_;

  // Whether a job of a shape fits the empty cluster (empty) or why not: jobs of a sweep share a
  // few shapes, so a long queue costs one lookup per job, not a placement over every worker.
  std::map<std::tuple<int, int, int, int, int64_t, int, int, int, int64_t, std::string>,
           std::string>
      fits_empty_;
  // The reservation: the job it is for, and the capacity projected at its start, less what jobs
  // placed ahead of it by backfill still hold then.
  std::optional<SchedJob> reserved_;
  Bins reserve_bins_;
  std::vector<SchedTask> reserved_tasks_;  // where it will run
  bool reserved_start_known_ = false;
  std::string queued_behind_;
  const QueueState* reserved_queue_ = nullptr;
};

}  // namespace trainyard::scheduling

#endif  // TRAINYARD_SERVER_SCHEDULING_SCHEDULE_PASS_H_
