// The small values that flags, specs and files carry: byte sizes ("4GiB"), durations ("12h"),
// URIs (s3://, file://, paths) and checkpoint object names' numbers. The first byte picks the
// parser, the rest is its text.

#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "common/byte_size.h"
#include "common/spec/job_spec.h"
#include "common/storage/checkpoint_layout.h"
#include "common/storage/uri.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const absl::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 4) {
    case 0:
      trainyard::ParseByteSize(text).IgnoreError();
      break;
    case 1:
      trainyard::ParseDurationSeconds(text).IgnoreError();
      break;
    case 2:
      trainyard::ParseUri(text).IgnoreError();
      break;
    default:
      (void)trainyard::ParseNameNumber(text);
  }
  return 0;
}
