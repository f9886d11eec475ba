// A stand-in for libnvidia-ml.so.1 with the entry points the agent resolves, scripted at every
// call by settings: read from the file named by FAKE_NVML_FILE (NAME=VALUE lines, replaced whole
// by a test while the agent runs), else from the environment.
//   FAKE_NVML_INIT_ERROR  nvmlInit's return code
//   FAKE_NVML_GPUS        how many
//   FAKE_NVML_LOST_GPU    an index whose readings fail with GPU_IS_LOST
//   FAKE_NVML_NO_POWER    power reading not supported
// GPU i reads utilisation 10(i+1) %, (i+1) GiB of memory with i x 256 MiB used, 40+i degrees and
// 100+i W. Its health is clean (no ECC errors, no retired pages or row remaps, PCIe gen 5 x16 of
// gen 5 x16, no clocks event reason) but where a fault is set, each a list "INDEX[=VALUE],...":
//   FAKE_NVML_ECC             i=N: N uncorrectable (volatile) ECC errors
//   FAKE_NVML_NO_ECC          i: ECC not supported (a board without it)
//   FAKE_NVML_RETIRED_PENDING i: pages pending retirement
//   FAKE_NVML_REMAP_FAILED    i: a row remapping failed
//   FAKE_NVML_REMAP_PENDING   i: a row remapping pending
//   FAKE_NVML_LINK_WIDTH      i=W: the link at xW (of x16)
//   FAKE_NVML_LINK_GEN        i=G: the link at gen G (of 5)
//   FAKE_NVML_CLOCKS          i=MASK: clocks event reasons (decimal or 0x...)
//   FAKE_NVML_NO_XID_EVENTS   i: nvmlDeviceRegisterEvents answers NOT_SUPPORTED
//   FAKE_NVML_XID_FILE        a file of "GPU XID" lines: each event set delivers each line once,
//                             in order, as an nvmlEventTypeXidCriticalError of that GPU
// Built twice: as fake_nvml, and with FAKE_NVML_OLD_DRIVER as fake_nvml_old, a driver without
// any of the health or event entry points.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr int kSuccess = 0;
constexpr int kInvalidArgument = 2;
constexpr int kNotSupported = 3;
constexpr int kTimeout = 10;
constexpr int kGpuIsLost = 15;

struct Utilization {
  unsigned int gpu;
  unsigned int memory;
};
struct Memory {
  unsigned long long total;  // NOLINT(runtime/int)
  unsigned long long free;   // NOLINT(runtime/int)
  unsigned long long used;   // NOLINT(runtime/int)
};

// The setting `name`: the file's line for it, else the environment's; empty when neither has it.
std::string Setting(const char* name) {
  if (const char* file = std::getenv("FAKE_NVML_FILE"); file != nullptr) {
    std::ifstream in(file);
    std::string line;
    const std::string prefix = std::string(name) + "=";
    while (std::getline(in, line)) {
      if (line.compare(0, prefix.size(), prefix) == 0) return line.substr(prefix.size());
    }
  }
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}
long long Number(const std::string& text) {  // NOLINT(runtime/int)
  return std::strtoll(text.c_str(), nullptr, 0);
}
int Env(const char* name, int otherwise) {
  const std::string v = Setting(name);
  return v.empty() ? otherwise : static_cast<int>(Number(v));
}
// GPU `index`'s entry in the list `name`: true, with `value` set (1 when the entry has none),
// when listed.
[[maybe_unused]] bool Listed(const char* name, long index,
                             long long* value = nullptr) {  // NOLINT(runtime/int)
  std::stringstream list(Setting(name));
  std::string entry;
  while (std::getline(list, entry, ',')) {
    const size_t eq = entry.find('=');
    if (entry.empty() || Number(entry.substr(0, eq)) != index) continue;
    if (value != nullptr) *value = eq == std::string::npos ? 1 : Number(entry.substr(eq + 1));
    return true;
  }
  return false;
}
// A device handle is its index plus one, so that none is null.
long Index(void* device) { return reinterpret_cast<long>(device) - 1; }  // NOLINT(runtime/int)
bool Lost(void* device) { return Index(device) == Env("FAKE_NVML_LOST_GPU", -1); }

