#include "common/spec/yaml_fields.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <limits>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace trainyard {
namespace {

size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

}  // namespace

absl::Status ParseYamlDocument(absl::string_view yaml,
                               const std::function<absl::Status(const YAML::Node&)>& parse) {
  try {
    return parse(YAML::Load(std::string(yaml)));
  } catch (const YAML::Exception& e) {
    if (e.mark.is_null()) return absl::InvalidArgumentError(absl::StrCat("yaml: ", e.msg));
    return absl::InvalidArgumentError(
        absl::StrCat("yaml: line ", e.mark.line + 1, ", column ", e.mark.column + 1, ": ", e.msg));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("yaml: ", e.what()));
  }
}

absl::Status FieldError(absl::string_view path, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", problem));
}

std::string Child(absl::string_view path, absl::string_view key) {
  return path.empty() ? std::string(key) : absl::StrCat(path, ".", key);
}

std::string Describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Null:
      return "null";
    case YAML::NodeType::Scalar:
      return absl::StrCat("'", node.Scalar(), "'");
    default:
      return "nothing";
  }
}

absl::Status ExpectMap(const YAML::Node& node, absl::string_view path) {
  if (node.IsMap()) return absl::OkStatus();
  return FieldError(path, absl::StrCat("expected a mapping, got ", Describe(node)));
}

// Checks that every key of `node` (a mapping) is one of `known`, and that none repeats.
absl::Status CheckKeys(const YAML::Node& node, absl::string_view path,
                       const std::vector<absl::string_view>& known) {
  std::set<std::string> seen;
  for (const auto& item : node) {
    if (!item.first.IsScalar()) {
      return FieldError(path.empty() ? "spec" : path, "keys must be plain strings");
    }
    const std::string& key = item.first.Scalar();
    const std::string key_path = Child(path, key);
    if (!seen.insert(key).second) return FieldError(key_path, "duplicate key");
    if (std::find(known.begin(), known.end(), key) != known.end()) continue;
    absl::string_view best;
    size_t best_distance = 3;
    for (absl::string_view candidate : known) {
      const size_t distance = EditDistance(key, candidate);
      if (distance < best_distance && distance < candidate.size()) {
        best = candidate;
        best_distance = distance;
      }
    }
    if (best.empty()) return FieldError(key_path, "unknown key");
    return FieldError(key_path, absl::StrCat("unknown key (did you mean '", best, "'?)"));
  }
  return absl::OkStatus();
}

bool IsSet(const YAML::Node& node) { return node.IsDefined() && !node.IsNull(); }

absl::StatusOr<std::string> ReadString(const YAML::Node& node, absl::string_view path) {
  if (!node.IsScalar()) {
    return FieldError(path, absl::StrCat("expected a string, got ", Describe(node)));
  }
  return node.Scalar();
}

absl::StatusOr<int64_t> ReadInt64(const YAML::Node& node, absl::string_view path) {
  if (node.IsScalar()) {
    const std::string& text = node.Scalar();
    int64_t value;
    if (absl::SimpleAtoi(text, &value)) return value;
    // Accept integral numbers written in floating-point form, such as 1e4.
    double d;
    if (absl::SimpleAtod(text, &d) && std::isfinite(d) && d == std::floor(d) &&
        std::fabs(d) <= 9.0e15) {
      return static_cast<int64_t>(d);
    }
  }
  return FieldError(path, absl::StrCat("expected an integer, got ", Describe(node)));
}

absl::StatusOr<int32_t> ReadInt32(const YAML::Node& node, absl::string_view path) {
  absl::StatusOr<int64_t> value = ReadInt64(node, path);
  if (!value.ok()) return value.status();
  if (*value < std::numeric_limits<int32_t>::min() ||
      *value > std::numeric_limits<int32_t>::max()) {
    return FieldError(path, absl::StrCat(*value, " is out of range"));
  }
  return static_cast<int32_t>(*value);
}

absl::StatusOr<double> ReadDouble(const YAML::Node& node, absl::string_view path) {
  if (node.IsScalar()) {
    double value;
    if (absl::SimpleAtod(node.Scalar(), &value) && std::isfinite(value)) return value;
  }
  return FieldError(path, absl::StrCat("expected a number, got ", Describe(node)));
}

absl::StatusOr<bool> ReadBool(const YAML::Node& node, absl::string_view path) {
  if (node.IsScalar()) {
    const std::string text = absl::AsciiStrToLower(node.Scalar());
    if (text == "true" || text == "yes" || text == "on") return true;
    if (text == "false" || text == "no" || text == "off") return false;
  }
  return FieldError(path, absl::StrCat("expected true or false, got ", Describe(node)));
}

}  // namespace trainyard
