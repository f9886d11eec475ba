#include "server/scheduling/scheduler.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainyard {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

SchedJob CpuJob(const std::string& id, int64_t seq, int min_ranks = 1, int max_ranks = 1,
                int priority = 0) {
  SchedJob j;
  j.id = id;
  j.seq = seq;
  j.min_ranks = min_ranks;
  j.max_ranks = max_ranks;
  j.priority = priority;
  j.slots_per_rank = 1;
  return j;
}

SchedJob GpuJob(const std::string& id, int64_t seq, int gpus, int ranks) {
  SchedJob j = CpuJob(id, seq, ranks, ranks);
  j.slots_per_rank = 0;
  j.gpus_per_rank = gpus;
  return j;
}

SchedWorker Worker(const std::string& id, int slots, int free_slots, int gpus = 0,
                   int free_gpus = 0) {
  SchedWorker w;
  w.id = id;
  w.total_slots = slots;
  w.free_slots = free_slots;
  w.total_gpus = gpus;
  w.free_gpus = free_gpus;
  return w;
}

std::vector<std::string> PlacedIds(const ScheduleDecision& d) {
  std::vector<std::string> ids;
  for (const Placement& p : d.placements) ids.push_back(p.job_id);
  return ids;
}

TEST(SchedulerTest, PriorityThenSubmissionOrder) {
  // One free slot: the highest priority wins even though it came last; between equal
  // priorities the earlier one wins.
  ScheduleDecision d =
      Schedule({CpuJob("a", 1), CpuJob("b", 2), CpuJob("c", 3, 1, 1, 5)}, {Worker("w1", 2, 2)});
  EXPECT_THAT(PlacedIds(d), ElementsAre("c", "a"));
  EXPECT_THAT(d.pending_reasons.at("b"), HasSubstr("waiting for capacity"));
}

TEST(SchedulerTest, FitsBySlots) {
  ScheduleDecision d = Schedule({CpuJob("a", 1, 3, 3)}, {Worker("w1", 2, 2), Worker("w2", 1, 1)});
  ASSERT_EQ(d.placements.size(), 1u);
  EXPECT_THAT(d.placements[0].rank_workers, UnorderedElementsAre("w1", "w1", "w2"));
}

TEST(SchedulerTest, FitsByGpusAndIgnoresSlots) {
  ScheduleDecision d =
      Schedule({GpuJob("g", 1, 2, 2)}, {Worker("w1", 0, 0, 4, 4), Worker("w2", 8, 8, 1, 1)});
  ASSERT_EQ(d.placements.size(), 1u);
  EXPECT_THAT(d.placements[0].rank_workers, ElementsAre("w1", "w1"));
}

SchedWorker WithMemory(SchedWorker w, int64_t total, int64_t free) {
  w.total_memory = total;
  w.free_memory = free;
  return w;
}

constexpr int64_t kGiB = int64_t{1} << 30;

// Ranks reserve their memory: two of 3 GiB do not share a worker offering 4 GiB.
TEST(SchedulerTest, FitsByMemory) {
  SchedJob job = CpuJob("m", 1, 2, 2);
  job.memory_per_rank = 3 * kGiB;
  ScheduleDecision d = Schedule({job}, {WithMemory(Worker("w1", 4, 4), 4 * kGiB, 4 * kGiB),
                                        WithMemory(Worker("w2", 4, 4), 4 * kGiB, 4 * kGiB)});
  ASSERT_EQ(d.placements.size(), 1u);
  EXPECT_THAT(d.placements[0].rank_workers, UnorderedElementsAre("w1", "w2"));
  // With one worker's memory taken, the gang waits, saying what it needs.
  d = Schedule({job}, {WithMemory(Worker("w1", 4, 4), 4 * kGiB, 4 * kGiB),
                       WithMemory(Worker("w2", 4, 4), 4 * kGiB, kGiB)});
  EXPECT_THAT(d.placements, IsEmpty());
  EXPECT_EQ(d.pending_reasons["m"],
            "waiting for capacity: needs 2 slots and 6.0 GiB of memory, 8 slots and 5.0 GiB of "
            "memory free");
}

