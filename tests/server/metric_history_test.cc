#include "server/jobs/metric_history.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <vector>

namespace trainyard {
namespace {

// Feeds `history` a report per `every` steps up to `steps`, one millisecond apart, and keeps the
// surviving points as the store would: what Add returns is deleted.
void Report(MetricHistory& history, const MetricHistoryBound& bound, int64_t from, int64_t steps,
            int64_t every, int64_t* ms, std::map<int64_t, int64_t>& kept) {
  for (int64_t step = from; step <= steps; step += every) {
    const MetricPointKey key{++*ms, step};
    kept[key.unix_ms] = key.step;
    for (const MetricPointKey& gone : history.Add(key, bound)) {
      EXPECT_EQ(kept.count(gone.unix_ms), 1u) << "deleted a point it never had";
      kept.erase(gone.unix_ms);
    }
    EXPECT_LE(history.size(), bound.max_points());
    EXPECT_EQ(history.size(), static_cast<int64_t>(kept.size()));
  }
}

TEST(MetricHistoryTest, KeepsEveryPointUntilTheBound) {
  MetricHistoryBound bound{100, 50, 10};
  MetricHistory history;
  int64_t ms = 0;
  std::map<int64_t, int64_t> kept;
  Report(history, bound, 0, bound.max_points() - 2, 1, &ms, kept);
  EXPECT_EQ(static_cast<int64_t>(kept.size()), bound.max_points() - 1);
}

TEST(MetricHistoryTest, AMillionStepsStayWithinTheBoundAndCoverTheRun) {
  MetricHistoryBound bound;  // 1000 recent steps, 2000 older points, 500 slack
  MetricHistory history;
  int64_t ms = 0;
  std::map<int64_t, int64_t> kept;
  Report(history, bound, 0, 1000000, 1, &ms, kept);
  ASSERT_LE(static_cast<int64_t>(kept.size()), bound.max_points());
  std::vector<int64_t> steps;
  for (const auto& [t, step] : kept) steps.push_back(step);
  std::sort(steps.begin(), steps.end());
  // Every one of the newest 1,000 steps is there...
  for (int64_t step = 1000000 - 1000; step <= 1000000; ++step) {
    EXPECT_TRUE(std::binary_search(steps.begin(), steps.end(), step)) << step;
  }
  // ...and the older ones are spread over the whole run: no gap wider than twice the spacing
  // 2,000 points would have.
  EXPECT_LE(steps.front(), 1000);
  int64_t widest = 0;
  for (size_t i = 1; i < steps.size(); ++i) widest = std::max(widest, steps[i] - steps[i - 1]);
  EXPECT_LE(widest, 2 * (1000000 / 2000) + 1);
  EXPECT_GE(steps.size(), 2000u);
}

TEST(MetricHistoryTest, ARestartThatRewindsKeepsTheNewAttemptsPoints) {
  MetricHistoryBound bound{10, 5, 1};
  MetricHistory history;
  int64_t ms = 0;
  std::map<int64_t, int64_t> kept;
  Report(history, bound, 0, 30, 1, &ms, kept);  // an attempt to step 30
  const int64_t restarted_at = ms;
  Report(history, bound, 20, 40, 1, &ms, kept);  // the next resumes from step 20
  for (const MetricPointKey& gone : history.Thinning(bound)) kept.erase(gone.unix_ms);
  // Of the steps both attempts reported, only the new attempt's points remain.
  for (const auto& [t, step] : kept) {
    if (t <= restarted_at && step >= 20) ADD_FAILURE() << "old attempt's step " << step << " kept";
  }
  EXPECT_TRUE(kept.count(ms));
}

TEST(MetricHistoryTest, ManyReportsOfOneStepKeepTheNewest) {
  MetricHistoryBound bound{10, 5, 1};
  MetricHistory history;
  for (int64_t ms = 1; ms <= 100; ++ms) history.Add({ms, 7}, bound);
  EXPECT_LE(history.size(), bound.max_points());
  // A thinning now leaves the newest report alone.
  const std::vector<MetricPointKey> gone = history.Thinning(bound);
  EXPECT_EQ(static_cast<int64_t>(gone.size()), history.size() - 1);
  for (const MetricPointKey& k : gone) EXPECT_NE(k.unix_ms, 100);
}

TEST(MetricHistoryTest, LoadedPointsAreThinnedByTheNextAdd) {
  MetricHistoryBound bound{10, 5, 1};
  MetricHistory history;
  for (int64_t i = 0; i < 100; ++i) history.Load({i + 1, i});
  const std::vector<MetricPointKey> gone = history.Add({1000, 100}, bound);
  EXPECT_FALSE(gone.empty());
  EXPECT_LE(history.size(), bound.max_points());
}

}  // namespace
}  // namespace trainyard
