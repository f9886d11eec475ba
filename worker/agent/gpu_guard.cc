#include "worker/agent/gpu_guard.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/log.h"

namespace trainyard {

GpuGuard::GpuGuard(GpuGuardOptions options, GpuHealth& health, const Clock& clock)
    : options_(std::move(options)), health_(health), clock_(clock) {
  absl::MutexLock lock(&mu_);
  ecc_.resize(static_cast<size_t>(std::max(options_.gpus, 0)));
}

GpuGuard::~GpuGuard() { Stop(); }

void GpuGuard::RecordEcc(int gpu, uint64_t count) {
  absl::MutexLock lock(&mu_);
  if (gpu >= 0 && static_cast<size_t>(gpu) < ecc_.size()) ecc_[gpu] = count;
}

GpuVerdict GpuGuard::Check(int gpu) {
  GpuVerdict verdict;
  if (options_.nvml != nullptr) {
    absl::StatusOr<GpuHealthReading> reading = options_.nvml->ReadHealth(gpu);
    if (reading.ok()) {
      verdict = EvaluateGpuHealth(*reading);
      if (reading->uncorrectable_ecc_errors.has_value()) {
        RecordEcc(gpu, *reading->uncorrectable_ecc_errors);
      }
    } else if (!absl::IsUnimplemented(reading.status())) {
      verdict.faults.push_back(std::string(reading.status().message()));
    }
  }
  // A GPU NVML already finds failing needs no compute check to stay out.
  if (!verdict.ok() || !options_.compute_check) return verdict;
  absl::StatusOr<std::string> computed = options_.compute_check(gpu);
  if (computed.ok()) {
    verdict.notes.push_back(*computed);
  } else if (absl::IsFailedPrecondition(computed.status())) {
    verdict.faults.push_back(
        absl::StrCat("the compute check failed: ", computed.status().message()));
  } else {
    LogWarning("GPU ", gpu, ": the compute check could not run (", computed.status().message(),
               "); the GPU stays in service on NVML's readings");
  }
  return verdict;
}

void GpuGuard::Fault(int gpu, const std::string& reason) {
  if (!health_.TakeOut(gpu, reason)) return;
  LogError("GPU ", gpu, " taken out of service: ", reason,
           "; nothing is placed on it until an admin returns it (trainyard workers return-gpu) "
           "and its check passes, or the agent restarts and its pre-flight check passes");
  if (options_.on_fault) options_.on_fault(gpu, reason);
}

void GpuGuard::Preflight() {
  if (!enabled() || options_.gpus <= 0) return;
  std::vector<GpuVerdict> verdicts(options_.gpus);
  std::vector<std::thread> checks;
  for (int gpu = 0; gpu < options_.gpus; ++gpu) {
    checks.emplace_back([this, gpu, &verdicts] { verdicts[gpu] = Check(gpu); });
  }
  for (std::thread& t : checks) t.join();
  int passed = 0;
  for (int gpu = 0; gpu < options_.gpus; ++gpu) {
    const GpuVerdict& v = verdicts[gpu];
    if (!v.ok()) {
      Fault(gpu, v.Reason());
      continue;
    }
    ++passed;
    if (!v.notes.empty()) LogInfo("GPU ", gpu, ": ", absl::StrJoin(v.notes, "; "));
  }
  LogInfo("pre-flight check: ", passed, " of ", options_.gpus, " GPUs passed (",
          options_.nvml != nullptr ? "NVML's readings" : "no NVML",
          options_.compute_check ? ", the compute check" : ", no compute check (no CUDA)", ")");
}

void GpuGuard::Start() {
  {
    absl::MutexLock lock(&mu_);
    if (started_ || stopping_ || !enabled()) return;
    started_ = true;
  }
  if (options_.nvml != nullptr) {
    absl::StatusOr<std::unique_ptr<XidWatch>> watch = options_.nvml->WatchXids();
    if (watch.ok()) {
      watch_ = *std::move(watch);
      xid_thread_ = std::thread([this] { WatchXids(); });
    } else {
      LogInfo("no XID events from NVML (", watch.status().message(),
              "): GPU errors during jobs are seen by the ECC counters and the checks only");
    }
  }
  poll_thread_ = std::thread([this] { Poll(); });
}

void GpuGuard::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    cv_.SignalAll();
  }
  if (xid_thread_.joinable()) xid_thread_.join();
  if (poll_thread_.joinable()) poll_thread_.join();
}

