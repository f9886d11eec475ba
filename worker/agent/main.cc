// trainyard-worker: the agent that runs trainers on one machine.

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/byte_size.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/rpc/channel.h"
#include "common/rpc/daemon_metrics_flags.h"
#include "common/rpc/metrics_http.h"
#include "common/rpc/ps_tls.h"
#include "grpcpp/grpcpp.h"
#include "worker/agent/agent.h"
#include "worker/agent/coordinator_link.h"
#include "worker/agent/drain_watcher.h"
#include "worker/agent/local_address.h"
#include "worker/agent/metrics.h"
#include "worker/agent/preemption_watcher.h"
#include "worker/agent/process_launcher.h"
#include "worker/agent/s3_gateway.h"
#include "worker/agent/subprocess.h"
#include "worker/agent/task_isolation.h"
#include "worker/agent/task_user.h"
#include "worker/agent/trainer_runtime.h"

namespace {

std::string DefaultCoordinator() {
  const char* env = std::getenv("TRAINYARD_COORDINATOR");
  return env != nullptr && *env != '\0' ? env : "127.0.0.1:7070";
}

std::string Hostname() {
  char buffer[HOST_NAME_MAX + 1] = {};
  if (gethostname(buffer, sizeof(buffer) - 1) != 0) return "worker";
  return buffer;
}

}  // namespace

ABSL_FLAG(std::string, coordinator, DefaultCoordinator(),
          "host:port of the coordinator, or a comma-separated list of a cluster's coordinators "
          "(the one that leads answers; default: $TRAINYARD_COORDINATOR, else 127.0.0.1:7070)");
ABSL_FLAG(std::string, name, "",
          "unique name of this worker; re-registering a name replaces it (default: the hostname)");
ABSL_FLAG(std::string, address, "",
          "address other machines reach this one at (trainers of a job meet their peers there); "
          "default: this machine's address on the interface that leads to --coordinator");
ABSL_FLAG(int, slots, 0,
          "CPU slots offered to the scheduler, one per CPU a task may use (default: the CPUs this "
          "process may use: its cores, or its cgroup's CPU quota in a container)");
ABSL_FLAG(std::string, memory, "",
          "memory offered to tasks (16GiB, 4000M), reserved by the tasks' resources.memory and "
          "the limit of all of them together (default: the memory this process may use, its "
          "machine's or its container's limit, less a reserve for the agent of 5 % between 256 "
          "MiB and 1 GiB)");
ABSL_FLAG(std::string, isolation, "auto",
          "how each task is held to its memory and CPU limits: auto (cgroup v2 where the agent "
          "can delegate its memory and cpu controllers, else the cgroup v1 memory and cpu "
          "controllers, else watch), cgroup-v2, cgroup-v1 (fail if unusable), or watch (no "
          "cgroups: the agent reads each task's resident memory and kills it over its limit; no "
          "CPU quota)");
ABSL_FLAG(int, gpus, -1,
          "GPUs offered to the scheduler; -1 finds them: NVML's count (libnvidia-ml.so.1, loaded "
          "at run time), else the count of /dev/nvidia[0-9]*");
ABSL_FLAG(bool, gpu_health, true,
          "check each GPU before jobs land on it (at the start, after each task, when an admin "
          "returns it: NVML's ECC, retired pages, row remapping, PCIe link and clock readings, "
          "and where the trainer has CUDA a compute check by `trainyard-trainer --gpu_check`), "
          "watch NVML's XID errors and ECC counters while jobs run, and take a GPU that fails out "
          "of service (docs/gpu.md, GPU health). --nogpu_health: none of it");
ABSL_FLAG(std::string, work_dir, "./trainyard-worker",
          "folder for task folders ({work_dir}/tasks/{task_id}/: task.pb, output.log, pid, "
          "stop-deadline)");
ABSL_FLAG(int64_t, data_cache_bytes, int64_t{10} << 30,
          "bound on the disk space of remote data shards cached under {work_dir}/cache/shards, "
          "shared by the tasks of this worker (least recently used shards not in use go first)");
