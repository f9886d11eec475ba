#include "worker/agent/metrics.h"

#include <unistd.h>

#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/exit_codes.h"
#include "worker/agent/gpu_health.h"

namespace trainyard {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

std::string ReadProcFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

MetricFamily Family(std::string name, std::string help, MetricType type) {
  MetricFamily family;
  family.name = std::move(name);
  family.help = std::move(help);
  family.type = type;
  return family;
}

void AddSample(MetricFamily& family, std::vector<ClientMetric::Label> labels, double value) {
  ClientMetric m;
  m.label = std::move(labels);
  if (family.type == MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  family.metric.push_back(std::move(m));
}

void Emit(std::vector<MetricFamily>& out, MetricFamily family) {
  if (!family.metric.empty()) out.push_back(std::move(family));
}

std::string TaskStateLabel(v1::TaskState state) {
  std::string name = absl::AsciiStrToLower(v1::TaskState_Name(state));
  if (absl::StartsWith(name, "task_")) name = name.substr(5);
  return name;
}

}  // namespace

std::optional<MachineCpu> ParseProcStat(absl::string_view text, int64_t ticks_per_second) {
  static const char* const kModes[] = {"user",   "nice", "system",  "idle",
                                       "iowait", "irq",  "softirq", "steal"};
  std::optional<MachineCpu> cpu;
  int cpus = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    std::vector<absl::string_view> fields = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (fields.empty() || !absl::StartsWith(fields[0], "cpu")) continue;
    if (fields[0] != "cpu") {
      cpus++;
      continue;
    }
    cpu.emplace();
    for (size_t i = 0; i < std::size(kModes) && i + 1 < fields.size(); ++i) {
      int64_t ticks = 0;
      if (!absl::SimpleAtoi(fields[i + 1], &ticks)) return std::nullopt;
      cpu->seconds_by_mode[kModes[i]] = static_cast<double>(ticks) / ticks_per_second;
    }
  }
  if (cpu.has_value()) cpu->cpus = cpus;
  return cpu;
}

std::optional<MachineMemory> ParseMeminfo(absl::string_view text) {
  int64_t total = -1;
  int64_t available = -1;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    std::vector<absl::string_view> fields = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (fields.size() < 2) continue;
    int64_t kib = 0;
    if (!absl::SimpleAtoi(fields[1], &kib)) continue;
    if (fields[0] == "MemTotal:") total = kib * 1024;
    if (fields[0] == "MemAvailable:") available = kib * 1024;
  }
  if (total < 0 || available < 0) return std::nullopt;
  return MachineMemory{total, available};
}

std::optional<double> ParsePidCpuSeconds(absl::string_view stat, int64_t ticks_per_second) {
  // "pid (comm) state ppid ...": comm may contain anything, so fields count from the last ')'.
  const size_t close = stat.rfind(')');
  if (close == absl::string_view::npos) return std::nullopt;
  std::vector<absl::string_view> fields =
      absl::StrSplit(stat.substr(close + 1), absl::ByAnyChar(" \n"), absl::SkipEmpty());
  // fields[0] is the state (field 3); utime and stime are fields 14 and 15.
  if (fields.size() < 13) return std::nullopt;
  int64_t utime = 0;
  int64_t stime = 0;
  if (!absl::SimpleAtoi(fields[11], &utime) || !absl::SimpleAtoi(fields[12], &stime)) {
    return std::nullopt;
  }
  return static_cast<double>(utime + stime) / ticks_per_second;
}

std::optional<int64_t> ParseVmRssBytes(absl::string_view status) {
  for (absl::string_view line : absl::StrSplit(status, '\n')) {
    if (!absl::StartsWith(line, "VmRSS:")) continue;
    std::vector<absl::string_view> fields =
        absl::StrSplit(line.substr(6), absl::ByAnyChar(" \t"), absl::SkipEmpty());
    int64_t kib = 0;
    if (!fields.empty() && absl::SimpleAtoi(fields[0], &kib)) return kib * 1024;
  }
  return std::nullopt;
}

std::map<std::string, double> ParseShardMetrics(absl::string_view text) {
  std::map<std::string, double> out;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    std::vector<absl::string_view> fields = absl::StrSplit(line, ' ', absl::SkipEmpty());
    double value = 0;
    if (fields.size() == 2 && absl::SimpleAtod(fields[1], &value))
      out[std::string(fields[0])] = value;
  }
  return out;
}

AgentMetrics::AgentMetrics(AgentMetricsSource source, GpuMonitor* gpus, std::string proc_root)
    : source_(std::move(source)), proc_root_(std::move(proc_root)), gpus_(gpus) {}

