#ifndef TRAINYARD_WORKER_AGENT_GPU_HEALTH_H_
#define TRAINYARD_WORKER_AGENT_GPU_HEALTH_H_

// Which of the worker's GPUs are in service, and the rules that take one out: what NVML's
// readings and XID errors say of a GPU's health. Pure logic with the clock injected; the agent's
// GpuGuard (gpu_guard.h) reads the GPUs and applies it.

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "trainyard/v1/job.pb.h"
#include "worker/agent/nvml.h"

namespace trainyard {

// ---- the rules ----

// What one GPU's readings say: the faults (each a reason that takes it out of service) and what
// is worth a log line but is no fault (a link that lowered its generation to save power, clocks
// held down by the software power cap).
struct GpuVerdict {
  std::vector<std::string> faults;
  std::vector<std::string> notes;
  bool ok() const { return faults.empty(); }
  std::string Reason() const;  // the faults joined with "; "
};
GpuVerdict EvaluateGpuHealth(const GpuHealthReading& reading);

// NVML's clocks event (throttle) reasons (nvml.h, nvmlClocksEventReason*): the bits and names.
// The hardware ones mean the board itself holds the clocks down (its slowdown signal, its
// temperature, its power brake); the others are software policy or an idle GPU.
inline constexpr uint64_t kClocksGpuIdle = 0x1;
inline constexpr uint64_t kClocksApplicationsClocksSetting = 0x2;
inline constexpr uint64_t kClocksSwPowerCap = 0x4;
inline constexpr uint64_t kClocksHwSlowdown = 0x8;
inline constexpr uint64_t kClocksSyncBoost = 0x10;
inline constexpr uint64_t kClocksSwThermalSlowdown = 0x20;
inline constexpr uint64_t kClocksHwThermalSlowdown = 0x40;
inline constexpr uint64_t kClocksHwPowerBrakeSlowdown = 0x80;
inline constexpr uint64_t kClocksDisplayClockSetting = 0x100;
inline constexpr uint64_t kClocksHardwareReasons =
    kClocksHwSlowdown | kClocksHwThermalSlowdown | kClocksHwPowerBrakeSlowdown;

// What an XID error says of its GPU (NVIDIA's Xid catalog, docs.nvidia.com/deploy/xid-errors).
enum class XidKind {
  kHardware,     // the GPU, its memory, links or firmware failed: taken out of service
  kApplication,  // usually the program's own doing (a bad address, a killed context): counted
  kOther,        // not classified here: counted and logged, not a fault
};
struct XidClass {
  XidKind kind;
  const char* what;  // "the GPU fell off the bus"; empty for unnamed ones
};
XidClass ClassifyXid(uint64_t xid);
// "XID 79 (the GPU fell off the bus)"
std::string DescribeXid(uint64_t xid);
// "hardware", "application", "other": the XID counter's kind label.
const char* XidKindName(XidKind kind);

// ---- the state ----

// The worker's GPUs 0..gpus-1, each in service or out of it with a reason and since when, and the
// XID errors seen on each. Thread-safe; never calls out while it holds its lock.
class GpuHealth {
 public:
  GpuHealth(int gpus, const Clock& clock);
  GpuHealth(const GpuHealth&) = delete;
  GpuHealth& operator=(const GpuHealth&) = delete;

  int size() const { return static_cast<int>(size_); }
  // False for an index out of range.
  bool InService(int gpu) const;
  // Takes `gpu` out of service for `reason` from now. False, and nothing changes, when it was out
  // already (the first reason stays) or the index is out of range.
  bool TakeOut(int gpu, const std::string& reason);
  // A GPU still out after a check that failed again: its reason and time are the new ones.
  void Renew(int gpu, const std::string& reason);
  // Back in service (a check passed).
  void PutBack(int gpu);
  // Every GPU out of service, by index.
  std::vector<v1::GpuFault> Faults() const;
  // The reason `gpu` is out of service; empty while it is in service.
  std::string Reason(int gpu) const;

  // Whether a check asked for by an admin's return of `gpu` may start now: it is out of service
  // and none started within `interval`. When true, now is recorded as that check's start.
  bool BeginReturnCheck(int gpu, absl::Duration interval);

  void CountXid(int gpu, uint64_t xid);
  // (gpu, xid) -> how many were seen since the agent started.
  std::map<std::pair<int, uint64_t>, int64_t> XidCounts() const;

 private:
  struct Gpu {
    bool in_service = true;
    std::string reason;
    absl::Time since;
    absl::Time return_checked = absl::InfinitePast();
  };

  const size_t size_;
  const Clock& clock_;
  mutable absl::Mutex mu_;
  std::vector<Gpu> gpus_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<int, uint64_t>, int64_t> xids_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trainyard

#endif  // TRAINYARD_WORKER_AGENT_GPU_HEALTH_H_
