// A TorchScript archive (a zip file), as the coordinator opens it at submission to learn the
// operators a model calls: its central directory (zip or zip64), then each code file, stored or
// deflated, read in ranges as from object storage.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/formats/torchscript_archive.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string archive(reinterpret_cast<const char*>(data), size);
  auto read = [&archive](int64_t offset, int64_t length) -> absl::StatusOr<std::string> {
    if (offset < 0 || length < 0 || offset > static_cast<int64_t>(archive.size())) {
      return absl::OutOfRangeError("past the end");
    }
    return archive.substr(static_cast<size_t>(offset),
                          static_cast<size_t>(std::min<int64_t>(
                              length, static_cast<int64_t>(archive.size()) - offset)));
  };
  trainyard::ReadTorchScriptNeeds(static_cast<int64_t>(size), read).IgnoreError();
  return 0;
}
