#ifndef TRAINYARD_SERVER_ADMIN_SERVICE_H_
#define TRAINYARD_SERVER_ADMIN_SERVICE_H_

#include "server/auth.h"
#include "server/call_gate.h"
#include "trainyard/v1/admin_service.grpc.pb.h"

namespace trainyard {

// gRPC AdminService over the Authenticator's tokens; admins only. `auth` and `gate` must outlive
// the service. Thread-safe.
class AdminServiceImpl final : public trainyard::v1::AdminService::Service {
 public:
  AdminServiceImpl(Authenticator& auth, CallGate& gate) : auth_(auth), gate_(gate) {}

  grpc::Status CreateToken(grpc::ServerContext* context,
                           const trainyard::v1::CreateTokenRequest* request,
                           trainyard::v1::CreateTokenResponse* response) override;
  grpc::Status ListTokens(grpc::ServerContext* context,
                          const trainyard::v1::ListTokensRequest* request,
                          trainyard::v1::ListTokensResponse* response) override;
  grpc::Status RevokeToken(grpc::ServerContext* context,
                           const trainyard::v1::RevokeTokenRequest* request,
                           trainyard::v1::Token* response) override;

 private:
  Authenticator& auth_;
  CallGate& gate_;
};

}  // namespace trainyard

#endif  // TRAINYARD_SERVER_ADMIN_SERVICE_H_
