#ifndef TRAINYARD_SERVER_API_ADMIN_SERVICE_H_
#define TRAINYARD_SERVER_API_ADMIN_SERVICE_H_

#include "server/api/call_gate.h"
#include "server/auth/auth.h"
#include "server/jobs/job_manager.h"
#include "trainyard/v1/admin_service.grpc.pb.h"

namespace trainyard {

// gRPC AdminService over the Authenticator's tokens and the JobManager's queues; admins only.
// `auth`, `manager` and `gate` must outlive the service. Thread-safe.
class AdminServiceImpl final : public trainyard::v1::AdminService::Service {
 public:
  AdminServiceImpl(Authenticator& auth, JobManager& manager, CallGate& gate)
      : auth_(auth), manager_(manager), gate_(gate) {}

  grpc::Status CreateToken(grpc::ServerContext* context,
                           const trainyard::v1::CreateTokenRequest* request,
                           trainyard::v1::CreateTokenResponse* response) override;
  grpc::Status ListTokens(grpc::ServerContext* context,
                          const trainyard::v1::ListTokensRequest* request,
                          trainyard::v1::ListTokensResponse* response) override;
  grpc::Status RevokeToken(grpc::ServerContext* context,
                           const trainyard::v1::RevokeTokenRequest* request,
                           trainyard::v1::Token* response) override;
  grpc::Status CreateQueue(grpc::ServerContext* context,
                           const trainyard::v1::CreateQueueRequest* request,
                           trainyard::v1::Queue* response) override;
  grpc::Status UpdateQueue(grpc::ServerContext* context,
                           const trainyard::v1::UpdateQueueRequest* request,
                           trainyard::v1::Queue* response) override;
  grpc::Status DeleteQueue(grpc::ServerContext* context,
                           const trainyard::v1::DeleteQueueRequest* request,
                           trainyard::v1::DeleteQueueResponse* response) override;
  grpc::Status ReturnGpu(grpc::ServerContext* context,
                         const trainyard::v1::ReturnGpuRequest* request,
                         trainyard::v1::Worker* response) override;

 private:
  Authenticator& auth_;
  JobManager& manager_;
  CallGate& gate_;
};

}  // namespace trainyard

#endif  // TRAINYARD_SERVER_API_ADMIN_SERVICE_H_
