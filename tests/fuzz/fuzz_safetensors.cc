// A safetensors file, as data sets and checkpoints bring them: its header's size, the header
// (names, dtypes, shapes, offsets) against the file's length, and the whole file decoded.

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "common/formats/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  if (trainyard::SafetensorsHeaderSize(bytes).ok()) {
    trainyard::DecodeSafetensorsHeader(bytes, static_cast<int64_t>(size)).IgnoreError();
  }
  trainyard::DecodeSafetensors(bytes).IgnoreError();
  return 0;
}
