#ifndef TRAINYARD_SERVER_LEADERSHIP_LEADERSHIP_H_
#define TRAINYARD_SERVER_LEADERSHIP_LEADERSHIP_H_

// Room leadership/: which coordinator leads a shared PostgreSQL store. The fenced lease, its
// keeper, the standby's warm copy of the state and the move of a SQLite state into PostgreSQL
// under the lease. It may call store/ and lifecycle/.
//
// How a coordinator sharing a PostgreSQL store comes to lead and keeps leading (docs/
// operations.md, "More than one coordinator"): a standby tries the lease until it is free; the
// leader renews it on a thread of its own and is told, once, when it is lost.

#include <functional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "server/leadership/leader_lease.h"

namespace trainyard {

// Tries `lease` every `poll` until it is taken (true) or `stopped` says to give up (false), which
// is asked between tries with the time to wait: it waits that long or less and returns true to
// stop. Logs the leader it stands by for whenever that changes, and why the database cannot be
// reached while it cannot. After each try, `leader` (when given) is told the address the leader
// serves at, empty when none leads or the database cannot say.
bool WaitToLead(LeaderLease& lease, absl::Duration poll,
                const std::function<bool(absl::Duration)>& stopped,
                const std::function<void(const std::string&)>& leader = nullptr);

// Renews a held lease every third of its length on a thread of its own. When the lease is lost
// (taken, or expired by the database's clock) or could not be renewed before its local expiry
// (valid_until), calls `on_lost` once, on that thread, with the reason; it then renews no more.
// The destructor stops the thread (it does not release the lease).
class LeaseKeeper {
 public:
  LeaseKeeper(LeaderLease& lease, const Clock& clock, std::function<void(absl::Status)> on_lost);
  ~LeaseKeeper();
  LeaseKeeper(const LeaseKeeper&) = delete;
  LeaseKeeper& operator=(const LeaseKeeper&) = delete;

  // `listener` is told, on the keeper's thread, false when a renewal fails (the lease may still
  // hold, but this coordinator can no longer be sure of it) and true when one succeeds again: the
  // leader's health says NOT_SERVING meanwhile (CoordinatorServer::SetServing). The listener is
  // called under the keeper's lock, so once OnCertainty(nullptr) returns it is never called again
  // (what it points to may then go).
  void OnCertainty(std::function<void(bool)> listener);

 private:
  void Loop();

  LeaderLease& lease_;
  const Clock& clock_;
  const std::function<void(absl::Status)> on_lost_;
  absl::Mutex mu_;
  absl::CondVar cv_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::function<void(bool)> listener_ ABSL_GUARDED_BY(mu_);
  bool certain_ = true;  // what the listener was last told; the keeper's thread only
  std::thread thread_;
};

}  // namespace trainyard

#endif  // TRAINYARD_SERVER_LEADERSHIP_LEADERSHIP_H_