AgentMetrics::~AgentMetrics() = default;

void AgentMetrics::CollectShardMetrics(const std::vector<v1::TaskStatus>& tasks,
                                       std::vector<MetricFamily>& out) const {
  if (!source_.task_dir) return;
  // (file key, metric name, help, type); counters in the file count from the shard's start.
  struct Series {
    const char* key;
    const char* name;
    const char* help;
    MetricType type;
  };
  static const Series kSeries[] = {
      {"pushes", "trainyard_ps_pushes_total",
       "Gradient pushes a parameter-server shard answered, applied or not.", MetricType::Counter},
      {"stale_pushes", "trainyard_ps_stale_pushes_total",
       "Pushes a shard did not apply because they were more than max_staleness versions behind "
       "(asynchronous mode).",
       MetricType::Counter},
      {"staleness_sum", "trainyard_ps_push_staleness_versions_total",
       "Versions behind the shard, summed over the pushes it applied (divide by the rate of "
       "applied pushes for the mean staleness).",
       MetricType::Counter},
      {"pulls", "trainyard_ps_pulls_total", "Parameter pulls a shard answered.",
       MetricType::Counter},
      {"bytes_received", "trainyard_ps_received_bytes_total",
       "Bytes of the pushes a shard received.", MetricType::Counter},
      {"bytes_sent", "trainyard_ps_sent_bytes_total", "Bytes of the pulls a shard answered.",
       MetricType::Counter},
      {"pull_wait_seconds", "trainyard_ps_pull_wait_seconds_total",
       "Time pulls waited at a shard for their version: the workers' wait for each other's pushes "
       "in synchronous mode.",
       MetricType::Counter},
      {"version", "trainyard_ps_version", "A shard's version: the updates it applied.",
       MetricType::Gauge},
  };
  std::vector<MetricFamily> families;
  for (const Series& series : kSeries)
    families.push_back(Family(series.name, series.help, series.type));
  for (const v1::TaskStatus& task : tasks) {
    if (task.role() != v1::TASK_ROLE_SHARD || task.state() != v1::TASK_RUNNING) continue;
    const std::map<std::string, double> values = ParseShardMetrics(
        ReadProcFile(absl::StrCat(source_.task_dir(task.task_id()), "/", kShardMetricsFile)));
    if (values.empty()) continue;
    const std::vector<ClientMetric::Label> labels = {{"job", task.job_id()},
                                                     {"shard", absl::StrCat(task.shard())}};
    for (size_t i = 0; i < families.size(); ++i) {
      auto it = values.find(kSeries[i].key);
      if (it != values.end()) AddSample(families[i], labels, it->second);
    }
  }
  for (MetricFamily& family : families) Emit(out, std::move(family));
}

void AgentMetrics::CollectTrainers(const std::vector<v1::TaskStatus>& tasks,
                                   std::vector<MetricFamily>& out) const {
  static const int64_t kTicks = sysconf(_SC_CLK_TCK) > 0 ? sysconf(_SC_CLK_TCK) : 100;
  std::map<std::string, int> by_state;
  for (v1::TaskState state : {v1::TASK_STARTING, v1::TASK_RUNNING, v1::TASK_EXITED,
                              v1::TASK_FAILED_TO_START, v1::TASK_STOPPED}) {
    by_state[TaskStateLabel(state)] = 0;
  }
  MetricFamily trainer_cpu =
      Family("trainyard_worker_trainer_cpu_seconds_total",
             "CPU time (user + system) of each running trainer process.", MetricType::Counter);
  MetricFamily trainer_rss =
      Family("trainyard_worker_trainer_resident_memory_bytes",
             "Resident memory of each running trainer process.", MetricType::Gauge);
  for (const v1::TaskStatus& task : tasks) {
    by_state[TaskStateLabel(task.state())]++;
    if (task.pid() <= 0 || task.state() != v1::TASK_RUNNING) continue;
    // A parameter-server shard is labelled by its shard, a rank by its rank.
    const std::vector<ClientMetric::Label> labels =
        task.role() == v1::TASK_ROLE_SHARD
            ? std::vector<ClientMetric::Label>{{"job", task.job_id()},
                                               {"shard", absl::StrCat(task.shard())}}
            : std::vector<ClientMetric::Label>{{"job", task.job_id()},
                                               {"rank", absl::StrCat(task.rank())}};
    const std::string dir = absl::StrCat(proc_root_, "/", task.pid());
    if (std::optional<double> cpu = ParsePidCpuSeconds(ReadProcFile(dir + "/stat"), kTicks)) {
      AddSample(trainer_cpu, labels, *cpu);
    }
    if (std::optional<int64_t> rss = ParseVmRssBytes(ReadProcFile(dir + "/status"))) {
      AddSample(trainer_rss, labels, static_cast<double>(*rss));
    }
  }
  MetricFamily trainers = Family("trainyard_worker_trainers",
                                 "Trainer processes the agent tracks, by state (ended ones until "
                                 "the coordinator has seen how they ended).",
                                 MetricType::Gauge);
  for (const auto& [state, count] : by_state) AddSample(trainers, {{"state", state}}, count);
  Emit(out, std::move(trainers));
  Emit(out, std::move(trainer_cpu));
  Emit(out, std::move(trainer_rss));
}

