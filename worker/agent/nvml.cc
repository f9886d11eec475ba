#include "worker/agent/nvml.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/log.h"
#include "worker/agent/subprocess.h"

namespace trainyard {

absl::StatusOr<GpuHealthReading> GpuMonitor::ReadHealth(int) {
  return absl::UnimplementedError("this GPU monitor reads no health");
}

absl::StatusOr<std::unique_ptr<XidWatch>> GpuMonitor::WatchXids() {
  return absl::UnimplementedError("this GPU monitor has no XID events");
}

namespace {

// NVML's C ABI, declared here so that no NVIDIA header is needed to build (nvml.h: these have
// kept their layout since the _v2 entry points of 2013).
using NvmlReturn = int;  // nvmlReturn_t
using NvmlDevice = void*;
using NvmlEventSet = void*;
using ULL = unsigned long long;  // NOLINT(runtime/int): NVML's own type
struct NvmlUtilization {
  unsigned int gpu;
  unsigned int memory;
};
struct NvmlMemory {
  ULL total;
  ULL free;
  ULL used;
};
// nvmlEventData_t as nvmlEventSetWait_v2 fills it (R470 on). The older nvmlEventSetWait fills
// the first three fields only, so one struct serves both.
struct NvmlEventData {
  NvmlDevice device;
  ULL event_type;
  ULL event_data;  // the XID of an nvmlEventTypeXidCriticalError (999: one NVML cannot name)
  unsigned int gpu_instance_id;
  unsigned int compute_instance_id;
};
constexpr NvmlReturn kNvmlSuccess = 0;               // NVML_SUCCESS
constexpr NvmlReturn kNvmlNotSupported = 3;          // NVML_ERROR_NOT_SUPPORTED
constexpr NvmlReturn kNvmlTimeout = 10;              // NVML_ERROR_TIMEOUT
constexpr NvmlReturn kNvmlGpuIsLost = 15;            // NVML_ERROR_GPU_IS_LOST
constexpr int kNvmlTemperatureGpu = 0;               // NVML_TEMPERATURE_GPU
constexpr int kNvmlMemoryErrorUncorrected = 1;       // NVML_MEMORY_ERROR_TYPE_UNCORRECTED
constexpr int kNvmlVolatileEcc = 0;                  // NVML_VOLATILE_ECC: since the driver loaded
constexpr int kNvmlFeatureEnabled = 1;               // NVML_FEATURE_ENABLED (nvmlEnableState_t)
constexpr ULL kNvmlEventTypeXidCriticalError = 0x8;  // nvmlEventTypeXidCriticalError
constexpr unsigned int kNvmlNameSize = 96;           // NVML_DEVICE_NAME_V2_BUFFER_SIZE
constexpr unsigned int kNvmlUuidSize = 96;           // NVML_DEVICE_UUID_V2_BUFFER_SIZE

// The entry points, resolved once. The health and event ones are optional (null when the driver
// lacks them: nvmlDeviceGetRemappedRows came with R450, nvmlEventSetWait_v2 with R470,
// nvmlDeviceGetCurrentClocksEventReasons with R535, which deprecated the ...ThrottleReasons name).
struct NvmlCalls {
  NvmlReturn (*init)() = nullptr;
  NvmlReturn (*shutdown)() = nullptr;
  const char* (*error_string)(NvmlReturn) = nullptr;
  NvmlReturn (*get_count)(unsigned int*) = nullptr;
  NvmlReturn (*get_handle)(unsigned int, NvmlDevice*) = nullptr;
  NvmlReturn (*get_utilization)(NvmlDevice, NvmlUtilization*) = nullptr;
  NvmlReturn (*get_memory)(NvmlDevice, NvmlMemory*) = nullptr;
  NvmlReturn (*get_uuid)(NvmlDevice, char*, unsigned int) = nullptr;
  NvmlReturn (*get_name)(NvmlDevice, char*, unsigned int) = nullptr;
  NvmlReturn (*get_temperature)(NvmlDevice, int, unsigned int*) = nullptr;
  NvmlReturn (*get_power)(NvmlDevice, unsigned int*) = nullptr;
  // Optional.
  NvmlReturn (*get_total_ecc)(NvmlDevice, int, int, ULL*) = nullptr;
  NvmlReturn (*get_retired_pending)(NvmlDevice, int*) = nullptr;
  NvmlReturn (*get_remapped_rows)(NvmlDevice, unsigned int*, unsigned int*, unsigned int*,
                                  unsigned int*) = nullptr;
  NvmlReturn (*get_link_width)(NvmlDevice, unsigned int*) = nullptr;
  NvmlReturn (*get_max_link_width)(NvmlDevice, unsigned int*) = nullptr;
  NvmlReturn (*get_link_generation)(NvmlDevice, unsigned int*) = nullptr;
  NvmlReturn (*get_max_link_generation)(NvmlDevice, unsigned int*) = nullptr;
  NvmlReturn (*get_clocks_event_reasons)(NvmlDevice, ULL*) = nullptr;
  NvmlReturn (*event_set_create)(NvmlEventSet*) = nullptr;
  NvmlReturn (*register_events)(NvmlDevice, ULL, NvmlEventSet) = nullptr;
  NvmlReturn (*event_set_wait)(NvmlEventSet, NvmlEventData*, unsigned int) = nullptr;
  NvmlReturn (*event_set_free)(NvmlEventSet) = nullptr;

