#ifndef TRAINYARD_TESTS_AGENT_FAKE_COORDINATOR_LINK_H_
#define TRAINYARD_TESTS_AGENT_FAKE_COORDINATOR_LINK_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "worker/agent/coordinator_link.h"

namespace trainyard::testing {

// A scripted coordinator for the agent: answers at once, records every call with the time of
// `clock`, and is told by the test what the desired tasks are, when it is unreachable and when
// to ask for a new registration. Thread-safe.
class FakeCoordinatorLink final : public CoordinatorLink {
 public:
  struct Call {
    std::string rpc;  // RegisterWorker, Sync, ReportTaskStatus, ReportPreemption, HoldLease
    absl::Time at;
    bool ok = true;  // answered (not UNAVAILABLE or CANCELLED)
    bool cancelled = false;
    bool granted = false;  // a HoldLease the coordinator took (not refused for reregister)
    v1::RegisterWorkerRequest registration;
    v1::SyncRequest sync;
    v1::ReportTaskStatusRequest report;
    v1::ReportPreemptionRequest preemption;
    v1::LeaseRequest lease;
  };

  explicit FakeCoordinatorLink(const Clock& clock) : clock_(clock) {}

  absl::StatusOr<v1::RegisterWorkerResponse> RegisterWorker(
      const v1::RegisterWorkerRequest& request, const CallLimits& limits) override {
    Call call = Begin("RegisterWorker", limits);
    call.registration = request;
    absl::MutexLock lock(&mu_);
    if (!call.ok) return Fail(std::move(call), limits);
    registered_ = true;
    calls_.push_back(std::move(call));
    v1::RegisterWorkerResponse response;
    response.set_worker_id(request.name());
    return response;
  }
  absl::StatusOr<v1::SyncResponse> Sync(const v1::SyncRequest& request,
                                        const CallLimits& limits) override {
    Call call = Begin("Sync", limits);
    call.sync = request;
    absl::MutexLock lock(&mu_);
    if (!call.ok) return Fail(std::move(call), limits);
    calls_.push_back(std::move(call));
    v1::SyncResponse response;
    if (!registered_) {
      response.set_reregister(true);
      return response;
    }
    response.set_version(version_);
    for (const v1::Task& task : desired_) *response.add_tasks() = task;
    for (const std::string& id : kill_) response.add_kill_task_ids(id);
    for (int gpu : return_gpus_) response.add_return_gpus(gpu);
    return response;
  }
  // Off until EnableLeases (UNIMPLEMENTED, as from a coordinator that keeps leases by Sync).
  // Held until the agent cancels it, the coordinator goes away or forgets the worker.
  absl::StatusOr<v1::LeaseResponse> HoldLease(const v1::LeaseRequest& request,
                                              const CallLimits& limits,
                                              const LeaseHeld& held) override {
    {
      absl::MutexLock lock(&mu_);
      if (!leases_) return absl::UnimplementedError("no lease stream");
    }
    Call call = Begin("HoldLease", limits);
    call.lease = request;
    uint64_t epoch;
    {
      absl::MutexLock lock(&mu_);
      if (!call.ok) return Fail(std::move(call), limits);
      call.granted = registered_;
      calls_.push_back(std::move(call));
      if (!registered_) {
        v1::LeaseResponse refused;
        refused.set_reregister(true);
        return refused;
      }
      ++open_leases_;
      epoch = lease_epoch_;
    }
    auto beater = std::make_shared<Beater>(this);
    absl::Duration beat_interval;
    {
      absl::MutexLock lock(&mu_);
      beat_interval = request.beats() ? beat_interval_ : absl::ZeroDuration();
    }
    held(beat_interval, beater);
    bool cancelled = false;
    if (limits.canceller != nullptr) {
      limits.canceller->SetCancel([this, &cancelled] {
        absl::MutexLock lock(&mu_);
        cancelled = true;
      });
    }
    {
      absl::MutexLock lock(&mu_);
      auto ended = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return cancelled || !available_ || lease_epoch_ != epoch;
      };
      mu_.Await(absl::Condition(&ended));
      --open_leases_;
      beater->closed = true;
    }
    if (limits.canceller != nullptr) limits.canceller->SetCancel(nullptr);
    return absl::UnavailableError("the lease stream ended");
  }
  absl::Status ReportTaskStatus(const v1::ReportTaskStatusRequest& request,
                                const CallLimits& limits) override {
    Call call = Begin("ReportTaskStatus", limits);
    call.report = request;
    absl::MutexLock lock(&mu_);
    if (!call.ok) return Fail(std::move(call), limits);
    calls_.push_back(std::move(call));
    return absl::OkStatus();
  }
  absl::Status ReportPreemption(const v1::ReportPreemptionRequest& request,
                                const CallLimits& limits) override {
    Call call = Begin("ReportPreemption", limits);
    call.preemption = request;
    absl::MutexLock lock(&mu_);
    if (!call.ok) return Fail(std::move(call), limits);
    calls_.push_back(std::move(call));
    return absl::OkStatus();
  }
  // Logs are taken whole and not recorded (the log shipper has tests of its own).
  absl::StatusOr<v1::ShipLogsResponse> ShipLogs(const v1::ShipLogsRequest& request,
                                                const CallLimits& limits) override {
    absl::MutexLock lock(&mu_);
    if (!available_) return absl::UnavailableError("the coordinator is away");
    v1::ShipLogsResponse response;
    response.set_next_offset(request.offset() + static_cast<int64_t>(request.data().size()));
    return response;
  }

