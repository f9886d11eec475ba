#ifndef TRAINYARD_SERVER_LEADERSHIP_LEADER_LEASE_H_
#define TRAINYARD_SERVER_LEADERSHIP_LEADER_LEASE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "server/store/postgres_connection.h"
#include "server/store/postgres_job_store.h"

namespace trainyard {

// Who leads, as the lease row says.
struct LeaderInfo {
  std::string holder;   // empty: no coordinator ever led
  std::string address;  // where it serves clients
  int64_t token = 0;
  bool live = false;  // the lease has not expired (by the database's clock)
};

// The leader lease of coordinators sharing a PostgreSQL database: one row (`leader`) naming the
// holder, its address, a fencing token and an expiry, all times by the database's clock. Taking
// the lease (only when it has expired) increments the token; renewing extends the expiry only if
// the row still names this holder and token and has not expired; the store's writes check the
// same (PostgresJobStore with a LeaseFence), so a deposed leader writes nothing.
// Besides the database's expiry, the holder keeps a local one: the time it sent its last
// successful take or renewal plus the lease. It is never later than the database's, so a holder
// that stops acting by it (valid_until) has stopped before another can take over.
// Thread-safe; calls block on the database, each within the connection's timeout.
class LeaderLease {
 public:
  // `holder`: a name unique to this process (two processes must never share it); `address`:
  // where it serves clients, told to others by Current(). UNAVAILABLE when the database cannot be
  // reached.
  static absl::StatusOr<std::unique_ptr<LeaderLease>> Open(const pg::ConnectOptions& options,
                                                           std::string holder, std::string address,
                                                           absl::Duration lease,
                                                           const Clock& clock);

  // Takes the lease if it has expired (or was released), with the next token: true if this
  // process now leads. UNAVAILABLE when the database cannot be reached.
  absl::StatusOr<bool> TryAcquire();
  // Extends a held lease. FAILED_PRECONDITION when it is no longer held (expired or taken: this
  // process must stop acting at once), UNAVAILABLE when the database did not answer (it must
  // stop at valid_until() unless a later renewal succeeds).
  absl::Status Renew();
  // Gives the lease up at once (a clean shutdown), so that a standby need not wait it out.
  absl::Status Release();
  // The row as it is now.
  absl::StatusOr<LeaderInfo> Current();

  // What the store's writes must carry; token 0 before the lease was first taken.
  LeaseFence fence() const;
  // Until when, by this process's clock, it may act as leader (InfinitePast when not leading).
  absl::Time valid_until() const;
  absl::Duration lease() const { return lease_; }

 private:
  LeaderLease(std::unique_ptr<pg::Connection> db, std::string holder, std::string address,
              absl::Duration lease, const Clock& clock)
      : db_(std::move(db)),
        holder_(std::move(holder)),
        address_(std::move(address)),
        lease_(lease),
        clock_(clock) {}

  mutable absl::Mutex mu_;
  const std::unique_ptr<pg::Connection> db_ ABSL_PT_GUARDED_BY(mu_);
  const std::string holder_;
  const std::string address_;
  const absl::Duration lease_;
  const Clock& clock_;
  int64_t token_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time valid_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace trainyard

#endif  // TRAINYARD_SERVER_LEADERSHIP_LEADER_LEASE_H_
