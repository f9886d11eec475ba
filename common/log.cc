#include "common/log.h"

#include <atomic>
#include <cstdio>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace trainyard {
namespace {

absl::Mutex log_mu;
std::string* component ABSL_GUARDED_BY(log_mu) = new std::string("trainyard");
std::atomic<int> threshold{static_cast<int>(LogSeverity::kInfo)};

}  // namespace

void SetLogComponent(absl::string_view name) {
  absl::MutexLock lock(&log_mu);
  *component = std::string(name);
}

void SetLogThreshold(LogSeverity severity) { threshold = static_cast<int>(severity); }

void LogLine(LogSeverity severity, absl::string_view message) {
  if (static_cast<int>(severity) < threshold.load(std::memory_order_relaxed)) return;
  const char letter = severity == LogSeverity::kInfo      ? 'I'
                      : severity == LogSeverity::kWarning ? 'W'
                                                          : 'E';
  std::string line = absl::StrCat(
      absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", RealClock::Get().Now(), absl::UTCTimeZone()), " ",
      std::string(1, letter), " ");
  absl::MutexLock lock(&log_mu);
  absl::StrAppend(&line, *component, ": ", message, "\n");
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

}  // namespace trainyard
