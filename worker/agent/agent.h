#ifndef TRAINYARD_WORKER_AGENT_AGENT_H_
#define TRAINYARD_WORKER_AGENT_AGENT_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "trainyard/v1/agent_service.pb.h"
#include "worker/agent/coordinator_link.h"
#include "worker/agent/debug_responder.h"
#include "worker/agent/gpu_guard.h"
#include "worker/agent/gpu_health.h"
#include "worker/agent/log_shipper.h"
#include "worker/agent/preemption_notice.h"
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
  // What the trainer runs (QueryTrainerRuntime), reported at registration; no libtorch_version:
  // unknown (the coordinator then gives it no job that needs particular operators).
  v1::TrainerRuntime runtime;
  absl::Duration stop_grace_period = absl::Seconds(10);  // plain stops: SIGTERM to SIGKILL
  // Long-poll hold time while the lease stream holds (news answers a poll at once); without the
  // stream (a coordinator that keeps leases by Sync), polls of at most kSyncLeaseWait renew it.
  absl::Duration sync_wait = absl::Seconds(60);
  absl::Duration task_retention = absl::Hours(24);  // folders of ended tasks are kept this long
  // The most a task's output.log holds on disk (LogShipper: the oldest output is freed past it).
  int64_t task_log_max_bytes = LogShipper::kDefaultMaxFileBytes;
  // With no lease from the coordinator this long (its stream broken and no Sync answered), the
  // agent kills its trainers (self-fencing): the coordinator has presumably given their work to
  // others. Zero: never. The coordinator's --mass_loss_hold by default: what training rides
  // through when the coordinator's own network is out.
  absl::Duration self_fence_after = absl::Minutes(5);
  std::map<std::string, std::string> trainer_env;  // ReconcilerOptions::trainer_env
  TaskIsolation* isolation = nullptr;              // ReconcilerOptions::isolation
  std::vector<std::string> trainer_env_pass;       // ReconcilerOptions::trainer_env_pass
  TaskUidRange task_uids;                          // ReconcilerOptions::task_uids
  S3Gateway* s3_gateway = nullptr;                 // ReconcilerOptions::s3_gateway
  // GPU health (GpuGuardOptions): NVML for the readings and XID events (null: none; not owned,
  // outlives the agent), the compute check of one GPU (the trainer's --gpu_check; unset: none),
  // and how often the ECC counters are read.
  GpuMonitor* gpu_monitor = nullptr;
  std::function<absl::StatusOr<std::string>(int gpu)> gpu_compute_check;
  absl::Duration gpu_poll_interval = absl::Seconds(5);
};

// While no lease stream holds, Syncs renew the lease and wait at most this long.
inline constexpr absl::Duration kSyncLeaseWait = absl::Seconds(1);

// The worker agent: registers with the coordinator, keeps its lease with a stream held open
// (HoldLease, on which it beats while it runs tasks; by long-polling Sync calls of at most
// kSyncLeaseWait where the coordinator has no such stream),
// hands the desired tasks to the Reconciler, reports task statuses (immediately and
// in every Sync) and ships task logs. Survives coordinator outages (retries with backoff capped
// at 2 s, keeps trainers running) and re-registers when the coordinator asks.
//
// Two ways to stop, both ending with Run returning 0 once no trainer runs:
//  - RequestStop (SIGINT): a plain stop. Every trainer gets SIGTERM, and SIGKILL after
//    stop_grace_period.
//  - RequestPreemption (SIGTERM, a cloud notice): the machine is going away at the notice's
//    deadline. The agent reports it to the coordinator (ReportPreemption, a few quick tries),
//    writes each trainer's stop-deadline file and sends it SIGTERM, SIGKILL at the deadline minus
//    a margin (2 s, or a tenth of the time left when that is less), and leaves before the
//    deadline whatever happens.
// In both it keeps syncing and reporting while the trainers wind down, so that the coordinator
// learns at once how each one ended, and ships the rest of their logs.
//
// Its GPUs are checked before jobs land on them (GpuGuard): at its start, before it registers,
// and after each task that used them, before the task's end is reported. A GPU that fails a check,
// an XID error of the hardware's or a rise of its uncorrectable ECC errors is taken out of
// service: the tasks on it are killed and reported with TaskStatus.gpu_fault, no task is given it,
// and every registration and Sync lists it (gpu_faults) until an admin returns it
// (SyncResponse.return_gpus) and its check passes, or the agent restarts and its check passes.
//
// Its parts come from the caller: the calls to the coordinator (`link`), how trainers are started
// (`launcher`) and the time that decides leases, backoff and kill times (`clock`), so that tests
// can run it against a scripted coordinator and fake processes on a simulated clock.
class Agent {
 public:
  Agent(AgentOptions options, std::unique_ptr<CoordinatorLink> link,
        std::unique_ptr<ProcessLauncher> launcher, const Clock& clock);
  ~Agent();
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  // Runs until a stop or preemption has been requested and every trainer has ended, and returns
  // the process exit code (0). Call from the main thread: trainers are forked from the calling
  // thread and die with it.
  int Run();

