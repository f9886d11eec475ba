#ifndef TRAINYARD_SERVER_JOBS_METRIC_HISTORY_H_
#define TRAINYARD_SERVER_JOBS_METRIC_HISTORY_H_

// Which of a job's progress reports its metric history keeps: every report of the newest steps,
// older ones thinned so that the history stays within a bound however long the job runs.
//
// The history is a job's points (the store's metric_points rows), each known here by when it was
// taken and the step it reports. Thinning groups the points of a zone into buckets of steps and
// keeps the newest point of each bucket:
// - the recent zone (steps within `recent_steps` of the highest step reported) in buckets of
//   one step: every step keeps its newest report;
// - the old zone (the steps before it) in buckets of a power-of-two width, the smallest that
//   leaves at most `old_points` buckets: evenly spread over the steps, coarser as the job grows.
// A history thins only once it holds `slack` points over its bound, so a write of one point
// rarely deletes any; it never holds more than recent_steps + 1 + old_points + slack points.
// A restart that rewinds the step shares buckets with the attempt it replaced, whose points go
// first (a chart against step shows the attempt that counts).

#include <cstdint>
#include <map>
#include <vector>

namespace trainyard {

struct MetricHistoryBound {
  int64_t recent_steps = 1000;
  int64_t old_points = 2000;  // at least 3
  int64_t slack = 500;        // at least 1

  // The most points a history holds.
  int64_t max_points() const { return recent_steps + 1 + old_points + slack; }
};

// A point of the history: when the coordinator took it (its key in the store) and its step.
struct MetricPointKey {
  int64_t unix_ms = 0;
  int64_t step = 0;
  bool operator==(const MetricPointKey& o) const { return unix_ms == o.unix_ms && step == o.step; }
};

// One job's history, by key. Not thread-safe (the JobManager holds it under its lock).
class MetricHistory {
 public:
  // A point read back from the store (no thinning).
  void Load(MetricPointKey key) { points_[key.unix_ms] = key.step; }
  // Adds a point (one taken at the same millisecond as a kept one replaces it) and returns the
  // points to delete: none until the history holds bound.max_points(), then the thinning above.
  std::vector<MetricPointKey> Add(MetricPointKey key, const MetricHistoryBound& bound);

  int64_t size() const { return static_cast<int64_t>(points_.size()); }

  // The points that thinning to `bound` would delete now, without deleting them.
  std::vector<MetricPointKey> Thinning(const MetricHistoryBound& bound) const;

 private:
  std::map<int64_t, int64_t> points_;  // unix_ms -> step
};

}  // namespace trainyard

#endif  // TRAINYARD_SERVER_JOBS_METRIC_HISTORY_H_
