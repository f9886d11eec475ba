#ifndef TRAINYARD_COMMON_FORMATS_WORKDIR_ARCHIVE_H_
#define TRAINYARD_COMMON_FORMATS_WORKDIR_ARCHIVE_H_

// A program's workdir as one archive: packed by the CLI from a local folder, stored by the
// coordinator by its SHA-256, unpacked by the trainer into the task's folder. A POSIX tar
// (libarchive) of regular files only, in path order, with no owner, time or mode other than the
// executable bit, so that the same files always make the same bytes (and the same hash).

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace trainyard {

// The limit on a workdir's files, in bytes, unless the coordinator's --max_workdir_size says
// otherwise.
inline constexpr int64_t kDefaultMaxWorkdirBytes = int64_t{100} << 20;
// Files of the workdir's root holding .gitignore-style patterns of what not to pack (both are
// read, .trainyardignore last, so it may take back with "!" what .gitignore leaves out).
inline constexpr char kGitignoreFile[] = ".gitignore";
inline constexpr char kTrainyardignoreFile[] = ".trainyardignore";

// The patterns of .gitignore files (gitignore(5)): "#" comments, "!" to include again, a
// trailing "/" for folders only, a pattern with a "/" anchored at the root (else matched
// against the name at any depth), "*", "?", "[...]" within a name and "**" across folders.
// The last pattern that matches decides. Nested .gitignore files are not read.
class IgnoreRules {
 public:
  void Add(absl::string_view text);
  // Whether `path` (relative to the root, '/'-separated) is left out.
  bool Ignored(absl::string_view path, bool is_folder) const;

 private:
  struct Rule {
    std::vector<std::string> segments;  // the pattern split at '/'; "**" for any folders
    bool negate = false;
    bool folders_only = false;
    bool anchored = false;
  };
  std::vector<Rule> rules_;
};

struct PackedWorkdir {
  std::string sha256;  // of the archive's bytes
  int64_t archive_bytes = 0;
  int64_t file_bytes = 0;  // the files' own bytes
  int files = 0;
  std::vector<std::string> left_out;  // links leading outside the folder, and folder links
};

// Packs the files below `dir` (what .gitignore and .trainyardignore leave, and never .git/) into
// the new file `archive_path`. A link to a file inside the folder is packed as that file; links
// leading outside it, and links to folders, are left out and listed. `progress(bytes, files)` is
// called now and then. FAILED_PRECONDITION when the files exceed `max_bytes` (naming their size,
// the limit and how to leave files out), INVALID_ARGUMENT for a name the archive cannot hold,
// NOT_FOUND for a missing folder, UNAVAILABLE for what cannot be read or written.
absl::StatusOr<PackedWorkdir> PackWorkdir(
    const std::string& dir, const std::string& archive_path, int64_t max_bytes,
    const std::function<void(int64_t bytes, int files)>& progress = nullptr);

// Unpacks the archive in the local file `archive_path` into `dir`: regular files and folders
// only, at paths that stay below `dir` (no "..", no absolute path, nothing through a link).
// INVALID_ARGUMENT naming an entry that breaks the rules, UNAVAILABLE for what cannot be read or
// written; on error what was unpacked so far stays (the caller empties `dir`).
absl::Status UnpackWorkdir(const std::string& archive_path, const std::string& dir);

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_FORMATS_WORKDIR_ARCHIVE_H_
