#ifndef TRAINYARD_SERVER_STATE_STORES_H_
#define TRAINYARD_SERVER_STATE_STORES_H_

// The coordinator's state as its main opens it: SQLite in the state folder, or PostgreSQL after
// waiting to lead (standing by meanwhile, with a warm copy of the state); the state folder's
// lock; and --migrate_state. Part of main's assembly: it reads the coordinator's flags.

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "server/leadership/leader_lease.h"
#include "server/leadership/leadership.h"
#include "server/store/log_store.h"

namespace trainyard {

// The cluster's state: three connections to one store (the manager's, the tokens', the
// searches'), the key that signs task credentials, and with PostgreSQL the lease that makes this
// coordinator the leader, kept renewed.
struct StateStores {
  std::unique_ptr<JobStore> jobs;
  std::unique_ptr<JobStore> tokens;
  std::unique_ptr<JobStore> searches;
  std::unique_ptr<LogBackend> logs;  // task logs: files in the state folder, or the database's
  std::string task_key;
  std::unique_ptr<LeaderLease> lease;
  std::unique_ptr<LeaseKeeper> keeper;
  int standby_port = 0;  // the API port it stood by on: the leader's server binds the same
};

// Waits up to a time for a stop signal: true if one came.
using SignalWait = std::function<bool(absl::Duration)>;
// Told, while standing by, the address of the leader whenever it changes (empty: none leads).
using LeaderSeen = std::function<void(const std::string&)>;

// Holds --state_dir for this process (flock on its coordinator.lock, released at exit): two
// coordinators on one state folder would both schedule. False (logged) when another holds it.
bool LockStateDir(const std::string& abs_state);

// --migrate_state: the state folder's SQLite state into the empty database of --store. The
// process's exit code.
int MigrateState(const std::string& abs_state);

// SQLite in the state folder; or PostgreSQL, after waiting to lead, standing by on `listen`
// meanwhile (telling `leader_seen`, when set, who leads). Returns nullopt after logging why when
// it cannot, or when a stop signal came while standing by (`stopped` set).
std::optional<StateStores> OpenStores(const std::string& abs_state, const std::string& listen,
                                      std::shared_ptr<grpc::ServerCredentials> credentials,
                                      const SignalWait& signal_within, bool* stopped,
                                      const LeaderSeen& leader_seen = nullptr);

}  // namespace trainyard

#endif  // TRAINYARD_SERVER_STATE_STORES_H_
