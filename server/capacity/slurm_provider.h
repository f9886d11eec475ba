#ifndef TRAINYARD_SERVER_CAPACITY_SLURM_PROVIDER_H_
#define TRAINYARD_SERVER_CAPACITY_SLURM_PROVIDER_H_

// Slurm as a CapacityProvider: the coordinator as a Slurm client, calling sbatch, squeue and
// scancel as a user would. Each allocation runs deploy/slurm/trainyard-agents.sbatch (one agent
// per node) and is named so that a restarted coordinator finds it again.

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/run_command.h"
#include "server/capacity/capacity_provider.h"

namespace trainyard {

struct SlurmOptions {
  std::string script;     // the sbatch script that starts the agents
  std::string partition;  // empty: Slurm's default partition
  std::string account;
  std::string qos;
  std::string time_limit;  // sbatch --time ("4:00:00"); empty: the partition's default
  int gpus_per_node = 0;   // --gres=gpu:N when > 0
  std::string env_file;    // the agents' settings (TRAINYARD_SLURM_ENV of the script)
  std::string job_name = "trainyard-agents";  // how this coordinator's allocations are found
  std::string output_dir;  // where the allocations' logs go (sbatch --output); empty: Slurm's
  std::vector<std::string> extra_args;  // more sbatch arguments, as given
};

// How the provider runs a command: RunCommand, or a script of answers in tests.
using CommandRunner = std::function<absl::StatusOr<CommandResult>(const std::vector<std::string>&)>;

class SlurmProvider : public CapacityProvider {
 public:
  SlurmProvider(SlurmOptions options, CommandRunner run);
  std::string Name() const override { return "Slurm"; }
  absl::StatusOr<std::string> Request(const std::string& job_id, int nodes) override;
  absl::StatusOr<std::vector<Allocation>> List() override;
  absl::Status Release(const std::string& id) override;
  std::string HowItEnded(const std::string& id) override;

  // The sbatch command line for an ask (for tests and the log).
  std::vector<std::string> SbatchArgs(const std::string& job_id, int nodes) const;

 private:
  absl::StatusOr<CommandResult> Call(const std::vector<std::string>& argv) const;
  SlurmOptions options_;
  CommandRunner run_;
};

// Runs commands for real, each for at most `timeout`.
CommandRunner RealCommandRunner(absl::Duration timeout);

// One line of `squeue -h -o "%i|%T|%D|%r|%k|%N"` read into an Allocation (its node names are
// Slurm's compressed list, expanded by the caller); nullopt for a line of another shape.
// Visible for tests.
std::optional<Allocation> ParseSqueueLine(absl::string_view line);

}  // namespace trainyard

#endif  // TRAINYARD_SERVER_CAPACITY_SLURM_PROVIDER_H_