ABSL_FLAG(std::string, trainer_path, "",
          "the trainyard-trainer executable (default: the one next to this binary)");
ABSL_FLAG(absl::Duration, stop_grace_period, absl::Seconds(10),
          "how long a trainer has to exit after SIGTERM before it gets SIGKILL, when it is stopped "
          "on the coordinator's request or by SIGINT to the agent");
ABSL_FLAG(absl::Duration, task_retention, absl::Hours(24),
          "folders of tasks that ended (their output.log included; the coordinator has its own "
          "copy) are removed this long after the coordinator stopped asking for them");
ABSL_FLAG(int64_t, task_log_max_bytes, trainyard::LogShipper::kDefaultMaxFileBytes,
          "the most a task's output.log holds on disk (at least 1 MiB); past it the oldest "
          "output is freed down to half of it, and the newest keeps being shipped");
ABSL_FLAG(
    std::string, trainer_env_pass, "",
    "Comma-separated names of more of this agent's environment variables that trainers "
    "inherit. By default they get only what the runtime needs (PATH, HOME, locale, "
    "proxies, OMP_*, CUDA_*, NCCL_*, GLOO_*, TORCH_*; AWS_* only with --nos3_gateway, ...) and "
    "never the agent's own credentials (TRAINYARD_TOKEN, TRAINYARD_TOKEN_FILE, ...).");
ABSL_FLAG(bool, s3_gateway, true,
          "trainers reach object storage through this agent (on loopback), each task with a key "
          "of its own that reaches only what its job names: its data, models and the checkpoints "
          "it resumes from to read, its own checkpoint folder to write. The agent's S3 "
          "credentials (AWS_*) stay with it. --nos3_gateway: trainers inherit the agent's AWS_* "
          "variables, its keys included. Nothing changes when the agent has no S3 credentials");
ABSL_FLAG(std::string, task_uid_range, "",
          "FIRST-LAST: run each job's trainers as a user id of their own from this range (its "
          "group the same number, no others), so that they cannot read this agent's token, "
          "other tasks' credentials or other jobs' caches. Needs the agent to run as root. Empty: "
          "trainers run as the agent's user.");
ABSL_FLAG(absl::Duration, grace_period, absl::Seconds(25),
          "on a preemption (SIGTERM, or a notice from --preemption_notice_url) the machine is "
          "taken to be gone this long after the notice (or at the notice's own earlier time): "
          "trainers are asked to save and exit (SIGTERM, with the deadline in their task folder's "
          "stop-deadline file), get SIGKILL 2 s before that (a tenth of the time left if less), "
          "and the agent exits before it. Keep it below the platform's own grace period "
          "(Kubernetes: 30 s)");
ABSL_FLAG(std::string, preemption_notice_url, "",
          "cloud metadata URL polled for a preemption notice; empty: none. GCE: "
          "http://metadata.google.internal/computeMetadata/v1/instance/preempted (TRUE/FALSE); "
          "AWS: http://169.254.169.254/latest/meta-data/spot/instance-action (404, or JSON with "
          "action and time; IMDSv2 tokens are used when required). A notice acts as SIGTERM; an "
          "endpoint that fails is logged once and otherwise ignored");
ABSL_FLAG(absl::Duration, preemption_poll_interval, absl::Seconds(1),
          "how often --preemption_notice_url is polled");
ABSL_FLAG(std::string, drain_command, "",
          "a command (split at spaces) that says whether this machine is being drained, run every "
          "--drain_poll_interval: when what it prints names a drained state (drain, drained, "
          "draining, mixed+drain), that acts as a preemption notice: the tasks' jobs move on and "
          "the agent leaves. The Slurm script sets `sinfo --noheader --nodes=NODE --format=%T`; "
          "empty: none");
