#ifndef TRAINYARD_SERVER_CAPACITY_SETUP_H_
#define TRAINYARD_SERVER_CAPACITY_SETUP_H_

// The coordinator's --capacity flags read into a running CapacityLoop (server/capacity/).

#include <memory>

#include "absl/status/statusor.h"
#include "server/capacity/capacity_loop.h"
#include "server/jobs/job_manager.h"

namespace trainyard {

// Checks the --capacity and --slurm_* flags (INVALID_ARGUMENT naming the flag); nullptr when
// --capacity is empty (nothing is asked for).
absl::StatusOr<std::unique_ptr<CapacityLoop>> CapacityFromFlags(JobManager& manager);

}  // namespace trainyard

#endif  // TRAINYARD_SERVER_CAPACITY_SETUP_H_
