#include "common/parallel.h"

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace trainyard {

absl::Status ParallelFor(int64_t n, int threads, const std::function<absl::Status(int64_t)>& fn) {
  std::atomic<int64_t> next{0};
  std::atomic<bool> failed{false};
  absl::Mutex mu;
  absl::Status first;
  auto worker = [&] {
    while (!failed.load()) {
      const int64_t i = next.fetch_add(1);
      if (i >= n) return;
      absl::Status s = fn(i);
      if (!s.ok()) {
        absl::MutexLock lock(&mu);
        if (first.ok()) first = s;
        failed = true;
      }
    }
  };
  const int count = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, n)));
  std::vector<std::thread> pool;
  for (int t = 1; t < count; ++t) pool.emplace_back(worker);
  worker();
  for (std::thread& t : pool) t.join();
  return first;
}

}  // namespace trainyard