ABSL_FLAG(absl::Duration, drain_poll_interval, absl::Seconds(30), "how often --drain_command runs");
ABSL_FLAG(absl::Duration, self_fence_after, absl::Minutes(5),
          "With no lease from the coordinator this long (its connection broken or cut off), kill "
          "the trainers: the coordinator has presumably restarted their jobs elsewhere "
          "(self-fencing). 0 never does. The default matches the coordinator's "
          "--mass_loss_hold, for which it trains on through its own network's outage.");
ABSL_FLAG(absl::Duration, sync_wait, absl::Seconds(60),
          "how long each Sync long-poll is held by the coordinator when nothing changes (news "
          "answers it at once; the coordinator holds one at most 60s); the lease is kept by a "
          "stream on which the agent beats while it runs tasks. With a coordinator that keeps "
          "leases by Sync, at most 1s.");
// Several coordinators or agents on one machine (tests, `trainyard up`) cannot all have it.
constexpr char kDefaultMetricsListen[] = "127.0.0.1:7072";
ABSL_FLAG(std::string, metrics_listen, kDefaultMetricsListen,
          "address for Prometheus metrics (HTTP GET /metrics) as HOST:PORT; port 0 lets the "
          "kernel pick one (see --metrics_port_file); empty turns metrics off. If the default "
          "address is taken the agent runs without metrics (with a warning); an address given "
          "explicitly that cannot be bound stops it");
ABSL_FLAG(std::string, token_file, "",
          "file holding this agent's token (made by an admin: `trainyard token create NAME "
          "--role agent`, NAME being --name); default: $TRAINYARD_TOKEN_FILE. Or authenticate "
          "with a client certificate (--cert_file, --key_file; CN = --name, OU = agent)");
ABSL_FLAG(std::string, ca_file, "",
          "PEM CA of the coordinator's TLS certificate: speak TLS (also handed to trainers); "
          "default: $TRAINYARD_CA_FILE");
ABSL_FLAG(std::string, cert_file, "", "PEM client certificate of this agent (with --ca_file)");
ABSL_FLAG(std::string, key_file, "", "PEM key of --cert_file");
ABSL_FLAG(std::string, tls_server_name, "",
          "name the coordinator's certificate carries, when not --coordinator's host");
ABSL_FLAG(std::string, ps_tls_cert, "",
          "PEM certificate that parameter-server shards on this machine serve TLS with (for the "
          "address the coordinator advertises for this worker, or --ps_tls_server_name), signed "
          "by the cluster's CA (--ca_file), which ranks verify it against; handed to shard tasks "
          "only. Without it shards beyond loopback speak plaintext, with a warning");
ABSL_FLAG(std::string, ps_tls_key, "", "PEM key of --ps_tls_cert");
ABSL_FLAG(std::string, ps_tls_server_name, "",
          "name the shards' certificates carry, when not the host a shard is reached at "
          "(handed to ranks)");
ABSL_FLAG(bool, insecure, false,
          "allow plaintext to a coordinator that is not on this machine (credentials then "
          "travel in clear)");

// The S3 gateway (--s3_gateway) where the agent has S3 credentials; null where it is off or
// there is nothing to keep from trainers. An error when it cannot listen.
absl::StatusOr<std::unique_ptr<trainyard::S3Gateway>> StartS3Gateway() {
  if (!absl::GetFlag(FLAGS_s3_gateway)) {
    trainyard::LogWarning("--nos3_gateway: trainers get this agent's S3 credentials");
    return nullptr;
  }
  absl::StatusOr<trainyard::S3ClientOptions> upstream =
      trainyard::S3ClientOptionsFromEnv([](const char* name) { return std::getenv(name); });
  if (!upstream.ok()) {
    trainyard::LogInfo("no S3 gateway (trainers reach no object storage with this agent's ",
                       "credentials): ", upstream.status().message());
    return nullptr;
  }
  trainyard::S3GatewayOptions gateway;
  gateway.upstream = *std::move(upstream);
  absl::StatusOr<std::unique_ptr<trainyard::S3Gateway>> started =
      trainyard::S3Gateway::Start(std::move(gateway));
  if (started.ok()) {
    trainyard::LogInfo("S3 gateway on ", (*started)->endpoint(),
                       ": trainers reach object storage with keys of their own");
  }
  return started;
}

