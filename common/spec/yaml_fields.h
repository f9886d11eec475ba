#ifndef TRAINYARD_COMMON_SPEC_YAML_FIELDS_H_
#define TRAINYARD_COMMON_SPEC_YAML_FIELDS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "yaml-cpp/yaml.h"

// Returns the status of `expr` when it is not OK.
#define TY_RETURN_IF_ERROR(expr)             \
  do {                                       \
    absl::Status ty_status_ = (expr);        \
    if (!ty_status_.ok()) return ty_status_; \
  } while (false)

namespace trainyard {

// Loads `yaml` and hands the document to `parse`, whose status it returns. A YAML syntax error is
// INVALID_ARGUMENT "yaml: line L, column C: <problem>"; yaml-cpp's exceptions never escape.
absl::Status ParseYamlDocument(absl::string_view yaml,
                               const std::function<absl::Status(const YAML::Node&)>& parse);

// Reading YAML specs (jobs, searches) field by field. Every error is INVALID_ARGUMENT and starts
// with the dotted path of the field: "optimizer.lr: expected a number, got 'abc'".

// INVALID_ARGUMENT "PATH: PROBLEM".
absl::Status FieldError(absl::string_view path, absl::string_view problem);
// "path.key", or "key" at the root.
std::string Child(absl::string_view path, absl::string_view key);
// How a node reads in an error: "a mapping", "a list", "null", "'text'".
std::string Describe(const YAML::Node& node);
absl::Status ExpectMap(const YAML::Node& node, absl::string_view path);
// Checks that every key of `node` (a mapping) is one of `known` (with a suggestion when one is
// close), and that none repeats.
absl::Status CheckKeys(const YAML::Node& node, absl::string_view path,
                       const std::vector<absl::string_view>& known);
// Present and not null.
bool IsSet(const YAML::Node& node);
absl::StatusOr<std::string> ReadString(const YAML::Node& node, absl::string_view path);
// Integral numbers written in floating-point form, such as 1e4, are accepted.
absl::StatusOr<int64_t> ReadInt64(const YAML::Node& node, absl::string_view path);
absl::StatusOr<int32_t> ReadInt32(const YAML::Node& node, absl::string_view path);
// Finite numbers only.
absl::StatusOr<double> ReadDouble(const YAML::Node& node, absl::string_view path);
// true/false, yes/no, on/off.
absl::StatusOr<bool> ReadBool(const YAML::Node& node, absl::string_view path);

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_SPEC_YAML_FIELDS_H_
