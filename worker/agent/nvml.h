#ifndef TRAINYARD_WORKER_AGENT_NVML_H_
#define TRAINYARD_WORKER_AGENT_NVML_H_

// The machine's NVIDIA GPUs as the driver's management library (NVML) sees them: how many there
// are, what each is doing, the readings that say whether it is healthy, and its XID errors as they
// happen. NVML is loaded with dlopen at run time, so the agent builds without NVIDIA's headers and
// runs on machines without the driver.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace trainyard {

// One GPU as NVML sees it. Readings a GPU does not support (power on some boards) are nullopt.
struct GpuSample {
  int index = 0;     // NVML's index: PCI bus order, as CUDA_DEVICE_ORDER=PCI_BUS_ID numbers them
  std::string uuid;  // "GPU-..."
  std::string name;  // "NVIDIA H100 80GB HBM3"
  double utilization_ratio = 0;  // 0..1: share of the last sample period a kernel ran
  int64_t memory_used_bytes = 0;
  int64_t memory_total_bytes = 0;
  std::optional<double> temperature_celsius;
  std::optional<double> power_watts;
};

// What NVML says of one GPU's health. A reading the board or the driver does not support (no ECC
// on the board, retired pages on GPUs that remap rows instead, a call an old driver lacks) is
// nullopt: not a fault. EvaluateGpuHealth (gpu_health.h) judges it.
struct GpuHealthReading {
  int index = 0;
  // Uncorrectable ECC errors since the driver loaded (NVML's volatile counter).
  std::optional<uint64_t> uncorrectable_ecc_errors;
  std::optional<bool> retired_pages_pending;  // a page awaits retirement (at the next reset)
  std::optional<bool> row_remap_failed;       // a row remapping failed
  std::optional<bool> row_remap_pending;      // a row remapping awaits the next reset
  std::optional<int> pcie_link_width;         // lanes now
  std::optional<int> pcie_max_link_width;     // the most this GPU and its slot allow
  std::optional<int> pcie_link_generation;
  std::optional<int> pcie_max_link_generation;
  // Why the clocks are held down now: a mask of NVML's clocks event (throttle) reasons.
  std::optional<uint64_t> clocks_event_reasons;
  // Readings that failed for another reason than "not supported", each "what: why".
  std::vector<std::string> unreadable;
};

// One XID error NVML reported on a GPU.
struct XidEvent {
  int index = 0;  // the GPU's
  uint64_t xid = 0;
};

// The XID errors of every GPU that reports them, as they happen. Wait may run on its own thread
// beside calls to the monitor that made it (NVML is thread-safe), which must outlive it.
class XidWatch {
 public:
  virtual ~XidWatch() = default;
  // The next XID error, waiting up to `timeout` (of real time: NVML's own wait) for one; nullopt
  // when none came. UNAVAILABLE when NVML fails to wait.
  virtual absl::StatusOr<std::optional<XidEvent>> Wait(absl::Duration timeout) = 0;
};

// Reads the GPUs. Thread-safe.
class GpuMonitor {
 public:
  virtual ~GpuMonitor() = default;
  // The GPUs the driver shows. UNAVAILABLE when NVML cannot count them.
  virtual absl::StatusOr<int> Count() = 0;
  // Every GPU that answered; one that fails to answer is left out (and logged once).
  virtual std::vector<GpuSample> Sample() = 0;
  // GPU `index`'s health readings. UNAVAILABLE when NVML cannot reach the GPU (lost, fallen off
  // the bus), with NVML's reason; UNIMPLEMENTED when this monitor reads no health.
  virtual absl::StatusOr<GpuHealthReading> ReadHealth(int index);
  // A watch of the XID errors of every GPU that supports the event. UNIMPLEMENTED when this
  // monitor or the driver has no XID events, or no GPU supports them.
  virtual absl::StatusOr<std::unique_ptr<XidWatch>> WatchXids();
};

// NVML from `library`. NOT_FOUND when it cannot be loaded or lacks a needed symbol, UNAVAILABLE
// when it loads but nvmlInit fails (a driver without GPUs, a broken install). The health readings
// and XID events are optional: a driver that lacks one reports it unsupported.
absl::StatusOr<std::unique_ptr<GpuMonitor>> LoadNvml(
    const std::string& library = "libnvidia-ml.so.1");

// The GPUs an agent offers when not told: NVML's count when `nvml` is given and counts, else the
// /dev/nvidia[0-9]* device files under `dev` (a driver without NVML in reach). `how` says which.
int DiscoverGpus(GpuMonitor* nvml, const std::string& dev, std::string* how);

}  // namespace trainyard

#endif  // TRAINYARD_WORKER_AGENT_NVML_H_
