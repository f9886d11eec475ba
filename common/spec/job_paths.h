#ifndef TRAINYARD_COMMON_SPEC_JOB_PATHS_H_
#define TRAINYARD_COMMON_SPEC_JOB_PATHS_H_

// The places a job reads and writes (data, models, its checkpoints), as the one URI parser reads
// them, and the rules that keep local ones under the folders a coordinator allows. The
// coordinator applies them at submission; the trainer's file store holds every open to the
// same folders on the worker, symbolic links resolved (FileObjectStore's roots).

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/storage/uri.h"
#include "trainyard/v1/job.pb.h"

namespace trainyard {

struct JobLocation {
  std::string field;    // "data.train", "model.stages[2]", "checkpoint.uri", ...
  std::string value;    // as written in the spec
  Uri uri;              // as ParseUri reads it; wildcards of data.train kept as written
  bool written;         // checkpoint.uri: the job writes there; it only reads the others
  bool folder = false;  // program.workdir: a folder (or an archive) rather than files
};

// Every place `spec` names, in field order: data.train, data.tokens, model.torchscript,
// model.stages[i], distill.teacher, program.workdir, checkpoint.uri (unset fields left out).
// INVALID_ARGUMENT naming the field when one does not parse (relative paths, "..", an unsupported
// scheme).
absl::StatusOr<std::vector<JobLocation>> JobLocations(const trainyard::v1::JobSpec& spec);

// Checks that every local place in `spec` lies under one of `allowed` (absolute folders),
// compared segment by segment on the parsed path, so neither "..", "//", "x://" nor "%2e%2e" can
// lead out. Where a place, or the deepest folder of it that exists, is on this machine, its real
// path (symbolic links resolved) must lie under an allowed folder's real path too. Globs are
// checked as written, so a pattern must name its folders (`/data/run-*/x` is under `/data`).
// INVALID_ARGUMENT naming the field and the allowed folders.
absl::Status CheckLocalPaths(const trainyard::v1::JobSpec& spec,
                             const std::vector<std::string>& allowed);

// Checks the local files `spec` reads (data.train's pattern, model.torchscript, distill.teacher,
// program.workdir)
// where this machine can see them: INVALID_ARGUMENT naming the field when their folder exists
// here but holds no match ("data.train: no files match '/data/x-*.safetensors'"). A folder this
// machine does not have is not checked (the workers may have it): the result names each such
// field and folder, for the job's events. Object storage (s3://) is not checked here.
absl::StatusOr<std::vector<std::string>> CheckLocalFiles(const trainyard::v1::JobSpec& spec);

// The folder of an owner's jobs under the coordinator's checkpoint root: {root}/{owner folder}/
// {job id}. The owner's name when it is a plain file name (letters, digits, '.', '_', '-', at
// most 128, not dots alone), else "u-" and the first 16 hex digits of its SHA-256, so that any
// name a certificate carries is one safe segment, and two owners never share one.
std::string OwnerFolder(absl::string_view owner);

// What of a pattern is fixed: the path up to the folder of its first wildcard (* ? [), with
// its trailing '/'; the path itself when it has none.
std::string FixedPart(const std::string& path);

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_SPEC_JOB_PATHS_H_
