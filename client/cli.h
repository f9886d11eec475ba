#ifndef TRAINYARD_CLIENT_CLI_H_
#define TRAINYARD_CLIENT_CLI_H_

#include <string>
#include <vector>

namespace trainyard::cli {

// Exit codes of the `trainyard` CLI.
inline constexpr int kExitSucceeded = 0;     // also: any command that did what it was asked
inline constexpr int kExitJobFailed = 1;     // submit --wait: the job (or search) FAILED
inline constexpr int kExitUsage = 2;         // bad flags or arguments, refused job spec
inline constexpr int kExitJobCancelled = 3;  // submit --wait: the job (or search) was CANCELLED
inline constexpr int kExitRpcError = 4;      // cannot reach the coordinator, or it said no
inline constexpr int kExitStorageError = 5;  // delete --checkpoints: the object store failed

// Runs `trainyard ARGS...` (argv without the program name) and returns the exit code. Writes
// results to stdout and errors ("error: ...") to stderr.
int RunCli(const std::vector<std::string>& args);

}  // namespace trainyard::cli

#endif  // TRAINYARD_CLIENT_CLI_H_
