#ifndef TRAINYARD_COMMON_BACKOFF_H_
#define TRAINYARD_COMMON_BACKOFF_H_

#include <cstdint>

#include "absl/random/random.h"
#include "absl/time/time.h"

namespace trainyard {

// min(initial * 2^n, max): the bound of the n-th delay (n from 0) of an exponential backoff.
inline absl::Duration BackoffBound(absl::Duration initial, absl::Duration max, int n) {
  absl::Duration bound = initial;
  for (int i = 0; i < n && bound < max; ++i) bound *= 2;
  return bound > max ? max : bound;
}

// Exponential backoff with jitter, as the agent retries calls to the coordinator: the n-th delay
// is drawn uniformly from [base/2, base] where base = BackoffBound(initial, max, n). The default
// cap is short so that agents find a restarted coordinator within seconds, well inside its lease.
// Not thread-safe.
class Backoff {
 public:
  explicit Backoff(absl::Duration initial = absl::Milliseconds(100),
                   absl::Duration max = absl::Seconds(2))
      : initial_(initial), max_(max) {}

  absl::Duration Next() {
    const absl::Duration base = BackoffBound(initial_, max_, attempts_++);
    return base * absl::Uniform(gen_, 0.5, 1.0);
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

#endif  // TRAINYARD_COMMON_BACKOFF_H_
