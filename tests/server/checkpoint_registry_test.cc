// PlanCheckpointCommit: retention, retries and the records it keeps.

#include "server/jobs/checkpoint_registry.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainyard {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

StoredCheckpoint At(int64_t step) {
  StoredCheckpoint c;
  c.checkpoint.set_job_id("j-1");
  c.checkpoint.set_step(step);
  c.checkpoint.set_uri(absl::StrCat("file:///ckpt/j-1/step-", step));
  return c;
}

std::vector<int64_t> Steps(const std::vector<StoredCheckpoint>& records, bool retired) {
  std::vector<int64_t> steps;
  for (const StoredCheckpoint& c : records) {
    if (c.retired == retired) steps.push_back(c.checkpoint.step());
  }
  return steps;
}

TEST(CheckpointRegistryTest, KeepsTheLatestAndRetiresTheRestOnce) {
  std::vector<StoredCheckpoint> records;
  for (int64_t step : {10, 20}) records = PlanCheckpointCommit(records, At(step), 2).records;
  CheckpointCommitPlan plan = PlanCheckpointCommit(records, At(30), 2);
  EXPECT_FALSE(plan.retry);
  EXPECT_THAT(plan.retired, ElementsAre("file:///ckpt/j-1/step-10"));
  EXPECT_THAT(Steps(plan.records, false), ElementsAre(20, 30));
  EXPECT_THAT(Steps(plan.records, true), ElementsAre(10));
  ASSERT_EQ(plan.upserts.size(), 2u);  // the new record and the retired one
  EXPECT_EQ(plan.upserts[1].retired_by_step, 30);

  // A retry of that commit changes nothing and hands back the same folder.
  CheckpointCommitPlan retry = PlanCheckpointCommit(plan.records, At(30), 2);
  EXPECT_TRUE(retry.retry);
  EXPECT_THAT(retry.retired, ElementsAre("file:///ckpt/j-1/step-10"));
  EXPECT_THAT(retry.upserts, IsEmpty());

  // The next commit removes the record retired before it.
  CheckpointCommitPlan next = PlanCheckpointCommit(plan.records, At(40), 2);
  EXPECT_THAT(next.removals, ElementsAre(std::make_pair(std::string("j-1"), int64_t{10})));
  EXPECT_THAT(Steps(next.records, false), ElementsAre(30, 40));
  EXPECT_THAT(Steps(next.records, true), ElementsAre(20));
}

TEST(CheckpointRegistryTest, ZeroKeepsAllAndKeepLastRetiresTheOldest) {
  std::vector<StoredCheckpoint> records;
  for (int64_t step : {10, 20, 30}) records = PlanCheckpointCommit(records, At(step), 0).records;
  EXPECT_THAT(Steps(records, false), ElementsAre(10, 20, 30));
  EXPECT_THAT(PlanCheckpointCommit(records, At(40), 2).retired,
              ElementsAre("file:///ckpt/j-1/step-20", "file:///ckpt/j-1/step-10"));
  EXPECT_THAT(PlanCheckpointCommit(records, At(40), 3).retired,
              ElementsAre("file:///ckpt/j-1/step-10"));
}

}  // namespace
}  // namespace trainyard
