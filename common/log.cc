#include "common/log.h"

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

}  // namespace

void SetLogComponent(absl::string_view name) {
  absl::MutexLock lock(&log_mu);
  *component = std::string(name);
}

void LogLine(LogSeverity severity, absl::string_view message) {
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
