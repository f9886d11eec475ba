// A program's workdir archive (a tar, from any user with a token) as the trainer unpacks it into
// the task's folder, and the .gitignore patterns the CLI packs by. The first byte picks which.
// Unpacking must leave nothing outside its folder and no link inside it, whatever the archive
// says; a pattern must match in bounded time (the run's timeout catches one that does not).

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/formats/workdir_archive.h"
#include "tests/fuzz/fuzz_support.h"

namespace fs = std::filesystem;

namespace {

const std::string& Sandbox() {
  static const std::string dir = trainyard::fuzz::MakeScratchDir("workdir");
  return dir;
}

void Unpack(absl::string_view archive) {
  const std::string sandbox = Sandbox();
  const std::string tar = sandbox + "/in.tar";
  const std::string dir = sandbox + "/out/task";
  fs::remove_all(sandbox + "/out");
  fs::create_directories(dir);
  std::ofstream(tar, std::ios::binary | std::ios::trunc).write(archive.data(), archive.size());
  trainyard::UnpackWorkdir(tar, dir).IgnoreError();
  // Whatever happened: nothing beside the task's folder, and no link below it.
  for (const fs::directory_entry& e : fs::directory_iterator(sandbox + "/out")) {
    if (e.path() != dir) __builtin_trap();
  }
  for (const fs::directory_entry& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_symlink() || !(e.is_regular_file() || e.is_directory())) __builtin_trap();
  }
}

void Match(absl::string_view text) {
  // The patterns, then (after a line "--") the paths to try.
  const size_t split = text.find("\n--\n");
  trainyard::IgnoreRules rules;
  rules.Add(text.substr(0, split));
  if (split == absl::string_view::npos) return;
  for (absl::string_view path : absl::StrSplit(text.substr(split + 4), '\n')) {
    rules.Ignored(path, /*is_folder=*/false);
    rules.Ignored(path, /*is_folder=*/true);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const absl::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] & 1) {
    Match(rest);
  } else {
    Unpack(rest);
  }
  return 0;
}
