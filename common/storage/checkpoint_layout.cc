#include "common/storage/checkpoint_layout.h"

#include <optional>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/storage/uri.h"

namespace trainyard {

namespace {
constexpr absl::string_view kManifestPrefix = "MANIFEST.g";
constexpr absl::string_view kManifestSuffix = ".json";
}  // namespace

std::string CheckpointStepUri(const std::string& checkpoint_uri, int64_t step) {
  return JoinUri(checkpoint_uri, absl::StrFormat("%s%012d", kCheckpointStepPrefix, step));
}

std::string ManifestName(int64_t generation) {
  return absl::StrCat(kManifestPrefix, generation, kManifestSuffix);
}

std::optional<int64_t> ParseNameNumber(absl::string_view digits) {
  int64_t value = 0;
  if (digits.empty() || !absl::SimpleAtoi(digits, &value) || value < 0 ||
      absl::StrCat(value) != digits) {
    return std::nullopt;
  }
  return value;
}

std::optional<int64_t> ManifestGeneration(absl::string_view name) {
  if (name == kLegacyManifestName) return -1;
  if (!absl::ConsumePrefix(&name, kManifestPrefix) ||
      !absl::ConsumeSuffix(&name, kManifestSuffix)) {
    return std::nullopt;
  }
  return ParseNameNumber(name);
}

absl::StatusOr<std::string> NewestManifestUri(ObjectStore& store, const std::string& step_uri) {
  std::string folder = step_uri;
  if (folder.empty() || folder.back() != '/') folder += '/';
  absl::StatusOr<std::vector<ObjectInfo>> objects = store.List(folder);
  if (!objects.ok()) return objects.status();
  std::optional<int64_t> newest;
  std::string uri;
  for (const ObjectInfo& info : *objects) {
    absl::string_view name = info.uri;
    if (!absl::ConsumePrefix(&name, folder)) continue;
    const std::optional<int64_t> generation = ManifestGeneration(name);
    if (generation && (!newest || *generation > *newest)) {
      newest = generation;
      uri = info.uri;
    }
  }
  if (!newest) {
    return absl::NotFoundError(absl::StrCat(step_uri, ": no manifest (not a whole checkpoint)"));
  }
  return uri;
}

}  // namespace trainyard
