#ifndef TRAINYARD_WORKER_AGENT_BACKOFF_H_
#define TRAINYARD_WORKER_AGENT_BACKOFF_H_

#include <cstdint>

#include "absl/random/random.h"
#include "absl/time/time.h"

namespace trainyard {

// Exponential backoff with jitter for retrying calls to the coordinator: the n-th delay is
// drawn uniformly from [base/2, base] where base = min(initial * 2^n, max). The default cap is
// short so that agents find a restarted coordinator within seconds, well inside its lease.
// Not thread-safe.
class Backoff {
 public:
  explicit Backoff(absl::Duration initial = absl::Milliseconds(100),
                   absl::Duration max = absl::Seconds(2))
      : initial_(initial), max_(max) {}

  absl::Duration Next() {
    absl::Duration base = initial_;
    for (int i = 0; i < attempts_ && base < max_; ++i) base *= 2;
    if (base > max_) base = max_;
    ++attempts_;
    const double fraction = absl::Uniform(gen_, 0.5, 1.0);
    return base * fraction;
  }
  void Reset() { attempts_ = 0; }
  int attempts() const { return attempts_; }

 private:
  const absl::Duration initial_;
  const absl::Duration max_;
  int attempts_ = 0;
  absl::BitGen gen_;
};

}  // namespace trainyard

#endif  // TRAINYARD_WORKER_AGENT_BACKOFF_H_
