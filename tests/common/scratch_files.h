#ifndef TRAINYARD_TESTS_COMMON_SCRATCH_FILES_H_
#define TRAINYARD_TESTS_COMMON_SCRATCH_FILES_H_

// A scratch folder for a unit test, and whole files written and read in it.

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace trainyard::testing {

// A new folder under /tmp, removed with everything in it on destruction.
class ScratchFolder {
 public:
  ScratchFolder() {
    char name[] = "/tmp/trainyard-scratch-XXXXXX";
    path_ = ::mkdtemp(name);
  }
  ~ScratchFolder() { std::filesystem::remove_all(path_); }
  ScratchFolder(const ScratchFolder&) = delete;
  ScratchFolder& operator=(const ScratchFolder&) = delete;
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& child) const { return path_ + "/" + child; }

 private:
  std::string path_;
};

// Writes `text` as the whole of `path`, making its folders.
inline void WriteText(const std::string& path, const std::string& text) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

// The whole of `path`; empty when it cannot be read.
inline std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace trainyard::testing

#endif  // TRAINYARD_TESTS_COMMON_SCRATCH_FILES_H_
