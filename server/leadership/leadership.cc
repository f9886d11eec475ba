#include "server/leadership/leadership.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace trainyard {

bool WaitToLead(LeaderLease& lease, absl::Duration poll,
                const std::function<bool(absl::Duration)>& stopped,
                const std::function<void(const std::string&)>& leader) {
  std::string last_seen;
  while (true) {
    absl::StatusOr<bool> led = lease.TryAcquire();
    if (led.ok() && *led) return true;
    std::string seen;
    std::string address;
    if (!led.ok()) {
      seen = absl::StrCat("cannot reach the database: ", led.status().message());
    } else if (absl::StatusOr<LeaderInfo> who = lease.Current(); who.ok()) {
      if (who->live) address = who->address;
      seen = who->live ? absl::StrCat("standby: ", who->holder, " leads at ", who->address,
                                      " (token ", who->token, ")")
                       : "standby: the lease has just expired";
    }
    if (leader) leader(address);
    if (!seen.empty() && seen != last_seen) {
      LogInfo(seen);
      last_seen = seen;
    }
    if (stopped(poll)) return false;
  }
}

LeaseKeeper::LeaseKeeper(LeaderLease& lease, const Clock& clock,
                         std::function<void(absl::Status)> on_lost)
    : lease_(lease), clock_(clock), on_lost_(std::move(on_lost)) {
  thread_ = std::thread([this] { Loop(); });
}

LeaseKeeper::~LeaseKeeper() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.Signal();
  thread_.join();
}

void LeaseKeeper::OnCertainty(std::function<void(bool)> listener) {
  absl::MutexLock lock(&mu_);
  listener_ = std::move(listener);
}

void LeaseKeeper::Loop() {
  const absl::Duration every = lease_.lease() / 3;
  absl::Status last_error;
  while (true) {
    const absl::Time valid_until = lease_.valid_until();
    // The next renewal, or the local expiry if that comes first (renewals failed until then).
    const absl::Time wake = std::min(clock_.Now() + every, valid_until);
    {
      absl::MutexLock lock(&mu_);
      while (!stop_ && !clock_.WaitWithDeadline(cv_, mu_, wake)) {
      }
      if (stop_) return;
    }
    if (clock_.Now() >= valid_until) {
      on_lost_(absl::UnavailableError(
          absl::StrCat("the leader lease could not be renewed before it expired",
                       last_error.ok() ? "" : absl::StrCat(" (", last_error.message(), ")"))));
      return;
    }
    absl::Status renewed = lease_.Renew();
    if (renewed.ok() != certain_) {
      certain_ = renewed.ok();
      {
        absl::MutexLock lock(&mu_);
        if (listener_) listener_(certain_);
      }
      if (certain_) LogInfo("the leader lease is renewed again: serving");
    }
    if (renewed.code() == absl::StatusCode::kFailedPrecondition) {
      on_lost_(renewed);
      return;
    }
    if (!renewed.ok() && last_error.ok()) {
      LogWarning("renewing the leader lease: ", renewed.message(), " (retrying until ",
                 absl::FormatTime(valid_until), "; health NOT_SERVING meanwhile)");
    }
    last_error = renewed;
  }
}

}  // namespace trainyard
