#ifndef TRAINYARD_COMMON_CLOCK_H_
#define TRAINYARD_COMMON_CLOCK_H_

#include <chrono>

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

// Seconds of the monotonic clock since `start`: for measuring how long work took (step-time
// splits, recovery phases), never for deciding anything, which takes a Clock.
inline double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_CLOCK_H_