  // Asks for a plain stop. A second request, or one after a preemption, changes nothing.
  // Thread-safe, non-blocking; may be called from a signal-watching thread (not from a signal
  // handler).
  void RequestStop();
  // Asks to wind down for a preemption by `notice.deadline`; also after RequestStop, when it
  // only brings the trainers' kill times forward. Only the first notice counts: a second one does
  // not move the deadline. Thread-safe, non-blocking, like RequestStop.
  void RequestPreemption(const PreemptionNotice& notice);

  // For metrics; thread-safe. Every task tracked, with its pid and state.
  std::vector<v1::TaskStatus> TaskStatuses() const { return reconciler_.Statuses(); }
  // GPUs handed to running trainers.
  int GpusAllocated() const { return reconciler_.GpusInUse(); }
  // GPUs out of service, and the XID errors seen by GPU and code.
  std::vector<v1::GpuFault> GpuFaults() const { return gpu_health_.Faults(); }
  std::map<std::pair<int, uint64_t>, int64_t> XidCounts() const { return gpu_health_.XidCounts(); }
  std::map<int, v1::TaskStatus> GpuTasks() const { return reconciler_.GpuTasks(); }
  // A task's folder (its trainer's working directory).
  std::string TaskDir(const std::string& task_id) const { return reconciler_.TaskDir(task_id); }

 private:
  class CoordinatorLogSink;

