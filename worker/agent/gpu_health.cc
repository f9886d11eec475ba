#include "worker/agent/gpu_health.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace trainyard {
namespace {

struct ClocksReason {
  uint64_t bit;
  const char* name;
};
constexpr ClocksReason kClocksReasons[] = {
    {kClocksHwSlowdown, "HW slowdown"},
    {kClocksHwThermalSlowdown, "HW thermal slowdown"},
    {kClocksHwPowerBrakeSlowdown, "HW power brake"},
    {kClocksSwPowerCap, "SW power cap"},
    {kClocksSwThermalSlowdown, "SW thermal slowdown"},
    {kClocksApplicationsClocksSetting, "applications clocks setting"},
    {kClocksSyncBoost, "sync boost"},
    {kClocksDisplayClockSetting, "display clock setting"},
};

// The names of the reasons of `mask` among `of`.
std::string ClocksReasonNames(uint64_t mask, uint64_t of) {
  std::vector<std::string> names;
  for (const ClocksReason& r : kClocksReasons) {
    if ((mask & of & r.bit) != 0) names.push_back(r.name);
  }
  return absl::StrJoin(names, ", ");
}

}  // namespace

std::string GpuVerdict::Reason() const { return absl::StrJoin(faults, "; "); }

GpuVerdict EvaluateGpuHealth(const GpuHealthReading& r) {
  GpuVerdict v;
  // Errors the hardware could not correct corrupt what the GPU computes or stores: any since the
  // driver loaded (a reset clears the count) is one too many.
  if (r.uncorrectable_ecc_errors.value_or(0) > 0) {
    v.faults.push_back(absl::StrCat(*r.uncorrectable_ecc_errors,
                                    " uncorrectable ECC errors since the driver loaded"));
  }
  if (r.retired_pages_pending.value_or(false)) {
    v.faults.push_back("memory pages are pending retirement (a GPU reset retires them)");
  }
  if (r.row_remap_failed.value_or(false)) v.faults.push_back("a memory row remapping failed");
  if (r.row_remap_pending.value_or(false)) {
    v.faults.push_back("a memory row remapping is pending (a GPU reset applies it)");
  }
  // The width does not change with load: fewer lanes than the GPU and its slot allow is a bad
  // contact or riser. The generation does: an idle GPU lowers it to save power.
  if (r.pcie_link_width.has_value() && r.pcie_max_link_width.has_value() &&
      *r.pcie_link_width < *r.pcie_max_link_width) {
    v.faults.push_back(
        absl::StrCat("PCIe link at x", *r.pcie_link_width, " of x", *r.pcie_max_link_width));
  }
  if (r.pcie_link_generation.has_value() && r.pcie_max_link_generation.has_value() &&
      *r.pcie_link_generation < *r.pcie_max_link_generation) {
    v.notes.push_back(absl::StrCat("PCIe gen ", *r.pcie_link_generation, " of ",
                                   *r.pcie_max_link_generation,
                                   " (an idle GPU lowers it to save power)"));
  }
  if (r.clocks_event_reasons.has_value()) {
    const uint64_t mask = *r.clocks_event_reasons;
    if ((mask & kClocksHardwareReasons) != 0) {
      v.faults.push_back(absl::StrCat("clocks held down by the hardware (",
                                      ClocksReasonNames(mask, kClocksHardwareReasons), ")"));
    }
    const std::string software = ClocksReasonNames(mask, ~kClocksHardwareReasons);
    if (!software.empty()) v.notes.push_back(absl::StrCat("clocks held down by ", software));
  }
  for (const std::string& what : r.unreadable) v.notes.push_back(absl::StrCat("no ", what));
  return v;
}

