#include "server/agent_service.h"

#include <algorithm>
#include <string>
#include <vector>

#include "common/grpc_status.h"

namespace trainyard {

using grpc::ServerContext;
using grpc::Status;

Status AgentServiceImpl::RegisterWorker(ServerContext*, const v1::RegisterWorkerRequest* request,
                                        v1::RegisterWorkerResponse* response) {
  absl::StatusOr<v1::RegisterWorkerResponse> result = manager_.RegisterWorker(*request);
  if (!result.ok()) return ToGrpcStatus(result.status());
  *response = *std::move(result);
  return Status::OK;
}

Status AgentServiceImpl::Sync(ServerContext*, const v1::SyncRequest* request,
                              v1::SyncResponse* response) {
  absl::StatusOr<v1::SyncResponse> result = manager_.Sync(*request);
  if (!result.ok()) return ToGrpcStatus(result.status());
  *response = *std::move(result);
  return Status::OK;
}

Status AgentServiceImpl::ReportTaskStatus(ServerContext*,
                                          const v1::ReportTaskStatusRequest* request,
                                          v1::ReportTaskStatusResponse*) {
  return ToGrpcStatus(manager_.ReportTaskStatus(request->worker_id(), request->status()));
}

Status AgentServiceImpl::ShipLogs(ServerContext*, const v1::ShipLogsRequest* request,
                                  v1::ShipLogsResponse* response) {
  absl::StatusOr<int64_t> next = manager_.ShipLogs(request->worker_id(), request->task_id(),
                                                   request->offset(), request->data());
  if (!next.ok()) return ToGrpcStatus(next.status());
  response->set_next_offset(*next);
  return Status::OK;
}

Status AgentServiceImpl::ReportProgress(ServerContext*, const v1::ReportProgressRequest* request,
                                        v1::ReportProgressResponse*) {
  return ToGrpcStatus(manager_.ReportProgress(request->job_id(), request->generation(),
                                              request->rank(), request->progress()));
}

Status AgentServiceImpl::CommitCheckpoint(ServerContext*,
                                          const v1::CommitCheckpointRequest* request,
                                          v1::CommitCheckpointResponse* response) {
  absl::StatusOr<std::vector<std::string>> retired = manager_.CommitCheckpoint(*request);
  if (!retired.ok()) return ToGrpcStatus(retired.status());
  for (std::string& uri : *retired) response->add_retired_uris(std::move(uri));
  return Status::OK;
}

Status AgentServiceImpl::ReportModel(ServerContext*, const v1::ReportModelRequest* request,
                                     v1::ReportModelResponse*) {
  return ToGrpcStatus(
      manager_.ReportModel(request->job_id(), request->generation(), request->uri()));
}

Status AgentServiceImpl::ReportEvent(ServerContext*, const v1::ReportEventRequest* request,
                                     v1::ReportEventResponse*) {
  return ToGrpcStatus(
      manager_.ReportEvent(request->job_id(), request->generation(), request->message()));
}

Status AgentServiceImpl::ReportPreemption(ServerContext*,
                                          const v1::ReportPreemptionRequest* request,
                                          v1::ReportPreemptionResponse*) {
  return ToGrpcStatus(manager_.ReportPreemption(*request));
}

Status AgentServiceImpl::RendezvousSet(ServerContext*, const v1::RendezvousSetRequest* request,
                                       v1::RendezvousSetResponse*) {
  return ToGrpcStatus(manager_.RendezvousSet(request->job_id(), request->generation(),
                                             request->key(), request->value()));
}

Status AgentServiceImpl::RendezvousGet(ServerContext* context,
                                       const v1::RendezvousGetRequest* request,
                                       v1::RendezvousGetResponse* response) {
  if (request->wait_ms() < 0) {
    return ToGrpcStatus(absl::InvalidArgumentError("wait_ms: must be >= 0"));
  }
  absl::Duration wait = absl::Milliseconds(request->wait_ms());
  const absl::Time deadline = absl::FromChrono(context->deadline());
  if (deadline != absl::InfiniteFuture()) wait = std::min(wait, deadline - absl::Now());
  wait = std::max(wait, absl::ZeroDuration());
  absl::StatusOr<std::string> value =
      manager_.RendezvousGet(request->job_id(), request->generation(), request->key(), wait);
  if (!value.ok()) return ToGrpcStatus(value.status());
  response->set_value(*std::move(value));
  return Status::OK;
}

}  // namespace trainyard
