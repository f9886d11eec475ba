#include "server/leadership/leader_lease.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace trainyard {

using pg::Params;

absl::StatusOr<std::unique_ptr<LeaderLease>> LeaderLease::Open(const pg::ConnectOptions& options,
                                                               std::string holder,
                                                               std::string address,
                                                               absl::Duration lease,
                                                               const Clock& clock) {
  if (holder.empty()) return absl::InvalidArgumentError("a lease holder needs a name");
  if (lease <= absl::ZeroDuration())
    return absl::InvalidArgumentError("the lease must be positive");
  absl::StatusOr<std::unique_ptr<pg::Connection>> db = pg::Connection::Open(options);
  if (!db.ok()) return db.status();
  if (absl::Status s = EnsurePostgresSchema(**db); !s.ok()) return s;
  return std::unique_ptr<LeaderLease>(
      new LeaderLease(*std::move(db), std::move(holder), std::move(address), lease, clock));
}

absl::StatusOr<bool> LeaderLease::TryAcquire() {
  absl::MutexLock lock(&mu_);
  const absl::Time sent = clock_.Now();
  // Waits (within lock_timeout) for a write of the old leader in flight, which holds the row.
  absl::StatusOr<pg::Result> r = db_->Exec(
      "UPDATE leader SET holder = $1, address = $2, token = token + 1, expires_at = now() + "
      "$3::bigint * "
      "interval '1 millisecond' WHERE id = 1 AND expires_at <= now() RETURNING token",
      Params().Add(holder_).Add(address_).Add(absl::ToInt64Milliseconds(lease_)));
  if (!r.ok()) return r.status();
  if (r->rows() == 0) return false;
  token_ = r->Int(0, 0);
  valid_until_ = sent + lease_;
  return true;
}

absl::Status LeaderLease::Renew() {
  absl::MutexLock lock(&mu_);
  if (token_ == 0) return absl::FailedPreconditionError("the lease was never taken");
  const absl::Time sent = clock_.Now();
  absl::StatusOr<pg::Result> r = db_->Exec(
      "UPDATE leader SET expires_at = now() + $3::bigint * interval '1 millisecond' WHERE id = 1 "
      "AND "
      "holder = $1 AND token = $2 AND expires_at > now()",
      Params().Add(holder_).Add(token_).Add(absl::ToInt64Milliseconds(lease_)));
  if (!r.ok()) return r.status();
  if (r->affected() != 1) {
    valid_until_ = absl::InfinitePast();
    return absl::FailedPreconditionError(
        absl::StrCat("the leader lease (token ", token_, ") was lost: it expired or was taken"));
  }
  valid_until_ = sent + lease_;
  return absl::OkStatus();
}

absl::Status LeaderLease::Release() {
  absl::MutexLock lock(&mu_);
  if (token_ == 0) return absl::OkStatus();
  valid_until_ = absl::InfinitePast();
  return db_->Run(
      "UPDATE leader SET expires_at = 'epoch' WHERE id = 1 AND holder = $1 AND token = $2",
      Params().Add(holder_).Add(token_));
}

absl::StatusOr<LeaderInfo> LeaderLease::Current() {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<pg::Result> r =
      db_->Exec("SELECT holder, address, token, expires_at > now() FROM leader WHERE id = 1");
  if (!r.ok()) return r.status();
  if (r->rows() != 1) return absl::DataLossError("the leader row is missing");
  LeaderInfo info;
  info.holder = r->Text(0, 0);
  info.address = r->Text(0, 1);
  info.token = r->Int(0, 2);
  info.live = r->Int(0, 3) != 0;
  return info;
}

LeaseFence LeaderLease::fence() const {
  absl::MutexLock lock(&mu_);
  return LeaseFence{holder_, token_};
}

absl::Time LeaderLease::valid_until() const {
  absl::MutexLock lock(&mu_);
  return valid_until_;
}

}  // namespace trainyard
