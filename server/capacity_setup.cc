#include "server/capacity_setup.h"

#include <unistd.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/byte_size.h"
#include "common/clock.h"
#include "common/log.h"
#include "server/capacity/slurm_provider.h"
#include "server/flags.h"

namespace trainyard {

absl::StatusOr<std::unique_ptr<CapacityLoop>> CapacityFromFlags(JobManager& manager) {
  const std::string kind = absl::GetFlag(FLAGS_capacity);
  if (kind.empty()) return nullptr;
  if (kind != "slurm") {
    return absl::InvalidArgumentError(
        absl::StrCat("--capacity: '", kind, "' is not a provider (slurm, or empty for none)"));
  }
  SlurmOptions slurm;
  slurm.script = absl::GetFlag(FLAGS_slurm_script);
  if (slurm.script.empty() || access(slurm.script.c_str(), R_OK) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--slurm_script: '", slurm.script,
                     "' cannot be read (deploy/slurm/trainyard-agents.sbatch, installed where the "
                     "coordinator can read it)"));
  }
  slurm.partition = absl::GetFlag(FLAGS_slurm_partition);
  slurm.account = absl::GetFlag(FLAGS_slurm_account);
  slurm.qos = absl::GetFlag(FLAGS_slurm_qos);
  slurm.time_limit = absl::GetFlag(FLAGS_slurm_time_limit);
  slurm.gpus_per_node = absl::GetFlag(FLAGS_slurm_gpus_per_node);
  slurm.env_file = absl::GetFlag(FLAGS_slurm_env_file);
  slurm.output_dir = absl::GetFlag(FLAGS_slurm_output_dir);
  slurm.job_name = absl::GetFlag(FLAGS_slurm_job_name);
  slurm.extra_args = absl::StrSplit(absl::GetFlag(FLAGS_slurm_sbatch_args), ' ', absl::SkipEmpty());
  if (slurm.job_name.empty() || slurm.job_name.find_first_of(" ,") != std::string::npos) {
    return absl::InvalidArgumentError("--slurm_job_name: a name without spaces or commas");
  }
  CapacityOptions options;
  options.shape.slots = absl::GetFlag(FLAGS_slurm_cpus_per_node);
  options.shape.gpus = slurm.gpus_per_node;
  if (options.shape.slots <= 0 || options.shape.gpus < 0) {
    return absl::InvalidArgumentError(
        "--slurm_cpus_per_node: the CPUs of a node of the partition (> 0), and "
        "--slurm_gpus_per_node >= 0");
  }
  if (const std::string memory = absl::GetFlag(FLAGS_slurm_memory_per_node); !memory.empty()) {
    absl::StatusOr<int64_t> bytes = ParseByteSize(memory);
    if (!bytes.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--slurm_memory_per_node: ", bytes.status().message()));
    }
    options.shape.memory_bytes = *bytes;
  }
  options.max_nodes = absl::GetFlag(FLAGS_slurm_max_nodes);
  if (options.max_nodes <= 0) return absl::InvalidArgumentError("--slurm_max_nodes must be > 0");
  options.idle_timeout = absl::GetFlag(FLAGS_slurm_idle_timeout);
  options.retry_after = absl::GetFlag(FLAGS_slurm_retry_after);
  options.worker_prefix = absl::GetFlag(FLAGS_slurm_worker_prefix);
  const absl::Duration interval = absl::GetFlag(FLAGS_slurm_poll_interval);
  if (interval <= absl::ZeroDuration() || options.retry_after <= absl::ZeroDuration() ||
      options.idle_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "--slurm_poll_interval and --slurm_retry_after must be > 0, --slurm_idle_timeout >= 0");
  }
  LogInfo("capacity: asking Slurm (partition ",
          slurm.partition.empty() ? "default" : slurm.partition, ") for at most ",
          options.max_nodes, " nodes of ", options.shape.slots, " slots and ", options.shape.gpus,
          " GPUs when jobs wait; idle allocations go back after ",
          absl::FormatDuration(options.idle_timeout));
  return std::make_unique<CapacityLoop>(
      manager,
      std::make_unique<SlurmProvider>(std::move(slurm), RealCommandRunner(absl::Seconds(30))),
      std::move(options), interval, RealClock::Get());
}

}  // namespace trainyard
