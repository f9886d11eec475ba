#ifndef TRAINYARD_TESTS_COMMON_PROCESS_CPU_H_
#define TRAINYARD_TESTS_COMMON_PROCESS_CPU_H_

#include <sys/types.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace trainyard::testing {

// CPU time (user + system) of a process so far, in seconds, from /proc/PID/stat; -1 if it
// cannot be read.
inline double CpuSeconds(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::ostringstream text;
  text << in.rdbuf();
  const std::string stat = text.str();
  // Fields counted from the last ')': the command may hold spaces and parentheses.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos || close + 2 > stat.size()) return -1;
  std::vector<absl::string_view> f = absl::StrSplit(absl::string_view(stat).substr(close + 2), ' ');
  int64_t user = 0, system = 0;
  if (f.size() < 13 || !absl::SimpleAtoi(f[11], &user) || !absl::SimpleAtoi(f[12], &system)) {
    return -1;
  }
  return static_cast<double>(user + system) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

}  // namespace trainyard::testing

#endif  // TRAINYARD_TESTS_COMMON_PROCESS_CPU_H_
