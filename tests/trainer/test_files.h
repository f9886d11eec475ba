#ifndef TRAINYARD_TESTS_TRAINER_TEST_FILES_H_
#define TRAINYARD_TESTS_TRAINER_TEST_FILES_H_

// Temporary folders and small file helpers shared by the trainer's test programs.

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>

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

}  // namespace trainyard::trainer::test_files

#endif  // TRAINYARD_TESTS_TRAINER_TEST_FILES_H_
