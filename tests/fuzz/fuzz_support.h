#ifndef TRAINYARD_TESTS_FUZZ_FUZZ_SUPPORT_H_
#define TRAINYARD_TESTS_FUZZ_FUZZ_SUPPORT_H_

// What several fuzz targets share: a folder of their own, and quiet logs.

#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "common/log.h"

namespace trainyard::fuzz {

// A new folder "fuzz-NAME-XXXXXX" in memory-backed /dev/shm (or the temp folder). Call once per
// process (keep it in a static): the inputs of one run reuse it.
inline std::string MakeScratchDir(const std::string& name) {
  namespace fs = std::filesystem;
  std::string pattern =
      (fs::exists("/dev/shm") ? std::string("/dev/shm") : fs::temp_directory_path().string()) +
      "/fuzz-" + name + "-XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) std::abort();
  return pattern;
}

// What the coordinator logs of each input (jobs submitted, workers lost) is noise to a fuzzer:
// only errors are written, unless TRAINYARD_FUZZ_SHOW is set.
inline void QuietLogsUnlessShown() {
  if (std::getenv("TRAINYARD_FUZZ_SHOW") == nullptr) SetLogThreshold(LogSeverity::kError);
}

}  // namespace trainyard::fuzz

#endif  // TRAINYARD_TESTS_FUZZ_FUZZ_SUPPORT_H_