namespace {

// What main assembles beside the agent's options, and keeps for as long as the agent runs.
struct AgentParts {
  std::unique_ptr<trainyard::TaskIsolation> isolation;
  std::unique_ptr<trainyard::GpuMonitor> nvml;
  std::unique_ptr<trainyard::S3Gateway> s3_gateway;
  trainyard::ClientCredentials credentials;
  absl::Duration grace_period;
};

// A flag's error: INVALID_ARGUMENT (exit 2); anything else the machine's (exit 1).
int ExitCode(const absl::Status& status) {
  return status.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

std::string Absolute(const std::string& path) {
  return std::filesystem::absolute(path).lexically_normal().string();
}

// This machine: its address, the slots, memory and GPUs it offers, and how tasks are confined.
absl::Status ReadMachine(trainyard::AgentOptions& options, AgentParts& parts) {
  options.coordinator = absl::GetFlag(FLAGS_coordinator);
  options.name = absl::GetFlag(FLAGS_name).empty() ? Hostname() : absl::GetFlag(FLAGS_name);
  options.address = absl::GetFlag(FLAGS_address);
  if (options.address.empty()) {
    // Toward the first coordinator of a list: they share a network.
    const std::vector<std::string> coordinators =
        trainyard::CoordinatorAddresses(options.coordinator);
    absl::StatusOr<std::string> local =
        trainyard::LocalAddressToward(coordinators.empty() ? options.coordinator : coordinators[0]);
    if (!local.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot tell this machine's address toward the coordinator (give --address): ",
          local.status().message()));
    }
    options.address = *local;
    trainyard::LogInfo("address ", options.address,
                       ": this machine's on the way to the coordinator (--address sets another)");
  }
  trainyard::IsolationOptions isolation_options;
  isolation_options.mode = absl::GetFlag(FLAGS_isolation);
  isolation_options.name = options.name;
  options.slots =
      absl::GetFlag(FLAGS_slots) > 0
          ? absl::GetFlag(FLAGS_slots)
          : std::max(1,
                     static_cast<int>(trainyard::AvailableCpus(isolation_options.files()) + 1e-6));
  if (const std::string memory = absl::GetFlag(FLAGS_memory); !memory.empty()) {
    absl::StatusOr<int64_t> bytes = trainyard::ParseByteSize(memory);
    if (!bytes.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--memory: ", bytes.status().message()));
    }
    options.memory_bytes = *bytes;
  } else {
    const int64_t available = trainyard::AvailableMemoryBytes(isolation_options.files());
    const int64_t reserve =
        std::clamp<int64_t>(available / 20, int64_t{256} << 20, int64_t{1} << 30);
    options.memory_bytes = std::max<int64_t>(available - reserve, 0);
  }
  isolation_options.total_memory_bytes = options.memory_bytes;
  std::string isolation_notes;
  absl::StatusOr<std::unique_ptr<trainyard::TaskIsolation>> isolation =
      trainyard::NewTaskIsolation(isolation_options, &isolation_notes);
  if (!isolation.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--isolation=", isolation_options.mode, ": ", isolation.status().message()));
  }
  parts.isolation = *std::move(isolation);
  options.isolation = parts.isolation.get();
  if (parts.isolation->Name() == "watch") {
    trainyard::LogWarning(
        "no cgroups for tasks",
        isolation_notes.empty() ? std::string() : absl::StrCat(" (", isolation_notes, ")"),
        ": memory limits are enforced by watching each task's resident memory, CPU quotas not "
        "at all");
  } else if (!isolation_notes.empty()) {
    trainyard::LogWarning(isolation_notes);
  }
  trainyard::LogInfo("offering ", options.slots, " slots and ",
                     trainyard::HumanBytes(options.memory_bytes), " of memory to tasks, held by ",
                     parts.isolation->Name());
  // NVML, when the driver has it: how many GPUs to offer, and their metrics.
  if (absl::StatusOr<std::unique_ptr<trainyard::GpuMonitor>> loaded = trainyard::LoadNvml();
      loaded.ok()) {
    parts.nvml = *std::move(loaded);
  } else {
    trainyard::LogInfo("no NVML (no GPU discovery through it, no GPU metrics): ",
                       loaded.status().message());
  }
  if (absl::GetFlag(FLAGS_gpus) >= 0) {
    options.gpus = absl::GetFlag(FLAGS_gpus);
  } else {
    std::string how;
    options.gpus = trainyard::DiscoverGpus(parts.nvml.get(), "/dev", &how);
    trainyard::LogInfo("offering ", options.gpus, " GPUs, found through ", how);
  }
  options.hostname = Hostname();
  return absl::OkStatus();
}

