#include "server/auth/console_logins.h"

#include <openssl/rand.h>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/sha256.h"

namespace trainyard {

void ConsoleLogins::DropExpiredLocked(absl::Time now) {
  absl::erase_if(pending_, [now](const auto& entry) { return entry.second.expires <= now; });
  absl::erase_if(spent_, [now](const auto& entry) { return entry.second <= now; });
}

absl::StatusOr<std::pair<std::string, absl::Time>> ConsoleLogins::Create(const Principal& person) {
  if (person.role != Role::kAdmin && person.role != Role::kUser) {
    return absl::PermissionDeniedError("console logins are for people (admins and users)");
  }
  unsigned char bytes[24];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) {
    return absl::InternalError("no random bytes for a login code");
  }
  const std::string code = absl::WebSafeBase64Escape(
      absl::string_view(reinterpret_cast<const char*>(bytes), sizeof(bytes)));
  const absl::Time now = clock_.Now();
  const absl::Time expires = now + kCodeLifetime;
  absl::MutexLock lock(&mu_);
  DropExpiredLocked(now);
  if (static_cast<int>(pending_.size()) >= kMaxPending) {
    return absl::ResourceExhaustedError(
        absl::StrCat(kMaxPending, " console login codes wait unused: try again in a few minutes"));
  }
  pending_[Sha256Hex(code)] = Pending{person, expires};
  return std::make_pair(code, expires);
}

absl::StatusOr<Principal> ConsoleLogins::Redeem(absl::string_view code) {
  const std::string hash = Sha256Hex(code);
  const absl::Time now = clock_.Now();
  absl::MutexLock lock(&mu_);
  auto it = pending_.find(hash);
  if (it == pending_.end()) {
    return absl::UnauthenticatedError(
        spent_.count(hash) ? "this login link was used already: ask for a new one "
                             "(trainyard console)"
                           : "this login link is not known (or has expired): ask for a new one "
                             "(trainyard console)");
  }
  const Pending pending = it->second;
  pending_.erase(it);
  if (pending.expires <= now) {
    return absl::UnauthenticatedError(
        "this login link has expired (they last 5 minutes): ask for a new one (trainyard "
        "console)");
  }
  spent_[hash] = pending.expires;
  DropExpiredLocked(now);
  return pending.person;
}

}  // namespace trainyard
