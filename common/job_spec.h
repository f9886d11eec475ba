#ifndef TRAINYARD_COMMON_JOB_SPEC_H_
#define TRAINYARD_COMMON_JOB_SPEC_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "trainyard/v1/job.pb.h"

namespace trainyard {

// Maps a YAML job spec (DESIGN.md, "Job spec") onto the JobSpec proto, fills defaults and
// validates it. INVALID_ARGUMENT whose message starts with the dotted field path, for example
// "optimizer.lr: must be > 0", "model.args.hiden: unknown key", "batch_size: expected an
// integer, got 'abc'". Nothing is returned on error.
absl::StatusOr<trainyard::v1::JobSpec> ParseJobSpecYaml(absl::string_view yaml);

// Fills defaults in place (strategy single, workers 1, loss cross_entropy, data.features "x",
// data.labels "y", optimizer defaults, checkpoint.keep_last 3, ...). Idempotent.
void ApplyJobSpecDefaults(trainyard::v1::JobSpec& spec);

// Checks a spec that already has its defaults. Same error form as ParseJobSpecYaml.
absl::Status ValidateJobSpec(const trainyard::v1::JobSpec& spec);

// "90s", "15m", "12h", "2d", "1h30m" -> seconds. INVALID_ARGUMENT otherwise.
absl::StatusOr<int64_t> ParseDurationSeconds(absl::string_view text);

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_JOB_SPEC_H_
