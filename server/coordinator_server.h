#ifndef TRAINYARD_SERVER_COORDINATOR_SERVER_H_
#define TRAINYARD_SERVER_COORDINATOR_SERVER_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/agent_service.h"
#include "server/job_manager.h"
#include "server/job_service.h"

namespace trainyard {

// The coordinator's gRPC server: JobService, AgentService, grpc.health.v1.Health and server
// reflection, plus the thread that runs JobManager::Tick() every `tick_interval` and whenever
// the manager asks for it. `manager` must outlive the server.
class CoordinatorServer {
 public:
  // Binds `listen` ("host:port"; port 0 lets the kernel pick) and starts serving and ticking.
  // UNAVAILABLE when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Start(
      JobManager& manager, const std::string& listen,
      absl::Duration tick_interval = absl::Milliseconds(100));
  ~CoordinatorServer();  // Shutdown(absl::Seconds(5)) if not done yet

  int port() const { return port_; }
  std::shared_ptr<grpc::Channel> InProcessChannel();

  // Ends blocked streams (JobManager::Shutdown), stops accepting calls, waits up to `grace` for
  // calls in flight, then cancels the rest and stops the tick thread. Idempotent; blocks.
  void Shutdown(absl::Duration grace);

 private:
  explicit CoordinatorServer(JobManager& manager);

  JobManager& manager_;
  JobServiceImpl job_service_;
  AgentServiceImpl agent_service_;
  std::unique_ptr<grpc::Server> server_;
  std::thread ticker_;
  int port_ = 0;
  bool shut_down_ = false;
};

}  // namespace trainyard

#endif  // TRAINYARD_SERVER_COORDINATOR_SERVER_H_
