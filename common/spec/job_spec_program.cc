// A job that runs the user's own program (JobSpec.program): its YAML section, its defaults and
// its validation. What the program is given when it runs is worker/trainer/program/'s.

#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/spec/job_spec.h"
#include "common/spec/job_spec_internal.h"
#include "common/spec/program_env.h"
#include "common/spec/yaml_fields.h"
#include "common/storage/uri.h"

namespace trainyard {
namespace job_spec_internal {
namespace {

bool IsEnvName(absl::string_view name) {
  if (name.empty() || name.size() > kMaxProgramEnvNameBytes) return false;
  if (!(absl::ascii_isalpha(name[0]) || name[0] == '_')) return false;
  for (char c : name) {
    if (!(absl::ascii_isalnum(c) || c == '_')) return false;
  }
  return true;
}

bool HasNul(absl::string_view text) { return text.find('\0') != absl::string_view::npos; }

// The trainer loop's fields, which a program replaces: the first one set, or empty.
std::string LoopFieldSet(const v1::JobSpec& spec) {
  const std::vector<std::pair<const char*, bool>> fields = {
      {"model", spec.has_model()},
      {"data", spec.has_data()},
      {"optimizer", spec.has_optimizer()},
      {"batch_size", spec.batch_size() != 0},
      {"loss", !spec.loss().empty()},
      {"max_steps", spec.max_steps() != 0},
      {"epochs", spec.epochs() != 0},
      {"seed", spec.seed() != 0},
      {"distill", spec.has_distill()},
      {"precision", spec.precision() != v1::PRECISION_UNSPECIFIED},
      {"cuda_graph", spec.cuda_graph()},
      {"pipeline", spec.has_pipeline()},
      {"parameter_servers", spec.has_parameter_servers()},
      {"accumulate_steps", spec.accumulate_steps() != 0},
      {"bucket_size_mb", spec.bucket_size_mb() != 0},
      {"log_every_steps", spec.log_every_steps() != 0},
      {"collective_timeout", spec.collective_timeout_seconds() != 0},
  };
  for (const auto& [name, set] : fields) {
    if (set) return name;
  }
  return "";
}

}  // namespace

absl::Status ParseProgram(const YAML::Node& node, v1::ProgramSpec& program) {
  TY_RETURN_IF_ERROR(ExpectMap(node, "program"));
  TY_RETURN_IF_ERROR(CheckKeys(node, "program", {"command", "workdir", "env"}));
  const YAML::Node command = node["command"];
  if (!IsSet(command)) {
    return FieldError("program.command", "required: the program's argv, e.g. [python3, train.py]");
  }
  if (command.IsScalar()) {
    // A single string is one word, never split: quoting rules differ between shells.
    absl::StatusOr<std::string> word = ReadString(command, "program.command");
    if (!word.ok()) return word.status();
    program.add_command(*word);
  } else if (command.IsSequence()) {
    for (size_t i = 0; i < command.size(); ++i) {
      absl::StatusOr<std::string> word =
          ReadString(command[i], absl::StrCat("program.command[", i, "]"));
      if (!word.ok()) return word.status();
      program.add_command(*word);
    }
  } else {
    return FieldError("program.command",
                      absl::StrCat("expected a list of words, got ", Describe(command)));
  }
  if (const YAML::Node workdir = node["workdir"]; IsSet(workdir)) {
    absl::StatusOr<std::string> value = ReadString(workdir, "program.workdir");
    if (!value.ok()) return value.status();
    program.set_workdir(*value);
  }
  if (const YAML::Node env = node["env"]; IsSet(env)) {
    TY_RETURN_IF_ERROR(ExpectMap(env, "program.env"));
    for (const auto& entry : env) {
      absl::StatusOr<std::string> name = ReadString(entry.first, "program.env");
      if (!name.ok()) return name.status();
      const std::string field = Child("program.env", *name);
      absl::StatusOr<std::string> value = ReadString(entry.second, field);
      if (!value.ok()) return value.status();
      if (!program.mutable_env()->insert({*name, *value}).second) {
        return FieldError(field, "set twice");
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateProgramJob(const v1::JobSpec& spec) {
  if (!spec.has_program()) {
    return FieldError("program", "required by strategy program: the command to run");
  }
  if (spec.strategy() != v1::PROGRAM && spec.strategy() != v1::STRATEGY_UNSPECIFIED) {
    return FieldError("strategy",
                      "a job with a program runs its own strategy (DDP, FSDP, ...): remove it");
  }
  if (const std::string field = LoopFieldSet(spec); !field.empty()) {
    return FieldError(field, "a job with a program sets no " + field +
                                 ": the program trains in its own way; remove it (or remove "
                                 "program to use the trainer's loop)");
  }
  const v1::WorkerRange& workers = spec.workers();
  if (workers.min() < 1) return FieldError("workers.min", "must be >= 1");
  if (workers.min() > workers.max()) return FieldError("workers", "min must be <= max");
  if (spec.resources().gpus_per_worker() < 0) {
    return FieldError("resources.gpus_per_worker", "must be >= 0");
  }
  const v1::ProgramSpec& program = spec.program();
  if (program.command_size() == 0 || program.command(0).empty()) {
    return FieldError("program.command", "required: the program's argv, e.g. [python3, train.py]");
  }
  if (program.command_size() > kMaxProgramArgs) {
    return FieldError("program.command", absl::StrCat("at most ", kMaxProgramArgs, " words"));
  }
  size_t bytes = 0;
  for (int i = 0; i < program.command_size(); ++i) {
    const std::string& word = program.command(i);
    if (HasNul(word)) {
      return FieldError(absl::StrCat("program.command[", i, "]"), "contains a NUL byte");
    }
    bytes += word.size();
  }
  if (bytes > kMaxProgramCommandBytes) {
    return FieldError("program.command",
                      absl::StrCat("longer than ", kMaxProgramCommandBytes, " bytes in all"));
  }
  if (!program.workdir().empty()) {
    if (absl::Status s = CheckAbsolute("program.workdir", program.workdir()); !s.ok()) return s;
  }
  if (program.env_size() > kMaxProgramEnv) {
    return FieldError("program.env", absl::StrCat("at most ", kMaxProgramEnv, " variables"));
  }
  for (const auto& [name, value] : program.env()) {
    const std::string field = Child("program.env", name);
    if (!IsEnvName(name)) {
      return FieldError(field, "a variable name: letters, digits and _, not starting with a digit");
    }
    if (IsProgramEnvSetByTrainyard(name)) {
      return FieldError(field,
                        "set by Trainyard for every rank (docs/user-guide.md, \"Your own "
                        "program\"); the program reads it, the spec cannot set it");
    }
    if (HasNul(value) || value.size() > kMaxProgramEnvValueBytes) {
      return FieldError(field, absl::StrCat("a value of at most ", kMaxProgramEnvValueBytes,
                                            " bytes without NUL"));
    }
  }
  return absl::OkStatus();
}

}  // namespace job_spec_internal
}  // namespace trainyard
