#include "common/spec/job_paths.h"

#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/sha256.h"
#include "common/spec/yaml_fields.h"
#include "common/storage/file_object_store.h"
#include "common/storage/object_cache.h"
#include "common/storage/object_store.h"

namespace trainyard {

absl::StatusOr<std::vector<JobLocation>> JobLocations(const v1::JobSpec& spec) {
  std::vector<std::pair<std::string, const std::string*>> fields = {
      {"data.train", &spec.data().train()},
      {"data.tokens", &spec.data().tokens()},
      {"model.torchscript", &spec.model().torchscript()}};
  for (int i = 0; i < spec.model().stages_size(); ++i) {
    fields.emplace_back(absl::StrCat("model.stages[", i, "]"), &spec.model().stages(i));
  }
  fields.emplace_back("distill.teacher", &spec.distill().teacher());
  fields.emplace_back("program.workdir", &spec.program().workdir());
  fields.emplace_back("checkpoint.uri", &spec.checkpoint().uri());
  std::vector<JobLocation> locations;
  for (auto& [field, value] : fields) {
    if (value->empty()) continue;
    absl::StatusOr<Uri> uri = ParseUri(*value);
    if (!uri.ok()) return FieldError(field, uri.status().message());
    locations.push_back(
        {field, *value, *std::move(uri), field == "checkpoint.uri", field == "program.workdir"});
  }
  return locations;
}

std::string OwnerFolder(absl::string_view owner) {
  bool plain = !owner.empty() && owner.size() <= 128 && !absl::StartsWith(owner, "u-");
  bool dots_only = true;
  for (char c : owner) {
    plain &= absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
    dots_only &= c == '.';
  }
  if (plain && !dots_only) return std::string(owner);
  return absl::StrCat("u-", Sha256Hex(owner).substr(0, 16));
}

std::string FixedPart(const std::string& path) {
  const size_t wild = path.find_first_of("*?[");
  if (wild == std::string::npos) return path;
  return path.substr(0, path.rfind('/', wild) + 1);
}

absl::Status CheckLocalPaths(const v1::JobSpec& spec, const std::vector<std::string>& allowed) {
  absl::StatusOr<std::vector<JobLocation>> locations = JobLocations(spec);
  if (!locations.ok()) return locations.status();
  const std::string where =
      allowed.empty() ? "no local paths are allowed here: use object storage (s3://)"
                      : absl::StrCat("local paths must be under ", absl::StrJoin(allowed, ", "));
  std::vector<Uri> folders;
  std::vector<Uri> real_folders;
  for (const std::string& folder : allowed) {
    absl::StatusOr<Uri> uri = ParseUri(folder);
    if (!uri.ok()) return uri.status();
    folders.push_back(*uri);
    if (absl::StatusOr<std::string> real = RealPathOfExisting(uri->path); real.ok()) {
      real_folders.push_back(Uri{"file", "", *real});
    }
  }
  auto inside = [](const Uri& uri, const std::vector<Uri>& within) {
    for (const Uri& folder : within) {
      if (IsWithin(uri, folder)) return true;
    }
    return false;
  };
  for (const JobLocation& location : *locations) {
    if (!location.uri.local()) continue;
    if (!inside(location.uri, folders)) {
      return absl::InvalidArgumentError(absl::StrCat(location.field, ": '", location.value,
                                                     "' is outside the folders this "
                                                     "coordinator allows; ",
                                                     where));
    }
    // Symbolic links this machine can see: where the path really leads.
    absl::StatusOr<std::string> real = RealPathOfExisting(FixedPart(location.uri.path));
    if (real.ok() && !inside(Uri{"file", "", *real}, real_folders)) {
      return absl::InvalidArgumentError(absl::StrCat(
          location.field, ": '", location.value, "' leads through a symbolic link to '", *real,
          "', outside the folders this coordinator allows; ", where));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> CheckLocalFiles(const v1::JobSpec& spec) {
  absl::StatusOr<std::vector<JobLocation>> locations = JobLocations(spec);
  if (!locations.ok()) return locations.status();
  std::vector<std::string> unchecked;
  for (const JobLocation& location : *locations) {
    if (!location.uri.local() || location.written) continue;
    const std::string& path = location.uri.path;
    if (location.folder) {
      // A folder (or an archive): it must be there when the machine has what holds it.
      std::error_code ec;
      const std::filesystem::path place(path);
      if (!std::filesystem::is_directory(place.parent_path(), ec)) {
        unchecked.push_back(absl::StrCat(location.field, " (", place.parent_path().string(),
                                         " is not on the coordinator's machine)"));
      } else if (!std::filesystem::exists(place, ec)) {
        return FieldError(location.field, absl::StrCat("no folder '", location.value, "'"));
      }
      continue;
    }
    // The folder up to the first wildcard: what must exist here for the check to mean anything.
    const std::string fixed = FixedPart(path);
    const std::string folder = fixed.substr(0, fixed.rfind('/') + 1);
    std::error_code ec;
    if (!std::filesystem::is_directory(folder, ec)) {
      unchecked.push_back(
          absl::StrCat(location.field, " (", folder, " is not on the coordinator's machine)"));
      continue;
    }
    FileObjectStore files;
    absl::StatusOr<std::vector<std::string>> matches =
        ExpandObjectGlob(files, location.uri.ToString());
    if (absl::IsNotFound(matches.status())) {
      const bool wild = fixed != path;
      return FieldError(location.field,
                        absl::StrCat(wild ? "no files match '" : "no file '", location.value, "'"));
    }
  }
  return unchecked;
}

}  // namespace trainyard