#ifndef FAKE_NVML_OLD_DRIVER
struct EventData {
  void* device;
  unsigned long long type;  // NOLINT(runtime/int)
  unsigned long long data;  // NOLINT(runtime/int)
  unsigned int gpu_instance;
  unsigned int compute_instance;
};
struct EventSet {
  std::vector<bool> registered = std::vector<bool>(64, false);
  size_t delivered = 0;  // lines of the XID file
};
#endif

}  // namespace

extern "C" {

int nvmlInit_v2() { return Env("FAKE_NVML_INIT_ERROR", kSuccess); }
int nvmlShutdown() { return kSuccess; }
const char* nvmlErrorString(int r) {
  switch (r) {
    case kSuccess:
      return "Success";
    case 9:
      return "Driver Not Loaded";
    case kGpuIsLost:
      return "GPU is lost";
    case kNotSupported:
      return "Not Supported";
    case kTimeout:
      return "Timeout";
    default:
      return "Unknown Error";
  }
}
int nvmlDeviceGetCount_v2(unsigned int* count) {
  *count = static_cast<unsigned int>(Env("FAKE_NVML_GPUS", 0));
  return kSuccess;
}
int nvmlDeviceGetHandleByIndex_v2(unsigned int index, void** device) {
  if (static_cast<int>(index) >= Env("FAKE_NVML_GPUS", 0)) return kInvalidArgument;
  *device = reinterpret_cast<void*>(static_cast<long>(index) + 1);  // NOLINT(runtime/int)
  return kSuccess;
}
int nvmlDeviceGetUtilizationRates(void* device, Utilization* u) {
  if (Lost(device)) return kGpuIsLost;
  u->gpu = static_cast<unsigned int>(10 * (Index(device) + 1));
  u->memory = 0;
  return kSuccess;
}
int nvmlDeviceGetMemoryInfo(void* device, Memory* m) {
  if (Lost(device)) return kGpuIsLost;
  m->total = static_cast<unsigned long long>(Index(device) + 1) << 30;  // NOLINT(runtime/int)
  m->used = static_cast<unsigned long long>(Index(device)) << 28;       // NOLINT(runtime/int)
  m->free = m->total - m->used;
  return kSuccess;
}
int nvmlDeviceGetUUID(void* device, char* uuid, unsigned int length) {
  std::snprintf(uuid, length, "GPU-fake-%ld", Index(device));
  return kSuccess;
}
int nvmlDeviceGetName(void* device, char* name, unsigned int length) {
  std::snprintf(name, length, "Fake GPU 80GB");
  return kSuccess;
}
int nvmlDeviceGetTemperature(void* device, int sensor, unsigned int* celsius) {
  if (sensor != 0) return kInvalidArgument;
  *celsius = static_cast<unsigned int>(40 + Index(device));
  return kSuccess;
}
int nvmlDeviceGetPowerUsage(void* device, unsigned int* milliwatts) {
  if (Env("FAKE_NVML_NO_POWER", 0) != 0) return kNotSupported;
  *milliwatts = static_cast<unsigned int>(100000 + 1000 * Index(device));
  return kSuccess;
}

#ifndef FAKE_NVML_OLD_DRIVER

int nvmlDeviceGetTotalEccErrors(void* device, int error_type, int counter_type,
                                unsigned long long* count) {  // NOLINT(runtime/int)
  if (Lost(device)) return kGpuIsLost;
  // Only what the agent asks for: uncorrected (1), volatile (0).
  if (error_type != 1 || counter_type != 0) return kInvalidArgument;
  if (Listed("FAKE_NVML_NO_ECC", Index(device))) return kNotSupported;
  long long n = 0;  // NOLINT(runtime/int)
  Listed("FAKE_NVML_ECC", Index(device), &n);
  *count = static_cast<unsigned long long>(n);  // NOLINT(runtime/int)
  return kSuccess;
}
int nvmlDeviceGetRetiredPagesPendingStatus(void* device, int* pending) {
  if (Lost(device)) return kGpuIsLost;
  *pending = Listed("FAKE_NVML_RETIRED_PENDING", Index(device)) ? 1 : 0;
  return kSuccess;
}
int nvmlDeviceGetRemappedRows(void* device, unsigned int* corrected, unsigned int* uncorrected,
                              unsigned int* pending, unsigned int* failed) {
  if (Lost(device)) return kGpuIsLost;
  *corrected = 0;
  *uncorrected = 0;
  *pending = Listed("FAKE_NVML_REMAP_PENDING", Index(device)) ? 1 : 0;
  *failed = Listed("FAKE_NVML_REMAP_FAILED", Index(device)) ? 1 : 0;
  return kSuccess;
}
int nvmlDeviceGetCurrPcieLinkWidth(void* device, unsigned int* width) {
  if (Lost(device)) return kGpuIsLost;
  long long w = 16;  // NOLINT(runtime/int)
  Listed("FAKE_NVML_LINK_WIDTH", Index(device), &w);
  *width = static_cast<unsigned int>(w);
  return kSuccess;
}
int nvmlDeviceGetMaxPcieLinkWidth(void* device, unsigned int* width) {
  if (Lost(device)) return kGpuIsLost;
  *width = 16;
  return kSuccess;
}
int nvmlDeviceGetCurrPcieLinkGeneration(void* device, unsigned int* generation) {
  if (Lost(device)) return kGpuIsLost;
  long long g = 5;  // NOLINT(runtime/int)
  Listed("FAKE_NVML_LINK_GEN", Index(device), &g);
  *generation = static_cast<unsigned int>(g);
  return kSuccess;
}
int nvmlDeviceGetMaxPcieLinkGeneration(void* device, unsigned int* generation) {
  if (Lost(device)) return kGpuIsLost;
  *generation = 5;
  return kSuccess;
}
int nvmlDeviceGetCurrentClocksEventReasons(void* device,
                                           unsigned long long* reasons) {  // NOLINT(runtime/int)
  if (Lost(device)) return kGpuIsLost;
  long long mask = 0;  // NOLINT(runtime/int)
  Listed("FAKE_NVML_CLOCKS", Index(device), &mask);
  *reasons = static_cast<unsigned long long>(mask);  // NOLINT(runtime/int)
  return kSuccess;
}

int nvmlEventSetCreate(void** set) {
  *set = new EventSet();
  return kSuccess;
}
int nvmlDeviceRegisterEvents(void* device, unsigned long long types,  // NOLINT(runtime/int)
                             void* set) {
  if (types != 0x8) return kInvalidArgument;  // nvmlEventTypeXidCriticalError alone
  if (Listed("FAKE_NVML_NO_XID_EVENTS", Index(device))) return kNotSupported;
  static_cast<EventSet*>(set)->registered.at(static_cast<size_t>(Index(device))) = true;
  return kSuccess;
}
int nvmlEventSetWait_v2(void* set, EventData* data, unsigned int timeout_ms) {
  auto* events = static_cast<EventSet*>(set);
  std::vector<std::pair<long, long long>> lines;  // NOLINT(runtime/int)
  const std::string path = Setting("FAKE_NVML_XID_FILE");
  std::ifstream in(path);
  long gpu = 0;       // NOLINT(runtime/int)
  long long xid = 0;  // NOLINT(runtime/int)
  while (!path.empty() && in >> gpu >> xid) lines.emplace_back(gpu, xid);
  while (events->delivered < lines.size()) {
    const auto [g, x] = lines[events->delivered++];
    if (!events->registered.at(static_cast<size_t>(g))) continue;
    std::memset(data, 0, sizeof(*data));
    data->device = reinterpret_cast<void*>(g + 1);
    data->type = 0x8;
    data->data = static_cast<unsigned long long>(x);  // NOLINT(runtime/int)
    data->gpu_instance = 0xFFFFFFFF;
    data->compute_instance = 0xFFFFFFFF;
    return kSuccess;
  }
  // Nothing yet: a short wait, as NVML's own until its timeout.
  std::this_thread::sleep_for(std::chrono::milliseconds(std::min(timeout_ms, 5u)));
  return kTimeout;
}
int nvmlEventSetFree(void* set) {
  delete static_cast<EventSet*>(set);
  return kSuccess;
}

#endif  // FAKE_NVML_OLD_DRIVER

}  // extern "C"