// The agent's own periods and bounds.
absl::Status ReadPeriods(trainyard::AgentOptions& options, AgentParts& parts) {
  options.stop_grace_period = absl::GetFlag(FLAGS_stop_grace_period);
  options.task_retention = absl::GetFlag(FLAGS_task_retention);
  if (options.task_retention < absl::ZeroDuration()) {
    return absl::FailedPreconditionError("--task_retention must be >= 0");
  }
  options.task_log_max_bytes = absl::GetFlag(FLAGS_task_log_max_bytes);
  if (options.task_log_max_bytes < (int64_t{1} << 20)) {
    return absl::FailedPreconditionError("--task_log_max_bytes must be at least 1 MiB (1048576)");
  }
  parts.grace_period = absl::GetFlag(FLAGS_grace_period);
  if (parts.grace_period <= absl::ZeroDuration()) {
    return absl::FailedPreconditionError("--grace_period must be > 0");
  }
  if (absl::GetFlag(FLAGS_preemption_poll_interval) <= absl::ZeroDuration() ||
      absl::GetFlag(FLAGS_drain_poll_interval) <= absl::ZeroDuration()) {
    return absl::FailedPreconditionError(
        "--preemption_poll_interval and --drain_poll_interval must be > 0");
  }
  options.sync_wait = absl::GetFlag(FLAGS_sync_wait);
  options.self_fence_after = std::max(absl::GetFlag(FLAGS_self_fence_after), absl::ZeroDuration());
  return absl::OkStatus();
}

// How the agent, and its trainers with their own task credentials, reach the coordinator.
absl::Status ReadCredentials(trainyard::AgentOptions& options, AgentParts& parts) {
  trainyard::ClientCredentials& credentials = parts.credentials;
  auto env = [](const char* name) {
    const char* value = std::getenv(name);
    return std::string(value != nullptr ? value : "");
  };
  std::string token_file = absl::GetFlag(FLAGS_token_file);
  if (token_file.empty()) token_file = env("TRAINYARD_TOKEN_FILE");
  if (!token_file.empty()) {
    absl::StatusOr<std::string> token = trainyard::ReadCredentialFile(token_file);
    if (!token.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("--token_file: ", token.status().message()));
    }
    credentials.token = *token;
  }
  credentials.ca_file = absl::GetFlag(FLAGS_ca_file);
  if (credentials.ca_file.empty()) credentials.ca_file = env("TRAINYARD_CA_FILE");
  credentials.cert_file = absl::GetFlag(FLAGS_cert_file);
  credentials.key_file = absl::GetFlag(FLAGS_key_file);
  credentials.server_name = absl::GetFlag(FLAGS_tls_server_name);
  credentials.insecure = absl::GetFlag(FLAGS_insecure);
  if (credentials.token.empty() && credentials.cert_file.empty()) {
    trainyard::LogWarning(
        "no credential (--token_file or --cert_file): the coordinator will "
        "refuse this agent");
  }
  if (!credentials.ca_file.empty()) {
    options.trainer_env["TRAINYARD_CA_FILE"] = Absolute(credentials.ca_file);
  }
  if (!credentials.server_name.empty()) {
    options.trainer_env["TRAINYARD_TLS_SERVER_NAME"] = credentials.server_name;
  }
  if (credentials.insecure) options.trainer_env["TRAINYARD_INSECURE"] = "1";
  return absl::OkStatus();
}

