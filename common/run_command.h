#ifndef TRAINYARD_COMMON_RUN_COMMAND_H_
#define TRAINYARD_COMMON_RUN_COMMAND_H_

// Runs a command to its end and keeps what it printed: for the few programs the coordinator
// calls as a user would (Slurm's sbatch, squeue and scancel).

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace trainyard {

struct CommandResult {
  int exit_code = 0;  // meaningful when signal == 0
  int signal = 0;     // the signal that ended it (SIGKILL after the timeout), 0 if it exited
  std::string out;    // its stdout, at most kMaxCommandOutput bytes
  std::string err;    // its stderr, likewise
  bool ok() const { return signal == 0 && exit_code == 0; }
};

inline constexpr size_t kMaxCommandOutput = 1 << 20;

// Runs `argv` (argv[0] looked up on PATH) with stdin from /dev/null, every signal at its default
// and none blocked, and `extra_env` on top of this process's environment, waits at most `timeout`
// (then SIGKILL), and returns how it ended and what it printed. NOT_FOUND when the program does not
// exist, INTERNAL when it cannot be started; a program that runs and fails is a result, not an
// error. Thread-safe.
absl::StatusOr<CommandResult> RunCommand(const std::vector<std::string>& argv,
                                         const std::vector<std::string>& extra_env,
                                         absl::Duration timeout);

// "exit 1: sbatch: error: invalid partition specified: x": how it ended and the last line of
// stderr (else stdout), for messages.
std::string DescribeCommandEnd(const CommandResult& r);

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_RUN_COMMAND_H_
