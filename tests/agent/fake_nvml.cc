// A stand-in for libnvidia-ml.so.1 with the entry points the agent resolves, scripted through
// the environment at every call: FAKE_NVML_INIT_ERROR (nvmlInit's return code), FAKE_NVML_GPUS
// (how many), FAKE_NVML_LOST_GPU (an index whose readings fail with GPU_IS_LOST),
// FAKE_NVML_NO_POWER (power reading not supported). GPU i reads utilisation 10(i+1) %, (i+1) GiB
// of memory with i x 256 MiB used, 40+i degrees and 100+i W.

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

constexpr int kSuccess = 0;
constexpr int kInvalidArgument = 2;
constexpr int kNotSupported = 3;
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

int Env(const char* name, int otherwise) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::atoi(v) : otherwise;
}
// A device handle is its index plus one, so that none is null.
long Index(void* device) { return reinterpret_cast<long>(device) - 1; }  // NOLINT(runtime/int)
bool Lost(void* device) { return Index(device) == Env("FAKE_NVML_LOST_GPU", -1); }

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

}  // extern "C"
