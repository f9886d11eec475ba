#ifndef TRAINYARD_SERVER_AUTH_CONSOLE_LOGINS_H_
#define TRAINYARD_SERVER_AUTH_CONSOLE_LOGINS_H_

// One-time login codes for the web console (`trainyard console`, `trainyard up`): a person asks
// for a code with their own credential (a token or a client certificate); the link that carries
// it logs a browser in once, within minutes, and the browser then holds a token of that person's
// that expires (Authenticator::CreateToken), never the credential the link was made with. Codes
// live in the leader's memory only (a code not used before a failover is simply asked for
// again) and are kept hashed. Thread-safe.

#include <cstdint>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "server/auth/auth.h"

namespace trainyard {

class ConsoleLogins {
 public:
  static constexpr absl::Duration kCodeLifetime = absl::Minutes(5);
  static constexpr int kMaxPending = 10000;

  // `clock` must outlive it.
  explicit ConsoleLogins(const Clock& clock) : clock_(clock) {}

  // A new code for `person` (an admin or a user), good once until the time returned.
  // RESOURCE_EXHAUSTED when kMaxPending codes wait unused; PERMISSION_DENIED for an agent or a
  // task.
  absl::StatusOr<std::pair<std::string, absl::Time>> Create(const Principal& person);

  // The person `code` was made for; the code is spent. UNAUTHENTICATED, saying which, for a code
  // that is unknown, already used or expired.
  absl::StatusOr<Principal> Redeem(absl::string_view code);

 private:
  struct Pending {
    Principal person;
    absl::Time expires;
  };
  void DropExpiredLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Clock& clock_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, Pending> pending_ ABSL_GUARDED_BY(mu_);   // by code hash
  absl::flat_hash_map<std::string, absl::Time> spent_ ABSL_GUARDED_BY(mu_);  // hash -> expiry
};

}  // namespace trainyard

#endif  // TRAINYARD_SERVER_AUTH_CONSOLE_LOGINS_H_
