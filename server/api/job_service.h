#ifndef TRAINYARD_SERVER_API_JOB_SERVICE_H_
#define TRAINYARD_SERVER_API_JOB_SERVICE_H_

#include "server/api/call_gate.h"
#include "server/auth/console_logins.h"
#include "server/jobs/job_manager.h"
#include "server/jobs/workdir_store.h"
#include "trainyard/v1/job_service.grpc.pb.h"

namespace trainyard {

// gRPC JobService over JobManager: admits the call (people only; users reach only their own
// jobs), calls the manager, maps its status. `manager` and `gate` must outlive the service.
// Thread-safe.
class JobServiceImpl final : public trainyard::v1::JobService::Service {
 public:
  // `workdirs` null: UploadWorkdir is UNIMPLEMENTED. `auth` makes the console's session tokens.
  JobServiceImpl(JobManager& manager, CallGate& gate, Authenticator& auth,
                 const WorkdirStore* workdirs = nullptr)
      : manager_(manager),
        gate_(gate),
        auth_(auth),
        logins_(RealClock::Get()),
        workdirs_(workdirs) {}

  grpc::Status SubmitJob(grpc::ServerContext* context,
                         const trainyard::v1::SubmitJobRequest* request,
                         trainyard::v1::Job* response) override;
  grpc::Status GetJob(grpc::ServerContext* context, const trainyard::v1::GetJobRequest* request,
                      trainyard::v1::Job* response) override;
  grpc::Status ListJobs(grpc::ServerContext* context, const trainyard::v1::ListJobsRequest* request,
                        trainyard::v1::ListJobsResponse* response) override;
  grpc::Status CancelJob(grpc::ServerContext* context,
                         const trainyard::v1::CancelJobRequest* request,
                         trainyard::v1::Job* response) override;
  grpc::Status DeleteJob(grpc::ServerContext* context,
                         const trainyard::v1::DeleteJobRequest* request,
                         trainyard::v1::DeleteJobResponse* response) override;
  grpc::Status WatchJob(grpc::ServerContext* context, const trainyard::v1::WatchJobRequest* request,
                        grpc::ServerWriter<trainyard::v1::WatchJobResponse>* writer) override;
  grpc::Status GetJobLogs(grpc::ServerContext* context,
                          const trainyard::v1::GetJobLogsRequest* request,
                          grpc::ServerWriter<trainyard::v1::LogChunk>* writer) override;
  grpc::Status ListWorkers(grpc::ServerContext* context,
                           const trainyard::v1::ListWorkersRequest* request,
                           trainyard::v1::ListWorkersResponse* response) override;
  grpc::Status ListQueues(grpc::ServerContext* context,
                          const trainyard::v1::ListQueuesRequest* request,
                          trainyard::v1::ListQueuesResponse* response) override;
  grpc::Status ListCheckpoints(grpc::ServerContext* context,
                               const trainyard::v1::ListCheckpointsRequest* request,
                               trainyard::v1::ListCheckpointsResponse* response) override;
  grpc::Status GetJobMetrics(grpc::ServerContext* context,
                             const trainyard::v1::GetJobMetricsRequest* request,
                             trainyard::v1::JobMetrics* response) override;
  grpc::Status DebugJob(grpc::ServerContext* context, const trainyard::v1::DebugJobRequest* request,
                        trainyard::v1::DebugJobResponse* response) override;
  grpc::Status CreateConsoleLogin(grpc::ServerContext* context,
                                  const trainyard::v1::CreateConsoleLoginRequest* request,
                                  trainyard::v1::ConsoleLogin* response) override;
  grpc::Status RedeemConsoleLogin(grpc::ServerContext* context,
                                  const trainyard::v1::RedeemConsoleLoginRequest* request,
                                  trainyard::v1::ConsoleSession* response) override;
  grpc::Status UploadWorkdir(grpc::ServerContext* context,
                             grpc::ServerReader<trainyard::v1::UploadWorkdirRequest>* reader,
                             trainyard::v1::UploadWorkdirResponse* response) override;

 private:
  // Admit for people, then PERMISSION_DENIED unless the caller may see job `job_id`.
  absl::StatusOr<Principal> AdmitForJob(const grpc::ServerContext& context,
                                        const google::protobuf::Message& request,
                                        absl::string_view rpc, absl::string_view job_id);

  JobManager& manager_;
  CallGate& gate_;
  Authenticator& auth_;
  ConsoleLogins logins_;
  const WorkdirStore* const workdirs_;
};

}  // namespace trainyard

#endif  // TRAINYARD_SERVER_API_JOB_SERVICE_H_
