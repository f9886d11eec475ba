#ifndef TRAINYARD_WORKER_TRAINER_CHECKPOINT_CHECKPOINT_FILES_H_
#define TRAINYARD_WORKER_TRAINER_CHECKPOINT_CHECKPOINT_FILES_H_

// The objects of a step folder by name, shared by the checkpoint's writer (checkpoint.cc) and
// its reader (checkpoint_read.cc); the layout itself is described in checkpoint.h.

#include <cstdint>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace trainyard::trainer::checkpoint_files {

inline constexpr char kModelObject[] = "model.safetensors";
inline constexpr char kOptimizerObject[] = "optimizer.safetensors";
inline constexpr char kStateObject[] = "trainer_state.json";
inline constexpr char kModelBase[] = "model";
inline constexpr char kOptimizerBase[] = "optimizer";

// A pipeline stage's objects carry the stage and the attempt's generation, so that an attempt
// never writes over a key an earlier one left ("model.stage-2-g3.safetensors"); the whole model's
// is "model.safetensors".
inline std::string ObjectName(absl::string_view base, int part, int64_t generation) {
  return part < 0 ? absl::StrCat(base, ".safetensors")
                  : absl::StrCat(base, ".stage-", part, "-g", generation, ".safetensors");
}
inline bool IsObjectOf(absl::string_view name, absl::string_view base) {
  if (name == ObjectName(base, -1, 0)) return true;
  const std::string prefix = absl::StrCat(base, ".stage-");
  if (!absl::StartsWith(name, prefix) || !absl::EndsWith(name, ".safetensors")) return false;
  const absl::string_view middle =
      name.substr(prefix.size(), name.size() - prefix.size() - strlen(".safetensors"));
  const size_t g = middle.find("-g");
  int part = 0;
  int64_t generation = 0;
  return g != absl::string_view::npos && absl::SimpleAtoi(middle.substr(0, g), &part) &&
         part >= 0 && absl::SimpleAtoi(middle.substr(g + 2), &generation);
}
// Where stage `part` of attempt `generation` lists the objects it wrote, once they all are.
inline std::string PartListName(int part, int64_t generation) {
  return absl::StrCat("PART-", part, "-g", generation, ".json");
}
inline constexpr char kManifestObject[] = "MANIFEST.json";

template <typename T>
bool ReadField(const nlohmann::json& j, const char* key, T& out) {
  auto it = j.find(key);
  if (it == j.end()) return false;
  try {
    out = it->get<T>();
  } catch (const nlohmann::json::exception&) {
    return false;
  }
  return true;
}

}  // namespace trainyard::trainer::checkpoint_files

#endif  // TRAINYARD_WORKER_TRAINER_CHECKPOINT_CHECKPOINT_FILES_H_