// A pipeline's stages may each reserve their own memory: rank i takes rank_memory[i].
TEST(SchedulerTest, RanksMayReserveMemoryEachTheirOwn) {
  SchedJob job = CpuJob("p", 1, 2, 2);
  job.rank_memory = {3 * kGiB, 2 * kGiB};
  // Rank 0 (3 GiB) fits only w1; rank 1 goes to w2 (most free slots).
  ScheduleDecision d = Schedule({job}, {WithMemory(Worker("w1", 4, 4), 4 * kGiB, 4 * kGiB),
                                        WithMemory(Worker("w2", 8, 8), 2 * kGiB, 2 * kGiB)});
  ASSERT_EQ(d.placements.size(), 1u);
  EXPECT_THAT(d.placements[0].rank_workers, ElementsAre("w1", "w2"));
  // The same ranks at 3 GiB each cannot both fit.
  job.rank_memory = {3 * kGiB, 3 * kGiB};
  d = Schedule({job}, {WithMemory(Worker("w1", 4, 4), 4 * kGiB, 4 * kGiB),
                       WithMemory(Worker("w2", 8, 8), 2 * kGiB, 2 * kGiB)});
  EXPECT_THAT(d.placements, IsEmpty());
  // What it waits for adds up each rank's own.
  job.rank_memory = {3 * kGiB, 1 * kGiB};
  d = Schedule({job}, {WithMemory(Worker("w1", 4, 4), 4 * kGiB, 2 * kGiB)});
  EXPECT_EQ(d.pending_reasons["p"],
            "waiting for capacity: needs 2 slots and 4.0 GiB of memory, 4 slots and 2.0 GiB of "
            "memory free");
}

// A rank larger than any worker's memory can never run there: unfit, with the numbers, and it
// holds up no one.
TEST(SchedulerTest, MoreMemoryThanAnyWorkerOffersIsUnfit) {
  SchedJob big = CpuJob("big", 1);
  big.memory_per_rank = 8 * kGiB;
  ScheduleDecision d =
      Schedule({big, CpuJob("small", 2)}, {WithMemory(Worker("w1", 4, 4), 4 * kGiB, 4 * kGiB)});
  EXPECT_THAT(PlacedIds(d), ElementsAre("small"));
  EXPECT_THAT(d.unfit, ElementsAre("big"));
  EXPECT_EQ(d.pending_reasons["big"],
            "needs 8.0 GiB of memory per rank; the largest worker offers 4.0 GiB");
}

// A worker that did not say its memory takes jobs that reserve some.
TEST(SchedulerTest, UnknownMemoryDoesNotLimit) {
  SchedJob job = CpuJob("m", 1);
  job.memory_per_rank = 8 * kGiB;
  ScheduleDecision d = Schedule({job}, {Worker("w1", 4, 4)});
  EXPECT_THAT(PlacedIds(d), ElementsAre("m"));
}

// Shards reserve their own memory.
TEST(SchedulerTest, ShardsReserveMemory) {
  SchedJob job = CpuJob("ps", 1, 1, 1);
  job.shards = 2;
  job.memory_per_shard = 3 * kGiB;
  ScheduleDecision d = Schedule({job}, {WithMemory(Worker("w1", 8, 8), 4 * kGiB, 4 * kGiB),
                                        WithMemory(Worker("w2", 8, 8), 4 * kGiB, 4 * kGiB)});
  ASSERT_EQ(d.placements.size(), 1u);
  EXPECT_THAT(d.placements[0].shard_workers, UnorderedElementsAre("w1", "w2"));
}

