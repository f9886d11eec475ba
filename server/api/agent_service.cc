#include "server/api/agent_service.h"

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/rpc/grpc_status.h"

namespace trainyard {

using grpc::ServerContext;
using grpc::Status;

// Agents speak only for the worker their credential names (worker ids are worker names), and
// trainers only for their own job, attempt and rank.

Status AgentServiceImpl::RegisterWorker(ServerContext* context,
                                        const v1::RegisterWorkerRequest* request,
                                        v1::RegisterWorkerResponse* response) {
  absl::StatusOr<Principal> caller =
      gate_.Admit(*context, *request, Audience::kAgents, "RegisterWorker");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  if (absl::Status s = AllowWorker(*caller, request->name()); !s.ok()) return ToGrpcStatus(s);
  absl::StatusOr<v1::RegisterWorkerResponse> result = manager_.RegisterWorker(*request);
  if (!result.ok()) return ToGrpcStatus(result.status());
  *response = *std::move(result);
  return Status::OK;
}

absl::StatusOr<std::optional<CallGate::StreamSlot>> AgentServiceImpl::LongPollSlot(
    const Principal& caller, int64_t wait_ms) {
  if (wait_ms <= 0) return std::nullopt;
  absl::StatusOr<CallGate::StreamSlot> slot = gate_.OpenStream(caller);
  if (!slot.ok()) return slot.status();
  return std::optional<CallGate::StreamSlot>(*std::move(slot));
}

Status AgentServiceImpl::Sync(ServerContext* context, const v1::SyncRequest* request,
                              v1::SyncResponse* response) {
  absl::StatusOr<Principal> caller = gate_.Admit(*context, *request, Audience::kAgents, "Sync");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  if (absl::Status s = AllowWorker(*caller, request->worker_id()); !s.ok()) return ToGrpcStatus(s);
  absl::StatusOr<std::optional<CallGate::StreamSlot>> slot =
      LongPollSlot(*caller, request->wait_ms());
  if (!slot.ok()) return ToGrpcStatus(slot.status());
  absl::StatusOr<v1::SyncResponse> result = manager_.Sync(*request);
  if (!result.ok()) return ToGrpcStatus(result.status());
  *response = *std::move(result);
  return Status::OK;
}

namespace {

// One agent's lease stream. The first message names the worker: admitted, the lease opened and
// answered; every later one is a beat. The reactions follow one another (a read, or the one
// write, is outstanding at a time); the manager may cancel the call from its own thread (`end`,
// never after CloseLease, which OnDone calls before the reactor goes).
class LeaseReactor final : public grpc::ServerBidiReactor<v1::LeaseRequest, v1::LeaseResponse> {
 public:
  LeaseReactor(grpc::CallbackServerContext* context, JobManager& manager, CallGate& gate)
      : context_(context), manager_(manager), gate_(gate) {
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the agent closed the stream, or the call ended (cancelled, broken)
      Finish(Status::OK);
      return;
    }
    if (opened_) {
      manager_.LeaseBeat(worker_id_, ticket_);
      StartRead(&request_);
      return;
    }
    if (answered_) {  // a message after a refusal: nothing to hold
      StartRead(&request_);
      return;
    }
    absl::StatusOr<Principal> caller =
        gate_.Admit(*context_, request_, Audience::kAgents, "HoldLease");
    if (!caller.ok()) {
      Finish(ToGrpcStatus(caller.status()));
      return;
    }
    if (absl::Status s = AllowWorker(*caller, request_.worker_id()); !s.ok()) {
      Finish(ToGrpcStatus(s));
      return;
    }
    worker_id_ = request_.worker_id();
    grpc::CallbackServerContext* context = context_;
    absl::StatusOr<LeaseTicket> ticket =
        manager_.OpenLease(worker_id_, request_.beats(), [context] { context->TryCancel(); });
    answered_ = true;
    if (!ticket.ok()) {
      if (!absl::IsNotFound(ticket.status()) && !absl::IsFailedPrecondition(ticket.status())) {
        Finish(ToGrpcStatus(ticket.status()));
        return;
      }
      answer_.set_reregister(true);
    } else {
      opened_ = true;
      ticket_ = *ticket;
      if (request_.beats()) {
        answer_.set_beat_interval_ms(absl::ToInt64Milliseconds(manager_.BeatInterval()));
      }
    }
    StartWrite(&answer_);
  }