// How the GPUs' health is checked (--gpu_health): NVML's readings, and the trainer's compute
// check where its LibTorch has CUDA.
void ReadGpuHealth(trainyard::AgentOptions& options, AgentParts& parts) {
  if (!absl::GetFlag(FLAGS_gpu_health) || options.gpus <= 0) return;
  options.gpu_monitor = parts.nvml.get();
  if (!options.runtime.cuda()) {
    trainyard::LogInfo("GPU checks without a compute check: the trainer's LibTorch has no CUDA",
                       options.gpu_monitor != nullptr ? "" : ", and no NVML: no GPU checks");
    return;
  }
  options.gpu_compute_check = [trainer = options.trainer_path, env = options.trainer_env,
                               dir = options.work_dir](int gpu) {
    return trainyard::RunTrainerGpuCheck(trainer, env, gpu,
                                         absl::StrCat(dir, "/gpu-check-", gpu, ".txt"),
                                         trainyard::RealClock::Get());
  };
}

// What trainers run and are given: the executable, the work folder, their environment (the
// parameter servers' TLS, what passes of the agent's), their users and the S3 gateway.
absl::Status ReadTrainers(trainyard::AgentOptions& options, AgentParts& parts) {
  std::error_code ec;
  std::filesystem::create_directories(absl::GetFlag(FLAGS_work_dir), ec);
  if (ec) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot create --work_dir ", absl::GetFlag(FLAGS_work_dir), ": ", ec.message()));
  }
  options.work_dir = Absolute(absl::GetFlag(FLAGS_work_dir));
  options.trainer_path = absl::GetFlag(FLAGS_trainer_path).empty()
                             ? trainyard::SelfExecutableDir() + "/trainyard-trainer"
                             : absl::GetFlag(FLAGS_trainer_path);
  if (access(options.trainer_path.c_str(), X_OK) != 0) {
    trainyard::LogWarning("trainer ", options.trainer_path,
                          " is not executable; tasks will fail to start");
  }
  // Parameter servers: the shard's certificate and key (the reconciler gives them to shard tasks
  // only), and the name ranks check it for.
  const std::string ps_cert = absl::GetFlag(FLAGS_ps_tls_cert);
  const std::string ps_key = absl::GetFlag(FLAGS_ps_tls_key);
  if (ps_cert.empty() != ps_key.empty()) {
    return absl::InvalidArgumentError("--ps_tls_cert and --ps_tls_key go together");
  }
  if (!ps_cert.empty()) {
    options.trainer_env[trainyard::kPsTlsCertEnv] = Absolute(ps_cert);
    options.trainer_env[trainyard::kPsTlsKeyEnv] = Absolute(ps_key);
  }
  if (!absl::GetFlag(FLAGS_ps_tls_server_name).empty()) {
    options.trainer_env[trainyard::kPsTlsServerNameEnv] = absl::GetFlag(FLAGS_ps_tls_server_name);
  }
  for (absl::string_view name :
       absl::StrSplit(absl::GetFlag(FLAGS_trainer_env_pass), ',', absl::SkipWhitespace())) {
    options.trainer_env_pass.emplace_back(absl::StripAsciiWhitespace(name));
  }
  absl::StatusOr<trainyard::TaskUidRange> task_uids =
      trainyard::ParseTaskUidRange(absl::GetFlag(FLAGS_task_uid_range));
  if (!task_uids.ok()) return task_uids.status();
  if (!task_uids->empty() && geteuid() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--task_uid_range: trainers can run as other users only when the agent "
                     "runs as root (it runs as uid ",
                     geteuid(), ")"));
  }
  options.task_uids = *task_uids;
  absl::StatusOr<std::unique_ptr<trainyard::S3Gateway>> s3_gateway = StartS3Gateway();
  if (!s3_gateway.ok()) return absl::UnavailableError(s3_gateway.status().message());
  parts.s3_gateway = *std::move(s3_gateway);
  options.s3_gateway = parts.s3_gateway.get();
  if (absl::GetFlag(FLAGS_data_cache_bytes) < 1) {
    return absl::InvalidArgumentError("--data_cache_bytes must be > 0");
  }
  options.trainer_env["TRAINYARD_DATA_CACHE_BYTES"] =
      absl::StrCat(absl::GetFlag(FLAGS_data_cache_bytes));
  // What the trainer runs, told at registration: jobs whose models need operators its LibTorch
  // lacks are not placed here.
  if (absl::StatusOr<trainyard::v1::TrainerRuntime> runtime = trainyard::QueryTrainerRuntime(
          options.trainer_path, options.trainer_env, options.work_dir + "/trainer-runtime.txt");
      runtime.ok()) {
    options.runtime = *std::move(runtime);
    trainyard::LogInfo("trainer: ", trainyard::DescribeTrainerRuntime(options.runtime));
  } else {
    trainyard::LogWarning("cannot tell what the trainer runs (jobs with TorchScript models will ",
                          "not be placed here): ", runtime.status().message());
  }
  ReadGpuHealth(options, parts);
  return absl::OkStatus();
}

