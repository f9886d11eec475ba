#ifndef TRAINYARD_WORKER_AGENT_GPU_GUARD_H_
#define TRAINYARD_WORKER_AGENT_GPU_GUARD_H_

#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "worker/agent/gpu_health.h"
#include "worker/agent/nvml.h"

namespace trainyard {

struct GpuGuardOptions {
  int gpus = 0;  // the worker's GPUs: 0..gpus-1
  // NVML's readings and XID events; null: none (a machine without the driver's NVML).
  GpuMonitor* nvml = nullptr;
  // The compute check of one GPU (the trainer's --gpu_check): its one-line summary when the GPU
  // passed it; FAILED_PRECONDITION, saying why, when the GPU failed it; any other error when the
  // check could not run (not the GPU's fault: the GPU is not taken out for it). Unset: no compute
  // check (the trainer has no CUDA). Blocks for the check (seconds); may run for several GPUs at
  // once.
  std::function<absl::StatusOr<std::string>(int gpu)> compute_check;
  // How often the ECC counters of the GPUs in service are read.
  absl::Duration poll_interval = absl::Seconds(5);
  // An admin's return of a GPU is checked at most this often (the coordinator repeats it).
  absl::Duration return_interval = absl::Minutes(1);
  // How long one NVML wait for an XID event lasts: how soon Stop ends the watch.
  absl::Duration xid_wait = absl::Milliseconds(500);
  // Called when a GPU is taken out of service (from any of the guard's threads or the caller's,
  // no lock of the guard held): the agent stops the tasks on it and tells the coordinator.
  std::function<void(int gpu, const std::string& reason)> on_fault;
};

// A GPU a check found failing, and why.
struct FailedGpu {
  int gpu = 0;
  std::string reason;
};

// Keeps the worker's GPUs healthy before jobs land on them: checks each one (NVML's readings,
// then the compute check) at the agent's start, after each task that used it, and when an admin
// returns it; watches NVML's XID events and the uncorrectable ECC counters while they run; and
// takes a GPU that fails out of service in `health`, which the reconciler consults before it
// gives a task a GPU. Thread-safe. `health` and the monitor must outlive it.
class GpuGuard {
 public:
  GpuGuard(GpuGuardOptions options, GpuHealth& health, const Clock& clock);
  ~GpuGuard();  // Stop
  GpuGuard(const GpuGuard&) = delete;
  GpuGuard& operator=(const GpuGuard&) = delete;

  // Whether it checks anything: NVML or the compute check.
  bool enabled() const { return options_.nvml != nullptr || options_.compute_check != nullptr; }

  // The pre-flight check of every GPU, all at once; takes out those that fail. Blocks until
  // every check has ended (seconds: the compute checks run side by side).
  void Preflight();
  // Starts watching: the XID events (where NVML has them) and the ECC counters, and the checks of
  // returned GPUs, on threads of its own until Stop. Call once, after Preflight.
  void Start();
  // Ends the watch and joins its threads (within xid_wait, or a running check). Idempotent.
  void Stop();

  // Checks `gpus`, which a task has just freed, before they are given out again; takes out those
  // that fail. The first GPU among them out of service (taken out now or before) with its reason;
  // nullopt when all are in service. Blocks for the checks (seconds).
  std::optional<FailedGpu> CheckFreed(const std::vector<int>& gpus);

  // An admin returned `gpus` to service: each that is out of service, and was not checked for a
  // return within return_interval, is checked again on the guard's thread and put back in service
  // when it passes (else its fault is renewed with the new reason). Repeats are ignored; GPUs in
  // service too. Non-blocking.
  void RequestReturn(const std::vector<int>& gpus);

 private:
  // NVML's readings of `gpu`, then its compute check when those pass. Blocking.
  GpuVerdict Check(int gpu);
  // Takes `gpu` out for `reason` unless it is out already, says so and calls on_fault.
  void Fault(int gpu, const std::string& reason);
  void WatchXids();
  void HandleXid(const XidEvent& event);
  void Poll();
  // The uncorrectable ECC counter of each GPU in service, against the last reading.
  void PollEcc();
  void ReturnCheck(int gpu);
  void RecordEcc(int gpu, uint64_t count);

  const GpuGuardOptions options_;
  GpuHealth& health_;
  const Clock& clock_;

  absl::Mutex mu_;
  absl::CondVar cv_;  // a return asked for, or Stop
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::set<int> returns_ ABSL_GUARDED_BY(mu_);  // to check on the poll thread
  // The last uncorrectable ECC count read of each GPU; nullopt before any (or unsupported).
  std::vector<std::optional<uint64_t>> ecc_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<XidWatch> watch_;  // set by Start, before its thread
  std::thread xid_thread_;
  std::thread poll_thread_;
};

}  // namespace trainyard

#endif  // TRAINYARD_WORKER_AGENT_GPU_GUARD_H_
