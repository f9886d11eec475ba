#ifndef TRAINYARD_COMMON_BACKOFF_H_
#define TRAINYARD_COMMON_BACKOFF_H_

#include <algorithm>
#include <cstdint>

#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/clock.h"

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

// How Retry repeats a call: until it succeeds, fails with an error the caller does not retry,
// has been made `max_attempts` times (0: no limit), or the clock has passed `give_up_at`.
struct RetryPolicy {
  int max_attempts = 0;
  absl::Time give_up_at = absl::InfiniteFuture();
  absl::Duration backoff = absl::Milliseconds(250);  // the first wait, doubling after each
  absl::Duration max_backoff = absl::InfiniteDuration();
};

// The one retry loop: calls `fn` (returning absl::Status) as `policy` says, while `retryable`
// (a predicate on the failed status) allows, waiting BackoffBound(backoff, max_backoff, n) on
// `clock` between tries (Clock::SleepFor: real sleeps on the real clock, none on a simulated
// one), the last wait cut short to end at `give_up_at`. Returns the last status. Blocks.
template <typename Retryable, typename Fn>
absl::Status Retry(const Clock& clock, const RetryPolicy& policy, Retryable&& retryable, Fn&& fn) {
  for (int n = 0;; ++n) {
    absl::Status status = fn();
    if (status.ok() || !retryable(status)) return status;
    if (policy.max_attempts > 0 && n + 1 >= policy.max_attempts) return status;
    const absl::Time now = clock.Now();
    if (now >= policy.give_up_at) return status;
    clock.SleepFor(
        std::min(BackoffBound(policy.backoff, policy.max_backoff, n), policy.give_up_at - now));
  }
}

// Retries every failure but a refusal (FAILED_PRECONDITION): what storage writes retry.
inline bool UnlessRefused(const absl::Status& status) {
  return status.code() != absl::StatusCode::kFailedPrecondition;
}

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_BACKOFF_H_