void AgentMetrics::CollectMachine(std::vector<MetricFamily>& out) const {
  static const int64_t kTicks = sysconf(_SC_CLK_TCK) > 0 ? sysconf(_SC_CLK_TCK) : 100;
  if (std::optional<MachineCpu> cpu = ParseProcStat(ReadProcFile(proc_root_ + "/stat"), kTicks)) {
    MetricFamily seconds = Family(
        "trainyard_worker_cpu_seconds_total",
        "CPU time of the machine summed over its CPUs, by mode (/proc/stat).", MetricType::Counter);
    for (const auto& [mode, value] : cpu->seconds_by_mode) {
      AddSample(seconds, {{"mode", mode}}, value);
    }
    Emit(out, std::move(seconds));
    MetricFamily cpus = Family("trainyard_worker_cpus", "CPUs of the machine.", MetricType::Gauge);
    AddSample(cpus, {}, cpu->cpus);
    Emit(out, std::move(cpus));
  }
  if (std::optional<MachineMemory> memory = ParseMeminfo(ReadProcFile(proc_root_ + "/meminfo"))) {
    MetricFamily total = Family("trainyard_worker_memory_total_bytes",
                                "Memory of the machine (MemTotal).", MetricType::Gauge);
    AddSample(total, {}, static_cast<double>(memory->total_bytes));
    Emit(out, std::move(total));
    MetricFamily available =
        Family("trainyard_worker_memory_available_bytes",
               "Memory available for new work without swapping (MemAvailable).", MetricType::Gauge);
    AddSample(available, {}, static_cast<double>(memory->available_bytes));
    Emit(out, std::move(available));
  }
}

void AgentMetrics::CollectGpuHealth(std::vector<MetricFamily>& out) const {
  if (source_.gpu_faults) {
    std::map<int, std::string> faults;
    for (const v1::GpuFault& f : source_.gpu_faults()) faults[f.index()] = f.reason();
    MetricFamily healthy = Family("trainyard_worker_gpu_healthy",
                                  "1 while the GPU is in service, 0 while its agent holds it out "
                                  "of service (a failed check, an XID error, ECC errors).",
                                  MetricType::Gauge);
    MetricFamily fault =
        Family("trainyard_worker_gpu_fault_info",
               "1 for each GPU out of service, labelled with why.", MetricType::Gauge);
    for (int gpu = 0; gpu < source_.gpus_offered; ++gpu) {
      auto it = faults.find(gpu);
      AddSample(healthy, {{"gpu", absl::StrCat(gpu)}}, it == faults.end() ? 1 : 0);
      if (it != faults.end()) {
        AddSample(fault, {{"gpu", absl::StrCat(gpu)}, {"reason", it->second}}, 1);
      }
    }
    Emit(out, std::move(healthy));
    Emit(out, std::move(fault));
  }
  if (source_.xid_counts) {
    MetricFamily xids = Family("trainyard_worker_gpu_xid_errors_total",
                               "XID errors NVML reported, by GPU, code and kind (hardware: the "
                               "GPU was taken out of service; application, other: counted only).",
                               MetricType::Counter);
    for (const auto& [key, count] : source_.xid_counts()) {
      AddSample(xids,
                {{"gpu", absl::StrCat(key.first)},
                 {"xid", absl::StrCat(key.second)},
                 {"kind", XidKindName(ClassifyXid(key.second).kind)}},
                static_cast<double>(count));
    }
    Emit(out, std::move(xids));
  }
}

