#include "common/byte_size.h"

#include <cstring>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace trainyard {

absl::StatusOr<int64_t> ParseByteSize(absl::string_view text) {
  // Longest suffixes first: "mib" before "ib" before "b".
  static const std::pair<const char*, int64_t> kUnits[] = {{"kib", int64_t{1} << 10},
                                                           {"mib", int64_t{1} << 20},
                                                           {"gib", int64_t{1} << 30},
                                                           {"tib", int64_t{1} << 40},
                                                           {"ki", int64_t{1} << 10},
                                                           {"mi", int64_t{1} << 20},
                                                           {"gi", int64_t{1} << 30},
                                                           {"ti", int64_t{1} << 40},
                                                           {"kb", 1000},
                                                           {"mb", 1000000},
                                                           {"gb", 1000000000},
                                                           {"tb", 1000000000000},
                                                           {"k", 1000},
                                                           {"m", 1000000},
                                                           {"g", 1000000000},
                                                           {"t", 1000000000000},
                                                           {"b", 1}};
  const std::string lower = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  int64_t unit = 1;
  absl::string_view number = lower;
  for (const auto& [suffix, size] : kUnits) {
    if (absl::EndsWith(lower, suffix)) {
      unit = size;
      number = absl::string_view(lower).substr(0, lower.size() - std::strlen(suffix));
      break;
    }
  }
  double value;
  if (!absl::SimpleAtod(absl::StripAsciiWhitespace(number), &value) || !(value > 0) ||
      value * static_cast<double>(unit) > 1e15) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", text, "' is not a size (256MB, 64MiB, 4Gi)"));
  }
  return static_cast<int64_t>(value * static_cast<double>(unit));
}

std::string HumanBytes(int64_t bytes) {
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes);
  int unit = -1;
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  return absl::StrFormat("%.1f %s", value, kUnits[unit]);
}

}  // namespace trainyard