  std::string Error(NvmlReturn r) const {
    const char* text = error_string(r);
    return absl::StrCat(text != nullptr ? text : "unknown error", " (", r, ")");
  }
};

class NvmlXidWatch final : public XidWatch {
 public:
  NvmlXidWatch(const NvmlCalls& nvml, NvmlEventSet set, std::vector<NvmlDevice> devices)
      : nvml_(nvml), set_(set), devices_(std::move(devices)) {}
  ~NvmlXidWatch() override { nvml_.event_set_free(set_); }

  absl::StatusOr<std::optional<XidEvent>> Wait(absl::Duration timeout) override {
    NvmlEventData data = {};
    const auto ms = static_cast<unsigned int>(
        std::max<int64_t>(0, std::min<int64_t>(absl::ToInt64Milliseconds(timeout), 1 << 30)));
    const NvmlReturn r = nvml_.event_set_wait(set_, &data, ms);
    if (r == kNvmlTimeout) return std::optional<XidEvent>();
    if (r != kNvmlSuccess) {
      return absl::UnavailableError(absl::StrCat("nvmlEventSetWait: ", nvml_.Error(r)));
    }
    if ((data.event_type & kNvmlEventTypeXidCriticalError) == 0) {
      return std::optional<XidEvent>();  // not asked for
    }
    for (size_t i = 0; i < devices_.size(); ++i) {
      if (devices_[i] == data.device) {
        return std::optional<XidEvent>(XidEvent{static_cast<int>(i), data.event_data});
      }
    }
    return absl::UnavailableError(
        absl::StrCat("XID ", data.event_data, " on a GPU NVML did not list"));
  }

 private:
  const NvmlCalls& nvml_;
  const NvmlEventSet set_;
  const std::vector<NvmlDevice> devices_;  // by index; null for GPUs without the event
};

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
    if (const NvmlReturn r = monitor->nvml_.init(); r != 0) {
      return absl::UnavailableError(absl::StrCat("nvmlInit failed: ", monitor->nvml_.Error(r)));
    }
    monitor->initialised_ = true;
    return std::unique_ptr<GpuMonitor>(std::move(monitor));
  }

  ~NvmlMonitor() override {
    if (initialised_) nvml_.shutdown();
    dlclose(handle_);
  }

  absl::StatusOr<int> Count() override {
    unsigned int count = 0;
    if (const NvmlReturn r = nvml_.get_count(&count); r != 0) {
      return absl::UnavailableError(absl::StrCat("nvmlDeviceGetCount failed: ", nvml_.Error(r)));
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
      if (const NvmlReturn r = nvml_.get_handle(static_cast<unsigned int>(i), &device); r != 0) {
        Warn(i, absl::StrCat("nvmlDeviceGetHandleByIndex: ", nvml_.Error(r)));
        continue;
      }
      GpuSample sample;
      sample.index = i;
      NvmlUtilization utilization = {};
      NvmlMemory memory = {};
      if (const NvmlReturn r = nvml_.get_utilization(device, &utilization); r != 0) {
        Warn(i, absl::StrCat("nvmlDeviceGetUtilizationRates: ", nvml_.Error(r)));
        continue;
      }
      if (const NvmlReturn r = nvml_.get_memory(device, &memory); r != 0) {
        Warn(i, absl::StrCat("nvmlDeviceGetMemoryInfo: ", nvml_.Error(r)));
        continue;
      }
      sample.utilization_ratio = utilization.gpu / 100.0;
      sample.memory_used_bytes = static_cast<int64_t>(memory.used);
      sample.memory_total_bytes = static_cast<int64_t>(memory.total);
      char text[kNvmlNameSize > kNvmlUuidSize ? kNvmlNameSize : kNvmlUuidSize] = {};
      if (nvml_.get_uuid(device, text, kNvmlUuidSize) == 0) sample.uuid = text;
      std::memset(text, 0, sizeof(text));
      if (nvml_.get_name(device, text, kNvmlNameSize) == 0) sample.name = text;
      // Optional readings: a board that lacks the sensor answers NOT_SUPPORTED.
      unsigned int value = 0;
      if (nvml_.get_temperature(device, kNvmlTemperatureGpu, &value) == 0) {
        sample.temperature_celsius = value;
      }
      if (nvml_.get_power(device, &value) == 0) sample.power_watts = value / 1000.0;  // mW
      samples.push_back(std::move(sample));
    }
    return samples;
  }