void AgentMetrics::CollectGpus(std::vector<MetricFamily>& out) const {
  MetricFamily offered =
      Family("trainyard_worker_gpus", "GPUs offered to the scheduler.", MetricType::Gauge);
  AddSample(offered, {}, source_.gpus_offered);
  Emit(out, std::move(offered));
  MetricFamily allocated = Family("trainyard_worker_gpus_allocated",
                                  "GPUs handed to running trainers.", MetricType::Gauge);
  AddSample(allocated, {}, source_.gpus_allocated ? source_.gpus_allocated() : 0);
  Emit(out, std::move(allocated));

  MetricFamily monitoring = Family("trainyard_worker_gpu_monitoring",
                                   "1 when NVML is loaded and GPU utilisation and memory are "
                                   "reported, 0 when the machine has no NVIDIA driver.",
                                   MetricType::Gauge);
  AddSample(monitoring, {}, gpus_ != nullptr ? 1 : 0);
  Emit(out, std::move(monitoring));
  if (gpus_ != nullptr) {
    const std::vector<GpuSample> samples = gpus_->Sample();
    MetricFamily utilization =
        Family("trainyard_worker_gpu_utilization_ratio",
               "Share of the last sample period (0..1) in which a kernel ran on the GPU.",
               MetricType::Gauge);
    MetricFamily used =
        Family("trainyard_worker_gpu_memory_used_bytes", "GPU memory in use.", MetricType::Gauge);
    MetricFamily total =
        Family("trainyard_worker_gpu_memory_total_bytes", "GPU memory.", MetricType::Gauge);
    // NVIDIA's DCGM exporter names and labels, so that dashboards made for it work here; the
    // task using the GPU in place of its Kubernetes pod.
    MetricFamily dcgm_util =
        Family("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", MetricType::Gauge);
    MetricFamily dcgm_used =
        Family("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", MetricType::Gauge);
    MetricFamily dcgm_free =
        Family("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", MetricType::Gauge);
    MetricFamily dcgm_temp =
        Family("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", MetricType::Gauge);
    MetricFamily dcgm_power =
        Family("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", MetricType::Gauge);
    const std::map<int, v1::TaskStatus> tasks =
        source_.gpu_tasks ? source_.gpu_tasks() : std::map<int, v1::TaskStatus>();
    constexpr double kMiB = 1024.0 * 1024.0;
    for (const GpuSample& s : samples) {
      const std::vector<ClientMetric::Label> labels = {{"gpu", absl::StrCat(s.index)}};
      AddSample(utilization, labels, s.utilization_ratio);
      AddSample(used, labels, static_cast<double>(s.memory_used_bytes));
      AddSample(total, labels, static_cast<double>(s.memory_total_bytes));
      std::vector<ClientMetric::Label> dcgm = {{"gpu", absl::StrCat(s.index)},
                                               {"UUID", s.uuid},
                                               {"device", absl::StrCat("nvidia", s.index)},
                                               {"modelName", s.name},
                                               {"Hostname", source_.hostname}};
      if (auto it = tasks.find(s.index); it != tasks.end()) {
        dcgm.push_back({"job", it->second.job_id()});
        dcgm.push_back({"task", it->second.task_id()});
      }
      AddSample(dcgm_util, dcgm, s.utilization_ratio * 100);
      AddSample(dcgm_used, dcgm, static_cast<double>(s.memory_used_bytes) / kMiB);
      AddSample(dcgm_free, dcgm,
                static_cast<double>(s.memory_total_bytes - s.memory_used_bytes) / kMiB);
      if (s.temperature_celsius.has_value()) AddSample(dcgm_temp, dcgm, *s.temperature_celsius);
      if (s.power_watts.has_value()) AddSample(dcgm_power, dcgm, *s.power_watts);
    }
    Emit(out, std::move(utilization));
    Emit(out, std::move(used));
    Emit(out, std::move(total));
    Emit(out, std::move(dcgm_util));
    Emit(out, std::move(dcgm_used));
    Emit(out, std::move(dcgm_free));
    Emit(out, std::move(dcgm_temp));
    Emit(out, std::move(dcgm_power));
  }
}

std::vector<MetricFamily> AgentMetrics::Collect() const {
  std::vector<MetricFamily> out;
  MetricFamily info =
      Family("trainyard_worker_info", "The worker's name; always 1.", MetricType::Gauge);
  AddSample(info, {{"worker", source_.worker_name}}, 1);
  Emit(out, std::move(info));
  const std::vector<v1::TaskStatus> tasks =
      source_.tasks ? source_.tasks() : std::vector<v1::TaskStatus>();
  CollectTrainers(tasks, out);
  CollectShardMetrics(tasks, out);
  CollectMachine(out);
  CollectGpus(out);
  CollectGpuHealth(out);
  return out;
}

}  // namespace trainyard
