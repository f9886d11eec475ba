#ifndef TRAINYARD_COMMON_SHA256_H_
#define TRAINYARD_COMMON_SHA256_H_

#include <string>

#include "absl/strings/string_view.h"

namespace trainyard {

// Lower-case hex SHA-256 of `data`.
std::string Sha256Hex(absl::string_view data);

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_SHA256_H_