XidClass ClassifyXid(uint64_t xid) {
  switch (xid) {
    // The hardware, its memory, its links or its firmware: NVIDIA's catalog resolves these by
    // resetting the GPU or the machine (or servicing the board), not by restarting the program.
    case 48:
      return {XidKind::kHardware, "a double-bit ECC error"};
    case 57:
      return {XidKind::kHardware, "an error programming the video memory interface"};
    case 58:
      return {XidKind::kHardware, "an unstable video memory interface"};
    case 62:
      return {XidKind::kHardware, "an internal micro-controller halted"};
    case 63:
      return {XidKind::kHardware, "an ECC page retirement or row remapping awaits a reset"};
    case 64:
      return {XidKind::kHardware, "an ECC page retirement or row remapping failed"};
    case 74:
      return {XidKind::kHardware, "an NVLink error"};
    case 79:
      return {XidKind::kHardware, "the GPU fell off the bus"};
    case 92:
      return {XidKind::kHardware, "a high single-bit ECC error rate"};
    case 94:
      return {XidKind::kHardware, "a contained ECC error"};
    case 95:
      return {XidKind::kHardware, "an uncontained ECC error"};
    case 119:
      return {XidKind::kHardware, "a GSP firmware RPC timed out"};
    case 120:
      return {XidKind::kHardware, "a GSP firmware error"};
    case 121:
      return {XidKind::kHardware, "a C2C link error"};
    case 140:
      return {XidKind::kHardware, "an unrecovered ECC error"};
    case 144:
    case 145:
    case 146:
    case 147:
    case 148:
    case 149:
    case 150:
      return {XidKind::kHardware, "an NVLink error"};
    case 154:
      return {XidKind::kHardware, "the driver asks for a GPU reset or a reboot"};
    // Usually the program's own doing: NVIDIA's catalog resolves these by restarting it.
    case 8:
      return {XidKind::kApplication, "the GPU stopped processing (a timeout)"};
    case 13:
      return {XidKind::kApplication, "a graphics engine exception"};
    case 31:
      return {XidKind::kApplication, "a GPU memory page fault"};
    case 43:
      return {XidKind::kApplication, "the GPU stopped processing a context"};
    case 45:
      return {XidKind::kApplication, "a context torn down (its process ended or was killed)"};
    case 68:
      return {XidKind::kApplication, "a video decoder exception"};
    case 69:
      return {XidKind::kApplication, "a graphics engine class error"};
    case 109:
      return {XidKind::kApplication, "a context switch timeout"};
    default:
      return {XidKind::kOther, ""};
  }
}

std::string DescribeXid(uint64_t xid) {
  const XidClass c = ClassifyXid(xid);
  return *c.what == '\0' ? absl::StrCat("XID ", xid) : absl::StrCat("XID ", xid, " (", c.what, ")");
}

const char* XidKindName(XidKind kind) {
  switch (kind) {
    case XidKind::kHardware:
      return "hardware";
    case XidKind::kApplication:
      return "application";
    case XidKind::kOther:
      return "other";
  }
  return "other";
}

GpuHealth::GpuHealth(int gpus, const Clock& clock)
    : size_(static_cast<size_t>(std::max(gpus, 0))), clock_(clock) {
  absl::MutexLock lock(&mu_);
  gpus_.resize(size_);
}

bool GpuHealth::InService(int gpu) const {
  absl::MutexLock lock(&mu_);
  return gpu >= 0 && static_cast<size_t>(gpu) < size_ && gpus_[gpu].in_service;
}

bool GpuHealth::TakeOut(int gpu, const std::string& reason) {
  absl::MutexLock lock(&mu_);
  if (gpu < 0 || static_cast<size_t>(gpu) >= size_ || !gpus_[gpu].in_service) return false;
  gpus_[gpu].in_service = false;
  gpus_[gpu].reason = reason;
  gpus_[gpu].since = clock_.Now();
  return true;
}

void GpuHealth::Renew(int gpu, const std::string& reason) {
  absl::MutexLock lock(&mu_);
  if (gpu < 0 || static_cast<size_t>(gpu) >= size_ || gpus_[gpu].in_service) return;
  gpus_[gpu].reason = reason;
  gpus_[gpu].since = clock_.Now();
}

void GpuHealth::PutBack(int gpu) {
  absl::MutexLock lock(&mu_);
  if (gpu < 0 || static_cast<size_t>(gpu) >= size_) return;
  gpus_[gpu].in_service = true;
  gpus_[gpu].reason.clear();
}

std::vector<v1::GpuFault> GpuHealth::Faults() const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::GpuFault> faults;
  for (size_t i = 0; i < size_; ++i) {
    if (gpus_[i].in_service) continue;
    v1::GpuFault& f = faults.emplace_back();
    f.set_index(static_cast<int32_t>(i));
    f.set_reason(gpus_[i].reason);
    f.set_since_unix_ms(absl::ToUnixMillis(gpus_[i].since));
  }
  return faults;
}

std::string GpuHealth::Reason(int gpu) const {
  absl::MutexLock lock(&mu_);
  if (gpu < 0 || static_cast<size_t>(gpu) >= size_) return "";
  return gpus_[gpu].reason;
}

bool GpuHealth::BeginReturnCheck(int gpu, absl::Duration interval) {
  absl::MutexLock lock(&mu_);
  if (gpu < 0 || static_cast<size_t>(gpu) >= size_ || gpus_[gpu].in_service) return false;
  const absl::Time now = clock_.Now();
  if (now < gpus_[gpu].return_checked + interval) return false;
  gpus_[gpu].return_checked = now;
  return true;
}

void GpuHealth::CountXid(int gpu, uint64_t xid) {
  absl::MutexLock lock(&mu_);
  ++xids_[{gpu, xid}];
}

std::map<std::pair<int, uint64_t>, int64_t> GpuHealth::XidCounts() const {
  absl::MutexLock lock(&mu_);
  return xids_;
}

}  // namespace trainyard