// A job whose model needs operators only some LibTorch has goes only to workers that run it,
// counts only their capacity, and does not hold up the queue while none is ready.
TEST(SchedulerTest, RuntimesLimitWhereAJobGoes) {
  SchedWorker old_a = Worker("old-a", 4, 4);
  SchedWorker old_b = Worker("old-b", 4, 4);
  SchedWorker fresh = Worker("new", 2, 2);
  old_a.runtime = old_b.runtime = "v113";
  fresh.runtime = "v26";
  SchedJob attention = CpuJob("attention", 1, 2, 2);
  attention.runtimes = std::vector<std::string>{"v26"};
  ScheduleDecision d = Schedule({attention, CpuJob("plain", 2)}, {old_a, old_b, fresh});
  ASSERT_EQ(d.placements.size(), 2u);
  EXPECT_THAT(d.placements[0].rank_workers, ElementsAre("new", "new"));

  // Three ranks: more than the one such worker holds, although the cluster has 10 slots.
  attention.min_ranks = attention.max_ranks = 3;
  d = Schedule({attention}, {old_a, old_b, fresh});
  EXPECT_THAT(d.placements, IsEmpty());
  EXPECT_EQ(d.pending_reasons.at("attention"), "needs 3 ranks of 1 slot; the cluster has 2 slots");
  EXPECT_THAT(d.unfit, ElementsAre("attention"));

  // None can run it: the reason the manager gave, and the next job goes on.
  attention.min_ranks = attention.max_ranks = 1;
  attention.runtime_reason = "no worker can run its model: LibTorch 1.13.0 lacks aten::x";
  d = Schedule({attention, CpuJob("plain", 2)}, {old_a, old_b});
  EXPECT_THAT(PlacedIds(d), ElementsAre("plain"));
  EXPECT_EQ(d.pending_reasons.at("attention"), attention.runtime_reason);
  EXPECT_THAT(d.unfit, ElementsAre("attention"));
}

TEST(SchedulerTest, GangIsAllOrNothing) {
  // Needs 3 ranks, only 2 slots free now (4 in the cluster): nothing is placed.
  ScheduleDecision d = Schedule({CpuJob("a", 1, 3, 3)}, {Worker("w1", 2, 1), Worker("w2", 2, 1)});
  EXPECT_THAT(d.placements, IsEmpty());
  EXPECT_EQ(d.pending_reasons.at("a"), "waiting for capacity: needs 3 slots, 2 free");
}

TEST(SchedulerTest, ElasticRangeTakesAsManyAsFit) {
  ScheduleDecision d = Schedule({CpuJob("a", 1, 2, 4)}, {Worker("w1", 4, 1), Worker("w2", 4, 2)});
  ASSERT_EQ(d.placements.size(), 1u);
  EXPECT_EQ(d.placements[0].rank_workers.size(), 3u);
}

TEST(SchedulerTest, ElasticRankCountDividesTheGlobalBatch) {
  // 3 ranks fit, but a batch of 8 splits evenly over 2 or 4, not 3.
  SchedJob job = CpuJob("a", 1, 2, 4);
  job.batch_size = 8;
  ScheduleDecision d = Schedule({job}, {Worker("w1", 4, 1), Worker("w2", 4, 2)});
  ASSERT_EQ(d.placements.size(), 1u);
  EXPECT_EQ(d.placements[0].rank_workers.size(), 2u);
  EXPECT_THAT(d.placements[0].rank_workers, UnorderedElementsAre("w1", "w2"));

  // 4 fit; a batch of 6 takes 3.
  job.min_ranks = 3;
  job.batch_size = 6;
  d = Schedule({job}, {Worker("w1", 4, 2), Worker("w2", 4, 2)});
  ASSERT_EQ(d.placements.size(), 1u);
  EXPECT_EQ(d.placements[0].rank_workers.size(), 3u);

  // 3 fit, but 8 needs 4 (or 2, below the minimum): the job waits.
  job.batch_size = 8;
  d = Schedule({job}, {Worker("w1", 4, 2), Worker("w2", 4, 1)});
  EXPECT_TRUE(d.placements.empty());
  EXPECT_THAT(d.pending_reasons["a"], HasSubstr("waiting for capacity"));
}

TEST(SchedulerTest, SpreadsOverDistinctWorkersMostFreeFirst) {
  ScheduleDecision d = Schedule({CpuJob("a", 1, 3, 3)},
                                {Worker("w1", 8, 2), Worker("w2", 8, 6), Worker("w3", 8, 4)});
  ASSERT_EQ(d.placements.size(), 1u);
  EXPECT_THAT(d.placements[0].rank_workers, ElementsAre("w2", "w3", "w1"));
}

TEST(SchedulerTest, ReasonForJobTooLargeForTheCluster) {
  ScheduleDecision d = Schedule({GpuJob("g", 1, 4, 1), CpuJob("big", 2, 5, 5), CpuJob("ok", 3)},
                                {Worker("w1", 2, 2)});
  EXPECT_EQ(d.pending_reasons.at("g"), "needs 4 GPUs per rank; the largest worker has 0");
  EXPECT_EQ(d.pending_reasons.at("big"), "needs 5 ranks of 1 slot; the cluster has 2 slots");
  // Neither blocks the job after them.
  EXPECT_THAT(PlacedIds(d), ElementsAre("ok"));
}

