#ifndef TRAINYARD_TESTS_COMMON_RUN_SHELL_H_
#define TRAINYARD_TESTS_COMMON_RUN_SHELL_H_

#include <stdio.h>
#include <sys/wait.h>

#include <string>
#include <utility>

namespace trainyard::testing {

// Runs `command` with /bin/sh; returns its exit code (-1 if it did not exit) and its output,
// stderr included.
inline std::pair<int, std::string> RunShell(const std::string& command) {
  std::string output;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return {-1, ""};
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) output.append(buffer, n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

}  // namespace trainyard::testing

#endif  // TRAINYARD_TESTS_COMMON_RUN_SHELL_H_
