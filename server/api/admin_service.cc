#include "server/api/admin_service.h"

#include <string>
#include <utility>

#include "common/rpc/grpc_status.h"

namespace trainyard {

using grpc::ServerContext;
using grpc::Status;

namespace {

v1::TokenRole ToProto(Role role) {
  switch (role) {
    case Role::kAdmin:
      return v1::TOKEN_ADMIN;
    case Role::kUser:
      return v1::TOKEN_USER;
    case Role::kAgent:
      return v1::TOKEN_AGENT;
    case Role::kTask:
      break;
  }
  return v1::TOKEN_ROLE_UNSPECIFIED;
}

v1::Token ToProto(const TokenInfo& info) {
  v1::Token t;
  t.set_id(info.id);
  t.set_name(info.name);
  t.set_role(ToProto(info.role));
  t.set_created_unix_ms(info.created_unix_ms);
  t.set_expires_unix_ms(info.expires_unix_ms);
  t.set_revoked_unix_ms(info.revoked_unix_ms);
  t.set_created_by(info.created_by);
  t.set_revoked_by(info.revoked_by);
  return t;
}

}  // namespace

Status AdminServiceImpl::CreateToken(ServerContext* context, const v1::CreateTokenRequest* request,
                                     v1::CreateTokenResponse* response) {
  absl::StatusOr<Principal> caller =
      gate_.Admit(*context, *request, Audience::kAdmins, "CreateToken");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  Role role;
  switch (request->role()) {
    case v1::TOKEN_ADMIN:
      role = Role::kAdmin;
      break;
    case v1::TOKEN_USER:
      role = Role::kUser;
      break;
    case v1::TOKEN_AGENT:
      role = Role::kAgent;
      break;
    default:
      return ToGrpcStatus(absl::InvalidArgumentError("role: one of admin, user, agent"));
  }
  if (request->ttl_seconds() < 0) {
    return ToGrpcStatus(absl::InvalidArgumentError("ttl_seconds: must be >= 0"));
  }
  const absl::Duration ttl = request->ttl_seconds() == 0 ? absl::InfiniteDuration()
                                                         : absl::Seconds(request->ttl_seconds());
  absl::StatusOr<std::pair<std::string, TokenInfo>> made =
      auth_.CreateToken(request->name(), role, ttl, caller->name);
  if (!made.ok()) return ToGrpcStatus(made.status());
  *response->mutable_token() = ToProto(made->second);
  response->set_secret(std::move(made->first));
  return Status::OK;
}

Status AdminServiceImpl::ListTokens(ServerContext* context, const v1::ListTokensRequest* request,
                                    v1::ListTokensResponse* response) {
  absl::StatusOr<Principal> caller =
      gate_.Admit(*context, *request, Audience::kAdmins, "ListTokens");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  for (const TokenInfo& info : auth_.ListTokens()) *response->add_tokens() = ToProto(info);
  return Status::OK;
}

Status AdminServiceImpl::RevokeToken(ServerContext* context, const v1::RevokeTokenRequest* request,
                                     v1::Token* response) {
  absl::StatusOr<Principal> caller =
      gate_.Admit(*context, *request, Audience::kAdmins, "RevokeToken");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  absl::StatusOr<TokenInfo> revoked = auth_.RevokeToken(request->id(), caller->name);
  if (!revoked.ok()) return ToGrpcStatus(revoked.status());
  *response = ToProto(*revoked);
  return Status::OK;
}

Status AdminServiceImpl::CreateQueue(ServerContext* context, const v1::CreateQueueRequest* request,
                                     v1::Queue* response) {
  absl::StatusOr<Principal> caller =
      gate_.Admit(*context, *request, Audience::kAdmins, "CreateQueue");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  absl::StatusOr<v1::Queue> queue = manager_.CreateQueue(request->queue(), caller->name);
  if (!queue.ok()) return ToGrpcStatus(queue.status());
  *response = *std::move(queue);
  return Status::OK;
}

Status AdminServiceImpl::UpdateQueue(ServerContext* context, const v1::UpdateQueueRequest* request,
                                     v1::Queue* response) {
  absl::StatusOr<Principal> caller =
      gate_.Admit(*context, *request, Audience::kAdmins, "UpdateQueue");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  absl::StatusOr<v1::Queue> queue = manager_.UpdateQueue(request->queue(), caller->name);
  if (!queue.ok()) return ToGrpcStatus(queue.status());
  *response = *std::move(queue);
  return Status::OK;
}

Status AdminServiceImpl::DeleteQueue(ServerContext* context, const v1::DeleteQueueRequest* request,
                                     v1::DeleteQueueResponse*) {
  absl::StatusOr<Principal> caller =
      gate_.Admit(*context, *request, Audience::kAdmins, "DeleteQueue");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  return ToGrpcStatus(manager_.DeleteQueue(request->name()));
}

Status AdminServiceImpl::ReturnGpu(ServerContext* context, const v1::ReturnGpuRequest* request,
                                   v1::Worker* response) {
  absl::StatusOr<Principal> caller =
      gate_.Admit(*context, *request, Audience::kAdmins, "ReturnGpu");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  absl::StatusOr<v1::Worker> worker = manager_.ReturnGpu(request->worker_id(), request->index());
  if (!worker.ok()) return ToGrpcStatus(worker.status());
  *response = *std::move(worker);
  return Status::OK;
}

}  // namespace trainyard
