#ifndef TRAINYARD_COMMON_PARALLEL_H_
#define TRAINYARD_COMMON_PARALLEL_H_

#include <cstdint>
#include <functional>

#include "absl/status/status.h"

namespace trainyard {

// Runs fn(i) for i in [0, n) on up to `threads` threads (the caller's among them), handing out
// indices in increasing order; stops handing out work after the first error and returns it.
// Blocks until every call that started has returned.
absl::Status ParallelFor(int64_t n, int threads, const std::function<absl::Status(int64_t)>& fn);

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_PARALLEL_H_
