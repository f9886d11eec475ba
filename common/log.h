#ifndef TRAINYARD_COMMON_LOG_H_
#define TRAINYARD_COMMON_LOG_H_

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace trainyard {

// Plain line logging to stderr: "2026-11-21T05:40:00.123Z I coordinator: message". Thread-safe.
// Deliberately not named LOG: LibTorch brings glog's macros into the trainer.
enum class LogSeverity { kInfo, kWarning, kError };

// Sets the component name printed on every line; call once at the start of main.
void SetLogComponent(absl::string_view component);
// Lines below `severity` are not written (kInfo, all, unless told). For programs that run the
// coordinator's code many times over and watch for crashes only (the fuzz targets).
void SetLogThreshold(LogSeverity severity);
void LogLine(LogSeverity severity, absl::string_view message);

template <typename... Args>
void LogInfo(const Args&... args) {
  LogLine(LogSeverity::kInfo, absl::StrCat(args...));
}
template <typename... Args>
void LogWarning(const Args&... args) {
  LogLine(LogSeverity::kWarning, absl::StrCat(args...));
}
template <typename... Args>
void LogError(const Args&... args) {
  LogLine(LogSeverity::kError, absl::StrCat(args...));
}

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_LOG_H_