TEST(SchedulerTest, NoWorkers) {
  ScheduleDecision d = Schedule({CpuJob("a", 1)}, {});
  EXPECT_EQ(d.pending_reasons.at("a"), "no workers registered");
  SchedWorker lost = Worker("w1", 4, 4);
  lost.ready = false;
  d = Schedule({CpuJob("a", 1)}, {lost});
  EXPECT_THAT(d.placements, IsEmpty());
  EXPECT_EQ(d.pending_reasons.at("a"), "no ready workers");
}

TEST(SchedulerTest, NoBackfillBehindABlockedJob) {
  // "big" fits the cluster but not the 1 free slot; "small" would fit but must wait.
  ScheduleDecision d = Schedule({CpuJob("big", 1, 2, 2), CpuJob("small", 2)},
                                {Worker("w1", 1, 1), Worker("w2", 1, 0)});
  EXPECT_THAT(d.placements, IsEmpty());
  EXPECT_EQ(d.pending_reasons.at("big"), "waiting for capacity: needs 2 slots, 1 free");
  EXPECT_THAT(d.pending_reasons.at("small"), HasSubstr("queued behind big"));
}

TEST(SchedulerTest, CapacityTakenByEarlierPlacementsInTheSamePass) {
  ScheduleDecision d =
      Schedule({CpuJob("a", 1, 2, 2), CpuJob("b", 2, 2, 2), CpuJob("c", 3)}, {Worker("w1", 4, 4)});
  EXPECT_THAT(PlacedIds(d), ElementsAre("a", "b"));
  EXPECT_EQ(d.pending_reasons.at("c"), "waiting for capacity: needs 1 slot, 0 free");
}

TEST(SchedulerTest, TwoLargeJobsCompetingForTheSameCapacityDoNotDeadlock) {
  // Each job needs 3 of the 4 slots. Placing ranks one at a time could leave each job holding
  // 2 slots and waiting forever for the third; gang placement gives one job all of its ranks
  // and holds nothing for the other.
  std::vector<SchedWorker> workers = {Worker("w1", 2, 2), Worker("w2", 2, 2)};
  ScheduleDecision d = Schedule({CpuJob("a", 1, 3, 3), CpuJob("b", 2, 3, 3)}, workers);
  ASSERT_EQ(d.placements.size(), 1u);
  EXPECT_EQ(d.placements[0].job_id, "a");
  EXPECT_EQ(d.placements[0].rank_workers.size(), 3u);
  EXPECT_EQ(d.pending_reasons.at("b"), "waiting for capacity: needs 3 slots, 1 free");
  // Once "a" is done, "b" gets all of its ranks at once.
  d = Schedule({CpuJob("b", 2, 3, 3)}, workers);
  ASSERT_EQ(d.placements.size(), 1u);
  EXPECT_EQ(d.placements[0].rank_workers.size(), 3u);
}

TEST(SchedulerTest, ElasticJobsCompetingNeverSplitBelowTheirMinimum) {
  ScheduleDecision d = Schedule({CpuJob("a", 1, 3, 4), CpuJob("b", 2, 3, 4)},
                                {Worker("w1", 2, 2), Worker("w2", 2, 2), Worker("w3", 1, 1)});
  ASSERT_EQ(d.placements.size(), 1u);
  EXPECT_EQ(d.placements[0].job_id, "a");
  EXPECT_EQ(d.placements[0].rank_workers.size(), 4u);
  EXPECT_THAT(d.pending_reasons.at("b"), HasSubstr("waiting for capacity"));
}

TEST(SchedulerTest, DataParallelRanksGoToDistinctWorkersWhenTheyCan) {
  ScheduleDecision d = Schedule({CpuJob("dp", 1, 2, 2)}, {Worker("w1", 4, 4), Worker("w2", 4, 4)});
  ASSERT_EQ(d.placements.size(), 1u);
  EXPECT_THAT(d.placements[0].rank_workers, UnorderedElementsAre("w1", "w2"));
}

