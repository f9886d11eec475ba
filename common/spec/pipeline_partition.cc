#include "common/spec/pipeline_partition.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace trainyard {

absl::StatusOr<std::vector<int>> PartitionLayers(const std::vector<int64_t>& layer_bytes,
                                                 int stages, absl::string_view mode,
                                                 const std::vector<int>& counts) {
  const int layers = static_cast<int>(layer_bytes.size());
  if (stages < 1) {
    return absl::InvalidArgumentError(absl::StrCat("pipeline.stages: must be >= 1, got ", stages));
  }
  if (stages > layers) {
    return absl::InvalidArgumentError(absl::StrCat("pipeline.stages: ", stages,
                                                   " stages, but the model has ", layers,
                                                   " layers (each stage needs at least one)"));
  }
  if (!counts.empty()) {
    if (static_cast<int>(counts.size()) != stages) {
      return absl::InvalidArgumentError(absl::StrCat("pipeline.partition: ", counts.size(),
                                                     " layer counts for ", stages, " stages"));
    }
    int sum = 0;
    for (int c : counts) {
      if (c < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("pipeline.partition: every stage needs at least one layer, got [",
                         absl::StrJoin(counts, ", "), "]"));
      }
      sum += c;
    }
    if (sum != layers) {
      return absl::InvalidArgumentError(absl::StrCat("pipeline.partition: [",
                                                     absl::StrJoin(counts, ", "), "] adds up to ",
                                                     sum, " layers, the model has ", layers));
    }
    return counts;
  }
  if (mode == "uniform") {
    std::vector<int> out(static_cast<size_t>(stages), layers / stages);
    for (int s = 0; s < layers % stages; ++s) ++out[static_cast<size_t>(s)];
    return out;
  }
  if (!mode.empty() && mode != "balanced") {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline.partition: unknown partition '", mode,
                     "', expected balanced, uniform or a list of layer counts"));
  }
  // best[k][i]: the best split of the first i layers into k stages, as (its largest stage, the
  // sum of its stages' squares: among splits with the same largest stage, the most even one);
  // cut[k][i] where its last stage starts.
  std::vector<int64_t> prefix(static_cast<size_t>(layers) + 1, 0);
  for (int i = 0; i < layers; ++i) prefix[i + 1] = prefix[i] + layer_bytes[i];
  using Cost = std::pair<int64_t, long double>;
  const Cost none = {std::numeric_limits<int64_t>::max(), 0};
  std::vector<std::vector<Cost>> best(stages + 1,
                                      std::vector<Cost>(static_cast<size_t>(layers) + 1, none));
  std::vector<std::vector<int>> cut(stages + 1, std::vector<int>(static_cast<size_t>(layers) + 1));
  best[0][0] = {0, 0};
  for (int k = 1; k <= stages; ++k) {
    for (int i = k; i <= layers; ++i) {
      for (int j = k - 1; j < i; ++j) {
        if (best[k - 1][j] == none) continue;
        const int64_t last = prefix[i] - prefix[j];
        const Cost cost = {std::max(best[k - 1][j].first, last),
                           best[k - 1][j].second +
                               static_cast<long double>(last) * static_cast<long double>(last)};
        if (cost < best[k][i]) {
          best[k][i] = cost;
          cut[k][i] = j;
        }
      }
    }
  }
  std::vector<int> out(static_cast<size_t>(stages));
  for (int k = stages, i = layers; k >= 1; --k) {
    out[static_cast<size_t>(k - 1)] = i - cut[k][i];
    i = cut[k][i];
  }
  return out;
}

}  // namespace trainyard
