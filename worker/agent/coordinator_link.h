#ifndef TRAINYARD_WORKER_AGENT_COORDINATOR_LINK_H_
#define TRAINYARD_WORKER_AGENT_COORDINATOR_LINK_H_

#include <functional>
#include <memory>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "trainyard/v1/agent_service.pb.h"

namespace trainyard {

// Lets another thread end a call to the coordinator early: the agent cancels its long poll when
// a stop or preemption is requested. Cancel before the call has started ends the call as soon as
// it starts. Thread-safe.
class CallCanceller {
 public:
  void Cancel() {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    // Under the lock: SetCancel(nullptr), which comes before the call's state goes away, waits
    // for it.
    if (cancel_) cancel_();
  }
  bool cancelled() const {
    absl::MutexLock lock(&mu_);
    return cancelled_;
  }
  // For CoordinatorLink implementations: `cancel` ends the call in flight (without blocking; it
  // runs under this object's lock); it runs at once when Cancel came first. Set it to nullptr
  // when the call has ended, before what `cancel` uses goes away.
  void SetCancel(std::function<void()> cancel) {
    absl::MutexLock lock(&mu_);
    cancel_ = std::move(cancel);
    if (cancelled_ && cancel_) cancel_();
  }

 private:
  mutable absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::function<void()> cancel_ ABSL_GUARDED_BY(mu_);
};

// How long one call may take, and how it may end early.
struct CallLimits {
  absl::Time deadline = absl::InfiniteFuture();  // in the agent's clock's time
  // Waits for the channel to (re)connect instead of failing at once while it backs off.
  bool wait_for_ready = false;
  CallCanceller* canceller = nullptr;  // may be null; outlives the call
};

// The agent's calls to the coordinator (the agent's half of trainyard.v1.AgentService). The seam
// between the agent's logic and gRPC: tests use a fake. Errors are the coordinator's or the
// transport's status (UNAVAILABLE, DEADLINE_EXCEEDED, CANCELLED when a CallCanceller ended the
// call). Implementations are thread-safe.
// Sends beats on a lease stream while it holds (HoldLease). Thread-safe; may outlive the stream.
class LeaseBeater {
 public:
  virtual ~LeaseBeater() = default;
  // One beat; false once the stream has ended.
  virtual bool Beat() = 0;
};

class CoordinatorLink {
 public:
  virtual ~CoordinatorLink() = default;
  virtual absl::StatusOr<v1::RegisterWorkerResponse> RegisterWorker(
      const v1::RegisterWorkerRequest& request, const CallLimits& limits) = 0;
  virtual absl::StatusOr<v1::SyncResponse> Sync(const v1::SyncRequest& request,
                                                const CallLimits& limits) = 0;
  virtual absl::Status ReportTaskStatus(const v1::ReportTaskStatusRequest& request,
                                        const CallLimits& limits) = 0;
  virtual absl::Status ReportPreemption(const v1::ReportPreemptionRequest& request,
                                        const CallLimits& limits) = 0;
  virtual absl::StatusOr<v1::ShipLogsResponse> ShipLogs(const v1::ShipLogsRequest& request,
                                                        const CallLimits& limits) = 0;
  // `trainyard debug`'s answer; UNIMPLEMENTED (the default) where the link has none.
  virtual absl::Status ReportDebug(const v1::ReportDebugRequest& request,
                                   const CallLimits& limits) {
    return absl::UnimplementedError("no debug reports");
  }
  // Opens the lease stream (AgentService.HoldLease) and calls `held` once the coordinator has
  // taken the lease, with how often it wants beats (zero: none) and where to send them; then
  // blocks until the stream ends, and returns the coordinator's answer (reregister when it
  // refused the lease) or the error that ended it. UNIMPLEMENTED (the default) when the
  // coordinator keeps leases by Sync only.
  using LeaseHeld =
      std::function<void(absl::Duration beat_interval, std::shared_ptr<LeaseBeater> beater)>;
  virtual absl::StatusOr<v1::LeaseResponse> HoldLease(const v1::LeaseRequest& request,
                                                      const CallLimits& limits,
                                                      const LeaseHeld& held) {
    return absl::UnimplementedError("no lease stream");
  }
};

// The link over a gRPC channel (TLS and credentials are the channel's). Deadlines are read as
// wall-clock times.
std::unique_ptr<CoordinatorLink> NewGrpcCoordinatorLink(std::shared_ptr<grpc::Channel> channel);

}  // namespace trainyard

#endif  // TRAINYARD_WORKER_AGENT_COORDINATOR_LINK_H_
