// The pipeline's plan: the schedules' orders, what they keep in memory, their bubble in a
// simulation against (K - 1) / (M + K - 1), and the partitions of layers into stages.

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/trainer/pipeline/plan.h"

namespace trainyard::trainer::pipeline {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string Order(const std::vector<Action>& actions) {
  std::string out;
  for (const Action& a : actions) {
    out += (a.kind == Action::kForward ? "F" : "B") + std::to_string(a.microbatch) + " ";
  }
  return out;
}

TEST(PipelinePlanTest, GpipeRunsEveryForwardThenEveryBackward) {
  EXPECT_EQ(Order(StageActions(Schedule::kGpipe, 0, 2, 3)), "F0 F1 F2 B2 B1 B0 ");
  EXPECT_EQ(Order(StageActions(Schedule::kGpipe, 1, 2, 3)), "F0 F1 F2 B2 B1 B0 ");
}

TEST(PipelinePlanTest, OneForwardOneBackwardFillsThenAlternates) {
  // 4 stages, 6 micro-batches: stage s fills with 3 - s forwards.
  EXPECT_EQ(Order(StageActions(Schedule::k1F1B, 0, 4, 6)), "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5 ");
  EXPECT_EQ(Order(StageActions(Schedule::k1F1B, 2, 4, 6)), "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5 ");
  EXPECT_EQ(Order(StageActions(Schedule::k1F1B, 3, 4, 6)), "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 ");
  // Fewer micro-batches than stages: the fill is cut short.
  EXPECT_EQ(Order(StageActions(Schedule::k1F1B, 0, 4, 2)), "F0 F1 B0 B1 ");
}

// Every micro-batch forward once, then backward once, on every stage; 1F1B keeps at most
// K - s micro-batches' activations where GPipe keeps all M.
TEST(PipelinePlanTest, EveryPassOnceAndWhatEachScheduleKeeps) {
  for (Schedule schedule : {Schedule::kGpipe, Schedule::k1F1B}) {
    for (int stages : {1, 2, 4}) {
      for (int m : {1, 4, 8, 16}) {
        for (int s = 0; s < stages; ++s) {
          const std::vector<Action> actions = StageActions(schedule, s, stages, m);
          ASSERT_EQ(actions.size(), static_cast<size_t>(2 * m));
          std::vector<int> forward(m, -1), backward(m, -1);
          for (size_t i = 0; i < actions.size(); ++i) {
            (actions[i].kind == Action::kForward ? forward : backward)[actions[i].microbatch] =
                static_cast<int>(i);
          }
          for (int b = 0; b < m; ++b) {
            EXPECT_GE(forward[b], 0);
            EXPECT_GT(backward[b], forward[b]);
          }
          const int expected = schedule == Schedule::kGpipe ? m : std::min(m, stages - s);
          EXPECT_EQ(PeakActivations(actions), expected) << stages << " stages, stage " << s;
        }
      }
    }
  }
}

// With equal stages both schedules end in (M + K - 1) (forward + backward) and idle the ideal
// bubble on every stage; neither deadlocks.
TEST(PipelinePlanTest, SimulatedBubbleIsTheIdealOne) {
  for (Schedule schedule : {Schedule::kGpipe, Schedule::k1F1B}) {
    for (int stages : {2, 4}) {
      for (int m : {4, 8, 16}) {
        absl::StatusOr<Timeline> t = Simulate(schedule, stages, m, 1.0, 2.0);
        ASSERT_TRUE(t.ok()) << t.status();
        EXPECT_DOUBLE_EQ(t->makespan, (m + stages - 1) * 3.0);
        for (int s = 0; s < stages; ++s) {
          EXPECT_DOUBLE_EQ(t->busy[s], m * 3.0);
          EXPECT_NEAR(t->bubble[s], IdealBubble(stages, m), 1e-12);
        }
      }
    }
  }
  EXPECT_DOUBLE_EQ(IdealBubble(4, 8), 3.0 / 11.0);
  // 1F1B on 4 stages and 8 micro-batches keeps 4, 3, 2, 1 micro-batches; GPipe 8 on each.
  EXPECT_THAT(Simulate(Schedule::k1F1B, 4, 8, 1, 2)->peak_activations, ElementsAre(4, 3, 2, 1));
  EXPECT_THAT(Simulate(Schedule::kGpipe, 4, 8, 1, 2)->peak_activations, ElementsAre(8, 8, 8, 8));
}

TEST(PipelinePlanTest, ScheduleNames) {
  EXPECT_EQ(*ParseSchedule("gpipe"), Schedule::kGpipe);
  EXPECT_EQ(*ParseSchedule("1f1b"), Schedule::k1F1B);
  EXPECT_EQ(ParseSchedule("interleaved").status().message(),
            "pipeline.schedule: unknown schedule 'interleaved', expected gpipe or 1f1b");
}

TEST(PipelinePlanTest, PartitionsOfLayersIntoStages) {
  // A transformer's layers: a large embedding, 4 equal blocks, a small head.
  const std::vector<int64_t> bytes = {400, 100, 100, 100, 100, 10};
  EXPECT_THAT(*PartitionLayers(bytes, 2, "balanced"), ElementsAre(1, 5));
  EXPECT_THAT(*PartitionLayers(bytes, 3, ""), ElementsAre(1, 2, 3));
  EXPECT_THAT(*PartitionLayers(bytes, 4, "uniform"), ElementsAre(2, 2, 1, 1));
  EXPECT_THAT(*PartitionLayers({1, 1, 1, 1, 1}, 2, "balanced"), ElementsAre(2, 3));
  EXPECT_THAT(*PartitionLayers(bytes, 6, "balanced"), ElementsAre(1, 1, 1, 1, 1, 1));
  EXPECT_THAT(*PartitionLayers(bytes, 2, "balanced", {3, 3}), ElementsAre(3, 3));
  // The largest stage of a balanced split is no larger than any other split's.
  const std::vector<int64_t> odd = {7, 3, 9, 1, 1, 8, 2, 6, 5};
  std::vector<int> split = *PartitionLayers(odd, 3, "balanced");
  EXPECT_THAT(split, ElementsAre(3, 4, 2));
  int64_t largest = 0;
  for (int s = 0, i = 0; s < 3; ++s) {
    int64_t sum = 0;
    for (int k = 0; k < split[s]; ++k) sum += odd[i++];
    largest = std::max(largest, sum);
  }
  EXPECT_EQ(largest, 19);  // [7 3 9] [1 1 8 2] [6 5]: no split of 3 does better
  EXPECT_EQ(PartitionLayers(bytes, 7, "balanced").status().message(),
            "pipeline.stages: 7 stages, but the model has 6 layers (each stage needs at least "
            "one)");
  EXPECT_THAT(PartitionLayers(bytes, 2, "", {2, 3}).status().message(),
              HasSubstr("pipeline.partition: [2, 3] adds up to 5 layers, the model has 6"));
  EXPECT_THAT(PartitionLayers(bytes, 2, "", {6, 0}).status().message(),
              HasSubstr("every stage needs at least one layer"));
  EXPECT_THAT(PartitionLayers(bytes, 3, "", {3, 3}).status().message(),
              HasSubstr("2 layer counts for 3 stages"));
  EXPECT_THAT(PartitionLayers(bytes, 2, "greedy").status().message(),
              HasSubstr("unknown partition 'greedy'"));
}

}  // namespace
}  // namespace trainyard::trainer::pipeline
