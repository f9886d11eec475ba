#include "worker/agent/nvml.h"

#include <dlfcn.h>

#include <cstring>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/log.h"
#include "worker/agent/subprocess.h"

namespace trainyard {
namespace {

// NVML's C ABI, declared here so that no NVIDIA header is needed to build (nvml.h: these have
// kept their layout since the _v2 entry points of 2013).
using NvmlReturn = int;  // nvmlReturn_t; 0 is NVML_SUCCESS
using NvmlDevice = void*;
struct NvmlUtilization {
  unsigned int gpu;
  unsigned int memory;
};
struct NvmlMemory {
  unsigned long long total;  // NOLINT(runtime/int): NVML's own types
  unsigned long long free;   // NOLINT(runtime/int)
  unsigned long long used;   // NOLINT(runtime/int)
};
constexpr int kNvmlTemperatureGpu = 0;      // NVML_TEMPERATURE_GPU
constexpr unsigned int kNvmlNameSize = 96;  // NVML_DEVICE_NAME_V2_BUFFER_SIZE
constexpr unsigned int kNvmlUuidSize = 96;  // NVML_DEVICE_UUID_V2_BUFFER_SIZE

class NvmlMonitor final : public GpuMonitor {
 public:
  static absl::StatusOr<std::unique_ptr<GpuMonitor>> Load(const std::string& library) {
    void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* error = dlerror();
      return absl::NotFoundError(
          absl::StrCat("cannot load ", library, ": ", error != nullptr ? error : "unknown error"));
    }
    std::unique_ptr<NvmlMonitor> monitor(new NvmlMonitor(handle));
    if (!monitor->Resolve()) {
      return absl::NotFoundError(absl::StrCat(library, " lacks the NVML functions needed"));
    }
    if (const NvmlReturn r = monitor->init_(); r != 0) {
      return absl::UnavailableError(absl::StrCat("nvmlInit failed: ", monitor->Error(r)));
    }
    monitor->initialised_ = true;
    return std::unique_ptr<GpuMonitor>(std::move(monitor));
  }

  ~NvmlMonitor() override {
    if (initialised_) shutdown_();
    dlclose(handle_);
  }

  absl::StatusOr<int> Count() override {
    unsigned int count = 0;
    if (const NvmlReturn r = get_count_(&count); r != 0) {
      return absl::UnavailableError(absl::StrCat("nvmlDeviceGetCount failed: ", Error(r)));
    }
    return static_cast<int>(count);
  }

  std::vector<GpuSample> Sample() override {
    std::vector<GpuSample> samples;
    absl::StatusOr<int> count = Count();
    if (!count.ok()) {
      Warn(-1, count.status().message());
      return samples;
    }
    for (int i = 0; i < *count; ++i) {
      NvmlDevice device = nullptr;
      if (const NvmlReturn r = get_handle_(static_cast<unsigned int>(i), &device); r != 0) {
        Warn(i, absl::StrCat("nvmlDeviceGetHandleByIndex: ", Error(r)));
        continue;
      }
      GpuSample sample;
      sample.index = i;
      NvmlUtilization utilization = {};
      NvmlMemory memory = {};
      if (const NvmlReturn r = get_utilization_(device, &utilization); r != 0) {
        Warn(i, absl::StrCat("nvmlDeviceGetUtilizationRates: ", Error(r)));
        continue;
      }
      if (const NvmlReturn r = get_memory_(device, &memory); r != 0) {
        Warn(i, absl::StrCat("nvmlDeviceGetMemoryInfo: ", Error(r)));
        continue;
      }
      sample.utilization_ratio = utilization.gpu / 100.0;
      sample.memory_used_bytes = static_cast<int64_t>(memory.used);
      sample.memory_total_bytes = static_cast<int64_t>(memory.total);
      char text[kNvmlNameSize > kNvmlUuidSize ? kNvmlNameSize : kNvmlUuidSize] = {};
      if (get_uuid_(device, text, kNvmlUuidSize) == 0) sample.uuid = text;
      std::memset(text, 0, sizeof(text));
      if (get_name_(device, text, kNvmlNameSize) == 0) sample.name = text;
      // Optional readings: a board that lacks the sensor answers NOT_SUPPORTED.
      unsigned int value = 0;
      if (get_temperature_(device, kNvmlTemperatureGpu, &value) == 0) {
        sample.temperature_celsius = value;
      }
      if (get_power_(device, &value) == 0) sample.power_watts = value / 1000.0;  // milliwatts
      samples.push_back(std::move(sample));
    }
    return samples;
  }

