#ifndef TRAINYARD_TESTS_COMMON_FAKE_CLOCK_H_
#define TRAINYARD_TESTS_COMMON_FAKE_CLOCK_H_

#include <optional>
#include <set>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace trainyard {

// A clock that moves only when told: by Advance, or by a sleep on it (SleepFor moves it on by the
// sleep at once). A wait with a deadline (WaitWithDeadline, AwaitWithDeadline) does not move it:
// it ends when its condition is met or when another thread has advanced the clock to the
// deadline, so that a test decides when each deadline comes. Thread-safe.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1'700'000'000)) : now_(start) {}
  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) const {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }
  // Moves the clock to `t` (never back).
  void AdvanceTo(absl::Time t) const {
    absl::MutexLock lock(&mu_);
    if (t > now_) now_ = t;
  }
  // Waits (in real time, up to `patience`) until some thread waits on this clock for a deadline
  // still ahead, and returns the earliest such deadline: when that thread will go on unless
  // woken. nullopt if none did in time. What a test advances the clock to, step by step.
  std::optional<absl::Time> AwaitWaiter(absl::Duration patience = absl::Seconds(30)) const {
    absl::MutexLock lock(&mu_);
    auto ahead = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !waiting_.empty() && *waiting_.rbegin() > now_;
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&ahead), patience)) return std::nullopt;
    return *waiting_.upper_bound(now_);
  }
  void SleepFor(absl::Duration d) const override { Advance(d); }
  // Polls the simulated time every kPoll of real time: Advance knows nothing of the waiters.
  bool WaitWithDeadline(absl::CondVar& cv, absl::Mutex& mu, absl::Time deadline) const override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (!Waiting(deadline)) return true;
    cv.WaitWithTimeout(&mu, kPoll);
    return Done(deadline);
  }
  bool AwaitWithDeadline(absl::Mutex& mu, const absl::Condition& condition,
                         absl::Time deadline) const override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    while (!condition.Eval()) {
      if (!Waiting(deadline)) return false;
      const bool met = mu.AwaitWithTimeout(condition, kPoll);
      if (Done(deadline) && !met) return false;
    }
    return true;
  }

  static constexpr absl::Duration kPoll = absl::Milliseconds(2);

 private:
  // Counts a wait for `deadline` (seen by AwaitWaiter) unless the deadline has passed.
  bool Waiting(absl::Time deadline) const {
    absl::MutexLock lock(&mu_);
    if (now_ >= deadline) return false;
    waiting_.insert(deadline);
    return true;
  }
  // Ends a wait Waiting counted; whether its deadline has passed.
  bool Done(absl::Time deadline) const {
    absl::MutexLock lock(&mu_);
    waiting_.erase(waiting_.find(deadline));
    return now_ >= deadline;
  }

  mutable absl::Mutex mu_;
  mutable absl::Time now_ ABSL_GUARDED_BY(mu_);
  mutable std::multiset<absl::Time> waiting_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trainyard

#endif  // TRAINYARD_TESTS_COMMON_FAKE_CLOCK_H_
