#include "worker/trainer/coordinator/rendezvous_client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "common/rpc/grpc_status.h"
#include "trainyard/v1/agent_service.grpc.pb.h"
#include "worker/trainer/coordinator/coordinator_client.h"  // Retry, CoordinatorRetry

namespace trainyard::trainer {
namespace {

// How long one RendezvousGet may hold the call; longer waits are several calls, so that a
// coordinator restart costs at most one of them.
constexpr absl::Duration kMaxWaitPerCall = absl::Seconds(20);
// Time the call itself may take beyond the wait it asks for.
constexpr absl::Duration kRpcSlack = absl::Seconds(5);

class GrpcRendezvousClient final : public RendezvousClient {
 public:
  GrpcRendezvousClient(std::shared_ptr<grpc::Channel> channel, std::string job_id,
                       int64_t generation, int32_t rank)
      : stub_(trainyard::v1::AgentService::NewStub(std::move(channel))),
        job_id_(std::move(job_id)),
        generation_(generation),
        rank_(rank) {}

  absl::Status Set(const std::string& key, const std::string& value) override {
    const Clock& clock = RealClock::Get();
    trainyard::v1::RendezvousSetRequest request;
    request.set_job_id(job_id_);
    request.set_generation(generation_);
    request.set_rank(rank_);
    request.set_key(key);
    request.set_value(value);
    // Rides out a coordinator restart; setting a key again to the same value changes nothing.
    return Retry(clock, CoordinatorRetry(clock.Now() + absl::Seconds(30), absl::Milliseconds(100)),
                 IsRetryableCoordinatorError, [&] {
                   trainyard::v1::RendezvousSetResponse response;
                   grpc::ClientContext context;
                   context.set_deadline(absl::ToChronoTime(clock.Now() + kRpcSlack));
                   context.set_wait_for_ready(true);  // as coordinator_client.cc says
                   return FromGrpcStatus(stub_->RendezvousSet(&context, request, &response),
                                         absl::StrCat("rendezvous set ", key));
                 });
  }

  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    const Clock& clock = RealClock::Get();
    const absl::Time deadline = clock.Now() + timeout;
    std::string value;
    // Long polls, one after another at once while they expire with time left; a transport
    // failure is retried like any coordinator call, until the deadline.
    auto poll = [&]() -> absl::Status {
      while (true) {
        const absl::Duration wait =
            std::clamp(deadline - clock.Now(), absl::ZeroDuration(), kMaxWaitPerCall);
        trainyard::v1::RendezvousGetRequest request;
        request.set_job_id(job_id_);
        request.set_generation(generation_);
        request.set_rank(rank_);
        request.set_key(key);
        request.set_wait_ms(absl::ToInt64Milliseconds(wait));
        trainyard::v1::RendezvousGetResponse response;
        grpc::ClientContext context;
        context.set_deadline(absl::ToChronoTime(clock.Now() + wait + kRpcSlack));
        context.set_wait_for_ready(true);  // as coordinator_client.cc says
        absl::Status status = FromGrpcStatus(stub_->RendezvousGet(&context, request, &response),
                                             absl::StrCat("rendezvous get ", key));
        if (status.ok()) value = std::move(*response.mutable_value());
        if (status.code() != absl::StatusCode::kDeadlineExceeded || clock.Now() >= deadline) {
          return status;
        }
      }
    };
    absl::Status status = Retry(clock, CoordinatorRetry(deadline, absl::Milliseconds(100)),
                                IsRetryableCoordinatorError, poll);
    if (status.ok()) return value;
    if (status.code() == absl::StatusCode::kDeadlineExceeded) {
      return absl::DeadlineExceededError(absl::StrCat("rendezvous: key '", key, "' not set within ",
                                                      absl::FormatDuration(timeout)));
    }
    return status;
  }

 private:
  const std::unique_ptr<trainyard::v1::AgentService::Stub> stub_;
  const std::string job_id_;
  const int64_t generation_;
  const int32_t rank_;
};

}  // namespace

std::unique_ptr<RendezvousClient> NewGrpcRendezvousClient(std::shared_ptr<grpc::Channel> channel,
                                                          const std::string& job_id,
                                                          int64_t generation, int32_t rank) {
  return std::make_unique<GrpcRendezvousClient>(std::move(channel), job_id, generation, rank);
}

}  // namespace trainyard::trainer
