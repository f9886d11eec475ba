#ifndef TRAINYARD_TESTS_COMMON_PROCESSES_H_
#define TRAINYARD_TESTS_COMMON_PROCESSES_H_

// Other processes as the tests see them, from /proc.

#include <signal.h>
#include <sys/types.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace trainyard::testing {

// /proc/PID/stat after the command, whose name may hold spaces and parentheses: "S 1234 ...",
// the state first, then the parent's pid. Empty when there is no such process.
inline std::string ProcStatAfterCommand(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::ostringstream text;
  text << in.rdbuf();
  const std::string stat = text.str();
  const size_t close = stat.rfind(')');
  return close == std::string::npos ? "" : stat.substr(close + 1);
}

// Whether `pid` is a process that has not yet exited: a zombie is gone as far as work goes.
inline bool ProcessAlive(pid_t pid) {
  if (kill(pid, 0) != 0) return false;
  std::istringstream rest(ProcStatAfterCommand(pid));
  std::string state;
  return !(rest >> state) || (state != "Z" && state != "X");
}

// The processes whose parent is `parent` now.
inline std::vector<pid_t> ChildProcesses(pid_t parent) {
  std::vector<pid_t> out;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    pid_t pid = 0;
    if (!absl::SimpleAtoi(entry.path().filename().string(), &pid)) continue;
    std::istringstream rest(ProcStatAfterCommand(pid));
    std::string state;
    pid_t ppid = 0;
    if (rest >> state >> ppid && ppid == parent) out.push_back(pid);
  }
  return out;
}

}  // namespace trainyard::testing

#endif  // TRAINYARD_TESTS_COMMON_PROCESSES_H_
