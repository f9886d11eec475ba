#ifndef TRAINYARD_SERVER_API_AGENT_SERVICE_H_
#define TRAINYARD_SERVER_API_AGENT_SERVICE_H_

#include <cstdint>
#include <optional>

#include "server/api/call_gate.h"
#include "server/jobs/job_manager.h"
#include "trainyard/v1/agent_service.grpc.pb.h"

namespace trainyard {

// gRPC AgentService over JobManager: agents for their own worker, trainers for their own job,
// attempt and rank (auth.h). `manager` and `gate` must outlive the service. Thread-safe.
// HoldLease runs on gRPC's callback API: an agent's lease stream holds no thread, and a beat
// costs no hand-off between threads (a thousand busy agents beat two thousand times a second).
class AgentServiceImpl final : public trainyard::v1::AgentService::WithCallbackMethod_HoldLease<
                                   trainyard::v1::AgentService::Service> {
 public:
  AgentServiceImpl(JobManager& manager, CallGate& gate) : manager_(manager), gate_(gate) {}

  grpc::Status RegisterWorker(grpc::ServerContext* context,
                              const trainyard::v1::RegisterWorkerRequest* request,
                              trainyard::v1::RegisterWorkerResponse* response) override;
  grpc::Status Sync(grpc::ServerContext* context, const trainyard::v1::SyncRequest* request,
                    trainyard::v1::SyncResponse* response) override;
  // Holds the worker's lease while the stream stays open (JobManager::OpenLease); each later
  // message is a beat (JobManager::LeaseBeat).
  grpc::ServerBidiReactor<trainyard::v1::LeaseRequest, trainyard::v1::LeaseResponse>* HoldLease(
      grpc::CallbackServerContext* context) override;
  grpc::Status ReportTaskStatus(grpc::ServerContext* context,
                                const trainyard::v1::ReportTaskStatusRequest* request,
                                trainyard::v1::ReportTaskStatusResponse* response) override;
  grpc::Status ReportDebug(grpc::ServerContext* context,
                           const trainyard::v1::ReportDebugRequest* request,
                           trainyard::v1::ReportDebugResponse* response) override;
  grpc::Status ShipLogs(grpc::ServerContext* context, const trainyard::v1::ShipLogsRequest* request,
                        trainyard::v1::ShipLogsResponse* response) override;
  grpc::Status ReportProgress(grpc::ServerContext* context,
                              const trainyard::v1::ReportProgressRequest* request,
                              trainyard::v1::ReportProgressResponse* response) override;
  grpc::Status CommitCheckpoint(grpc::ServerContext* context,
                                const trainyard::v1::CommitCheckpointRequest* request,
                                trainyard::v1::CommitCheckpointResponse* response) override;
  grpc::Status ReportModel(grpc::ServerContext* context,
                           const trainyard::v1::ReportModelRequest* request,
                           trainyard::v1::ReportModelResponse* response) override;
  grpc::Status ReportEvent(grpc::ServerContext* context,
                           const trainyard::v1::ReportEventRequest* request,
                           trainyard::v1::ReportEventResponse* response) override;
  grpc::Status RendezvousSet(grpc::ServerContext* context,
                             const trainyard::v1::RendezvousSetRequest* request,
                             trainyard::v1::RendezvousSetResponse* response) override;
  grpc::Status ReportPreemption(grpc::ServerContext* context,
                                const trainyard::v1::ReportPreemptionRequest* request,
                                trainyard::v1::ReportPreemptionResponse* response) override;
  // Waits at most until the call's deadline, so a client that gave up frees the thread.
  grpc::Status RendezvousGet(grpc::ServerContext* context,
                             const trainyard::v1::RendezvousGetRequest* request,
                             trainyard::v1::RendezvousGetResponse* response) override;

 private:
  // A long poll (wait_ms > 0) holds one of the caller's stream slots while it waits, so that no
  // caller can tie up the server's threads; nothing for a call that answers at once.
  // RESOURCE_EXHAUSTED past the caller's limit.
  absl::StatusOr<std::optional<CallGate::StreamSlot>> LongPollSlot(const Principal& caller,
                                                                   int64_t wait_ms);
  JobManager& manager_;
  CallGate& gate_;
};

}  // namespace trainyard

#endif  // TRAINYARD_SERVER_API_AGENT_SERVICE_H_
