#ifndef TRAINYARD_CLIENT_LOCAL_CLUSTER_H_
#define TRAINYARD_CLIENT_LOCAL_CLUSTER_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace trainyard::cli {

struct LocalClusterOptions {
  int workers = 2;
  int slots = 0;  // per worker; 0: max(1, cores / workers)
  int port = 7070;
  std::string state_dir;  // empty: a new temporary folder
  std::string bin_dir;    // where trainyard-coordinator and trainyard-worker are
  absl::Duration start_timeout = absl::Seconds(30);
};

// `trainyard up`: runs a coordinator and `workers` worker agents on this machine in the
// foreground until SIGINT/SIGTERM, then stops the workers (SIGINT, wait), then the coordinator.
// A worker that exits or is killed meanwhile is reported on stderr (name, exit, the end of its
// log) and stays down while the rest go on, as a lost machine would; the coordinator's end stops
// everything. Their logs go to {state_dir}/logs/. Returns the exit code: 0 after a requested
// shutdown, 1 if the coordinator died on its own or a child could not be started. Call from the
// main thread.
int RunLocalCluster(const LocalClusterOptions& options);

// The port in a coordinator port file ("7070", "127.0.0.1:7070", with or without a newline).
// INVALID_ARGUMENT if there is none.
absl::StatusOr<int> ParsePortFile(const std::string& text);

}  // namespace trainyard::cli

#endif  // TRAINYARD_CLIENT_LOCAL_CLUSTER_H_
