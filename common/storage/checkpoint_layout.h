#ifndef TRAINYARD_COMMON_STORAGE_CHECKPOINT_LAYOUT_H_
#define TRAINYARD_COMMON_STORAGE_CHECKPOINT_LAYOUT_H_

// Where a job's checkpoints live under its checkpoint URI, the one fact that the trainer (which
// writes them), the coordinator (which checks a commit names the job's own folder and later
// deletes it) and the tests share: one folder per step, {checkpoint_uri}/step-{S:%012d}/, and the
// exported model in {checkpoint_uri}/final/. What a step folder holds is the trainer's
// (worker/trainer/checkpoint/checkpoint.h) or a program's (worker/trainer/program/files.h); both
// end with a manifest named by the attempt that wrote it, found here.
//
// Why by attempt: an old attempt cut off from the coordinator may still reach the object store
// and write into the step folder of a step the new attempt has committed. Every object an attempt
// writes carries its generation, the manifest too, so no write of an old attempt touches what a
// newer one wrote; a reader takes the manifest of the newest attempt in the folder. An attempt
// writes its manifest last, after every object it lists, so a newer attempt's manifest, committed
// or not, always describes a whole checkpoint of that step.

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/storage/object_store.h"

namespace trainyard {

// Every step folder's name starts with it (listing a job's folders lists this prefix).
inline constexpr char kCheckpointStepPrefix[] = "step-";
// The folder of a finished job's exported model.
inline constexpr char kFinalModelFolder[] = "final";

// {checkpoint_uri}/step-{step:%012d}
std::string CheckpointStepUri(const std::string& checkpoint_uri, int64_t step);

// `digits` as a number >= 0 when it is written exactly as StrCat writes one ("12"; not "012",
// "+12" or ""), else nullopt: the generations and stages that objects' names carry.
std::optional<int64_t> ParseNameNumber(absl::string_view digits);

// The manifest attempt `generation` writes in a step folder: "MANIFEST.g{generation}.json".
std::string ManifestName(int64_t generation);
// The name of checkpoints written before manifests were named by attempt; read, never written.
inline constexpr char kLegacyManifestName[] = "MANIFEST.json";
// The generation a manifest's name carries (-1 for the legacy name), or nullopt for any other
// name.
std::optional<int64_t> ManifestGeneration(absl::string_view name);

// The URI of the manifest a reader uses in the step folder `step_uri`: the newest attempt's (the
// legacy name counts as older than any). NOT_FOUND, naming the folder, when it holds none.
absl::StatusOr<std::string> NewestManifestUri(ObjectStore& store, const std::string& step_uri);

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_STORAGE_CHECKPOINT_LAYOUT_H_
