#ifndef TRAINYARD_WORKER_AGENT_NVML_H_
#define TRAINYARD_WORKER_AGENT_NVML_H_

// The machine's NVIDIA GPUs as the driver's management library (NVML) sees them: how many there
// are, and what each is doing. NVML is loaded with dlopen at run time, so the agent builds
// without NVIDIA's headers and runs on machines without the driver.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

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

// Reads the GPUs. Implementations are not thread-safe: callers serialise.
class GpuMonitor {
 public:
  virtual ~GpuMonitor() = default;
  // The GPUs the driver shows. UNAVAILABLE when NVML cannot count them.
  virtual absl::StatusOr<int> Count() = 0;
  // Every GPU that answered; one that fails to answer is left out (and logged once).
  virtual std::vector<GpuSample> Sample() = 0;
};

// NVML from `library`. NOT_FOUND when it cannot be loaded or lacks a needed symbol, UNAVAILABLE
// when it loads but nvmlInit fails (a driver without GPUs, a broken install).
absl::StatusOr<std::unique_ptr<GpuMonitor>> LoadNvml(
    const std::string& library = "libnvidia-ml.so.1");

// The GPUs an agent offers when not told: NVML's count when `nvml` is given and counts, else the
// /dev/nvidia[0-9]* device files under `dev` (a driver without NVML in reach). `how` says which.
int DiscoverGpus(GpuMonitor* nvml, const std::string& dev, std::string* how);

}  // namespace trainyard

#endif  // TRAINYARD_WORKER_AGENT_NVML_H_
