// A search over a job's own program: the trial's values go into its command and environment
// where they name a {placeholder}, and its objective may be any figure the program reports.

#include <optional>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "server/searches/search_spec.h"

namespace trainyard {
namespace {

// `text` with every {name} of `values` replaced; records each name it used in `used`.
std::string Substitute(const std::string& text, const TrialValues& values,
                       std::set<std::string>& used) {
  std::string out = text;
  for (const auto& [name, value] : values) {
    const std::string placeholder = absl::StrCat("{", name, "}");
    if (!absl::StrContains(out, placeholder)) continue;
    // A YAML string value ("'adam'") goes in as its text.
    std::string plain = value;
    if (plain.size() >= 2 && (plain.front() == '\'' || plain.front() == '"') &&
        plain.back() == plain.front()) {
      plain = plain.substr(1, plain.size() - 2);
    }
    absl::StrReplaceAll({{placeholder, plain}}, &out);
    used.insert(name);
  }
  return out;
}

}  // namespace

TrialValues SubstituteIntoProgram(YAML::Node& program, const TrialValues& values) {
  std::set<std::string> used;
  if (YAML::Node command = program["command"]; command.IsSequence()) {
    for (size_t i = 0; i < command.size(); ++i) {
      if (command[i].IsScalar()) command[i] = Substitute(command[i].Scalar(), values, used);
    }
  } else if (command.IsScalar()) {
    program["command"] = Substitute(command.Scalar(), values, used);
  }
  if (YAML::Node env = program["env"]; env.IsMap()) {
    for (auto entry : env) {
      if (entry.second.IsScalar()) {
        env[entry.first.Scalar()] = Substitute(entry.second.Scalar(), values, used);
      }
    }
  }
  TrialValues rest;
  for (const auto& [name, value] : values) {
    if (used.count(name) == 0) rest[name] = value;
  }
  return rest;
}

std::optional<double> TrialMetric(const v1::JobProgress& progress, const std::string& metric) {
  if (metric == "loss") return progress.loss();
  if (metric == "val_accuracy") {
    return progress.has_val_accuracy() ? std::optional<double>(progress.val_accuracy())
                                       : std::nullopt;
  }
  if (metric == "val_loss") {
    return progress.has_val_loss() ? std::optional<double>(progress.val_loss()) : std::nullopt;
  }
  const auto it = progress.metrics().find(metric);
  if (it == progress.metrics().end()) return std::nullopt;
  return it->second;
}

bool IsTrainerMetric(const std::string& metric) {
  return metric == "loss" || metric == "val_accuracy" || metric == "val_loss";
}

}  // namespace trainyard
