#ifndef TRAINYARD_COMMON_BYTE_SIZE_H_
#define TRAINYARD_COMMON_BYTE_SIZE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace trainyard {

// "256MB", "64MiB", "4Gi", "1G", "1000": bytes (k, M, G, T powers of 1000; Ki, Mi, Gi, Ti and
// KiB, MiB, GiB, TiB powers of 1024; case does not matter). More than 0 and at most 1e15 bytes;
// INVALID_ARGUMENT otherwise.
absl::StatusOr<int64_t> ParseByteSize(absl::string_view text);

// "512 B", "1.5 KiB", "4.0 GiB".
std::string HumanBytes(int64_t bytes);

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_BYTE_SIZE_H_
