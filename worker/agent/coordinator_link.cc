#include "worker/agent/coordinator_link.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/rpc/grpc_status.h"
#include "trainyard/v1/agent_service.grpc.pb.h"

namespace trainyard {
namespace {

class GrpcCoordinatorLink final : public CoordinatorLink {
 public:
  explicit GrpcCoordinatorLink(std::shared_ptr<grpc::Channel> channel)
      : stub_(v1::AgentService::NewStub(std::move(channel))) {}

  absl::StatusOr<v1::RegisterWorkerResponse> RegisterWorker(
      const v1::RegisterWorkerRequest& request, const CallLimits& limits) override {
    return Call(&Stub::RegisterWorker, request, limits);
  }
  absl::StatusOr<v1::SyncResponse> Sync(const v1::SyncRequest& request,
                                        const CallLimits& limits) override {
    return Call(&Stub::Sync, request, limits);
  }
  absl::Status ReportTaskStatus(const v1::ReportTaskStatusRequest& request,
                                const CallLimits& limits) override {
    return Call(&Stub::ReportTaskStatus, request, limits).status();
  }
  absl::Status ReportDebug(const v1::ReportDebugRequest& request,
                           const CallLimits& limits) override {
    return Call(&Stub::ReportDebug, request, limits).status();
  }
  absl::Status ReportPreemption(const v1::ReportPreemptionRequest& request,
                                const CallLimits& limits) override {
    return Call(&Stub::ReportPreemption, request, limits).status();
  }
  absl::StatusOr<v1::ShipLogsResponse> ShipLogs(const v1::ShipLogsRequest& request,
                                                const CallLimits& limits) override {
    return Call(&Stub::ShipLogs, request, limits);
  }
  absl::StatusOr<v1::LeaseResponse> HoldLease(const v1::LeaseRequest& request,
                                              const CallLimits& limits,
                                              const LeaseHeld& held) override {
    grpc::ClientContext context;
    Prepare(context, limits);
    std::unique_ptr<LeaseStream> stream = stub_->HoldLease(&context);
    v1::LeaseResponse answer;
    bool answered = false;
    if (stream->Write(request) && stream->Read(&answer)) {
      answered = true;
      if (!answer.reregister()) {
        auto beater = std::make_shared<StreamBeater>(stream.get());
        held(absl::Milliseconds(std::max<int64_t>(answer.beat_interval_ms(), 0)), beater);
        v1::LeaseResponse more;
        while (stream->Read(&more)) {
        }
        // The call is over: a beat in flight fails at once; none starts after this.
        beater->Close();
      }
    }
    const grpc::Status status = stream->Finish();
    if (limits.canceller != nullptr) limits.canceller->SetCancel(nullptr);
    if (answered && answer.reregister()) return answer;
    if (!status.ok()) return FromGrpcStatus(status);
    return absl::UnavailableError("the coordinator ended the lease stream");
  }

 private:
  using Stub = v1::AgentService::Stub;
  using LeaseStream = grpc::ClientReaderWriter<v1::LeaseRequest, v1::LeaseResponse>;

  // Beats written on the stream beside the reads of HoldLease (gRPC allows one writer and one
  // reader at a time); none after Close.
  class StreamBeater final : public LeaseBeater {
   public:
    explicit StreamBeater(LeaseStream* stream) : stream_(stream) {}
    bool Beat() override {
      absl::MutexLock lock(&mu_);
      return stream_ != nullptr && stream_->Write(v1::LeaseRequest());
    }
    void Close() {
      absl::MutexLock lock(&mu_);
      stream_ = nullptr;
    }

   private:
    absl::Mutex mu_;
    LeaseStream* stream_ ABSL_GUARDED_BY(mu_);
  };

  // The call's deadline and readiness, and its cancellation through limits.canceller (which the
  // caller resets with SetCancel(nullptr) once the call has ended, before `context` goes).
  static void Prepare(grpc::ClientContext& context, const CallLimits& limits) {
    if (limits.deadline != absl::InfiniteFuture()) {
      context.set_deadline(absl::ToChronoTime(limits.deadline));
    }
    context.set_wait_for_ready(limits.wait_for_ready);
    if (limits.canceller != nullptr) {
      limits.canceller->SetCancel([&context] { context.TryCancel(); });
    }
  }

  template <typename Request, typename Response>
  absl::StatusOr<Response> Call(grpc::Status (Stub::*rpc)(grpc::ClientContext*, const Request&,
                                                          Response*),
                                const Request& request, const CallLimits& limits) {
    grpc::ClientContext context;
    Prepare(context, limits);
    Response response;
    const grpc::Status status = ((*stub_).*rpc)(&context, request, &response);
    if (limits.canceller != nullptr) limits.canceller->SetCancel(nullptr);
    if (!status.ok()) return FromGrpcStatus(status);
    return response;
  }

  const std::unique_ptr<Stub> stub_;
};

}  // namespace

std::unique_ptr<CoordinatorLink> NewGrpcCoordinatorLink(std::shared_ptr<grpc::Channel> channel) {
  return std::make_unique<GrpcCoordinatorLink>(std::move(channel));
}

}  // namespace trainyard
