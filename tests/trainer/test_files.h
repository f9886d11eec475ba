#ifndef TRAINYARD_TESTS_TRAINER_TEST_FILES_H_
#define TRAINYARD_TESTS_TRAINER_TEST_FILES_H_

// Temporary folders and small file helpers shared by the trainer's test programs.

#include <dirent.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace trainyard::trainer::test_files {

// Folders made by MakeTempDir, removed when the test program ends.
inline std::vector<std::string>& TempDirs() {
  static auto* const dirs = new std::vector<std::string>();
  return *dirs;
}

// Removes `dir` and everything under it, never following links. Not std::filesystem::remove_all:
// PyTorch's pip LibTorch (built against an older libstdc++) exports its own copy of it, which
// programs linking that LibTorch bind to, and that copy calls through a null pointer.
inline void RemoveTree(const std::string& dir) {
  nftw(
      dir.c_str(),
      [](const char* path, const struct stat*, int, struct FTW*) { return remove(path); }, 16,
      FTW_DEPTH | FTW_PHYS);
}

class RemoveTempDirs : public ::testing::Environment {
 public:
  void TearDown() override {
    for (const std::string& dir : TempDirs()) RemoveTree(dir);
  }
};

// A new empty folder under the test temp dir; registers its removal at exit on first use.
inline std::string MakeTempDir() {
  static ::testing::Environment* const remove =
      ::testing::AddGlobalTestEnvironment(new RemoveTempDirs);
  (void)remove;
  std::string pattern = ::testing::TempDir() + "trainer_test.XXXXXX";
  EXPECT_NE(mkdtemp(pattern.data()), nullptr);
  TempDirs().push_back(pattern);
  return pattern;
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

inline bool FileExists(const std::string& path) { return std::ifstream(path).good(); }

// The file that the newest attempt wrote for `base` ("MANIFEST", "model", "optimizer",
// "trainer_state") in the step folder `step_dir`: "{base}.g{G}.json" or ".safetensors" with the
// largest G there (worker/trainer/checkpoint/checkpoint.h), or a path that does not exist.
inline std::string StepFile(const std::string& step_dir, const std::string& base) {
  const std::string ext = base == "MANIFEST" || base == "trainer_state" ? ".json" : ".safetensors";
  const std::string prefix = base + ".g";
  long long newest = -1;
  if (DIR* dir = opendir(step_dir.c_str()); dir != nullptr) {
    while (const dirent* entry = readdir(dir)) {
      const std::string name = entry->d_name;
      if (name.size() <= prefix.size() + ext.size() ||
          name.compare(0, prefix.size(), prefix) != 0 ||
          name.compare(name.size() - ext.size(), ext.size(), ext) != 0) {
        continue;
      }
      const std::string digits =
          name.substr(prefix.size(), name.size() - prefix.size() - ext.size());
      if (digits.find_first_not_of("0123456789") != std::string::npos) continue;
      newest = std::max(newest, std::stoll(digits));
    }
    closedir(dir);
  }
  return newest < 0 ? step_dir + "/" + base + ".none" + ext
                    : step_dir + "/" + prefix + std::to_string(newest) + ext;
}

}  // namespace trainyard::trainer::test_files

#endif  // TRAINYARD_TESTS_TRAINER_TEST_FILES_H_
