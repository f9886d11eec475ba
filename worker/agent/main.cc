// trainyard-worker: the agent that runs trainers on one machine.

#include <signal.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/time/time.h"
#include "common/log.h"
#include "common/metrics_http.h"
#include "grpcpp/grpcpp.h"
#include "worker/agent/agent.h"
#include "worker/agent/metrics.h"
#include "worker/agent/subprocess.h"

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
          "host:port of the coordinator (default: $TRAINYARD_COORDINATOR, else 127.0.0.1:7070)");
ABSL_FLAG(std::string, name, "",
          "unique name of this worker; re-registering a name replaces it (default: the hostname)");
ABSL_FLAG(std::string, address, "127.0.0.1",
          "address other machines reach this one at (trainers of a job meet their peers there)");
ABSL_FLAG(int, slots, 0, "CPU slots offered to the scheduler (default: the number of cores)");
ABSL_FLAG(int, gpus, -1,
          "GPUs offered to the scheduler; -1 detects them (the count of /dev/nvidia[0-9]*)");
ABSL_FLAG(std::string, work_dir, "./trainyard-worker",
          "folder for task folders ({work_dir}/tasks/{task_id}/: task.pb, output.log, pid)");
ABSL_FLAG(std::string, trainer_path, "",
          "the trainyard-trainer executable (default: the one next to this binary)");
ABSL_FLAG(absl::Duration, stop_grace_period, absl::Seconds(10),
          "how long a trainer has to exit after SIGTERM before it gets SIGKILL");
ABSL_FLAG(absl::Duration, sync_wait, absl::Seconds(1),
          "how long each Sync long-poll is held by the coordinator; also the lease renewal "
          "period");
// Several coordinators or agents on one machine (tests, `trainyard up`) cannot all have it.
constexpr char kDefaultMetricsListen[] = "0.0.0.0:7072";
ABSL_FLAG(std::string, metrics_listen, kDefaultMetricsListen,
          "address for Prometheus metrics (HTTP GET /metrics) as HOST:PORT; port 0 lets the "
          "kernel pick one (see --metrics_port_file); empty turns metrics off. If the default "
          "address is taken the agent runs without metrics (with a warning); an address given "
          "explicitly that cannot be bound stops it");
ABSL_FLAG(std::string, metrics_port_file, "",
          "if set, once metrics are served, write their bound port number to this file");

int main(int argc, char** argv) {
  absl::FlagsUsageConfig usage_config;
  auto own_flags = [](absl::string_view file) { return absl::EndsWith(file, "agent/main.cc"); };
  usage_config.contains_help_flags = own_flags;
  usage_config.contains_helpshort_flags = own_flags;
  absl::SetFlagsUsageConfig(usage_config);
  absl::SetProgramUsageMessage(
      "trainyard-worker: registers this machine with the coordinator and runs the trainers it "
      "is given.\nUsage: trainyard-worker [--coordinator=HOST:PORT] [--name=NAME] "
      "[--slots=N] [--gpus=N] ...");
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
  options.coordinator = absl::GetFlag(FLAGS_coordinator);
  options.name = absl::GetFlag(FLAGS_name).empty() ? Hostname() : absl::GetFlag(FLAGS_name);
  options.address = absl::GetFlag(FLAGS_address);
  options.slots = absl::GetFlag(FLAGS_slots) > 0
                      ? absl::GetFlag(FLAGS_slots)
                      : std::max(1u, std::thread::hardware_concurrency());
  options.gpus =
      absl::GetFlag(FLAGS_gpus) >= 0 ? absl::GetFlag(FLAGS_gpus) : trainyard::DetectGpuCount();
  options.memory_bytes = trainyard::MachineMemoryBytes();
  options.hostname = Hostname();
  std::error_code ec;
  std::filesystem::create_directories(absl::GetFlag(FLAGS_work_dir), ec);
  if (ec) {
    trainyard::LogError("cannot create --work_dir ", absl::GetFlag(FLAGS_work_dir), ": ",
                        ec.message());
    return 1;
  }
  options.work_dir = std::filesystem::absolute(absl::GetFlag(FLAGS_work_dir)).lexically_normal();
  options.trainer_path = absl::GetFlag(FLAGS_trainer_path).empty()
                             ? trainyard::SelfExecutableDir() + "/trainyard-trainer"
                             : absl::GetFlag(FLAGS_trainer_path);
  if (access(options.trainer_path.c_str(), X_OK) != 0) {
    trainyard::LogWarning("trainer ", options.trainer_path,
                          " is not executable; tasks will fail to start");
  }
  options.stop_grace_period = absl::GetFlag(FLAGS_stop_grace_period);
  options.sync_wait = absl::GetFlag(FLAGS_sync_wait);

  grpc::ChannelArguments channel_args;
  // Reconnect quickly after a coordinator restart: the lease runs out in seconds.
  channel_args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  channel_args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  channel_args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  trainyard::Agent agent(
      options, grpc::CreateCustomChannel(options.coordinator, grpc::InsecureChannelCredentials(),
                                         channel_args));

  // Declared after the agent so that they go first: scrapes read the agent. The server holds the
  // metrics only weakly.
  std::shared_ptr<trainyard::AgentMetrics> metrics;
  std::unique_ptr<trainyard::MetricsHttpServer> metrics_server;
  if (const std::string listen = absl::GetFlag(FLAGS_metrics_listen); !listen.empty()) {
    absl::StatusOr<std::unique_ptr<trainyard::GpuMonitor>> nvml = trainyard::LoadNvml();
    std::unique_ptr<trainyard::GpuMonitor> gpus;
    if (nvml.ok()) {
      gpus = *std::move(nvml);
    } else {
      trainyard::LogInfo("no GPU metrics: ", nvml.status().message());
    }
    trainyard::AgentMetricsSource source;
    source.worker_name = options.name;
    source.gpus_offered = options.gpus;
    source.tasks = [&agent] { return agent.TaskStatuses(); };
    source.gpus_allocated = [&agent] { return agent.GpusAllocated(); };
    metrics = std::make_shared<trainyard::AgentMetrics>(std::move(source), std::move(gpus));
    absl::StatusOr<std::unique_ptr<trainyard::MetricsHttpServer>> started =
        trainyard::MetricsHttpServer::Start(listen, metrics);
    if (started.ok()) {
      metrics_server = *std::move(started);
      trainyard::LogInfo("metrics on ", listen.substr(0, listen.rfind(':')), ":",
                         metrics_server->port(), "/metrics");
    } else if (listen != kDefaultMetricsListen) {
      trainyard::LogError("--metrics_listen: ", started.status().ToString());
      return 1;
    } else {
      trainyard::LogWarning("metrics are off: ", started.status().message());
    }
  }
  if (const std::string path = absl::GetFlag(FLAGS_metrics_port_file);
      !path.empty() && metrics_server != nullptr) {
    if (absl::Status s = trainyard::WritePortFile(path, metrics_server->port()); !s.ok()) {
      trainyard::LogError("--metrics_port_file: ", s.ToString());
      return 1;
    }
  }

  std::thread signal_thread([&agent, stop_signals] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    agent.RequestStop(trainyard::StopReason::kTerminationSignal);
  });
  signal_thread.detach();

  return agent.Run();
}
