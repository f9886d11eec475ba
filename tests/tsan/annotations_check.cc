// Checks the annotations of absl_sync_annotations.cc under ThreadSanitizer (make test-tsan): two
// threads add to a counter a thousand times each. Both under an absl::Mutex: no report (without the
// annotations ThreadSanitizer reports a race, as it cannot see Debian's Abseil lock). With "race",
// the main thread skips the lock: a report (a race is still found).

#include <cstring>
#include <thread>

#include "absl/synchronization/mutex.h"

namespace {
absl::Mutex mu;
int counter = 0;
}  // namespace

int main(int argc, char** argv) {
  const bool race = argc > 1 && std::strcmp(argv[1], "race") == 0;
  std::thread other([] {
    for (int i = 0; i < 1000; ++i) {
      absl::MutexLock lock(&mu);
      ++counter;
    }
  });
  for (int i = 0; i < 1000; ++i) {
    if (race) {
      ++counter;
    } else {
      absl::MutexLock lock(&mu);
      ++counter;
    }
  }
  other.join();
  return 0;
}