  // One RegisterWorker call ending within `timeout`; the gRPC error if it fails. CANCELLED,
  // without a call, when Wake came after wake_seq_ was `seen`.
  absl::Status RegisterOnce(absl::Duration timeout, uint64_t seen);
  // One Sync call held up to `wait` and ending within wait + `timeout`. UNAVAILABLE etc. on
  // transport errors; NOT_FOUND when asked to re-register; CANCELLED as RegisterOnce.
  absl::Status SyncOnce(absl::Duration wait, absl::Duration timeout, uint64_t seen);
  // Run's rounds: its state, the preemption's report when due, the trainers' stop when asked
  // for, and one call to the coordinator (register or sync, and the wait after a failure).
  struct LoopState;
  void ReportPreemptionIfDue(LoopState& s, const PreemptionNotice& notice);
  void BeginStopIfAsked(LoopState& s, bool preemption_begins, bool stop_requested,
                        absl::Time kill_at);
  void Contact(LoopState& s, uint64_t seen);
  // One ReportPreemption call.
  absl::Status ReportPreemption(const PreemptionNotice& notice);
  void Report(const v1::TaskStatus& status);
  // GpuGuard's on_fault: kills the tasks on `gpu` and wakes Run, so that the coordinator hears of
  // the fault at once.
  void OnGpuFault(int gpu, const std::string& reason);
  // The reconciler's before_exit_reported hook, after the log: checks the GPUs task `task_id`
  // freed before they are given out again (not while the agent stops), and puts a failed end
  // down to a GPU that failed under it.
  void CheckGpusAfterTask(const std::string& task_id);
  void SupervisorLoop();
  // Kills the trainers once the agent has been without a lease for options_.self_fence_after
  // (once per such spell; SupervisorLoop's thread only).
  void SelfFence();
  void ShipperLoop();
  // Holds the lease stream of each registration until EndLease, reopening it at once (then
  // backing off up to 1 s) when it breaks.
  void LeaseLoop();
  // While the lease stream holds and the coordinator wants beats, beats on it every interval the
  // coordinator asked for, as long as the agent has tasks (Busy), until EndLease.
  void BeatLoop();
  bool Busy() const;
  void EndLease();
  // How long the next long poll may wait (see AgentOptions::sync_wait).
  absl::Duration SyncWait();
  // When an RPC started now with `timeout` must end: never after leave_by_.
  absl::Time RpcDeadline(absl::Duration timeout);
  // Wakes Run: a stop or preemption was requested.
  void Wake() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits up to `d` (never past leave_by_), or until Wake is called after wake_seq_ was `seen`.
  void Sleep(absl::Duration d, uint64_t seen);
  // Limits of a call started now with `timeout` that Wake cancels; CANCELLED, and no call, when
  // Wake came after wake_seq_ was `seen`. EndCall when it returns.
  absl::StatusOr<CallLimits> BeginCall(absl::Duration timeout, uint64_t seen,
                                       CallCanceller& canceller);
  void EndCall();

  const AgentOptions options_;
  const Clock& clock_;
  const std::unique_ptr<CoordinatorLink> link_;
  const std::unique_ptr<ProcessLauncher> launcher_;
  std::unique_ptr<CoordinatorLogSink> log_sink_;
  LogShipper shipper_;
  GpuHealth gpu_health_;  // before the reconciler that consults it
  Reconciler reconciler_;
  GpuGuard gpu_guard_;    // after the reconciler it stops tasks through
  DebugResponder debug_;  // after the reconciler it reads

  absl::Notification threads_done_;
  mutable absl::Mutex mu_;
  absl::CondVar wake_cv_;
  uint64_t wake_seq_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_requested_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<PreemptionNotice> preemption_ ABSL_GUARDED_BY(mu_);
  absl::Time kill_at_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();   // of trainers, preempted
  absl::Time leave_by_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();  // of the agent, preempted
  std::string worker_id_ ABSL_GUARDED_BY(mu_);
  uint64_t known_version_ ABSL_GUARDED_BY(mu_) = 0;
  CallCanceller* active_call_ ABSL_GUARDED_BY(mu_) = nullptr;  // Register or Sync in flight
  uint64_t registrations_ ABSL_GUARDED_BY(mu_) = 0;
  bool lease_held_ ABSL_GUARDED_BY(mu_) = false;  // the coordinator took the lease stream
  // When the coordinator last had this worker's lease (a stream held until then, or a call
  // answered); the agent's start before any.
  absl::Time last_contact_ ABSL_GUARDED_BY(mu_);
  bool fenced_ = false;  // SupervisorLoop's: the trainers were killed for want of a lease
  bool lease_done_ ABSL_GUARDED_BY(mu_) = false;  // EndLease was called
  CallCanceller* lease_call_ ABSL_GUARDED_BY(mu_) = nullptr;
  absl::CondVar lease_cv_;
  // The held lease stream's beats: where (null: no stream) and how often (zero: none wanted).
  std::shared_ptr<LeaseBeater> beater_ ABSL_GUARDED_BY(mu_);
  absl::Duration beat_interval_ ABSL_GUARDED_BY(mu_);
  int desired_tasks_ ABSL_GUARDED_BY(mu_) = 0;  // in the coordinator's last answer, kills too
};

}  // namespace trainyard

#endif  // TRAINYARD_WORKER_AGENT_AGENT_H_
