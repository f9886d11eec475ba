#include "server/searches/search_spec.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/spec/job_spec.h"
#include "common/spec/yaml_fields.h"
#include "yaml-cpp/yaml.h"

namespace trainyard {
namespace {

using trainyard::v1::Hyperparameter;
using trainyard::v1::SearcherSpec;
using trainyard::v1::SearchSpec;

constexpr int kMaxRungs = 10;
constexpr int kMaxHyperparameters = 64;

std::string Flow(const YAML::Node& node) {
  YAML::Emitter out;
  out.SetMapFormat(YAML::Flow);
  out.SetSeqFormat(YAML::Flow);
  out << node;
  return out.c_str();
}

// 12 significant digits: a grid's 0.01 reads "0.01", not the "0.010000000000000004" that
// exp(log(...)) gives. The text is the value: the trial's job parses it.
std::string FormatDouble(double v) { return absl::StrFormat("%.12g", v); }

// A trial's draws must be the same after a coordinator restart and on every machine: SplitMix64
// of (seed, trial, hyperparameter) rather than a standard distribution, whose output the
// standard does not fix.
uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

double Uniform(int64_t seed, int number, int index) {
  const uint64_t h =
      SplitMix64(static_cast<uint64_t>(seed) ^
                 SplitMix64((static_cast<uint64_t>(number) << 16) ^ static_cast<uint64_t>(index)));
  return static_cast<double>(h >> 11) * 0x1.0p-53;  // [0, 1)
}

// How many values a hyperparameter takes on the grid.
int64_t GridPoints(const Hyperparameter& h) {
  if (h.type() == "const") return 1;
  if (h.type() == "categorical") return h.values_size();
  if (h.type() == "int") return static_cast<int64_t>(h.max() - h.min()) + 1;
  return std::max(1, h.count());
}

std::string GridValue(const Hyperparameter& h, int64_t i) {
  if (h.type() == "const" || h.type() == "categorical") return h.values(static_cast<int>(i));
  if (h.type() == "int") return absl::StrCat(static_cast<int64_t>(h.min()) + i);
  const int64_t n = GridPoints(h);
  if (n == 1) return FormatDouble(h.min());
  if (i == n - 1) return FormatDouble(h.max());
  const double t = static_cast<double>(i) / static_cast<double>(n - 1);
  if (h.type() == "log") {
    return FormatDouble(std::exp(std::log(h.min()) + t * (std::log(h.max()) - std::log(h.min()))));
  }
  return FormatDouble(h.min() + t * (h.max() - h.min()));
}

std::string DrawnValue(const Hyperparameter& h, double u) {
  if (h.type() == "const") return h.values(0);
  if (h.type() == "categorical") {
    const int n = h.values_size();
    return h.values(std::min(n - 1, static_cast<int>(u * n)));
  }
  if (h.type() == "int") {
    const int64_t lo = static_cast<int64_t>(h.min());
    const int64_t span = static_cast<int64_t>(h.max()) - lo + 1;
    return absl::StrCat(lo +
                        std::min(span - 1, static_cast<int64_t>(u * static_cast<double>(span))));
  }
  double v = h.type() == "log"
                 ? std::exp(std::log(h.min()) + u * (std::log(h.max()) - std::log(h.min())))
                 : h.min() + u * (h.max() - h.min());
  return FormatDouble(std::clamp(v, h.min(), h.max()));
}

// The values each hyperparameter is checked at when the search is submitted.
std::vector<std::string> Corners(const Hyperparameter& h) {
  if (h.type() == "const" || h.type() == "categorical") {
    return {h.values().begin(), h.values().end()};
  }
  if (h.type() == "int") {
    return {absl::StrCat(static_cast<int64_t>(h.min())),
            absl::StrCat(static_cast<int64_t>(h.max()))};
  }
  return {FormatDouble(h.min()), FormatDouble(h.max())};
}

absl::Status ParseHyperparameter(const std::string& path, const YAML::Node& node,
                                 Hyperparameter& h) {
  const std::string field = Child("hyperparameters", path);
  if (path.empty() ||
      !std::all_of(path.begin(), path.end(),
                   [](char c) {
                     return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.';
                   }) ||
      absl::StrContains(path, "..") || path.front() == '.' || path.back() == '.') {
    return FieldError(field, "a field's path in the job spec, like optimizer.lr");
  }
  for (absl::string_view fixed : {"name", "stop_at_step", "checkpoint.resume_from"}) {
    if (path == fixed || absl::StartsWith(path, absl::StrCat(fixed, "."))) {
      return FieldError(field, "is set by the search, not searched over");
    }
  }
  h.set_path(path);
  TY_RETURN_IF_ERROR(ExpectMap(node, field));
  TY_RETURN_IF_ERROR(CheckKeys(node, field, {"type", "min", "max", "values", "value", "count"}));
  if (!IsSet(node["type"])) {
    return FieldError(Child(field, "type"), "required: const, int, double, log or categorical");
  }
  absl::StatusOr<std::string> type = ReadString(node["type"], Child(field, "type"));
  if (!type.ok()) return type.status();
  h.set_type(*type);
  auto only = [&](const std::vector<absl::string_view>& allowed) -> absl::Status {
    for (const char* key : {"min", "max", "values", "value", "count"}) {
      if (IsSet(node[key]) && std::find(allowed.begin(), allowed.end(), key) == allowed.end()) {
        return FieldError(Child(field, key), absl::StrCat("not for type ", *type));
      }
    }
    return absl::OkStatus();
  };
  if (*type == "const") {
    TY_RETURN_IF_ERROR(only({"value"}));
    if (!IsSet(node["value"])) return FieldError(Child(field, "value"), "required");
    h.add_values(Flow(node["value"]));
    return absl::OkStatus();
  }
  if (*type == "categorical") {
    TY_RETURN_IF_ERROR(only({"values"}));
    const YAML::Node values = node["values"];
    const std::string values_field = Child(field, "values");
    if (!values.IsSequence() || values.size() == 0) {
      return FieldError(values_field, "expected a list of at least one value");
    }
    if (values.size() > static_cast<size_t>(kMaxCategoricalValues)) {
      return FieldError(values_field, absl::StrCat("at most ", kMaxCategoricalValues, " values"));
    }
    std::set<std::string> seen;
    for (size_t i = 0; i < values.size(); ++i) {
      std::string text = Flow(values[i]);
      if (!seen.insert(text).second) {
        return FieldError(absl::StrCat(values_field, "[", i, "]"), "repeats a value");
      }
      h.add_values(std::move(text));
    }
    return absl::OkStatus();
  }
  if (*type != "int" && *type != "double" && *type != "log") {
    return FieldError(Child(field, "type"),
                      absl::StrCat("unknown type '", *type,
                                   "', expected const, int, double, log or categorical"));
  }
  TY_RETURN_IF_ERROR(only({"min", "max", "count"}));
  for (const char* key : {"min", "max"}) {
    const std::string key_field = Child(field, key);
    if (!IsSet(node[key])) return FieldError(key_field, "required");
    double value = 0;
    if (*type == "int") {
      absl::StatusOr<int64_t> v = ReadInt64(node[key], key_field);
      if (!v.ok()) return v.status();
      if (std::llabs(*v) > (int64_t{1} << 50)) return FieldError(key_field, "is out of range");
      value = static_cast<double>(*v);
    } else {
      absl::StatusOr<double> v = ReadDouble(node[key], key_field);
      if (!v.ok()) return v.status();
      value = *v;
    }
    if (key[1] == 'i') {
      h.set_min(value);
    } else {
      h.set_max(value);
    }
  }
  if (h.min() > h.max()) return FieldError(Child(field, "max"), "must be >= min");
  if (*type == "log" && h.min() <= 0) return FieldError(Child(field, "min"), "must be > 0 for log");
  if (IsSet(node["count"])) {
    if (*type == "int") return FieldError(Child(field, "count"), "not for type int");
    absl::StatusOr<int32_t> count = ReadInt32(node["count"], Child(field, "count"));
    if (!count.ok()) return count.status();
    if (*count < 1 || *count > kMaxSearchTrials) {
      return FieldError(Child(field, "count"),
                        absl::StrCat("must be in [1, ", kMaxSearchTrials, "]"));
    }
    h.set_count(*count);
  }
  return absl::OkStatus();
}

absl::Status ParseSearcher(const YAML::Node& node, SearcherSpec& s) {
  const std::string field = "searcher";
  if (!IsSet(node)) return FieldError(field, "required");
  TY_RETURN_IF_ERROR(ExpectMap(node, field));
  TY_RETURN_IF_ERROR(
      CheckKeys(node, field,
                {"name", "metric", "smaller_is_better", "max_trials", "max_concurrent_trials",
                 "max_failed_trials", "max_length", "divisor", "max_rungs", "seed"}));
  auto string_field = [&](const char* key, std::string* out) -> absl::Status {
    if (!IsSet(node[key])) return absl::OkStatus();
    absl::StatusOr<std::string> v = ReadString(node[key], Child(field, key));
    if (!v.ok()) return v.status();
    *out = *v;
    return absl::OkStatus();
  };
  auto int_field = [&](const char* key, int64_t min, int64_t max, auto setter) -> absl::Status {
    if (!IsSet(node[key])) return absl::OkStatus();
    absl::StatusOr<int64_t> v = ReadInt64(node[key], Child(field, key));
    if (!v.ok()) return v.status();
    if (*v < min || *v > max) {
      return FieldError(Child(field, key), absl::StrCat("must be in [", min, ", ", max, "]"));
    }
    setter(*v);
    return absl::OkStatus();
  };
  TY_RETURN_IF_ERROR(string_field("name", s.mutable_name()));
  if (s.name() != "random" && s.name() != "grid" && s.name() != "asha") {
    return FieldError(Child(field, "name"), s.name().empty()
                                                ? "required: random, grid or asha"
                                                : absl::StrCat("unknown searcher '", s.name(),
                                                               "', expected random, grid or asha"));
  }
  TY_RETURN_IF_ERROR(string_field("metric", s.mutable_metric()));
  if (s.metric().empty() || s.metric().size() > 64 ||
      !std::all_of(s.metric().begin(), s.metric().end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-';
      })) {
    return FieldError(Child(field, "metric"),
                      s.metric().empty()
                          ? "required: val_accuracy, loss, val_loss, or a figure "
                            "the template's program reports"
                          : absl::StrCat("'", s.metric(), "' is not a metric's name"));
  }
  // Losses fall as a model gets better.
  s.set_smaller_is_better(absl::EndsWith(s.metric(), "loss"));
  if (IsSet(node["smaller_is_better"])) {
    absl::StatusOr<bool> v = ReadBool(node["smaller_is_better"], Child(field, "smaller_is_better"));
    if (!v.ok()) return v.status();
    s.set_smaller_is_better(*v);
  }
  TY_RETURN_IF_ERROR(int_field("max_trials", 1, kMaxSearchTrials,
                               [&](int64_t v) { s.set_max_trials(static_cast<int32_t>(v)); }));
  if (s.max_trials() == 0 && s.name() != "grid") {
    return FieldError(Child(field, "max_trials"), "required for random and asha");
  }
  s.set_max_concurrent_trials(kDefaultMaxConcurrentTrials);
  TY_RETURN_IF_ERROR(int_field("max_concurrent_trials", 1, 1000, [&](int64_t v) {
    s.set_max_concurrent_trials(static_cast<int32_t>(v));
  }));
  TY_RETURN_IF_ERROR(int_field("max_failed_trials", 0, kMaxSearchTrials, [&](int64_t v) {
    s.set_max_failed_trials(static_cast<int32_t>(v));
  }));
  TY_RETURN_IF_ERROR(int_field("seed", INT64_MIN, INT64_MAX, [&](int64_t v) { s.set_seed(v); }));
  if (s.name() != "asha") {
    for (const char* key : {"max_length", "divisor", "max_rungs"}) {
      if (IsSet(node[key])) return FieldError(Child(field, key), "only for the asha searcher");
    }
    return absl::OkStatus();
  }
  TY_RETURN_IF_ERROR(
      int_field("max_length", 1, int64_t{1} << 40, [&](int64_t v) { s.set_max_length(v); }));
  if (s.max_length() == 0) return FieldError(Child(field, "max_length"), "required for asha");
  s.set_divisor(3);
  s.set_max_rungs(3);
  TY_RETURN_IF_ERROR(
      int_field("divisor", 2, 100, [&](int64_t v) { s.set_divisor(static_cast<int32_t>(v)); }));
  TY_RETURN_IF_ERROR(int_field("max_rungs", 1, kMaxRungs,
                               [&](int64_t v) { s.set_max_rungs(static_cast<int32_t>(v)); }));
  int64_t needed = 1;
  for (int k = 1; k < s.max_rungs(); ++k) needed *= s.divisor();
  if (s.max_length() < needed) {
    return FieldError(
        Child(field, "max_length"),
        absl::StrCat(s.max_length(), " steps cannot hold ", s.max_rungs(), " rungs with divisor ",
                     s.divisor(), " (needs at least ", needed, ")"));
  }
  return absl::OkStatus();
}

// "optimizer.lr: must be > 0" from a trial's job spec, told as the search's field: the
// hyperparameter it comes from, or the template.
absl::Status Attribute(const absl::Status& error, const SearchSpec& spec, const TrialValues& values,
                       const std::string* varied) {
  const std::string message(error.message());
  auto names = [&](const std::string& path) {
    return absl::StartsWith(message, absl::StrCat(path, ":")) ||
           absl::StartsWith(message, absl::StrCat(path, ".")) ||
           absl::StartsWith(message, absl::StrCat(path, "["));
  };
  const std::string* blamed = nullptr;
  if (varied != nullptr && names(*varied)) blamed = varied;
  for (const Hyperparameter& h : spec.hyperparameters()) {
    if (blamed == nullptr && names(h.path())) blamed = &h.path();
  }
  if (blamed == nullptr && varied != nullptr) blamed = varied;
  if (blamed == nullptr) return absl::InvalidArgumentError(absl::StrCat("template.", message));
  return absl::InvalidArgumentError(
      absl::StrCat("hyperparameters.", *blamed, ": ", values.at(*blamed), " makes ", message));
}

absl::Status CheckTrials(const SearchSpec& spec) {
  TrialValues base;
  for (const Hyperparameter& h : spec.hyperparameters()) base[h.path()] = Corners(h).front();
  absl::StatusOr<v1::JobSpec> job = TrialJobSpec(spec, base);
  if (!job.ok()) return Attribute(job.status(), spec, base, nullptr);
  const SearcherSpec& s = spec.searcher();
  if (!job->has_program() && !IsTrainerMetric(s.metric())) {
    return FieldError("searcher.metric",
                      absl::StrCat("unknown metric '", s.metric(),
                                   "': the trainer reports val_accuracy, loss and val_loss (a "
                                   "template's own program may report others)"));
  }
  if (s.metric() == "val_accuracy" && !job->has_program()) {
    if (job->loss() != "cross_entropy") {
      return FieldError("searcher.metric", "val_accuracy needs template.loss: cross_entropy");
    }
    if (job->data().validation_split() <= 0) {
      return FieldError("searcher.metric", "val_accuracy needs template.data.validation_split > 0");
    }
  }
  if (s.name() == "asha" && !job->checkpoint().resume_from().empty()) {
    return FieldError("template.checkpoint.resume_from",
                      "not with asha, whose rungs resume from each other");
  }
  for (const Hyperparameter& h : spec.hyperparameters()) {
    const std::vector<std::string> corners = Corners(h);
    for (size_t i = 1; i < corners.size(); ++i) {
      TrialValues values = base;
      values[h.path()] = corners[i];
      absl::StatusOr<v1::JobSpec> varied = TrialJobSpec(spec, values);
      if (!varied.ok()) return Attribute(varied.status(), spec, values, &h.path());
    }
  }
  return absl::OkStatus();
}

absl::Status ParseSearch(const YAML::Node& root, SearchSpec& spec) {
  if (!IsSet(root)) return FieldError("spec", "the search spec is empty");
  TY_RETURN_IF_ERROR(ExpectMap(root, "spec"));
  TY_RETURN_IF_ERROR(CheckKeys(root, "", {"name", "searcher", "hyperparameters", "template"}));
  if (!IsSet(root["name"])) return FieldError("name", "required");
  absl::StatusOr<std::string> name = ReadString(root["name"], "name");
  if (!name.ok()) return name.status();
  spec.set_name(*name);
  TY_RETURN_IF_ERROR(ParseSearcher(root["searcher"], *spec.mutable_searcher()));

  const YAML::Node space = root["hyperparameters"];
  if (!IsSet(space)) return FieldError("hyperparameters", "required: at least one");
  TY_RETURN_IF_ERROR(ExpectMap(space, "hyperparameters"));
  if (space.size() == 0) return FieldError("hyperparameters", "required: at least one");
  if (space.size() > static_cast<size_t>(kMaxHyperparameters)) {
    return FieldError("hyperparameters", absl::StrCat("at most ", kMaxHyperparameters));
  }
  std::set<std::string> paths;
  for (const auto& item : space) {
    if (!item.first.IsScalar()) return FieldError("hyperparameters", "keys must be field paths");
    const std::string path = item.first.Scalar();
    // One path inside another would have two values for the same field.
    for (const std::string& other : paths) {
      if (path == other || absl::StartsWith(path, other + ".") ||
          absl::StartsWith(other, path + ".")) {
        return FieldError(Child("hyperparameters", path),
                          absl::StrCat("overlaps hyperparameters.", other));
      }
    }
    paths.insert(path);
    TY_RETURN_IF_ERROR(ParseHyperparameter(path, item.second, *spec.add_hyperparameters()));
    const Hyperparameter& h = spec.hyperparameters(spec.hyperparameters_size() - 1);
    if (spec.searcher().name() == "asha") {
      for (absl::string_view owned : {"max_steps", "epochs"}) {
        if (path == owned) {
          return FieldError(Child("hyperparameters", path),
                            "asha sets it (searcher.max_length): not searched over");
        }
      }
    }
    if (spec.searcher().name() == "grid" && (h.type() == "double" || h.type() == "log") &&
        h.count() == 0) {
      return FieldError(Child(Child("hyperparameters", path), "count"),
                        "required by the grid searcher for double and log ranges");
    }
  }

  const YAML::Node job = root["template"];
  if (!IsSet(job)) return FieldError("template", "required: the job spec of every trial");
  TY_RETURN_IF_ERROR(ExpectMap(job, "template"));
  YAML::Emitter out;
  out << job;
  spec.set_template_yaml(out.c_str());

  SearcherSpec& s = *spec.mutable_searcher();
  if (s.name() == "grid") {
    const int64_t size = GridSize(spec);
    if (size > kMaxSearchTrials) {
      return FieldError("hyperparameters",
                        absl::StrCat("the grid has more than ", kMaxSearchTrials, " points"));
    }
    if (s.max_trials() == 0) s.set_max_trials(static_cast<int32_t>(size));
    if (s.max_trials() > size) {
      return FieldError("searcher.max_trials",
                        absl::StrCat(s.max_trials(), " is more than the grid's ", size, " points"));
    }
  }
  return CheckTrials(spec);
}

}  // namespace

