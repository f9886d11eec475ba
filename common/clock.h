#ifndef TRAINYARD_COMMON_CLOCK_H_
#define TRAINYARD_COMMON_CLOCK_H_

#include <chrono>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace trainyard {

// The only way logic reads time, so that tests can drive leases, timeouts and backoff with a
// simulated clock instead of sleeping. Implementations are thread-safe.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
  // Waits `d` of this clock's time. The real clock sleeps; a simulated one may instead move on by
  // `d` at once, so that code that waits between tries (retry backoff) runs in no real time under
  // test, its waits measured in the clock's time.
  virtual void SleepFor(absl::Duration d) const { absl::SleepFor(d); }
  // Waits on `cv` (`mu` held, released while waiting, as CondVar::WaitWithDeadline) until it is
  // signalled or this clock reaches `deadline`; true when the deadline has passed. May return
  // early without either (callers loop on their condition, as with any condition variable).
  virtual bool WaitWithDeadline(absl::CondVar& cv, absl::Mutex& mu, absl::Time deadline) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return cv.WaitWithDeadline(&mu, deadline);
  }
  // Waits (`mu` held, as Mutex::AwaitWithDeadline) until `condition` holds or this clock reaches
  // `deadline`; returns whether the condition holds.
  virtual bool AwaitWithDeadline(absl::Mutex& mu, const absl::Condition& condition,
                                 absl::Time deadline) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return mu.AwaitWithDeadline(condition, deadline);
  }
  // The same, for `timeout` of this clock's time from now.
  bool AwaitWithTimeout(absl::Mutex& mu, const absl::Condition& condition,
                        absl::Duration timeout) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return AwaitWithDeadline(mu, condition, Now() + timeout);
  }
};

// Wall-clock time. Thread-safe; the returned reference lives for the whole program.
class RealClock final : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
  static const Clock& Get() {
    static const RealClock* const kClock = new RealClock();
    return *kClock;
  }
};

// The monotonic clock now: the start of a measurement of how long work took (SecondsSince,
// step-time splits, recovery phases), never for deciding anything, which takes a Clock.
inline std::chrono::steady_clock::time_point MonotonicNow() {
  return std::chrono::steady_clock::now();
}

// A gRPC deadline `timeout` of real time from now (gRPC's own timers are real time).
inline std::chrono::system_clock::time_point GrpcDeadline(absl::Duration timeout) {
  return absl::ToChronoTime(RealClock::Get().Now() + timeout);
}

// Seconds of the monotonic clock since `start`: for measuring how long work took (step-time
// splits, recovery phases), never for deciding anything, which takes a Clock.
inline double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_CLOCK_H_