 private:
  explicit NvmlMonitor(void* handle) : handle_(handle) {}

  template <typename F>
  bool Symbol(const char* name, F& out) {
    out = reinterpret_cast<F>(dlsym(handle_, name));
    return out != nullptr;
  }

  bool Resolve() {
    return Symbol("nvmlInit_v2", init_) && Symbol("nvmlShutdown", shutdown_) &&
           Symbol("nvmlErrorString", error_string_) &&
           Symbol("nvmlDeviceGetCount_v2", get_count_) &&
           Symbol("nvmlDeviceGetHandleByIndex_v2", get_handle_) &&
           Symbol("nvmlDeviceGetUtilizationRates", get_utilization_) &&
           Symbol("nvmlDeviceGetMemoryInfo", get_memory_) &&
           Symbol("nvmlDeviceGetUUID", get_uuid_) && Symbol("nvmlDeviceGetName", get_name_) &&
           Symbol("nvmlDeviceGetTemperature", get_temperature_) &&
           Symbol("nvmlDeviceGetPowerUsage", get_power_);
  }

  std::string Error(NvmlReturn r) const {
    const char* text = error_string_(r);
    return absl::StrCat(text != nullptr ? text : "unknown error", " (", r, ")");
  }

  // A GPU that stops answering is worth one line, not one per scrape.
  void Warn(int index, absl::string_view message) {
    if (!warned_.insert(index).second) return;
    LogWarning(index < 0 ? std::string("NVML") : absl::StrCat("GPU ", index), ": ", message,
               "; left out of the GPU metrics");
  }

  void* const handle_;
  bool initialised_ = false;
  std::set<int> warned_;
  NvmlReturn (*init_)() = nullptr;
  NvmlReturn (*shutdown_)() = nullptr;
  const char* (*error_string_)(NvmlReturn) = nullptr;
  NvmlReturn (*get_count_)(unsigned int*) = nullptr;
  NvmlReturn (*get_handle_)(unsigned int, NvmlDevice*) = nullptr;
  NvmlReturn (*get_utilization_)(NvmlDevice, NvmlUtilization*) = nullptr;
  NvmlReturn (*get_memory_)(NvmlDevice, NvmlMemory*) = nullptr;
  NvmlReturn (*get_uuid_)(NvmlDevice, char*, unsigned int) = nullptr;
  NvmlReturn (*get_name_)(NvmlDevice, char*, unsigned int) = nullptr;
  NvmlReturn (*get_temperature_)(NvmlDevice, int, unsigned int*) = nullptr;
  NvmlReturn (*get_power_)(NvmlDevice, unsigned int*) = nullptr;
};

}  // namespace

absl::StatusOr<std::unique_ptr<GpuMonitor>> LoadNvml(const std::string& library) {
  return NvmlMonitor::Load(library);
}

int DiscoverGpus(GpuMonitor* nvml, const std::string& dev, std::string* how) {
  if (nvml != nullptr) {
    absl::StatusOr<int> count = nvml->Count();
    if (count.ok()) {
      *how = "NVML";
      return *count;
    }
    *how = absl::StrCat("the ", dev, "/nvidia[0-9]* files (", count.status().message(), ")");
  } else {
    *how = absl::StrCat("the ", dev, "/nvidia[0-9]* files (no NVML)");
  }
  return DetectGpuCount(dev);
}

}  // namespace trainyard