  void OnWriteDone(bool ok) override {
    if (!ok || answer_.reregister()) {
      Finish(Status::OK);
      return;
    }
    // Held until the agent closes the stream, its connection breaks (a host killed: a reset; an
    // idle one cut off or frozen: the pings go unanswered), or the manager ends it (no beat while
    // the agent runs tasks).
    StartRead(&request_);
  }

  void OnDone() override {
    if (opened_) manager_.CloseLease(worker_id_, ticket_);
    delete this;
  }

 private:
  grpc::CallbackServerContext* const context_;
  JobManager& manager_;
  CallGate& gate_;
  v1::LeaseRequest request_;
  v1::LeaseResponse answer_;
  std::string worker_id_;
  bool answered_ = false;  // the first message was answered (the lease held, or refused)
  bool opened_ = false;    // the lease was opened: CloseLease at the end
  LeaseTicket ticket_;
};

}  // namespace

grpc::ServerBidiReactor<v1::LeaseRequest, v1::LeaseResponse>* AgentServiceImpl::HoldLease(
    grpc::CallbackServerContext* context) {
  return new LeaseReactor(context, manager_, gate_);
}

Status AgentServiceImpl::ReportTaskStatus(ServerContext* context,
                                          const v1::ReportTaskStatusRequest* request,
                                          v1::ReportTaskStatusResponse*) {
  absl::StatusOr<Principal> caller =
      gate_.Admit(*context, *request, Audience::kAgents, "ReportTaskStatus");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  if (absl::Status s = AllowWorker(*caller, request->worker_id()); !s.ok()) return ToGrpcStatus(s);
  return ToGrpcStatus(manager_.ReportTaskStatus(request->worker_id(), request->status()));
}

Status AgentServiceImpl::ReportDebug(ServerContext* context, const v1::ReportDebugRequest* request,
                                     v1::ReportDebugResponse*) {
  absl::StatusOr<Principal> caller =
      gate_.Admit(*context, *request, Audience::kAgents, "ReportDebug");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  if (absl::Status s = AllowWorker(*caller, request->worker_id()); !s.ok()) return ToGrpcStatus(s);
  return ToGrpcStatus(manager_.ReportDebug(*request));
}

Status AgentServiceImpl::ShipLogs(ServerContext* context, const v1::ShipLogsRequest* request,
                                  v1::ShipLogsResponse* response) {
  absl::StatusOr<Principal> caller = gate_.Admit(*context, *request, Audience::kAgents, "ShipLogs");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  if (absl::Status s = AllowWorker(*caller, request->worker_id()); !s.ok()) return ToGrpcStatus(s);
  absl::StatusOr<int64_t> next = manager_.ShipLogs(request->worker_id(), request->task_id(),
                                                   request->offset(), request->data());
  if (!next.ok()) return ToGrpcStatus(next.status());
  response->set_next_offset(*next);
  return Status::OK;
}

Status AgentServiceImpl::ReportProgress(ServerContext* context,
                                        const v1::ReportProgressRequest* request,
                                        v1::ReportProgressResponse*) {
  absl::StatusOr<Principal> caller =
      gate_.Admit(*context, *request, Audience::kTasks, "ReportProgress");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  if (absl::Status s =
          AllowTask(*caller, request->job_id(), request->generation(), request->rank());
      !s.ok()) {
    return ToGrpcStatus(s);
  }
  return ToGrpcStatus(manager_.ReportProgress(request->job_id(), request->generation(),
                                              request->rank(), request->progress()));
}

Status AgentServiceImpl::CommitCheckpoint(ServerContext* context,
                                          const v1::CommitCheckpointRequest* request,
                                          v1::CommitCheckpointResponse* response) {
  absl::StatusOr<Principal> caller =
      gate_.Admit(*context, *request, Audience::kTasks, "CommitCheckpoint");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  if (absl::Status s = AllowTask(*caller, request->job_id(), request->generation()); !s.ok()) {
    return ToGrpcStatus(s);
  }
  absl::StatusOr<std::vector<std::string>> retired = manager_.CommitCheckpoint(*request);
  if (!retired.ok()) return ToGrpcStatus(retired.status());
  for (std::string& uri : *retired) response->add_retired_uris(std::move(uri));
  return Status::OK;
}

