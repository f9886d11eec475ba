#ifndef TRAINYARD_WORKER_AGENT_AGENT_H_
#define TRAINYARD_WORKER_AGENT_AGENT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "grpcpp/grpcpp.h"
#include "trainyard/v1/agent_service.grpc.pb.h"
#include "worker/agent/log_shipper.h"
#include "worker/agent/process_launcher.h"
#include "worker/agent/reconciler.h"

namespace trainyard {

struct AgentOptions {
  std::string coordinator;  // host:port
  std::string name;         // unique worker name
  std::string address;      // where other machines reach this one
  int slots = 1;
  int gpus = 0;
  int64_t memory_bytes = 0;
  std::string hostname;
  std::string work_dir;  // absolute
  std::string trainer_path;
  absl::Duration stop_grace_period = absl::Seconds(10);
  absl::Duration sync_wait = absl::Seconds(1);  // long-poll hold time, also the lease renewal
};

// Why the agent is asked to stop.
enum class StopReason {
  kTerminationSignal,  // SIGTERM or SIGINT
  // A later preemption watcher adds kPreemptionNotice here: the agent then reports the
  // preemption to the coordinator and lets the trainers checkpoint before stopping them.
};

// The worker agent: registers with the coordinator, keeps its lease alive with long-polling
// Sync calls, hands the desired tasks to the Reconciler, reports task statuses (immediately and
// in every Sync) and ships task logs. Survives coordinator outages (retries with backoff, keeps
// trainers running) and re-registers when the coordinator asks.
class Agent {
 public:
  Agent(AgentOptions options, std::shared_ptr<grpc::Channel> channel);
  ~Agent();
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  // Runs until RequestStop, then stops every trainer (SIGTERM, SIGKILL after the grace period),
  // reports how they ended and returns the process exit code (0). Call from the main thread:
  // trainers are forked from the calling thread and die with it.
  int Run();

  // Asks Run to wind down. Thread-safe, non-blocking; may be called from a signal-watching
  // thread (not from a signal handler).
  void RequestStop(StopReason reason);

  // For metrics; thread-safe. Every task tracked, with its pid and state.
  std::vector<v1::TaskStatus> TaskStatuses() const { return reconciler_.Statuses(); }
  // GPUs handed to running trainers.
  int GpusAllocated() const { return options_.gpus - reconciler_.FreeGpus(); }

 private:
  class CoordinatorLogSink;

  // Retries until registered or asked to stop. False if asked to stop first.
  bool Register();
  // One Sync call. UNAVAILABLE etc. on transport errors; NOT_FOUND when asked to re-register.
  absl::Status SyncOnce();
  void Report(const v1::TaskStatus& status);
  void SupervisorLoop();
  void ShipperLoop();
  // Waits up to `d` or until a stop is requested; true if a stop was requested.
  bool WaitOrStop(absl::Duration d);

  const AgentOptions options_;
  std::unique_ptr<v1::AgentService::Stub> stub_;
  std::unique_ptr<ProcessLauncher> launcher_;
  std::unique_ptr<CoordinatorLogSink> log_sink_;
  LogShipper shipper_;
  Reconciler reconciler_;

  absl::Notification stop_requested_;
  absl::Notification threads_done_;
  absl::Mutex mu_;
  std::string worker_id_ ABSL_GUARDED_BY(mu_);
  uint64_t known_version_ ABSL_GUARDED_BY(mu_) = 0;
  grpc::ClientContext* active_call_ ABSL_GUARDED_BY(mu_) = nullptr;
};

// MemTotal from /proc/meminfo in bytes; 0 if unknown.
int64_t MachineMemoryBytes();

}  // namespace trainyard

#endif  // TRAINYARD_WORKER_AGENT_AGENT_H_
