#ifndef TRAINYARD_WORKER_AGENT_METRICS_H_
#define TRAINYARD_WORKER_AGENT_METRICS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "trainyard/v1/agent_service.pb.h"
#include "worker/agent/nvml.h"

namespace trainyard {

// What the agent knows that /proc does not. Functions are called on the scraping thread and must
// be thread-safe.
struct AgentMetricsSource {
  std::string worker_name;
  int gpus_offered = 0;
  // Every task the agent tracks, with its pid (0 if it never started).
  std::function<std::vector<trainyard::v1::TaskStatus>()> tasks;
  // GPUs handed to running trainers.
  std::function<int()> gpus_allocated;
  // The running task each allocated GPU (by index) is handed to. Unset: no task labels.
  std::function<std::map<int, trainyard::v1::TaskStatus>()> gpu_tasks;
  std::string hostname;  // the DCGM-named series' Hostname label
  // A task's folder, where a parameter-server shard writes its counters (kShardMetricsFile).
  // Unset: no shard metrics.
  std::function<std::string(const std::string& task_id)> task_dir;
  // The GPUs out of service (GpuHealth::Faults), and the XID errors seen by GPU and code. Unset:
  // no GPU health series.
  std::function<std::vector<trainyard::v1::GpuFault>()> gpu_faults;
  std::function<std::map<std::pair<int, uint64_t>, int64_t>()> xid_counts;
};

// The worker agent's Prometheus metrics, read fresh on every scrape: trainer processes by state,
// CPU and memory of the machine (/proc/stat, /proc/meminfo) and of each running trainer
// (/proc/<pid>/stat, /proc/<pid>/status), the counters each running parameter-server shard
// writes to its folder, each GPU's health (in service or not, and why; its XID errors), and,
// when a GpuMonitor is given, each GPU's utilisation, memory, temperature and power under
// NVIDIA's DCGM exporter names (DCGM_FI_DEV_*, labelled with the job and task using the GPU) and
// ours. Names are listed in docs/operations.md. Thread-safe.
class AgentMetrics final : public prometheus::Collectable {
 public:
  // `gpus` may be null (no NVML): the GPU series are then absent and
  // trainyard_worker_gpu_monitoring is 0; not owned, it must outlive the metrics. `proc_root` is
  // "/proc" except in tests.
  AgentMetrics(AgentMetricsSource source, GpuMonitor* gpus, std::string proc_root = "/proc");
  ~AgentMetrics() override;

  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  // Collect's parts: the trainers (by state, and each one's CPU and memory), the machine's CPU
  // and memory, and the GPUs (offered, handed out, and NVML's samples under our names and
  // DCGM's).
  void CollectTrainers(const std::vector<trainyard::v1::TaskStatus>& tasks,
                       std::vector<prometheus::MetricFamily>& out) const;
  void CollectMachine(std::vector<prometheus::MetricFamily>& out) const;
  void CollectGpus(std::vector<prometheus::MetricFamily>& out) const;
  // Each GPU in service or not (and why), and the XID errors by GPU, code and kind.
  void CollectGpuHealth(std::vector<prometheus::MetricFamily>& out) const;
  // The counters of each running parameter-server shard, from its folder.
  void CollectShardMetrics(const std::vector<trainyard::v1::TaskStatus>& tasks,
                           std::vector<prometheus::MetricFamily>& out) const;

  const AgentMetricsSource source_;
  const std::string proc_root_;
  GpuMonitor* const gpus_;  // thread-safe: scrapes may overlap
};

// ---- parsing, exposed for tests ----

// A shard's kShardMetricsFile: "name value" lines; lines that do not parse are skipped.
std::map<std::string, double> ParseShardMetrics(absl::string_view text);

// The aggregate "cpu" line of /proc/stat as seconds by mode (user, nice, system, idle, iowait,
// irq, softirq, steal), and the number of "cpuN" lines. nullopt if there is no "cpu" line.
struct MachineCpu {
  std::map<std::string, double> seconds_by_mode;
  int cpus = 0;
};
std::optional<MachineCpu> ParseProcStat(absl::string_view text, int64_t ticks_per_second);

// MemTotal and MemAvailable of /proc/meminfo in bytes; nullopt if either is missing.
struct MachineMemory {
  int64_t total_bytes = 0;
  int64_t available_bytes = 0;
};
std::optional<MachineMemory> ParseMeminfo(absl::string_view text);

// utime + stime of /proc/<pid>/stat in seconds (the command name may hold spaces and
// parentheses); nullopt if malformed.
std::optional<double> ParsePidCpuSeconds(absl::string_view stat, int64_t ticks_per_second);

// VmRSS of /proc/<pid>/status in bytes; nullopt if missing (a zombie has none).
std::optional<int64_t> ParseVmRssBytes(absl::string_view status);

}  // namespace trainyard

#endif  // TRAINYARD_WORKER_AGENT_METRICS_H_