absl::StatusOr<SearchSpec> ParseSearchYaml(absl::string_view yaml) {
  SearchSpec spec;
  absl::Status parsed =
      ParseYamlDocument(yaml, [&spec](const YAML::Node& root) { return ParseSearch(root, spec); });
  if (!parsed.ok()) return parsed;
  return spec;
}

int64_t GridSize(const SearchSpec& spec) {
  int64_t size = 1;
  for (const Hyperparameter& h : spec.hyperparameters()) {
    size = std::min<int64_t>(size * std::min<int64_t>(GridPoints(h), kMaxSearchTrials + 1),
                             kMaxSearchTrials + 1);
  }
  return size;
}

TrialValues ValuesOfTrial(const SearchSpec& spec, int number) {
  TrialValues values;
  const int n = spec.hyperparameters_size();
  if (spec.searcher().name() == "grid") {
    int64_t rest = number;
    for (int i = n - 1; i >= 0; --i) {
      const Hyperparameter& h = spec.hyperparameters(i);
      const int64_t points = GridPoints(h);
      values[h.path()] = GridValue(h, rest % points);
      rest /= points;
    }
    return values;
  }
  for (int i = 0; i < n; ++i) {
    const Hyperparameter& h = spec.hyperparameters(i);
    values[h.path()] = DrawnValue(h, Uniform(spec.searcher().seed(), number, i));
  }
  return values;
}

