#include "server/jobs/worker_limits.h"

#include <fnmatch.h>

#include <exception>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/byte_size.h"
#include "yaml-cpp/yaml.h"

namespace trainyard {
namespace {

absl::Status EntryError(size_t i, absl::string_view field, absl::string_view problem) {
  return absl::InvalidArgumentError(
      absl::StrCat("worker limits: entry ", i + 1, ": ", field, ": ", problem));
}

// A non-negative count of `field` in `node`, or the error naming it.
absl::StatusOr<int> Count(const YAML::Node& node, size_t i, const char* field) {
  int value = -1;
  try {
    value = node.as<int>();
  } catch (const std::exception&) {
    return EntryError(i, field, "must be a whole number");
  }
  if (value < 0) return EntryError(i, field, "must be >= 0");
  return value;
}

}  // namespace

absl::StatusOr<WorkerLimits> WorkerLimits::Parse(absl::string_view yaml) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("worker limits: not YAML: ", e.what()));
  }
  WorkerLimits limits;
  if (root.IsNull()) return limits;
  if (!root.IsSequence()) {
    return absl::InvalidArgumentError(
        "worker limits: expected a list of {name, slots, gpus, memory}");
  }
  for (size_t i = 0; i < root.size(); ++i) {
    const YAML::Node entry = root[i];
    if (!entry.IsMap()) return EntryError(i, "entry", "expected {name, slots, gpus, memory}");
    WorkerLimit limit;
    for (const auto& field : entry) {
      const std::string key = field.first.as<std::string>();
      if (key == "name") {
        limit.name = field.second.as<std::string>();
      } else if (key == "slots" || key == "gpus") {
        absl::StatusOr<int> n = Count(field.second, i, key.c_str());
        if (!n.ok()) return n.status();
        (key == "slots" ? limit.slots : limit.gpus) = *n;
      } else if (key == "memory") {
        absl::StatusOr<int64_t> bytes = ParseByteSize(field.second.as<std::string>());
        if (!bytes.ok()) return EntryError(i, "memory", bytes.status().message());
        limit.memory_bytes = *bytes;
      } else {
        return EntryError(i, key, "unknown field (name, slots, gpus, memory)");
      }
    }
    if (!entry["name"]) return EntryError(i, "name", "missing (a glob on worker names)");
    limits.entries_.push_back(limit);
  }
  return limits;
}

absl::StatusOr<WorkerLimits> WorkerLimits::Load(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream text;
  text << in.rdbuf();
  return Parse(text.str());
}

const WorkerLimit& WorkerLimits::For(absl::string_view name) const {
  const std::string worker(name);
  for (const WorkerLimit& entry : entries_) {
    if (fnmatch(entry.name.c_str(), worker.c_str(), 0) == 0) return entry;
  }
  return defaults_;
}

absl::Status WorkerLimits::Check(absl::string_view name, int slots, int gpus,
                                 int64_t memory_bytes) const {
  const WorkerLimit& limit = For(name);
  auto over = [&](const char* field, const std::string& claim, const std::string& bound) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": worker ", name, " claims ", claim, ", over its limit of ", bound,
                     " (--worker_limits_file, entry '", limit.name, "')"));
  };
  if (slots > limit.slots) return over("slots", absl::StrCat(slots), absl::StrCat(limit.slots));
  if (gpus > limit.gpus) return over("gpus", absl::StrCat(gpus), absl::StrCat(limit.gpus));
  if (memory_bytes > limit.memory_bytes) {
    return over("memory_bytes", HumanBytes(memory_bytes), HumanBytes(limit.memory_bytes));
  }
  return absl::OkStatus();
}

}  // namespace trainyard
