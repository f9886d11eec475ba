#ifndef TRAINYARD_SERVER_CAPACITY_CAPACITY_PROVIDER_H_
#define TRAINYARD_SERVER_CAPACITY_CAPACITY_PROVIDER_H_

// Room capacity/: machines asked for when gangs wait. A CapacityProvider is a cluster manager that
// hands out nodes on which Trainyard agents start (Slurm today: slurm_provider.h); the
// CapacityAsker (capacity_asker.h) decides when to ask and when to give nodes back, and the
// CapacityLoop (capacity_loop.h) runs it beside the job manager. May call: jobs.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace trainyard {

// What one node of the provider offers its agent.
struct NodeShape {
  int slots = 1;
  int gpus = 0;
  int64_t memory_bytes = 0;  // 0: not known (not counted)
};

enum class AllocationState { kPending, kRunning, kEnded };

// One ask of the provider: a set of nodes held together (a Slurm job).
struct Allocation {
  std::string id;      // the provider's own (Slurm's job id)
  std::string job_id;  // the Trainyard job it was asked for; empty when not known
  int nodes = 0;
  AllocationState state = AllocationState::kPending;
  std::string detail;                   // the provider's words: "PENDING (Resources)"
  std::vector<std::string> node_names;  // where it runs, once running
};

// A cluster manager that hands out nodes with a Trainyard agent on each. Implementations call
// out to the manager (commands, HTTP) and may block for seconds; they are called from one thread.
class CapacityProvider {
 public:
  virtual ~CapacityProvider() = default;
  // "Slurm": for messages.
  virtual std::string Name() const = 0;
  // Asks for `nodes` nodes for Trainyard job `job_id`; returns the allocation's id. An error
  // carries the manager's own words (a refused partition, an unknown account).
  virtual absl::StatusOr<std::string> Request(const std::string& job_id, int nodes) = 0;
  // Every allocation of this coordinator that has not ended, asked for by this process or an
  // earlier one (a restarted coordinator finds its allocations again); never one started by
  // other hands.
  virtual absl::StatusOr<std::vector<Allocation>> List() = 0;
  // Gives an allocation back (its agents get the manager's stop signal and leave).
  virtual absl::Status Release(const std::string& id) = 0;
  // How an allocation that left List ended, in the manager's words ("FAILED, exit code 1:0");
  // empty when it no longer knows.
  virtual std::string HowItEnded(const std::string& id) = 0;
};

}  // namespace trainyard

#endif  // TRAINYARD_SERVER_CAPACITY_CAPACITY_PROVIDER_H_