  absl::StatusOr<GpuHealthReading> ReadHealth(int index) override;
  absl::StatusOr<std::unique_ptr<XidWatch>> WatchXids() override;

 private:
  explicit NvmlMonitor(void* handle) : handle_(handle) {}

  template <typename F>
  bool Symbol(const char* name, F& out) {
    out = reinterpret_cast<F>(dlsym(handle_, name));
    return out != nullptr;
  }

  bool Resolve() {
    NvmlCalls& n = nvml_;
    const bool required =
        Symbol("nvmlInit_v2", n.init) && Symbol("nvmlShutdown", n.shutdown) &&
        Symbol("nvmlErrorString", n.error_string) && Symbol("nvmlDeviceGetCount_v2", n.get_count) &&
        Symbol("nvmlDeviceGetHandleByIndex_v2", n.get_handle) &&
        Symbol("nvmlDeviceGetUtilizationRates", n.get_utilization) &&
        Symbol("nvmlDeviceGetMemoryInfo", n.get_memory) &&
        Symbol("nvmlDeviceGetUUID", n.get_uuid) && Symbol("nvmlDeviceGetName", n.get_name) &&
        Symbol("nvmlDeviceGetTemperature", n.get_temperature) &&
        Symbol("nvmlDeviceGetPowerUsage", n.get_power);
    if (!required) return false;
    Symbol("nvmlDeviceGetTotalEccErrors", n.get_total_ecc);
    Symbol("nvmlDeviceGetRetiredPagesPendingStatus", n.get_retired_pending);
    Symbol("nvmlDeviceGetRemappedRows", n.get_remapped_rows);
    Symbol("nvmlDeviceGetCurrPcieLinkWidth", n.get_link_width);
    Symbol("nvmlDeviceGetMaxPcieLinkWidth", n.get_max_link_width);
    Symbol("nvmlDeviceGetCurrPcieLinkGeneration", n.get_link_generation);
    Symbol("nvmlDeviceGetMaxPcieLinkGeneration", n.get_max_link_generation);
    if (!Symbol("nvmlDeviceGetCurrentClocksEventReasons", n.get_clocks_event_reasons)) {
      Symbol("nvmlDeviceGetCurrentClocksThrottleReasons", n.get_clocks_event_reasons);
    }
    Symbol("nvmlEventSetCreate", n.event_set_create);
    Symbol("nvmlDeviceRegisterEvents", n.register_events);
    if (!Symbol("nvmlEventSetWait_v2", n.event_set_wait)) {
      Symbol("nvmlEventSetWait", n.event_set_wait);
    }
    Symbol("nvmlEventSetFree", n.event_set_free);
    return true;
  }

  // A GPU that stops answering is worth one line, not one per scrape.
  void Warn(int index, absl::string_view message) {
    {
      absl::MutexLock lock(&mu_);
      if (!warned_.insert(index).second) return;
    }
    LogWarning(index < 0 ? std::string("NVML") : absl::StrCat("GPU ", index), ": ", message,
               "; left out of the GPU metrics");
  }

  void* const handle_;
  NvmlCalls nvml_;  // resolved before nvmlInit, fixed after
  bool initialised_ = false;
  absl::Mutex mu_;
  std::set<int> warned_ ABSL_GUARDED_BY(mu_);
};

// One optional reading: true with `out` set when it answered, false when the GPU or driver does
// not support it (or the driver lacks the call); a lost GPU or another failure is recorded.
template <typename F, typename... Args>
bool Read(const NvmlCalls& nvml, F call, const char* what, GpuHealthReading& reading,
          NvmlReturn& lost, Args... args) {
  if (call == nullptr) return false;
  const NvmlReturn r = call(args...);
  if (r == kNvmlSuccess) return true;
  if (r == kNvmlGpuIsLost) {
    lost = r;
  } else if (r != kNvmlNotSupported) {
    reading.unreadable.push_back(absl::StrCat(what, ": ", nvml.Error(r)));
  }
  return false;
}