std::optional<FailedGpu> GpuGuard::CheckFreed(const std::vector<int>& gpus) {
  std::optional<FailedGpu> first;
  for (int gpu : gpus) {
    if (health_.InService(gpu)) {
      if (!enabled()) continue;
      const GpuVerdict v = Check(gpu);
      if (v.ok()) continue;
      Fault(gpu, v.Reason());
    }
    if (!first.has_value()) first = FailedGpu{gpu, health_.Reason(gpu)};
  }
  return first;
}

void GpuGuard::RequestReturn(const std::vector<int>& gpus) {
  for (int gpu : gpus) {
    if (health_.InService(gpu) || !health_.BeginReturnCheck(gpu, options_.return_interval)) {
      continue;
    }
    LogInfo("GPU ", gpu, " returned to service by an admin: checking it again");
    absl::MutexLock lock(&mu_);
    returns_.insert(gpu);
    cv_.SignalAll();
  }
}

void GpuGuard::ReturnCheck(int gpu) {
  const GpuVerdict v = Check(gpu);
  if (v.ok()) {
    health_.PutBack(gpu);
    LogInfo("GPU ", gpu, " is back in service: its check passed",
            v.notes.empty() ? "" : absl::StrCat(" (", absl::StrJoin(v.notes, "; "), ")"));
    return;
  }
  health_.Renew(gpu, v.Reason());
  LogWarning("GPU ", gpu, " stays out of service: its check failed again: ", v.Reason());
}

void GpuGuard::WatchXids() {
  bool failing = false;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
    }
    absl::StatusOr<std::optional<XidEvent>> event = watch_->Wait(options_.xid_wait);
    if (event.ok()) {
      failing = false;
      if (event->has_value()) HandleXid(**event);
      continue;
    }
    if (!failing) LogWarning("cannot wait for XID events: ", event.status().message());
    failing = true;
    // Not a tight loop on a wait that fails at once.
    absl::MutexLock lock(&mu_);
    const absl::Time until = clock_.Now() + options_.poll_interval;
    while (!stopping_) {
      if (clock_.WaitWithDeadline(cv_, mu_, until)) break;
    }
  }
}

void GpuGuard::HandleXid(const XidEvent& event) {
  health_.CountXid(event.index, event.xid);
  const XidClass c = ClassifyXid(event.xid);
  if (c.kind == XidKind::kHardware) {
    Fault(event.index, DescribeXid(event.xid));
    return;
  }
  LogWarning("GPU ", event.index, ": ", DescribeXid(event.xid),
             c.kind == XidKind::kApplication ? ", usually the program's own doing"
                                             : ", not one that takes a GPU out",
             "; the GPU stays in service");
}

void GpuGuard::Poll() {
  absl::Time next = clock_.Now() + options_.poll_interval;
  while (true) {
    std::set<int> returns;
    {
      absl::MutexLock lock(&mu_);
      while (!stopping_ && returns_.empty() && clock_.Now() < next) {
        clock_.WaitWithDeadline(cv_, mu_, next);
      }
      if (stopping_) return;
      returns.swap(returns_);
    }
    for (int gpu : returns) ReturnCheck(gpu);
    if (clock_.Now() >= next) {
      PollEcc();
      next = clock_.Now() + options_.poll_interval;
    }
  }
}

void GpuGuard::PollEcc() {
  if (options_.nvml == nullptr) return;
  for (int gpu = 0; gpu < options_.gpus; ++gpu) {
    if (!health_.InService(gpu)) continue;
    absl::StatusOr<GpuHealthReading> reading = options_.nvml->ReadHealth(gpu);
    if (absl::IsUnimplemented(reading.status())) return;
    if (!reading.ok()) {
      Fault(gpu, std::string(reading.status().message()));
      continue;
    }
    if (!reading->uncorrectable_ecc_errors.has_value()) continue;
    const uint64_t now = *reading->uncorrectable_ecc_errors;
    std::optional<uint64_t> before;
    {
      absl::MutexLock lock(&mu_);
      before = ecc_[gpu];
      ecc_[gpu] = now;
    }
    // The volatile counter starts again at 0 when the driver reloads: only a rise counts.
    if (before.has_value() && now > *before) {
      Fault(gpu, absl::StrCat(now - *before, " new uncorrectable ECC errors (", now,
                              " since the driver loaded)"));
    }
  }
}

}  // namespace trainyard