absl::StatusOr<v1::JobSpec> TrialJobSpec(const SearchSpec& spec, const TrialValues& values) {
  std::string text;
  try {
    YAML::Node root = YAML::Load(spec.template_yaml());
    if (!root.IsMap()) return FieldError("template", "expected a mapping");
    YAML::Node program = root["program"];
    const bool own_program = program.IsMap();
    // A program's hyperparameters go into its command and environment where they are named.
    const TrialValues at_paths = own_program ? SubstituteIntoProgram(program, values) : values;
    for (const auto& [path, value] : at_paths) {
      const std::vector<std::string> parts = absl::StrSplit(path, '.');
      YAML::Node node = root;
      std::string at;
      for (size_t i = 0; i + 1 < parts.size(); ++i) {
        at = Child(at, parts[i]);
        YAML::Node next = node[parts[i]];
        if (!IsSet(next)) {
          node[parts[i]] = YAML::Node(YAML::NodeType::Map);
          next = node[parts[i]];
        } else if (!next.IsMap()) {
          return FieldError(
              at, absl::StrCat("expected a mapping to hold ", path, ", got ", Describe(next)));
        }
        node.reset(next);
      }
      node[parts.back()] = YAML::Load(value);
    }
    // A program runs as long as it says; its rungs end at stop_at_step all the same.
    if (spec.searcher().name() == "asha" && !own_program) {
      root["max_steps"] = spec.searcher().max_length();
      root.remove("epochs");
    }
    if (!IsSet(root["name"])) root["name"] = spec.name();
    YAML::Emitter out;
    out << root;
    text = out.c_str();
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("template: ", e.what()));
  }
  return ParseJobSpecYaml(text);
}

std::vector<int64_t> RungEndSteps(const SearcherSpec& searcher) {
  const int rungs = std::max(1, searcher.max_rungs());
  const int64_t divisor = std::max(2, searcher.divisor());
  int64_t first = searcher.max_length();
  for (int k = 1; k < rungs; ++k) first /= divisor;
  std::vector<int64_t> steps;
  int64_t step = std::max<int64_t>(1, first);
  for (int k = 0; k + 1 < rungs; ++k, step *= divisor) steps.push_back(step);
  steps.push_back(searcher.max_length());
  return steps;
}

bool PromotedAtRung(double value, std::vector<double> reached, int divisor,
                    bool smaller_is_better) {
  const size_t kept = std::max<size_t>(1, reached.size() / static_cast<size_t>(divisor));
  std::sort(reached.begin(), reached.end());
  if (smaller_is_better) return value <= reached[kept - 1];
  return value >= reached[reached.size() - kept];
}

}  // namespace trainyard
