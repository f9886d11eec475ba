#ifndef TRAINYARD_COMMON_EXIT_CODES_H_
#define TRAINYARD_COMMON_EXIT_CODES_H_

#include <string>

namespace trainyard {

// How a trainer process ends. The agent reports the code; the coordinator classifies it
// (user error vs infrastructure) for its restart policy. A trainer that fails also writes a
// one-line cause to the file kTerminationMessageFile in its working directory.
inline constexpr int kExitOk = 0;
inline constexpr int kExitInternal = 1;        // a bug or an unexpected error
inline constexpr int kExitUserError = 2;       // bad spec, data, model: retrying will not help
inline constexpr int kExitInfrastructure = 3;  // object store, coordinator, peers: may succeed
// Stopped by SIGTERM or SIGINT at a step boundary, after saving that step (128 + 15).
inline constexpr int kExitStoppedBySignal = 143;

inline constexpr char kTerminationMessageFile[] = "termination-message";
// Written by the agent into the trainer's working directory before it sends SIGTERM to ask for a
// save at the next agreed step and an exit by a deadline: one line, decimal unix milliseconds.
inline constexpr char kStopDeadlineFile[] = "stop-deadline";
// Written by a parameter-server shard into its working directory about once a second (replaced
// whole): one "name value" line per counter of ShardStats, which the agent exports as metrics.
inline constexpr char kShardMetricsFile[] = "shard-metrics";
// Written by a trainer rank into its working directory after every update: the step count, in
// decimal, padded with spaces to a fixed width and rewritten in place. The agent reads it when the
// task ends and reports it as TaskStatus.last_step.
inline constexpr char kLastStepFile[] = "last-step";
// The task's output (its stdout and stderr), which the agent writes into the task folder and
// ships as its log.
inline constexpr char kTaskOutputFile[] = "output.log";

// "SIGKILL", "SIGTERM", ...; "signal N" for ones without a name here.
std::string SignalName(int sig);
// How a process ended, as messages say it: "exited with code 3", "killed by signal 9 (SIGKILL)".
std::string DescribeExit(int exit_code, int signal);

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_EXIT_CODES_H_
