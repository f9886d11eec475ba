#ifndef TRAINYARD_WORKER_TRAINER_PROGRAM_FILES_H_
#define TRAINYARD_WORKER_TRAINER_PROGRAM_FILES_H_

// A program's files in the object store: its workdir, brought to the worker, and its
// checkpoints, sent up and brought back. Internal to program/.
//
// A program's checkpoint of step S is a step folder like a trainer's
// ({checkpoint_uri}/step-{S:%012d}/, common/storage/checkpoint_layout.h) holding each file a rank
// wrote at `g{G}/{relative path}` (G the attempt's generation, so that no write of an earlier
// attempt that still reaches the store can touch what a later one committed) and
// MANIFEST.g{G}.json, written last by rank 0 in the trainer's format ({"format":
// "trainyard-checkpoint/1", "kind": "program", "job_id", "step", "generation", "created_unix_ms",
// "objects": [{"name", "size", "sha256"}]}).

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/storage/object_store.h"

namespace trainyard::trainer::program {

struct StoredFile {
  std::string name;  // in the step folder: "g3/model.pt"
  int64_t size = 0;
  std::string sha256;
};

// Every regular file below `dir`, as paths relative to it, sorted. INVALID_ARGUMENT naming a
// symbolic link, device or other non-regular entry (a checkpoint holds files, and a link could
// send one of the worker's files up), UNAVAILABLE when the folder cannot be read.
absl::StatusOr<std::vector<std::string>> ListFiles(const std::string& dir);

// Sends every file below `dir` to `{step_uri}/g{generation}/{path}`, each hashed as it goes.
// Errors as ListFiles, or UNAVAILABLE from the store, naming the file.
absl::StatusOr<std::vector<StoredFile>> UploadFiles(ObjectStore& store, const std::string& dir,
                                                    const std::string& step_uri,
                                                    int64_t generation);

// The objects a checkpoint lists, as JSON (a list of {"name", "size", "sha256"}) and back:
// INVALID_ARGUMENT for a malformed entry or a name that is not a safe relative path
// (common/storage/uri.h). The manifest's "objects", and each rank's part of a commit.
nlohmann::json EncodeFiles(const std::vector<StoredFile>& files);
absl::StatusOr<std::vector<StoredFile>> DecodeFiles(const nlohmann::json& objects);

// The path an object of a step folder restores to: its name without the "g{G}/" of the attempt
// that wrote it (a trainer's objects, which have none, as they are).
std::string RestoredPath(const std::string& name);

// A manifest's JSON, and the objects of one read back: INVALID_ARGUMENT when it is not a
// manifest or names an object with an unsafe path.
std::string EncodeManifest(const std::string& job_id, int64_t step, int64_t generation,
                           int64_t created_unix_ms, const std::vector<StoredFile>& files);
struct Manifest {
  int64_t step = 0;
  std::vector<StoredFile> files;
};
absl::StatusOr<Manifest> DecodeManifest(absl::string_view json);

// Brings the checkpoint of step folder `step_uri` into `dir` (emptied first): every object of
// its manifest, its size and SHA-256 checked, at its path without the attempt's "g{G}/" (a
// trainer's checkpoint: as named). Returns its step. NOT_FOUND for a missing manifest or object,
// DATA_LOSS for a size or hash that differs, INVALID_ARGUMENT for a malformed manifest,
// UNAVAILABLE from the store or the disk; `dir` is left empty on error.
absl::StatusOr<int64_t> RestoreCheckpoint(ObjectStore& store, const std::string& step_uri,
                                          const std::string& dir);

// Brings the program's files from `uri` into `dir`: an archive's (a URI ending in .tar,
// common/formats/workdir_archive.h), or every object below the folder URI, at its path relative
// to it. INVALID_ARGUMENT for an object whose path would leave `dir`, NOT_FOUND for
// an empty or missing folder, UNAVAILABLE from the store.
absl::Status FetchWorkdir(ObjectStore& store, const std::string& uri, const std::string& dir);

// Removes everything below `dir`, keeping `dir`. Best effort.
void EmptyFolder(const std::string& dir);

}  // namespace trainyard::trainer::program

#endif  // TRAINYARD_WORKER_TRAINER_PROGRAM_FILES_H_
