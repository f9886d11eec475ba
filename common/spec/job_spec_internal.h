#ifndef TRAINYARD_COMMON_SPEC_JOB_SPEC_INTERNAL_H_
#define TRAINYARD_COMMON_SPEC_JOB_SPEC_INTERNAL_H_

// Parts of ValidateJobSpec (job_spec.cc) kept in files of their own: the model's section
// (job_spec_model.cc) and a program's (job_spec_program.cc). Internal to the job spec's files.

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "trainyard/v1/job.pb.h"
#include "yaml-cpp/yaml.h"

namespace trainyard::job_spec_internal {

// A file the workers read or write: an absolute path or a URI, as the one parser reads it (a
// relative path would be read from whatever folder each trainer runs in). INVALID_ARGUMENT
// naming `field`.
absl::Status CheckAbsolute(absl::string_view field, const std::string& value);

// The model section: one source (builtin, torchscript or stages) and its arguments within
// bounds. INVALID_ARGUMENT naming the field.
absl::Status ValidateModel(const trainyard::v1::ModelSpec& model);

// A job's own program (job_spec_program.cc): the YAML section `program` into `program`, and the
// whole spec of such a job (strategy program, no field of the trainer's loop, the program's
// command, workdir and environment within bounds). INVALID_ARGUMENT naming the field.
absl::Status ParseProgram(const YAML::Node& node, trainyard::v1::ProgramSpec& program);
absl::Status ValidateProgramJob(const trainyard::v1::JobSpec& spec);

}  // namespace trainyard::job_spec_internal

#endif  // TRAINYARD_COMMON_SPEC_JOB_SPEC_INTERNAL_H_
