#ifndef TRAINYARD_WORKER_TRAINER_CHECKPOINT_CHECKPOINT_FILES_H_
#define TRAINYARD_WORKER_TRAINER_CHECKPOINT_CHECKPOINT_FILES_H_

// The objects of a step folder by name, shared by the checkpoint's writer (checkpoint.cc) and
// its reader (checkpoint_read.cc); the layout itself is described in checkpoint.h.

#include <cstdint>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <type_traits>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "common/json_fields.h"
#include "common/storage/checkpoint_layout.h"

namespace trainyard::trainer::checkpoint_files {

inline constexpr char kModelObject[] = "model.safetensors";
inline constexpr char kOptimizerObject[] = "optimizer.safetensors";
inline constexpr char kStateObject[] = "trainer_state.json";
inline constexpr char kModelBase[] = "model";
inline constexpr char kOptimizerBase[] = "optimizer";
inline constexpr char kStateBase[] = "trainer_state";

// Every object carries the generation of the attempt that wrote it, so that no attempt ever
// writes over a key another one left (common/storage/checkpoint_layout.h says why):
// "model.g3.safetensors", and a pipeline stage's also its stage, "model.stage-2-g3.safetensors".
// Checkpoints written before that hold "model.safetensors", which readers still take.
inline std::string ObjectName(absl::string_view base, int part, int64_t generation) {
  return part < 0 ? absl::StrCat(base, ".g", generation, ".safetensors")
                  : absl::StrCat(base, ".stage-", part, "-g", generation, ".safetensors");
}
inline std::string StateObjectName(int64_t generation) {
  return absl::StrCat(kStateBase, ".g", generation, ".json");
}
// Whether `name` is "{base}.g{G}{suffix}" or, for pipeline stages, "{base}.stage-K-gG{suffix}".
inline bool IsNamedByAttempt(absl::string_view name, absl::string_view base,
                             absl::string_view suffix) {
  if (!absl::ConsumePrefix(&name, base) || !absl::ConsumeSuffix(&name, suffix)) return false;
  if (absl::ConsumePrefix(&name, ".g")) return ParseNameNumber(name).has_value();
  if (!absl::ConsumePrefix(&name, ".stage-")) return false;
  const size_t g = name.find("-g");
  return g != absl::string_view::npos && ParseNameNumber(name.substr(0, g)).has_value() &&
         ParseNameNumber(name.substr(g + 2)).has_value();
}
inline bool IsObjectOf(absl::string_view name, absl::string_view base) {
  return name == absl::StrCat(base, ".safetensors") || IsNamedByAttempt(name, base, ".safetensors");
}
inline bool IsStateObject(absl::string_view name) {
  return name == kStateObject ||
         (!absl::StrContains(name, ".stage-") && IsNamedByAttempt(name, kStateBase, ".json"));
}
// Where stage `part` of attempt `generation` lists the objects it wrote, once they all are.
inline std::string PartListName(int part, int64_t generation) {
  return absl::StrCat("PART-", part, "-g", generation, ".json");
}

// Typed, range-checked reads of outside JSON (common/json_fields.h).
using ::trainyard::ReadField;

}  // namespace trainyard::trainer::checkpoint_files

#endif  // TRAINYARD_WORKER_TRAINER_CHECKPOINT_CHECKPOINT_FILES_H_
