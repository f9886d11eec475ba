#ifndef TRAINYARD_TESTS_TRAINER_FAKE_RENDEZVOUS_H_
#define TRAINYARD_TESTS_TRAINER_FAKE_RENDEZVOUS_H_

#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "worker/trainer/coordinator/rendezvous_client.h"

namespace trainyard::trainer {

// An in-memory rendezvous store shared by the ranks of one test (one client per rank, or the
// same one for all: it is thread-safe).
class FakeRendezvous final : public RendezvousClient {
 public:
  absl::Status Set(const std::string& key, const std::string& value) override {
    absl::MutexLock lock(&mu_);
    values_[key] = value;
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    absl::MutexLock lock(&mu_);
    auto has_key = [this, &key]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return values_.count(key) > 0; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&has_key), timeout)) {
      return absl::DeadlineExceededError(absl::StrCat("key '", key, "' not set"));
    }
    return values_.at(key);
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trainyard::trainer

#endif  // TRAINYARD_TESTS_TRAINER_FAKE_RENDEZVOUS_H_
