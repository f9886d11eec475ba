// The scheduler's sharing policies: queues with quotas and borrowing, fair share, preemption and
// backfill with a reservation, on a fake clock (SchedContext::now_ms).
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/scheduling/scheduler.h"

namespace trainyard {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

SchedJob Job(const std::string& id, int64_t seq, const std::string& queue, int ranks = 1,
             int priority = 0) {
  SchedJob j;
  j.id = id;
  j.seq = seq;
  j.queue = queue;
  j.min_ranks = j.max_ranks = ranks;
  j.priority = priority;
  return j;
}

SchedJob GpuJob(const std::string& id, int64_t seq, const std::string& queue, int gpus) {
  SchedJob j = Job(id, seq, queue);
  j.slots_per_rank = 0;
  j.gpus_per_rank = gpus;
  return j;
}

SchedWorker Worker(const std::string& id, int slots, int gpus = 0) {
  SchedWorker w;
  w.id = id;
  w.total_slots = w.free_slots = slots;
  w.total_gpus = w.free_gpus = gpus;
  return w;
}

SchedQueue Queue(const std::string& name, int slots, int borrow = 0, double weight = 1,
                 int gpus = 0, int borrow_gpus = 0) {
  SchedQueue q;
  q.name = name;
  q.quota_slots = slots;
  q.borrow_slots = borrow;
  q.weight = weight;
  q.quota_gpus = gpus;
  q.borrow_gpus = borrow_gpus;
  return q;
}

// The scheduler's view of a cluster over time: running jobs hold capacity on their workers and
// end at their end_ms; preempted ones stop (their ranks saved) at the next Pass.
class Cluster {
 public:
  explicit Cluster(std::vector<SchedWorker> workers) : workers_(std::move(workers)) {}

  SchedContext context;

  void Run(const std::string& id, const std::string& queue, std::vector<std::string> on,
           int priority = 0, int64_t end_ms = 0, int64_t checkpoint_ms = 0, int slots = 1,
           int gpus = 0) {
    SchedRunning r;
    r.id = id;
    r.queue = queue;
    r.priority = priority;
    r.seq = ++seq_;
    r.end_ms = end_ms;
    r.checkpoint_ms = checkpoint_ms;
    for (const std::string& w : on) r.tasks.push_back({w, slots, gpus, 0});
    Hold(r.tasks, 1);
    context.running.push_back(std::move(r));
  }

  // One scheduling pass at `now_ms`: what ended by then frees its capacity first, preempted jobs
  // are stopping in this pass (as the coordinator marks them) and gone from the next, and
  // placements start running with `runtime_ms` of their job.
  ScheduleDecision Pass(int64_t now_ms, const std::vector<SchedJob>& pending) {
    context.now_ms = now_ms;
    std::vector<SchedRunning> still;
    for (SchedRunning& r : context.running) {
      if (r.stopping || (r.end_ms > 0 && r.end_ms <= now_ms)) {
        Hold(r.tasks, -1);
        stopped.push_back(r.id);
      } else {
        still.push_back(std::move(r));
      }
    }
    context.running = std::move(still);
    ScheduleDecision d = Schedule(pending, workers_, context);
    for (const Preemption& p : d.preemptions) {
      for (SchedRunning& r : context.running) {
        if (r.id == p.victim) r.stopping = true;
      }
    }
    for (const Placement& p : d.placements) {
      const SchedJob& job = *std::find_if(pending.begin(), pending.end(),
                                          [&](const SchedJob& j) { return j.id == p.job_id; });
      SchedRunning r;
      r.id = job.id;
      r.queue = job.queue;
      r.priority = job.priority;
      r.seq = job.seq;
      r.preemptible = job.preemptible;
      r.end_ms = job.runtime_ms > 0 ? now_ms + job.runtime_ms : 0;
      for (const std::string& w : p.rank_workers) {
        r.tasks.push_back({w, std::max(job.slots_per_rank, 0), job.gpus_per_rank, 0});
      }
      Hold(r.tasks, 1);
      context.running.push_back(std::move(r));
    }
    return d;
  }

  std::vector<std::string> stopped;

