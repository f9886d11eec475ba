#ifndef TRAINYARD_TESTS_COMMON_PROCESS_CPU_H_
#define TRAINYARD_TESTS_COMMON_PROCESS_CPU_H_

#include <sys/types.h>
#include <unistd.h>

#include <cstdint>
#include <sstream>
#include <string>

#include "tests/common/processes.h"

namespace trainyard::testing {

// CPU time (user + system) of a process so far, in seconds, from /proc/PID/stat; -1 if it
// cannot be read.
inline double CpuSeconds(pid_t pid) {
  std::istringstream fields(ProcStatAfterCommand(pid));
  std::string skip;
  for (int i = 0; i < 11 && fields >> skip; ++i) {
  }
  int64_t user = 0, system = 0;
  if (!(fields >> user >> system)) return -1;
  return static_cast<double>(user + system) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

}  // namespace trainyard::testing

#endif  // TRAINYARD_TESTS_COMMON_PROCESS_CPU_H_
