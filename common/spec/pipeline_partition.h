#ifndef TRAINYARD_COMMON_SPEC_PIPELINE_PARTITION_H_
#define TRAINYARD_COMMON_SPEC_PIPELINE_PARTITION_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace trainyard {

// How a model's layers (in order) are split into stages: each stage a consecutive run of at
// least one layer.
//   "balanced" (or empty): the split whose largest stage, in `layer_bytes`, is smallest, and
//     among those the most even (the least sum of the stages' squares);
//   "uniform": layers / stages each, the first layers % stages stages one more;
//   `counts`: the user's layer counts per stage (non-empty counts win over `mode`).
// Returns the layer count of each stage. INVALID_ARGUMENT naming pipeline.stages or
// pipeline.partition: more stages than layers, counts that are not one per stage, below 1, or do
// not add up to the layers, an unknown mode.
absl::StatusOr<std::vector<int>> PartitionLayers(const std::vector<int64_t>& layer_bytes,
                                                 int stages, absl::string_view mode,
                                                 const std::vector<int>& counts = {});

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_SPEC_PIPELINE_PARTITION_H_
