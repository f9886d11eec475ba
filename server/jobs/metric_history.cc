#include "server/jobs/metric_history.h"

#include <algorithm>
#include <set>
#include <utility>

namespace trainyard {

std::vector<MetricPointKey> MetricHistory::Add(MetricPointKey key,
                                               const MetricHistoryBound& bound) {
  points_[key.unix_ms] = key.step;
  if (size() < bound.max_points()) return {};
  std::vector<MetricPointKey> drop = Thinning(bound);
  for (const MetricPointKey& k : drop) points_.erase(k.unix_ms);
  return drop;
}

std::vector<MetricPointKey> MetricHistory::Thinning(const MetricHistoryBound& bound) const {
  std::vector<MetricPointKey> drop;
  if (points_.empty()) return drop;
  const int64_t old_points = std::max<int64_t>(bound.old_points, 3);  // a width always fits
  int64_t top = points_.begin()->second;
  int64_t bottom = top;
  for (const auto& [ms, step] : points_) {
    top = std::max(top, step);
    bottom = std::min(bottom, step);
  }
  const int64_t cutoff = top - std::max<int64_t>(bound.recent_steps, 0);  // old zone: below it
  // The old zone's bucket width: the smallest power of two leaving at most old_points buckets.
  // Buckets are aligned to multiples of the width, so that they stay put as the zone grows.
  int64_t width = 1;
  const int64_t span = cutoff - bottom;
  while (span > 0 && span / width + 2 > old_points) width *= 2;
  auto bucket = [&](int64_t step) -> std::pair<bool, int64_t> {
    if (step >= cutoff) return {false, step};
    const int64_t b = step / width;
    return {true, (step < 0 && step % width != 0) ? b - 1 : b};
  };
  // Newest first: the first point seen in a bucket is the one it keeps.
  std::set<std::pair<bool, int64_t>> seen;
  for (auto it = points_.rbegin(); it != points_.rend(); ++it) {
    if (!seen.insert(bucket(it->second)).second) drop.push_back({it->first, it->second});
  }
  return drop;
}

}  // namespace trainyard