SchedJob PsJob(const std::string& id, int64_t seq, int min_ranks, int max_ranks, int shards) {
  SchedJob j = CpuJob(id, seq, min_ranks, max_ranks);
  j.shards = shards;
  return j;
}

TEST(SchedulerTest, ShardsArePlacedWithTheRanksAndSpread) {
  ScheduleDecision d =
      Schedule({PsJob("ps", 1, 2, 2, 2)}, {Worker("w1", 2, 2), Worker("w2", 2, 2)});
  ASSERT_EQ(d.placements.size(), 1u);
  EXPECT_THAT(d.placements[0].rank_workers, UnorderedElementsAre("w1", "w2"));
  EXPECT_THAT(d.placements[0].shard_workers, UnorderedElementsAre("w1", "w2"));
}

TEST(SchedulerTest, ShardsTakeSlotsAndTheGangIsAllOrNothing) {
  // Two ranks fit, and so do two shards, but not all four.
  ScheduleDecision d =
      Schedule({PsJob("ps", 1, 2, 2, 2)}, {Worker("w1", 2, 2), Worker("w2", 1, 1)});
  EXPECT_THAT(d.placements, IsEmpty());
  EXPECT_EQ(d.pending_reasons.at("ps"),
            "needs 2 ranks of 1 slot and 2 parameter-server shards of 1 slot; the cluster has 3 "
            "slots");
  // The cluster could hold it, but other work holds the capacity.
  d = Schedule({PsJob("ps", 1, 2, 2, 2), CpuJob("small", 2)},
               {Worker("w1", 2, 1), Worker("w2", 2, 2)});
  EXPECT_THAT(d.placements, IsEmpty());
  EXPECT_EQ(d.pending_reasons.at("ps"), "waiting for capacity: needs 4 slots, 3 free");
  EXPECT_EQ(d.pending_reasons.at("small"), "queued behind ps (running now would delay it)");
}

TEST(SchedulerTest, ElasticParameterServerJobLeavesRoomForItsShards) {
  // Four ranks would fit alone; with its two shards the job gets two.
  ScheduleDecision d =
      Schedule({PsJob("ps", 1, 1, 4, 2)}, {Worker("w1", 2, 2), Worker("w2", 2, 2)});
  ASSERT_EQ(d.placements.size(), 1u);
  EXPECT_EQ(d.placements[0].rank_workers.size(), 2u);
  EXPECT_EQ(d.placements[0].shard_workers.size(), 2u);
  // The capacity it took is gone for the next job in the same pass.
  d = Schedule({PsJob("ps", 1, 1, 4, 1), CpuJob("next", 2)},
               {Worker("w1", 2, 2), Worker("w2", 2, 2)});
  ASSERT_EQ(d.placements.size(), 1u);
  EXPECT_EQ(d.placements[0].rank_workers.size(), 3u);
  EXPECT_EQ(d.pending_reasons.at("next"), "waiting for capacity: needs 1 slot, 0 free");
}

TEST(SchedulerTest, GpuRanksWithCpuShards) {
  SchedJob job = GpuJob("g", 1, 1, 2);
  job.shards = 1;
  // w1 has GPUs but no free slot; the shard goes where a slot is.
  ScheduleDecision d = Schedule({job}, {Worker("w1", 1, 0, 2, 2), Worker("w2", 1, 1, 0, 0)});
  ASSERT_EQ(d.placements.size(), 1u);
  EXPECT_THAT(d.placements[0].rank_workers, ElementsAre("w1", "w1"));
  EXPECT_THAT(d.placements[0].shard_workers, ElementsAre("w2"));
  d = Schedule({job}, {Worker("w1", 1, 0, 2, 2)});
  EXPECT_EQ(d.pending_reasons.at("g"),
            "waiting for capacity: needs 2 GPUs and 1 slot, 2 GPUs and 0 slots free");
  d = Schedule({job}, {Worker("w1", 0, 0, 2, 2)});
  EXPECT_EQ(d.pending_reasons.at("g"),
            "needs 2 ranks of 1 GPU and 1 parameter-server shard of 1 slot; the cluster has 2 "
            "GPUs and 0 slots");
}

}  // namespace
}  // namespace trainyard