Status AgentServiceImpl::ReportModel(ServerContext* context, const v1::ReportModelRequest* request,
                                     v1::ReportModelResponse*) {
  absl::StatusOr<Principal> caller =
      gate_.Admit(*context, *request, Audience::kTasks, "ReportModel");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  if (absl::Status s = AllowTask(*caller, request->job_id(), request->generation()); !s.ok()) {
    return ToGrpcStatus(s);
  }
  return ToGrpcStatus(
      manager_.ReportModel(request->job_id(), request->generation(), request->uri()));
}

Status AgentServiceImpl::ReportEvent(ServerContext* context, const v1::ReportEventRequest* request,
                                     v1::ReportEventResponse*) {
  absl::StatusOr<Principal> caller =
      gate_.Admit(*context, *request, Audience::kTasks, "ReportEvent");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  if (absl::Status s =
          AllowTask(*caller, request->job_id(), request->generation(), request->rank());
      !s.ok()) {
    return ToGrpcStatus(s);
  }
  return ToGrpcStatus(
      manager_.ReportEvent(request->job_id(), request->generation(), request->message()));
}

Status AgentServiceImpl::ReportPreemption(ServerContext* context,
                                          const v1::ReportPreemptionRequest* request,
                                          v1::ReportPreemptionResponse*) {
  // Agents for their own machine; admins drain any worker this way.
  absl::StatusOr<Principal> caller =
      gate_.Admit(*context, *request, Audience::kAgentsAdmins, "ReportPreemption");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  if (absl::Status s = AllowWorker(*caller, request->worker_id()); !s.ok()) return ToGrpcStatus(s);
  return ToGrpcStatus(manager_.ReportPreemption(*request));
}

Status AgentServiceImpl::RendezvousSet(ServerContext* context,
                                       const v1::RendezvousSetRequest* request,
                                       v1::RendezvousSetResponse*) {
  absl::StatusOr<Principal> caller =
      gate_.Admit(*context, *request, Audience::kTasks, "RendezvousSet");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  if (absl::Status s =
          AllowTask(*caller, request->job_id(), request->generation(), request->rank());
      !s.ok()) {
    return ToGrpcStatus(s);
  }
  return ToGrpcStatus(manager_.RendezvousSet(request->job_id(), request->generation(),
                                             request->key(), request->value()));
}

Status AgentServiceImpl::RendezvousGet(ServerContext* context,
                                       const v1::RendezvousGetRequest* request,
                                       v1::RendezvousGetResponse* response) {
  absl::StatusOr<Principal> caller =
      gate_.Admit(*context, *request, Audience::kTasks, "RendezvousGet");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  if (absl::Status s =
          AllowTask(*caller, request->job_id(), request->generation(), request->rank());
      !s.ok()) {
    return ToGrpcStatus(s);
  }
  if (request->wait_ms() < 0) {
    return ToGrpcStatus(absl::InvalidArgumentError("wait_ms: must be >= 0"));
  }
  absl::StatusOr<std::optional<CallGate::StreamSlot>> slot =
      LongPollSlot(*caller, request->wait_ms());
  if (!slot.ok()) return ToGrpcStatus(slot.status());
  absl::Duration wait = absl::Milliseconds(request->wait_ms());
  const absl::Time deadline = absl::FromChrono(context->deadline());
  if (deadline != absl::InfiniteFuture()) wait = std::min(wait, deadline - RealClock::Get().Now());
  wait = std::max(wait, absl::ZeroDuration());
  absl::StatusOr<std::string> value =
      manager_.RendezvousGet(request->job_id(), request->generation(), request->key(), wait);
  if (!value.ok()) return ToGrpcStatus(value.status());
  response->set_value(*std::move(value));
  return Status::OK;
}

}  // namespace trainyard