// Runs the agent until it stops: its metrics, the preemption watch and the signals around it.
int Serve(const trainyard::AgentOptions& options, AgentParts& parts, sigset_t stop_signals) {
  // Reconnects within a second, and finds a connection that died unheard by its own pings: the
  // lease stream and the long poll then move to a new one.
  const grpc::ChannelArguments channel_args =
      trainyard::CoordinatorClientArguments(trainyard::kAgentPingInterval);
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      trainyard::NewClientChannel(options.coordinator, parts.credentials, channel_args);
  if (!channel.ok()) {
    trainyard::LogError(channel.status().message());
    return 1;
  }
  const trainyard::Clock& clock = trainyard::RealClock::Get();
  trainyard::Agent agent(options, trainyard::NewGrpcCoordinatorLink(*std::move(channel)),
                         trainyard::NewRealProcessLauncher(), clock);

  // Declared after the agent so that they go first: scrapes read the agent. The server holds the
  // metrics only weakly.
  std::shared_ptr<trainyard::AgentMetrics> metrics;
  if (const std::string listen = absl::GetFlag(FLAGS_metrics_listen); !listen.empty()) {
    trainyard::AgentMetricsSource source;
    source.worker_name = options.name;
    source.gpus_offered = options.gpus;
    source.tasks = [&agent] { return agent.TaskStatuses(); };
    source.gpus_allocated = [&agent] { return agent.GpusAllocated(); };
    source.gpu_tasks = [&agent] { return agent.GpuTasks(); };
    source.hostname = options.hostname;
    source.task_dir = [&agent](const std::string& task_id) { return agent.TaskDir(task_id); };
    source.gpu_faults = [&agent] { return agent.GpuFaults(); };
    source.xid_counts = [&agent] { return agent.XidCounts(); };
    metrics = std::make_shared<trainyard::AgentMetrics>(std::move(source), parts.nvml.get());
  }
  absl::StatusOr<std::unique_ptr<trainyard::MetricsHttpServer>> metrics_server =
      trainyard::StartDaemonMetrics(trainyard::DaemonMetricsFlagsFromCommandLine(
                                        absl::GetFlag(FLAGS_metrics_listen), kDefaultMetricsListen),
                                    metrics);
  if (!metrics_server.ok()) {
    trainyard::LogError(metrics_server.status().message());
    return 1;
  }

  // Stopped (and joined) before the agent goes: it calls into it.
  std::unique_ptr<trainyard::PreemptionWatcher> watcher;
  if (const std::string url = absl::GetFlag(FLAGS_preemption_notice_url); !url.empty()) {
    trainyard::PreemptionWatcherOptions watch;
    watch.url = url;
    watch.poll_interval = absl::GetFlag(FLAGS_preemption_poll_interval);
    watch.grace_period = parts.grace_period;
    watcher = std::make_unique<trainyard::PreemptionWatcher>(watch, trainyard::RealClock::Get());
    watcher->Start(
        [&agent](const trainyard::PreemptionNotice& notice) { agent.RequestPreemption(notice); });
  }

  std::unique_ptr<trainyard::DrainWatcher> drain;
  if (const std::string command = absl::GetFlag(FLAGS_drain_command); !command.empty()) {
    trainyard::DrainWatcherOptions watch;
    watch.command = absl::StrSplit(command, ' ', absl::SkipEmpty());
    watch.poll_interval = absl::GetFlag(FLAGS_drain_poll_interval);
    watch.grace_period = parts.grace_period;
    drain = std::make_unique<trainyard::DrainWatcher>(watch, trainyard::RealClock::Get());
    drain->Start(
        [&agent](const trainyard::PreemptionNotice& notice) { agent.RequestPreemption(notice); });
  }

  // Signals are taken for as long as the process lives, so that a second one is logged, not
  // fatal; the agent is handed them only while it exists.
  static absl::Mutex signal_mu;
  static trainyard::Agent* signal_target ABSL_GUARDED_BY(signal_mu) = nullptr;
  {
    absl::MutexLock lock(&signal_mu);
    signal_target = &agent;
  }
  std::thread signal_thread([stop_signals, grace_period = parts.grace_period, &clock] {
    while (true) {
      int sig = 0;
      if (sigwait(&stop_signals, &sig) != 0) continue;
      absl::MutexLock lock(&signal_mu);
      if (signal_target == nullptr) continue;
      if (sig == SIGTERM) {
        signal_target->RequestPreemption(
            {"SIGTERM", clock.Now() + grace_period, "SIGTERM to the worker agent"});
      } else {
        signal_target->RequestStop();
      }
    }
  });
  signal_thread.detach();

  const int code = agent.Run();
  watcher.reset();
  absl::MutexLock lock(&signal_mu);
  signal_target = nullptr;
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  // absl's Mutex checks every lock for lock-order cycles unless told not to (this build of it
  // has the check on); gRPC's locks go through it too. Measured in the coordinator: 9 % of its
  // CPU with 1,000 idle agents (docs/benchmarks.md).
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  absl::FlagsUsageConfig usage_config;
  auto own_flags = [](absl::string_view file) {
    return absl::EndsWith(file, "agent/main.cc") ||
           absl::EndsWith(file, trainyard::kDaemonMetricsFlagsFile);
  };
  usage_config.contains_help_flags = own_flags;
  usage_config.contains_helpshort_flags = own_flags;
  absl::SetFlagsUsageConfig(usage_config);
  absl::SetProgramUsageMessage(
      "trainyard-worker: registers this machine with the coordinator and runs the trainers it "
      "is given.\nUsage: trainyard-worker [--coordinator=HOST:PORT] [--name=NAME] "
      "[--slots=N] [--gpus=N] ...\n"
      "Signals: SIGTERM means this machine is being preempted: the agent reports it to the "
      "coordinator, asks its trainers to save and exit by --grace_period, and exits 0 within it. "
      "SIGINT is a plain stop: trainers get SIGTERM, SIGKILL after --stop_grace_period, and the "
      "agent exits 0 once they are gone. A second signal changes nothing.");
  absl::ParseCommandLine(argc, argv);
  trainyard::SetLogComponent("worker");

  // Signals are taken by one thread with sigwait; every other thread (and, until exec, every
  // child) inherits the blocked mask. A trainer that closes a pipe must not kill the agent.
  signal(SIGPIPE, SIG_IGN);
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  trainyard::AgentOptions options;
  AgentParts parts;
  for (auto read : {ReadMachine, ReadPeriods, ReadCredentials, ReadTrainers}) {
    if (absl::Status status = read(options, parts); !status.ok()) {
      trainyard::LogError(status.message());
      return ExitCode(status);
    }
  }
  return Serve(options, parts, stop_signals);
}