 private:
  void Hold(const std::vector<SchedTask>& tasks, int sign) {
    for (const SchedTask& t : tasks) {
      for (SchedWorker& w : workers_) {
        if (w.id != t.worker) continue;
        w.free_slots -= sign * t.slots;
        w.free_gpus -= sign * t.gpus;
      }
    }
  }

  std::vector<SchedWorker> workers_;
  int64_t seq_ = 1000;
};

std::vector<std::string> Placed(const ScheduleDecision& d) {
  std::vector<std::string> ids;
  for (const Placement& p : d.placements) ids.push_back(p.job_id);
  return ids;
}

std::vector<std::string> Victims(const ScheduleDecision& d) {
  std::vector<std::string> ids;
  for (const Preemption& p : d.preemptions) ids.push_back(p.victim);
  return ids;
}

TEST(QueueSchedulingTest, AQueueRunsWithinItsQuotaWithoutBorrowing) {
  Cluster c({Worker("w1", 2), Worker("w2", 2)});
  c.context.queues = {Queue("a", 2), Queue("b", 2)};
  ScheduleDecision d = c.Pass(0, {Job("a1", 1, "a"), Job("a2", 2, "a"), Job("a3", 3, "a")});
  EXPECT_THAT(Placed(d), ElementsAre("a1", "a2"));
  EXPECT_EQ(d.pending_reasons.at("a3"),
            "queue a is at its limit: it holds 2 slots of 2 slots of quota; the job needs 1");
  EXPECT_EQ(d.queues.at("a").used_slots, 2);
  EXPECT_EQ(d.queues.at("b").used_slots, 0);
  // The default queue's quota is what the listed queues leave: nothing here.
  EXPECT_EQ(d.queues.at("default").quota_slots, 0);
}

TEST(QueueSchedulingTest, BorrowsIdleCapacityUpToItsLimit) {
  Cluster c({Worker("w1", 3), Worker("w2", 3)});
  c.context.queues = {Queue("a", 2, /*borrow=*/2), Queue("b", 4)};
  std::vector<SchedJob> jobs;
  for (int i = 0; i < 6; ++i) jobs.push_back(Job("a" + std::to_string(i), i, "a"));
  ScheduleDecision d = c.Pass(0, jobs);
  EXPECT_THAT(Placed(d), ElementsAre("a0", "a1", "a2", "a3"));
  EXPECT_THAT(d.pending_reasons.at("a4"),
              HasSubstr("holds 4 slots of 2 slots of quota + 2 borrowed"));
  // A job that is not preemptible runs only within the quota.
  SchedJob fixed = Job("fixed", 10, "a");
  fixed.preemptible = false;
  Cluster c2({Worker("w1", 3), Worker("w2", 3)});
  c2.context.queues = c.context.queues;
  c2.Run("x1", "a", {"w1"});
  c2.Run("x2", "a", {"w1"});
  d = c2.Pass(0, {fixed});
  EXPECT_THAT(d.placements, IsEmpty());
  EXPECT_THAT(d.pending_reasons.at("fixed"), HasSubstr("not preemptible: within the quota only"));
}

TEST(QueueSchedulingTest, ReclaimsBorrowedCapacityByPreemptingNoMoreThanBorrowed) {
  Cluster c({Worker("w1", 2), Worker("w2", 2), Worker("w3", 2)});
  c.context.queues = {Queue("a", 2, /*borrow=*/-1), Queue("b", 4)};
  // Queue a borrows 3 slots of b's quota: a0 (within quota) and four borrowed single ranks, the
  // one checkpointed last (a3) the cheapest to stop among equals.
  c.Run("a0", "a", {"w1", "w1"}, 0, 0, 100);
  c.Run("a1", "a", {"w2"}, 0, 0, 100);
  c.Run("a2", "a", {"w2"}, 0, 0, 100);
  c.Run("a3", "a", {"w3"}, 0, 0, 900);
  // b needs 2 slots of its quota: two victims of a, never a0 (a is then at its quota).
  ScheduleDecision d = c.Pass(1000, {Job("b1", 1, "b", 2)});
  EXPECT_THAT(d.placements, IsEmpty());
  ASSERT_EQ(d.preemptions.size(), 1u);
  EXPECT_THAT(Victims(d), ElementsAre("a3"));  // w3 has a free slot: one victim is enough
  EXPECT_THAT(d.preemptions[0].reason, HasSubstr("reclaims its quota from queue a"));
  EXPECT_THAT(d.pending_reasons.at("b1"), HasSubstr("preempting a3"));
  // The next pass: a3 has stopped, and b1 runs where it freed.
  d = c.Pass(2000, {Job("b1", 1, "b", 2)});
  EXPECT_THAT(Placed(d), ElementsAre("b1"));
  EXPECT_THAT(d.preemptions, IsEmpty());
  // Another b job of 2: a holds 4 of its 2-slot quota; stopping a0 alone (one gang) or a1 and
  // a2 (two) frees enough: one gang it is, and a keeps its quota.
  d = c.Pass(3000, {Job("b2", 2, "b", 2)});
  EXPECT_THAT(Victims(d), ElementsAre("a0"));
  EXPECT_EQ(d.queues.at("a").used_slots, 2);
  // b now wants beyond its own quota of 4: it may only borrow, never preempt a's quota.
  c.Pass(4000, {Job("b2", 2, "b", 2)});
  d = c.Pass(5000, {Job("b3", 3, "b", 2)});
  EXPECT_THAT(d.preemptions, IsEmpty());
  EXPECT_THAT(d.pending_reasons.at("b3"), HasSubstr("queue b is at its limit"));
}

TEST(QueueSchedulingTest, HigherPriorityPreemptsWithinAQueueAndWaitsForTheSave) {
  Cluster c({Worker("w1", 1), Worker("w2", 1)});
  c.Run("low", "", {"w1", "w2"}, /*priority=*/0);
  const SchedJob high = Job("high", 5, "", 2, /*priority=*/10);
  ScheduleDecision d = c.Pass(0, {high});
  EXPECT_THAT(Victims(d), ElementsAre("low"));
  EXPECT_EQ(d.preemptions[0].reason, "for high (priority 10 over 0 in queue default)");
  // While the victim saves, no other job is preempted for it and nothing takes its place; a job
  // of the same priority as the victim waits.
  SchedJob same = Job("same", 6, "", 1, 0);
  c.context.running[0].stopping = true;
  SchedWorker w1 = Worker("w1", 1);
  SchedWorker w2 = Worker("w2", 1);
  w1.free_slots = w2.free_slots = 0;  // the stopping ranks still hold them
  ScheduleDecision waiting = Schedule({high, same}, {w1, w2}, c.context);
  EXPECT_THAT(waiting.preemptions, IsEmpty());
  EXPECT_THAT(waiting.placements, IsEmpty());
  EXPECT_EQ(waiting.pending_reasons.at("high"), "waiting for stopping jobs to free its capacity");
  EXPECT_EQ(waiting.pending_reasons.at("same"), "waiting for capacity: needs 1 slot, 0 free");
  // Equal priority never preempts.
  Cluster e({Worker("w1", 1)});
  e.Run("first", "", {"w1"}, 3);
  d = e.Pass(0, {Job("second", 9, "", 1, 3)});
  EXPECT_THAT(d.preemptions, IsEmpty());
  EXPECT_THAT(d.pending_reasons.at("second"), HasSubstr("waiting for capacity"));
}

TEST(QueueSchedulingTest, VictimsAreLowestPriorityFewestGangsAndNeverUnpreemptible) {
  auto cluster = [] {
    Cluster c({Worker("w1", 2), Worker("w2", 2)});
    c.Run("p1-small", "", {"w1"}, 1);
    c.Run("p1-pair", "", {"w1", "w2"}, 1);
    c.Run("p0", "", {"w2"}, 0);
    c.context.running.back().preemptible = false;
    return c;
  };
  // Needs 2 slots: p0 cannot be preempted; of the priority-1 jobs one gang that suffices alone
  // (the pair) beats two.
  Cluster c = cluster();
  ScheduleDecision d = c.Pass(0, {Job("urgent", 1, "", 2, 5)});
  EXPECT_THAT(Victims(d), ElementsAre("p1-pair"));
  // Needs 3: both priority-1 jobs, and still never p0.
  c = cluster();
  d = c.Pass(0, {Job("bigger", 1, "", 3, 5)});
  EXPECT_THAT(Victims(d), UnorderedElementsAre("p1-small", "p1-pair"));
  // Needs 4: it would take p0 too, which cannot be preempted: nothing is stopped in vain.
  c = cluster();
  d = c.Pass(0, {Job("all", 1, "", 4, 5)});
  EXPECT_THAT(d.preemptions, IsEmpty());
  EXPECT_THAT(d.pending_reasons.at("all"), HasSubstr("waiting for capacity"));
}

// A job the scheduler preempted runs a while after it resumes before it can be preempted again.
TEST(QueueSchedulingTest, AResumedVictimIsProtectedForAWhile) {
  Cluster c({Worker("w1", 1)});
  c.Run("resumed", "", {"w1"}, 0);
  c.context.running.back().protected_until_ms = 5000;
  ScheduleDecision d = c.Pass(1000, {Job("urgent", 1, "", 1, 9)});
  EXPECT_THAT(d.preemptions, IsEmpty());
  EXPECT_THAT(d.pending_reasons.at("urgent"), HasSubstr("waiting for capacity"));
  d = c.Pass(5001, {Job("urgent", 1, "", 1, 9)});
  EXPECT_THAT(Victims(d), ElementsAre("resumed"));
}

TEST(QueueSchedulingTest, PreemptionOffOnlyWaits) {
  Cluster c({Worker("w1", 1)});
  c.context.policy.preemption = false;
  c.Run("low", "", {"w1"}, 0);
  ScheduleDecision d = c.Pass(0, {Job("high", 1, "", 1, 9)});
  EXPECT_THAT(d.preemptions, IsEmpty());
  EXPECT_EQ(d.reserved_for, "high");
}

// Dominant-resource fair share by weight: queue a (weight 2) and b (weight 1), nothing of quota
// for either, both borrowing everything: a gets two thirds of the slots.
TEST(QueueSchedulingTest, FairShareByWeight) {
  Cluster c({Worker("w1", 6)});
  c.context.queues = {Queue("a", 0, -1, 2), Queue("b", 0, -1, 1)};
  std::vector<SchedJob> jobs;
  for (int i = 0; i < 6; ++i) {
    jobs.push_back(Job("b" + std::to_string(i), i, "b"));  // b submitted first
    jobs.push_back(Job("a" + std::to_string(i), 100 + i, "a"));
  }
  ScheduleDecision d = c.Pass(0, jobs);
  EXPECT_EQ(d.queues.at("a").used_slots, 4);
  EXPECT_EQ(d.queues.at("b").used_slots, 2);
  // What waits says whose job holds the line (b2: the queues' shares are even again, and it
  // came first), and its queue when it is another's.
  EXPECT_EQ(d.reserved_for, "b2");
  EXPECT_EQ(d.pending_reasons.at("a4"), "queued behind b2 of queue b");
  EXPECT_EQ(d.pending_reasons.at("b3"), "queued behind b2");
  // Without fair share: submission order.
  Cluster fifo({Worker("w1", 6)});
  fifo.context.queues = c.context.queues;
  fifo.context.policy.fair_share = false;
  d = fifo.Pass(0, jobs);
  EXPECT_EQ(d.queues.at("a").used_slots, 0);
  EXPECT_EQ(d.queues.at("b").used_slots, 6);
}

// Over two resources the dominant one counts: a GPU queue that holds half the GPUs has a larger
// share than a CPU queue that holds a third of the slots.
TEST(QueueSchedulingTest, FairShareUsesTheDominantResource) {
  Cluster c({Worker("w1", 6, 4)});
  c.context.queues = {Queue("gpu", 0, -1, 1, 0, -1), Queue("cpu", 0, -1, 1, 0, -1)};
  c.Run("g-running", "gpu", {"w1"}, 0, 0, 0, /*slots=*/0, /*gpus=*/2);
  c.Run("c-running", "cpu", {"w1", "w1"});
  // cpu (2/6 of the slots) before gpu (2/4 of the GPUs); then both at one half, the earlier
  // submission; then cpu again (gpu at 3/4).
  ScheduleDecision d =
      c.Pass(0, {GpuJob("g-next", 1, "gpu", 1), Job("c-next", 2, "cpu"), Job("c-more", 3, "cpu")});
  EXPECT_THAT(Placed(d), ElementsAre("c-next", "g-next", "c-more"));
}

// EASY backfill: the head of the line holds a reservation at the time running jobs end; a job
// behind it runs now only if it ends before then or does not touch the reserved capacity.
TEST(QueueSchedulingTest, BackfillNeverDelaysTheReservation) {
  Cluster c({Worker("w1", 2), Worker("w2", 2), Worker("w3", 1)});
  c.Run("running", "", {"w1", "w1"}, 0, /*end_ms=*/10000);
  SchedJob head = Job("head", 1, "", 2);
  head.slots_per_rank = 2;  // needs w1 and w2 whole
  SchedJob quick = Job("quick", 2, "");
  quick.runtime_ms = 5000;  // ends before 10000
  SchedJob long_one = Job("long", 3, "");
  long_one.runtime_ms = 50000;
  SchedJob unknown = Job("unknown", 4, "");
  ScheduleDecision d = c.Pass(0, {head, quick, long_one, unknown});
  EXPECT_EQ(d.reserved_for, "head");
  EXPECT_EQ(d.reserved_start_ms, 10000);
  // quick ends in time (on w2); long goes around the reservation to w3; unknown finds no room
  // that leaves the reservation whole.
  EXPECT_THAT(Placed(d), ElementsAre("quick", "long"));
  ASSERT_EQ(d.placements.size(), 2u);
  EXPECT_THAT(d.placements[1].rank_workers, ElementsAre("w3"));
  EXPECT_EQ(d.pending_reasons.at("unknown"), "queued behind head (running now would delay it)");
  // Without backfill, everything behind the head waits.
  Cluster nb({Worker("w1", 2), Worker("w2", 2), Worker("w3", 1)});
  nb.Run("running", "", {"w1", "w1"}, 0, 10000);
  nb.context.policy.backfill = false;
  d = nb.Pass(0, {head, quick, long_one, unknown});
  EXPECT_THAT(d.placements, IsEmpty());
  EXPECT_EQ(d.pending_reasons.at("quick"), "queued behind head (no backfill)");
}

// The starvation bound: with every running job's end known, the job holding the reservation
// starts no later than the reservation said, however many small jobs keep arriving behind it.
TEST(QueueSchedulingTest, AReservedGangStartsByItsReservationUnderAStreamOfSmallJobs) {
  Cluster c({Worker("w1", 4), Worker("w2", 4)});
  for (int i = 0; i < 8; ++i) {
    c.Run("r" + std::to_string(i), "", {i < 4 ? "w1" : "w2"}, 0, /*end_ms=*/1000 * (i + 1));
  }
  SchedJob gang = Job("gang", 1, "", 8);
  std::vector<SchedJob> pending = {gang};
  int64_t promised = -1;
  int64_t started = -1;
  int backfilled = 0;
  for (int64_t now = 0; now <= 20000 && started < 0; now += 250) {
    SchedJob small = Job("s" + std::to_string(now), 10 + now, "");
    small.runtime_ms = 700 + (now % 3) * 800;  // 0.7 to 2.3 s
    pending.push_back(small);
    ScheduleDecision d = c.Pass(now, pending);
    if (promised < 0 && d.reserved_for == "gang") promised = d.reserved_start_ms;
    for (const Placement& p : d.placements) {
      if (p.job_id == "gang") started = now;
      if (p.job_id != "gang") backfilled++;
      pending.erase(std::remove_if(pending.begin(), pending.end(),
                                   [&](const SchedJob& j) { return j.id == p.job_id; }),
                    pending.end());
    }
  }
  EXPECT_EQ(promised, 8000);
  ASSERT_GE(started, 0) << "the gang never started";
  EXPECT_LE(started, promised);
  EXPECT_GT(backfilled, 0) << "nothing ran in the gaps";
}

}  // namespace
}  // namespace trainyard
