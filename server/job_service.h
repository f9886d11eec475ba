#ifndef TRAINYARD_SERVER_JOB_SERVICE_H_
#define TRAINYARD_SERVER_JOB_SERVICE_H_

#include "server/job_manager.h"
#include "trainyard/v1/job_service.grpc.pb.h"

namespace trainyard {

// gRPC JobService over JobManager: checks requests, calls the manager, maps its status.
// `manager` must outlive the service. Thread-safe.
class JobServiceImpl final : public trainyard::v1::JobService::Service {
 public:
  explicit JobServiceImpl(JobManager& manager) : manager_(manager) {}

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
  grpc::Status ListCheckpoints(grpc::ServerContext* context,
                               const trainyard::v1::ListCheckpointsRequest* request,
                               trainyard::v1::ListCheckpointsResponse* response) override;

 private:
  JobManager& manager_;
};

}  // namespace trainyard

#endif  // TRAINYARD_SERVER_JOB_SERVICE_H_