  // While false, every call fails with UNAVAILABLE (and is recorded so).
  void SetAvailable(bool available) {
    absl::MutexLock lock(&mu_);
    available_ = available;
  }
  // The tasks the next Syncs answer, and those to kill at once, under a new version.
  void SetDesired(std::vector<v1::Task> tasks, std::vector<std::string> kill = {}) {
    absl::MutexLock lock(&mu_);
    desired_ = std::move(tasks);
    kill_ = std::move(kill);
    ++version_;
  }
  // The GPUs every later Sync asks the agent to take back into service (an admin's return).
  void SetReturnGpus(std::vector<int> gpus) {
    absl::MutexLock lock(&mu_);
    return_gpus_ = std::move(gpus);
  }
  // With a beat interval, an agent that says it beats is asked to (each beat is a "Beat" call).
  void EnableLeases(absl::Duration beat_interval = absl::ZeroDuration()) {
    absl::MutexLock lock(&mu_);
    leases_ = true;
    beat_interval_ = beat_interval;
  }
  // Lease streams held now.
  int OpenLeases() const {
    absl::MutexLock lock(&mu_);
    return open_leases_;
  }
  // Forgets the worker, as a restarted coordinator that lost it would: Syncs answer reregister
  // until it registers again.
  void ForgetWorker() {
    absl::MutexLock lock(&mu_);
    registered_ = false;
    ++lease_epoch_;  // and ends its lease streams
  }
  std::vector<Call> calls() const {
    absl::MutexLock lock(&mu_);
    return calls_;
  }
  // Waits (in real time, up to 30 s) until `done` holds for the calls so far; whether it did.
  bool WaitFor(const std::function<bool(const std::vector<Call>&)>& done) const {
    absl::MutexLock lock(&mu_);
    auto met = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done(calls_); };
    return mu_.AwaitWithTimeout(absl::Condition(&met), absl::Seconds(30));
  }

 private:
  class Beater final : public LeaseBeater {
   public:
    explicit Beater(FakeCoordinatorLink* link) : link_(link) {}
    bool Beat() override {
      absl::MutexLock lock(&link_->mu_);
      if (closed) return false;
      Call call;
      call.rpc = "Beat";
      call.at = link_->clock_.Now();
      link_->calls_.push_back(std::move(call));
      return true;
    }
    bool closed ABSL_GUARDED_BY(link_->mu_) = false;

   private:
    FakeCoordinatorLink* const link_;
  };

  // The canceller's state is read without mu_ held: its own lock comes before mu_ (a lease
  // stream's cancel callback takes mu_ under it).
  Call Begin(const std::string& rpc, const CallLimits& limits) {
    Call call;
    call.rpc = rpc;
    call.at = clock_.Now();
    call.cancelled = limits.canceller != nullptr && limits.canceller->cancelled();
    absl::MutexLock lock(&mu_);
    call.ok = available_ && !call.cancelled;
    return call;
  }
  absl::Status Fail(Call call, const CallLimits&) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const bool cancelled = call.cancelled;
    calls_.push_back(std::move(call));
    if (cancelled) return absl::CancelledError("cancelled");
    return absl::UnavailableError("the coordinator is away");
  }

  const Clock& clock_;
  mutable absl::Mutex mu_;
  std::vector<Call> calls_ ABSL_GUARDED_BY(mu_);
  bool available_ ABSL_GUARDED_BY(mu_) = true;
  bool registered_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 1;
  std::vector<v1::Task> desired_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> kill_ ABSL_GUARDED_BY(mu_);
  std::vector<int> return_gpus_ ABSL_GUARDED_BY(mu_);
  bool leases_ ABSL_GUARDED_BY(mu_) = false;
  absl::Duration beat_interval_ ABSL_GUARDED_BY(mu_);
  int open_leases_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t lease_epoch_ ABSL_GUARDED_BY(mu_) = 0;
};

// How many of `calls` are of `rpc`.
inline int CountCalls(const std::vector<FakeCoordinatorLink::Call>& calls, const std::string& rpc) {
  int n = 0;
  for (const FakeCoordinatorLink::Call& call : calls) n += call.rpc == rpc ? 1 : 0;
  return n;
}

}  // namespace trainyard::testing

#endif  // TRAINYARD_TESTS_AGENT_FAKE_COORDINATOR_LINK_H_
