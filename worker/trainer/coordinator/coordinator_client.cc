#include "worker/trainer/coordinator/coordinator_client.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/log.h"
#include "trainyard/v1/agent_service.grpc.pb.h"

namespace trainyard::trainer {
namespace {

absl::Status FromGrpc(const grpc::Status& status, const char* method) {
  if (status.ok()) return absl::OkStatus();
  const std::string message = absl::StrCat(method, ": ", status.error_message());
  // A refusal from the coordinator (a fenced, stale attempt; a job that ended meanwhile; a
  // credential it does not take) is not the user's fault: it must not count as a user error
  // (exit 2) in the restart policy, and retrying will not change it.
  switch (status.error_code()) {
    case grpc::StatusCode::PERMISSION_DENIED:
    case grpc::StatusCode::UNAUTHENTICATED:
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::ABORTED:
    case grpc::StatusCode::NOT_FOUND:
      return absl::AbortedError(message);
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return absl::DeadlineExceededError(message);
    case grpc::StatusCode::INVALID_ARGUMENT:
      return absl::InternalError(message);
    default:
      return absl::UnavailableError(message);
  }
}

class GrpcCoordinatorClient final : public CoordinatorClient {
 public:
  GrpcCoordinatorClient(std::shared_ptr<grpc::Channel> channel, std::string job_id,
                        int64_t generation, int32_t rank, absl::Duration rpc_timeout)
      : stub_(trainyard::v1::AgentService::NewStub(std::move(channel))),
        job_id_(std::move(job_id)),
        generation_(generation),
        rank_(rank),
        rpc_timeout_(rpc_timeout) {}

  absl::Status ReportProgress(const trainyard::v1::JobProgress& progress) override {
    trainyard::v1::ReportProgressRequest request;
    request.set_job_id(job_id_);
    request.set_generation(generation_);
    request.set_rank(rank_);
    *request.mutable_progress() = progress;
    trainyard::v1::ReportProgressResponse response;
    grpc::ClientContext context;
    Limit(context);
    return FromGrpc(stub_->ReportProgress(&context, request, &response), "ReportProgress");
  }

  absl::StatusOr<std::vector<std::string>> CommitCheckpoint(int64_t step, int64_t size_bytes,
                                                            absl::Time save_started) override {
    trainyard::v1::CommitCheckpointRequest request;
    request.set_job_id(job_id_);
    request.set_generation(generation_);
    request.set_step(step);
    request.set_size_bytes(size_bytes);
    request.set_save_started_unix_ms(absl::ToUnixMillis(save_started));
    trainyard::v1::CommitCheckpointResponse response;
    grpc::ClientContext context;
    Limit(context);
    absl::Status status =
        FromGrpc(stub_->CommitCheckpoint(&context, request, &response), "CommitCheckpoint");
    if (!status.ok()) return status;
    return std::vector<std::string>(response.retired_uris().begin(), response.retired_uris().end());
  }

  absl::Status ReportModel(const std::string& uri) override {
    trainyard::v1::ReportModelRequest request;
    request.set_job_id(job_id_);
    request.set_generation(generation_);
    request.set_uri(uri);
    trainyard::v1::ReportModelResponse response;
    grpc::ClientContext context;
    Limit(context);
    return FromGrpc(stub_->ReportModel(&context, request, &response), "ReportModel");
  }

  absl::Status ReportEvent(const std::string& message) override {
    trainyard::v1::ReportEventRequest request;
    request.set_job_id(job_id_);
    request.set_generation(generation_);
    request.set_rank(rank_);
    request.set_message(message);
    trainyard::v1::ReportEventResponse response;
    grpc::ClientContext context;
    Limit(context);
    return FromGrpc(stub_->ReportEvent(&context, request, &response), "ReportEvent");
  }

 private:
  // Each call waits for the channel to connect, up to its deadline, rather than failing at once
  // while the channel is between attempts: a call in flight is also what drives a reconnection
  // (without one, gRPC's client polls its connections only every few seconds, longer than an
  // attempt may take, and a channel whose callers only fail fast may never reconnect after an
  // outage).
  void Limit(grpc::ClientContext& context) const {
    context.set_deadline(GrpcDeadline(rpc_timeout_));
    context.set_wait_for_ready(true);
  }

  const std::unique_ptr<trainyard::v1::AgentService::Stub> stub_;
  const std::string job_id_;
  const int64_t generation_;
  const int32_t rank_;
  const absl::Duration rpc_timeout_;
};

}  // namespace

std::unique_ptr<CoordinatorClient> NewGrpcCoordinatorClient(std::shared_ptr<grpc::Channel> channel,
                                                            const std::string& job_id,
                                                            int64_t generation, int32_t rank,
                                                            absl::Duration rpc_timeout) {
  return std::make_unique<GrpcCoordinatorClient>(std::move(channel), job_id, generation, rank,
                                                 rpc_timeout);
}

bool IsRetryableCoordinatorError(const absl::Status& status) {
  return status.code() == absl::StatusCode::kUnavailable ||
         status.code() == absl::StatusCode::kDeadlineExceeded;
}

ProgressReporter::ProgressReporter(CoordinatorClient* client, const Clock& clock,
                                   absl::Duration min_interval)
    : client_(client), clock_(clock), min_interval_(min_interval) {
  thread_ = std::thread([this] { Loop(); });
}

ProgressReporter::~ProgressReporter() { Stop(); }

void ProgressReporter::Update(const trainyard::v1::JobProgress& progress) {
  absl::MutexLock lock(&mu_);
  pending_ = progress;
  pending_->set_updated_unix_ms(absl::ToUnixMillis(clock_.Now()));
}

void ProgressReporter::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void ProgressReporter::Loop() {
  while (true) {
    trainyard::v1::JobProgress progress;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || pending_.has_value(); };
      mu_.Await(absl::Condition(&ready));
      if (stop_) return;
      progress = *pending_;
      pending_.reset();
    }
    absl::Status status = client_->ReportProgress(progress);
    absl::MutexLock lock(&mu_);
    if (!status.ok() && IsRetryableCoordinatorError(status)) {
      LogWarning("progress report failed, will retry: ", status.ToString());
      if (!pending_.has_value()) pending_ = progress;
    } else if (!status.ok()) {
      LogWarning("progress report refused: ", status.ToString());
    }
    // Pace the reports; a stop request ends the wait early.
    mu_.AwaitWithTimeout(absl::Condition(&stop_), min_interval_);
    if (stop_) return;
  }
}

absl::Status ProgressReporter::Finish(const trainyard::v1::JobProgress& final_progress,
                                      absl::Time give_up_at) {
  Stop();
  trainyard::v1::JobProgress progress = final_progress;
  progress.set_updated_unix_ms(absl::ToUnixMillis(clock_.Now()));
  return Retry(clock_, CoordinatorRetry(give_up_at), IsRetryableCoordinatorError,
               [&] { return client_->ReportProgress(progress); });
}

}  // namespace trainyard::trainer