absl::StatusOr<GpuHealthReading> NvmlMonitor::ReadHealth(int index) {
  NvmlDevice device = nullptr;
  if (const NvmlReturn r = nvml_.get_handle(static_cast<unsigned int>(index), &device); r != 0) {
    return absl::UnavailableError(
        absl::StrCat("NVML cannot reach it (nvmlDeviceGetHandleByIndex: ", nvml_.Error(r), ")"));
  }
  GpuHealthReading reading;
  reading.index = index;
  NvmlReturn lost = kNvmlSuccess;
  ULL ecc = 0;
  if (Read(nvml_, nvml_.get_total_ecc, "ECC errors", reading, lost, device,
           kNvmlMemoryErrorUncorrected, kNvmlVolatileEcc, &ecc)) {
    reading.uncorrectable_ecc_errors = ecc;
  }
  int pending = 0;
  if (Read(nvml_, nvml_.get_retired_pending, "retired pages", reading, lost, device, &pending)) {
    reading.retired_pages_pending = pending == kNvmlFeatureEnabled;
  }
  unsigned int corrected = 0, uncorrected = 0, remap_pending = 0, remap_failed = 0;
  if (Read(nvml_, nvml_.get_remapped_rows, "remapped rows", reading, lost, device, &corrected,
           &uncorrected, &remap_pending, &remap_failed)) {
    reading.row_remap_pending = remap_pending != 0;
    reading.row_remap_failed = remap_failed != 0;
  }
  unsigned int value = 0;
  if (Read(nvml_, nvml_.get_link_width, "PCIe link width", reading, lost, device, &value)) {
    reading.pcie_link_width = static_cast<int>(value);
  }
  if (Read(nvml_, nvml_.get_max_link_width, "PCIe link width", reading, lost, device, &value)) {
    reading.pcie_max_link_width = static_cast<int>(value);
  }
  if (Read(nvml_, nvml_.get_link_generation, "PCIe generation", reading, lost, device, &value)) {
    reading.pcie_link_generation = static_cast<int>(value);
  }
  if (Read(nvml_, nvml_.get_max_link_generation, "PCIe generation", reading, lost, device,
           &value)) {
    reading.pcie_max_link_generation = static_cast<int>(value);
  }
  ULL reasons = 0;
  if (Read(nvml_, nvml_.get_clocks_event_reasons, "clocks event reasons", reading, lost, device,
           &reasons)) {
    reading.clocks_event_reasons = reasons;
  }
  if (lost != kNvmlSuccess) {
    return absl::UnavailableError(absl::StrCat("NVML cannot reach it: ", nvml_.Error(lost)));
  }
  return reading;
}

absl::StatusOr<std::unique_ptr<XidWatch>> NvmlMonitor::WatchXids() {
  if (nvml_.event_set_create == nullptr || nvml_.register_events == nullptr ||
      nvml_.event_set_wait == nullptr || nvml_.event_set_free == nullptr) {
    return absl::UnimplementedError("this NVML has no event sets");
  }
  absl::StatusOr<int> count = Count();
  if (!count.ok()) return count.status();
  NvmlEventSet set = nullptr;
  if (const NvmlReturn r = nvml_.event_set_create(&set); r != kNvmlSuccess) {
    return absl::UnavailableError(absl::StrCat("nvmlEventSetCreate: ", nvml_.Error(r)));
  }
  std::vector<NvmlDevice> devices(*count, nullptr);
  int registered = 0;
  for (int i = 0; i < *count; ++i) {
    NvmlDevice device = nullptr;
    if (nvml_.get_handle(static_cast<unsigned int>(i), &device) != kNvmlSuccess) continue;
    const NvmlReturn r = nvml_.register_events(device, kNvmlEventTypeXidCriticalError, set);
    if (r != kNvmlSuccess) {
      LogWarning("GPU ", i, ": no XID events (nvmlDeviceRegisterEvents: ", nvml_.Error(r), ")");
      continue;
    }
    devices[i] = device;
    ++registered;
  }
  if (registered == 0) {
    nvml_.event_set_free(set);
    return absl::UnimplementedError("no GPU reports XID events");
  }
  return std::unique_ptr<XidWatch>(new NvmlXidWatch(nvml_, set, std::move(devices)));
}

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
