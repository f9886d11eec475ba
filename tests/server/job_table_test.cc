// JobTable: every index follows the jobs through their states, and a removed job leaves nothing;
// UsedCapacity over it.

#include "server/jobs/job_table.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/jobs/capacity.h"

namespace trainyard {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

v1::Job MakeJob(const std::string& id, v1::JobState state, int priority = 0) {
  v1::Job job;
  job.set_id(id);
  job.set_state(state);
  job.mutable_spec()->set_priority(priority);
  return job;
}

v1::TaskInfo* AddTask(v1::Job& job, const std::string& worker, int rank) {
  v1::TaskInfo* t = job.add_tasks();
  t->set_task_id(absl::StrCat(job.id(), ".g", job.generation(), ".r", rank));
  t->set_generation(job.generation());
  t->set_rank(rank);
  t->set_worker_id(worker);
  t->set_state(v1::TASK_STARTING);
  return t;
}

std::vector<std::string> QueueIds(const JobTable& table) {
  std::vector<std::string> ids;
  for (const auto& [key, entry] : table.pending()) ids.push_back(entry->job.id());
  return ids;
}

TEST(JobTableTest, TheQueueIsInPriorityThenSubmissionOrderAndParkingSetsJobsAside) {
  JobTable table;
  table.Add(1, MakeJob("a-1", v1::PENDING));
  table.Add(2, MakeJob("b-2", v1::PENDING, /*priority=*/5));
  table.Add(3, MakeJob("c-3", v1::PENDING));
  EXPECT_THAT(QueueIds(table), ElementsAre("b-2", "a-1", "c-3"));
  table.Park(JobTable::KeyOf(*table.Find("a-1")));
  EXPECT_THAT(QueueIds(table), ElementsAre("b-2", "c-3"));
  // A parked job that changes state leaves the parking too.
  JobEntry& c = *table.Find("c-3");
  table.Park(JobTable::KeyOf(c));
  const v1::Job before = c.job;
  c.job.set_state(v1::CANCELLED);
  table.Reindex(c, before);
  table.UnparkAll();
  EXPECT_THAT(QueueIds(table), ElementsAre("b-2", "a-1"));
  EXPECT_EQ(table.counts().at(v1::PENDING), 2);
  EXPECT_EQ(table.counts().at(v1::CANCELLED), 1);
}

TEST(JobTableTest, IndexesFollowAJobThroughItsLifeAndRemovalLeavesNothing) {
  JobTable table;
  JobEntry& entry = table.Add(7, MakeJob("j-7", v1::PENDING));
  EXPECT_THAT(table.active(), ElementsAre(7));
  EXPECT_THAT(table.attempts(), IsEmpty());

  // Placed on two workers.
  v1::Job before = entry.job;
  entry.job.set_state(v1::SCHEDULED);
  entry.job.set_generation(1);
  AddTask(entry.job, "w1", 0);
  AddTask(entry.job, "w2", 1);
  EXPECT_THAT(table.Reindex(entry, before), UnorderedElementsAre("w1", "w2"));
  EXPECT_THAT(table.pending(), IsEmpty());
  EXPECT_THAT(table.attempts(), ElementsAre(7));
  EXPECT_EQ(table.FindByTask("j-7.g1.r1"), &entry);
  ASSERT_EQ(table.ActiveTasksOn("w2").size(), 1u);
  EXPECT_EQ(table.ActiveTasksOn("w2")[0].second->task_id(), "j-7.g1.r1");

  // Rank 1 ends: only w2's tasks change.
  before = entry.job;
  entry.job.mutable_tasks(1)->set_state(v1::TASK_EXITED);
  EXPECT_THAT(table.Reindex(entry, before), ElementsAre("w2"));
  EXPECT_THAT(table.ActiveTasksOn("w2"), IsEmpty());

  // The job fails: final, stopping, finished, nothing active.
  before = entry.job;
  entry.job.set_state(v1::FAILED);
  entry.job.set_finished_unix_ms(1000);
  EXPECT_THAT(table.Reindex(entry, before), ElementsAre("w1"));
  EXPECT_THAT(table.active(), IsEmpty());
  EXPECT_THAT(table.attempts(), IsEmpty());
  EXPECT_THAT(table.stopping(), ElementsAre(7));
  EXPECT_THAT(table.finished(), ElementsAre(std::make_pair(int64_t{1000}, int64_t{7})));
  EXPECT_THAT(table.ActiveTasksOn("w1"), IsEmpty());

  table.Remove("j-7");
  EXPECT_EQ(table.size(), 0u);
  EXPECT_EQ(table.Find("j-7"), nullptr);
  EXPECT_EQ(table.FindBySeq(7), nullptr);
  EXPECT_EQ(table.FindByTask("j-7.g1.r0"), nullptr);
  EXPECT_THAT(table.by_seq(), IsEmpty());
  EXPECT_THAT(table.stopping(), IsEmpty());
  EXPECT_THAT(table.finished(), IsEmpty());
  EXPECT_THAT(table.counts(), IsEmpty());
}

TEST(JobTableTest, AJobPutBackFromFinalIsActiveAgain) {
  // What undoing a change that could not be written does.
  JobTable table;
  JobEntry& entry = table.Add(1, MakeJob("j-1", v1::RUNNING));
  entry.job.set_generation(1);
  AddTask(entry.job, "w1", 0)->set_state(v1::TASK_RUNNING);
  table.Reindex(entry, MakeJob("j-1", v1::RUNNING));
  const v1::Job running = entry.job;
  entry.job.set_state(v1::SUCCEEDED);
  entry.job.set_finished_unix_ms(5);
  table.Reindex(entry, running);
  const v1::Job done = entry.job;
  entry.job = running;
  EXPECT_THAT(table.Reindex(entry, done), ElementsAre("w1"));
  EXPECT_THAT(table.active(), ElementsAre(1));
  EXPECT_THAT(table.stopping(), IsEmpty());
  EXPECT_THAT(table.finished(), IsEmpty());
  EXPECT_EQ(table.ActiveTasksOn("w1").size(), 1u);
  EXPECT_EQ(table.counts().at(v1::RUNNING), 1);
  EXPECT_EQ(table.counts().count(v1::SUCCEEDED), 0u);
}

TEST(CapacityTest, TasksHoldCapacityUntilTheyEndOrTheHoldRunsOut) {
  JobTable table;
  const absl::Time now = absl::FromUnixSeconds(1000);
  const absl::Duration hold = absl::Seconds(60);
  // Running, 2 GPUs a rank, ranks on w1 and w2.
  v1::Job gpu = MakeJob("gpu-1", v1::RUNNING);
  gpu.mutable_spec()->mutable_resources()->set_gpus_per_worker(2);
  gpu.set_generation(1);
  AddTask(gpu, "w1", 0)->set_state(v1::TASK_RUNNING);
  AddTask(gpu, "w2", 1)->set_state(v1::TASK_RUNNING);
  table.Add(1, gpu);
  // Restarting 10 s ago: its rank on w1 still stops; its rank on w3 is on a worker that is gone.
  v1::Job restarting = MakeJob("cpu-2", v1::RESTARTING);
  restarting.set_generation(1);
  AddTask(restarting, "w1", 0)->set_state(v1::TASK_RUNNING);
  AddTask(restarting, "w3", 1)->set_state(v1::TASK_RUNNING);
  table.Add(2, restarting).restarting_since = now - absl::Seconds(10);
  // Cancelled two minutes ago with a rank never reported: past the hold.
  v1::Job cancelled = MakeJob("old-3", v1::CANCELLED);
  cancelled.set_generation(1);
  AddTask(cancelled, "w2", 0);
  table.Add(3, cancelled).ended = now - absl::Minutes(2);
  // A shard of a parameter-server job holds its slots and no GPU.
  v1::Job ps = MakeJob("ps-4", v1::SCHEDULED);
  ps.mutable_spec()->mutable_parameter_servers()->set_slots(3);
  ps.set_generation(1);
  v1::TaskInfo* shard = AddTask(ps, "w2", 0);
  shard->set_role(v1::TASK_ROLE_SHARD);
  shard->set_task_id("ps-4.g1.s0");
  table.Add(4, ps);

  const auto used = UsedCapacity(table, now, hold, [](absl::string_view w) { return w == "w3"; });
  ASSERT_EQ(used.count("w3"), 0u);
  EXPECT_EQ(used.at("w1").gpus, 2);
  EXPECT_EQ(used.at("w1").slots, 1);  // the stopping CPU rank
  EXPECT_THAT(used.at("w1").task_ids, UnorderedElementsAre("gpu-1.g1.r0", "cpu-2.g1.r0"));
  EXPECT_EQ(used.at("w2").gpus, 2);
  EXPECT_EQ(used.at("w2").slots, 3);  // the shard; the cancelled job's rank no longer counts
  // Past the hold, the restarting job's ranks stop counting too.
  const auto later =
      UsedCapacity(table, now + absl::Minutes(1), hold, [](absl::string_view) { return false; });
  EXPECT_EQ(later.at("w1").slots, 0);
  EXPECT_EQ(later.at("w1").gpus, 2);
}

}  // namespace
}  // namespace trainyard
