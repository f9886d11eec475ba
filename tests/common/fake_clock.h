#ifndef TRAINYARD_TESTS_COMMON_FAKE_CLOCK_H_
#define TRAINYARD_TESTS_COMMON_FAKE_CLOCK_H_

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace trainyard {

// A clock that moves only when told: by Advance, or by a wait on it (SleepFor moves it on by the
// wait at once). Thread-safe.
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
  void SleepFor(absl::Duration d) const override { Advance(d); }

 private:
  mutable absl::Mutex mu_;
  mutable absl::Time now_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trainyard

#endif  // TRAINYARD_TESTS_COMMON_FAKE_CLOCK_H_
