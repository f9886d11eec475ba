#ifndef TRAINYARD_SERVER_API_COORDINATOR_SERVER_H_
#define TRAINYARD_SERVER_API_COORDINATOR_SERVER_H_

// Room api/: the gRPC services (jobs, agents, admins, searches), the call gate every call
// passes (bounds, authentication, roles, streams per caller) and the metrics the coordinator
// serves. Each RPC validates, calls jobs/ or searches/, and maps the status; it may call auth/,
// jobs/ and searches/, and nothing calls it but the coordinator's main.

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/api/admin_service.h"
#include "server/api/agent_service.h"
#include "server/api/call_gate.h"
#include "server/api/job_service.h"
#include "server/api/search_service.h"
#include "server/auth/auth.h"
#include "server/jobs/job_manager.h"
#include "server/jobs/workdir_store.h"

namespace trainyard {

struct CoordinatorServerOptions {
  std::string listen = "127.0.0.1:0";  // "host:port"; port 0 lets the kernel pick
  // Null: plaintext.
  std::shared_ptr<grpc::ServerCredentials> credentials;
  int max_streams_per_caller = 16;
  // Non-empty: a second, plaintext port serving only grpc.health.v1.Health, for probes that
  // cannot speak TLS (the kubelet's).
  std::string health_listen;
  absl::Duration tick_interval = absl::Milliseconds(100);
  // HTTP/2 keepalive pings on a connection silent for lease_ping_interval (anything received
  // puts the next ping off): one unanswered for lease_ping_timeout closes the connection, which
  // ends the agent lease stream on it (HoldLease). Busy agents' beats find a lost host sooner.
  absl::Duration lease_ping_interval = absl::Seconds(75);
  absl::Duration lease_ping_timeout = absl::Seconds(10);
  // Non-null: SearchService is served and searches tick after the jobs. Must outlive the server.
  SearchManager* searches = nullptr;
  // Non-null: JobService.UploadWorkdir keeps programs' workdirs there. Must outlive the server.
  const WorkdirStore* workdirs = nullptr;
  // Serve grpc.reflection.v1alpha.ServerReflection on the API port. It answers anyone who
  // connects, without a credential (the call gate never sees it), with every service and message
  // the coordinator serves: off unless asked for (tools such as grpcurl on a trusted network).
  bool reflection = false;
};

// The coordinator's gRPC server: JobService, AgentService, AdminService and SearchService (each
// call admitted by a CallGate over `auth`), grpc.health.v1.Health and, when asked for, server
// reflection, plus the
// thread that runs JobManager::Tick() (then SearchManager::Tick()) every `tick_interval` and
// whenever the manager asks for it. `manager` and
// `auth` must outlive the server.
class CoordinatorServer {
 public:
  // Binds options.listen and starts serving and ticking. UNAVAILABLE when the address cannot be
  // bound.
  static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Start(
      JobManager& manager, Authenticator& auth, const CoordinatorServerOptions& options);
  ~CoordinatorServer();  // Shutdown(absl::Seconds(5)) if not done yet

  int port() const { return port_; }
  int health_port() const { return health_port_; }
  std::shared_ptr<grpc::Channel> InProcessChannel();

  // The whole server's health ("") on the API port and on --health_listen: SERVING while it leads
  // sure of its lease, NOT_SERVING while it cannot be sure (a renewal failed: LeaseKeeper), so
  // that clients given several coordinators send it nothing meanwhile. Thread-safe.
  void SetServing(bool serving);

  // Ends blocked streams (JobManager::Shutdown), stops accepting calls, waits up to `grace` for
  // calls in flight, then cancels the rest and stops the tick thread. Idempotent; blocks.
  void Shutdown(absl::Duration grace);

 private:
  class HealthOnly;
  CoordinatorServer(JobManager& manager, Authenticator& auth, int max_streams_per_caller,
                    const WorkdirStore* workdirs);

  JobManager& manager_;
  CallGate gate_;
  JobServiceImpl job_service_;
  AgentServiceImpl agent_service_;
  AdminServiceImpl admin_service_;
  std::unique_ptr<SearchServiceImpl> search_service_;  // with options.searches
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<HealthOnly> health_only_;  // outlives health_server_
  std::unique_ptr<grpc::Server> health_server_;
  int health_port_ = 0;
  std::thread ticker_;
  int port_ = 0;
  bool shut_down_ = false;
};

// The health service a coordinator serves on --health_listen: the whole server ("") SERVING while
// it leads and serves, NOT_SERVING while it stands by (so that a readiness probe sends clients to
// the leader only); "liveness" SERVING in both (the process is well, whatever its role).
inline constexpr char kLivenessService[] = "liveness";

// The trailing metadata in which a standby names the leader's address.
inline constexpr char kLeaderMetadata[] = "trainyard-leader";

// A standby's server (PostgreSQL store, another coordinator leads), on the API address and on
// --health_listen alike: grpc.health.v1.Health with the server ("") NOT_SERVING and "liveness"
// SERVING, so that probes and clients given several coordinators (round_robin with gRPC's
// client-side health checks, common/rpc/channel.h) keep to the leader; and every other call
// answered UNAVAILABLE with a message that names the leader's address (also in the trailing
// metadata kLeaderMetadata), for a client given this coordinator's address alone.
class StandbyServer {
 public:
  // Binds `listen` (credentials null: plaintext). UNAVAILABLE when it cannot listen there.
  static absl::StatusOr<std::unique_ptr<StandbyServer>> Start(
      const std::string& listen, std::shared_ptr<grpc::ServerCredentials> credentials = nullptr);
  ~StandbyServer();  // stops at once: a standby has no call worth waiting for

  int port() const { return port_; }
  // Where the leader serves, as its lease says; empty while none leads.
  void SetLeader(const std::string& address);
  std::string leader() const;

 private:
  class Refuser;
  StandbyServer();

  mutable absl::Mutex mu_;
  std::string leader_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Refuser> refuser_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace trainyard

#endif  // TRAINYARD_SERVER_API_COORDINATOR_SERVER_H_
