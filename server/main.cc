// trainyard-coordinator: the source of truth of a Trainyard cluster (docs/architecture.md).

#include <fcntl.h>
#include <poll.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/byte_size.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/rpc/channel.h"
#include "common/rpc/credentials.h"
#include "common/rpc/daemon_metrics_flags.h"
#include "common/rpc/metrics_http.h"
#include "common/storage/object_store.h"
#include "common/storage/uri.h"
#include "server/api/coordinator_server.h"
#include "server/api/metrics.h"
#include "server/capacity_setup.h"
#include "server/console/console_server.h"
#include "server/console/json_gateway.h"
#include "server/flags.h"
#include "server/jobs/job_manager.h"
#include "server/jobs/workdir_store.h"
#include "server/leadership/leader_lease.h"
#include "server/leadership/leadership.h"
#include "server/leadership/standby_copy.h"
#include "server/leadership/store_migration.h"
#include "server/searches/search_manager.h"
#include "server/state_stores.h"
#include "server/store/log_store.h"
#include "server/store/postgres_job_store.h"
#include "server/store/postgres_log_backend.h"
#include "server/store/sqlite_job_store.h"

namespace trainyard {
namespace {

// SIGTERM/SIGINT land on whichever thread the kernel picks (some library threads exist before
// main), so the handler only writes the signal number to a pipe that the main thread reads.
int g_signal_pipe[2] = {-1, -1};

void OnSignal(int signal_number) {
  const unsigned char byte = static_cast<unsigned char>(signal_number);
  [[maybe_unused]] ssize_t n = write(g_signal_pipe[1], &byte, 1);
}

int WaitForSignal() {
  unsigned char byte = 0;
  while (read(g_signal_pipe[0], &byte, 1) < 0 && errno == EINTR) {
  }
  return byte;
}

// Waits up to `timeout` for a stop signal: true if one came (it is left for WaitForSignal).
bool SignalWithin(absl::Duration timeout) {
  pollfd p = {g_signal_pipe[0], POLLIN, 0};
  int rc;
  while ((rc = poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout)))) < 0 &&
         errno == EINTR) {
  }
  return rc > 0;
}

// The job manager's options from the flags; FAILED_PRECONDITION naming the flag for a bad one.
absl::Status ReadManagerOptions(const std::string& checkpoint_root, JobManagerOptions& options,
                                int64_t* max_task_log_bytes) {
  auto bad = [](absl::string_view message) { return absl::FailedPreconditionError(message); };
  options.checkpoint_root = checkpoint_root;
  options.worker_timeout = absl::GetFlag(FLAGS_worker_timeout);
  options.worker_stream_grace =
      std::max(absl::GetFlag(FLAGS_worker_stream_grace), absl::ZeroDuration());
  options.mass_loss_hold = std::max(absl::GetFlag(FLAGS_mass_loss_hold), absl::ZeroDuration());
  options.lease_beat_timeout =
      std::max(absl::GetFlag(FLAGS_lease_beat_timeout), absl::ZeroDuration());
  options.restart_backoff = std::max(absl::GetFlag(FLAGS_restart_backoff), absl::ZeroDuration());
  options.restart_backoff_max =
      std::max(absl::GetFlag(FLAGS_restart_backoff_max), options.restart_backoff);
  options.start_timeout = absl::GetFlag(FLAGS_start_timeout);
  options.max_active_jobs = absl::GetFlag(FLAGS_max_active_jobs);
  if (options.max_active_jobs < 1) return bad("--max_active_jobs: must be at least 1");
  options.job_retention = absl::GetFlag(FLAGS_job_retention);
  options.lost_worker_retention = absl::GetFlag(FLAGS_lost_worker_retention);
  if (options.job_retention <= absl::ZeroDuration()) {
    return bad("--job_retention: must be positive (or 'inf' to keep finished jobs)");
  }
  *max_task_log_bytes = absl::GetFlag(FLAGS_max_task_log_bytes);
  if (*max_task_log_bytes < 4096) return bad("--max_task_log_bytes: must be at least 4096");
  options.max_job_events = absl::GetFlag(FLAGS_max_job_events);
  options.max_job_restart_records = absl::GetFlag(FLAGS_max_job_restart_records);
  if (options.max_job_events < 20) return bad("--max_job_events: must be at least 20");
  if (options.max_job_restart_records < 1) {
    return bad("--max_job_restart_records: must be at least 1");
  }
  if (options.lost_worker_retention <= absl::ZeroDuration()) {
    return bad("--lost_worker_retention: must be positive");
  }
  options.metric_history.recent_steps = absl::GetFlag(FLAGS_metric_history_recent_steps);
  options.metric_history.old_points = absl::GetFlag(FLAGS_metric_history_points);
  if (options.metric_history.recent_steps < 0) {
    return bad("--metric_history_recent_steps: must be >= 0");
  }
  if (options.metric_history.old_points < 3) return bad("--metric_history_points: must be >= 3");
  options.scheduler_policy.backfill = absl::GetFlag(FLAGS_backfill);
  options.scheduler_policy.fair_share = absl::GetFlag(FLAGS_fair_share);
  options.scheduler_policy.preemption = absl::GetFlag(FLAGS_preemption);
  options.preemption_grace = absl::GetFlag(FLAGS_preemption_grace);
  options.preemption_exempt =
      std::max(absl::GetFlag(FLAGS_preemption_exempt_time), absl::ZeroDuration());
  if (options.preemption_grace <= absl::ZeroDuration()) {
    return bad("--preemption_grace: must be positive");
  }
  if (options.start_timeout <= absl::ZeroDuration())
    return bad("--start_timeout: must be positive");
  if (const std::string path = absl::GetFlag(FLAGS_worker_limits_file); !path.empty()) {
    absl::StatusOr<WorkerLimits> limits = WorkerLimits::Load(path);
    if (!limits.ok()) {
      return bad(absl::StrCat("--worker_limits_file: ", limits.status().message()));
    }
    options.worker_limits = *std::move(limits);
  }
  if (const std::string allowed = absl::GetFlag(FLAGS_allowed_local_paths); allowed != "*") {
    std::vector<std::string> folders;
    for (absl::string_view part : absl::StrSplit(allowed, ',', absl::SkipWhitespace())) {
      absl::StatusOr<std::string> path = LocalPath(absl::StripAsciiWhitespace(part));
      if (!path.ok() || !absl::StartsWith(*path, "/")) {
        return bad(absl::StrCat("--allowed_local_paths: '", part, "' is not an absolute folder"));
      }
      folders.push_back(*path);
    }
    if (allowed.empty()) {
      if (absl::StatusOr<std::string> root = LocalPath(checkpoint_root); root.ok()) {
        folders.push_back(*root);
      }
    }
    options.allowed_local_paths = folders;
  }
  return absl::OkStatus();
}

// The API's credentials: TLS from the flags, plaintext only on loopback or with --insecure.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ApiCredentials(const std::string& listen,
                                                                        ServerTls& tls) {
  tls.cert_file = absl::GetFlag(FLAGS_tls_cert);
  tls.key_file = absl::GetFlag(FLAGS_tls_key);
  tls.client_ca_file = absl::GetFlag(FLAGS_client_ca);
  if (tls.cert_file.empty() && !IsLoopbackAddress(listen)) {
    if (!absl::GetFlag(FLAGS_insecure)) {
      return absl::FailedPreconditionError(
          absl::StrCat("--listen=", listen,
                       " is not loopback and there is no TLS: give --tls_cert and --tls_key, or "
                       "--insecure to serve plaintext (tokens then travel in clear)"));
    }
    LogWarning("serving plaintext on ", listen,
               " (--insecure): tokens and job data travel in clear");
  }
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials = NewServerCredentials(tls);
  if (!credentials.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("TLS: ", credentials.status().message()));
  }
  return credentials;
}

// The tokens, with a first admin token written to --admin_token_file when none is valid.
absl::StatusOr<std::unique_ptr<Authenticator>> LoadTokens(StateStores& stores,
                                                          const std::string& abs_state) {
  absl::StatusOr<std::unique_ptr<Authenticator>> auth =
      Authenticator::Create(*stores.tokens, stores.task_key, RealClock::Get());
  if (!auth.ok()) {
    return absl::Status(auth.status().code(),
                        absl::StrCat("cannot load tokens: ", auth.status().ToString()));
  }
  std::string admin_token_file = absl::GetFlag(FLAGS_admin_token_file);
  if (admin_token_file.empty()) admin_token_file = abs_state + "/admin.token";
  absl::StatusOr<std::optional<std::string>> admin = (*auth)->EnsureAdminToken();
  if (!admin.ok()) {
    return absl::Status(admin.status().code(), absl::StrCat("cannot make the first admin token: ",
                                                            admin.status().ToString()));
  }
  if (admin->has_value()) {
    if (absl::Status s = WriteSecretFile(admin_token_file, **admin + "\n"); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("--admin_token_file: ", s.ToString()));
    }
    LogInfo("no admin token was valid: made one, in ", admin_token_file);
  }
  return auth;
}

// The console stops calling the server, and the calls it has in flight end (the server's
// shutdown cancels its streams), before the server goes.
void StopConsoleCalls(ConsoleServer* console, std::shared_ptr<const JsonGateway>& gateway) {
  if (console == nullptr || gateway == nullptr) return;
  console->SetGateway(nullptr);
  if (!gateway->WaitForCalls(absl::Seconds(10))) {
    LogWarning("console: calls still in flight 10 s after the server stopped");
  }
  gateway.reset();
}

// The console, when --console_listen asks for one: HTTPS with the API's certificate, plain HTTP
// only on loopback or with --insecure. Null with `error` set when it cannot start.
std::unique_ptr<ConsoleServer> StartConsole(const ServerTls& tls, std::string* error) {
  ConsoleOptions options;
  options.listen = absl::GetFlag(FLAGS_console_listen);
  if (options.listen.empty()) return nullptr;
  options.tls_cert_file = tls.cert_file;
  options.tls_key_file = tls.key_file;
  options.max_body_bytes = absl::GetFlag(FLAGS_console_max_body_bytes);
  if (options.max_body_bytes < 1024) {
    *error = "--console_max_body_bytes: must be at least 1024";
    return nullptr;
  }
  if (tls.cert_file.empty() && !IsLoopbackAddress(options.listen)) {
    if (!absl::GetFlag(FLAGS_insecure)) {
      *error = absl::StrCat("--console_listen=", options.listen,
                            " is not loopback and there is no TLS: give --tls_cert and --tls_key, "
                            "or --insecure to serve plain HTTP (tokens then travel in clear)");
      return nullptr;
    }
    LogWarning("console: serving plain HTTP on ", options.listen, " (--insecure)");
  }
  absl::StatusOr<std::unique_ptr<ConsoleServer>> console = ConsoleServer::Start(options);
  if (!console.ok()) {
    *error = absl::StrCat("--console_listen: ", console.status().message());
    return nullptr;
  }
  if (const std::string port_file = absl::GetFlag(FLAGS_console_port_file); !port_file.empty()) {
    if (absl::Status s = WritePortFile(port_file, (*console)->port()); !s.ok()) {
      *error = absl::StrCat("--console_port_file: ", s.ToString());
      return nullptr;
    }
  }
  LogInfo("console at ", (*console)->url());
  return *std::move(console);
}

// What the leader serves, until a stop signal: the job manager and the searches over the stores,
// the API, and the lease let go of at the end.
int Lead(StateStores& stores, const std::string& abs_state, JobManagerOptions options,
         int64_t max_task_log_bytes, CoordinatorMetrics& metrics,
         CoordinatorServerOptions server_options, ConsoleServer* console,
         const std::string& description) {
  options.task_credential_key = stores.task_key;
  options.event_sink = &metrics;
  // s3:// models are read at submission with the S3 settings of this process's environment (as
  // workers read them), when it has them: their operators decide which workers can run a job.
  const std::unique_ptr<ObjectStoreResolver> model_stores =
      NewObjectStoreResolver([](const char* name) { return std::getenv(name); });
  options.model_stores = model_stores.get();
  // Programs' workdirs, kept by content under the owners' folders of the checkpoint root.
  absl::StatusOr<int64_t> max_workdir = ParseByteSize(absl::GetFlag(FLAGS_max_workdir_size));
  if (!max_workdir.ok()) {
    LogError("--max_workdir_size: ", max_workdir.status().message());
    return 1;
  }
  const WorkdirStore workdirs(model_stores.get(), options.checkpoint_root, *max_workdir);
  server_options.workdirs = &workdirs;
  absl::StatusOr<std::unique_ptr<Authenticator>> auth = LoadTokens(stores, abs_state);
  if (!auth.ok()) {
    LogError(auth.status().message());
    return 1;
  }
  absl::StatusOr<std::unique_ptr<JobManager>> manager = JobManager::Create(
      RealClock::Get(), std::move(stores.jobs),
      std::make_unique<LogStore>(std::move(stores.logs), max_task_log_bytes), options);
  if (!manager.ok()) {
    LogError("cannot load state: ", manager.status().ToString());
    return 1;
  }
  JobManager* manager_ptr = manager->get();
  std::unique_ptr<TrialJobs> trial_jobs = TrialJobsOf(**manager);
  absl::StatusOr<std::unique_ptr<SearchManager>> searches =
      SearchManager::Create(RealClock::Get(), *trial_jobs, std::move(stores.searches));
  if (!searches.ok()) {
    LogError("cannot load searches: ", searches.status().ToString());
    return 1;
  }
  SearchManager* searches_ptr = searches->get();
  metrics.SetSnapshotSource([manager_ptr, searches_ptr] {
    ClusterMetricsSnapshot snap = manager_ptr->MetricsSnapshot();
    snap.searches = searches_ptr->MetricsSnapshot();
    return snap;
  });
  // Scrapes stop reading the manager and the searches before they go, on every way out.
  absl::Cleanup no_snapshots = [&metrics] { metrics.SetSnapshotSource(nullptr); };
  server_options.searches = searches->get();
  absl::StatusOr<std::unique_ptr<CoordinatorServer>> server =
      CoordinatorServer::Start(**manager, **auth, server_options);
  if (!server.ok()) {
    LogError(server.status().ToString());
    return 1;
  }
  // The lease keeper (which outlives the server) tells the server's health whether the lease is
  // certain, until the server goes: on every way out, before it is freed.
  if (stores.keeper != nullptr) {
    CoordinatorServer* serving = server->get();
    stores.keeper->OnCertainty([serving](bool sure) { serving->SetServing(sure); });
  }
  absl::Cleanup no_serving = [&stores] {
    if (stores.keeper != nullptr) stores.keeper->OnCertainty(nullptr);
  };
  const std::string& listen = server_options.listen;
  LogInfo("listening on ", listen.substr(0, listen.rfind(':')), ":", (*server)->port(),
          description);
  if (const std::string port_file = absl::GetFlag(FLAGS_port_file); !port_file.empty()) {
    if (absl::Status s = WritePortFile(port_file, (*server)->port()); !s.ok()) {
      LogError("--port_file: ", s.ToString());
      return 1;
    }
  }

  // The console's calls go to this server from now on, until it goes.
  std::shared_ptr<const JsonGateway> gateway =
      std::make_shared<JsonGateway>((*server)->InProcessChannel());
  if (console != nullptr) console->SetGateway(gateway);
  absl::Cleanup no_console = [console, &gateway] { StopConsoleCalls(console, gateway); };

  absl::StatusOr<std::unique_ptr<CapacityLoop>> capacity = CapacityFromFlags(**manager);
  if (!capacity.ok()) {
    LogError(capacity.status().message());
    return 1;
  }
  if (*capacity != nullptr) (*capacity)->Start();

  const int signal_number = WaitForSignal();
  LogInfo("signal ", signal_number, ": shutting down");
  capacity->reset();
  (*server)->Shutdown(absl::Seconds(5));
  std::move(no_serving).Invoke();
  std::move(no_console).Invoke();
  server->reset();
  std::move(no_snapshots).Invoke();
  searches->reset();
  manager->reset();  // flushes progress, closes the database
  if (stores.lease != nullptr) {
    stores.keeper.reset();
    // A standby takes over now rather than when the lease would have run out.
    if (absl::Status s = stores.lease->Release(); !s.ok()) {
      LogWarning("releasing the leader lease: ", s.message());
    } else {
      LogInfo("released the leader lease");
    }
  }
  LogInfo("stopped");
  return 0;
}

// Stop signals come through a pipe (OnSignal) that the main thread waits on.
bool CatchStopSignals() {
  if (pipe(g_signal_pipe) != 0) {
    LogError("pipe: ", std::strerror(errno));
    return false;
  }
  struct sigaction action = {};
  action.sa_handler = OnSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
  // A parent that blocks these signals (to sigwait for them itself) passes its mask on through
  // exec; unblock them here so that at least this thread takes them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_UNBLOCK, &stop_signals, nullptr);
  return true;
}

int Run() {
  if (!CatchStopSignals()) return 1;
  const std::string state_dir = absl::GetFlag(FLAGS_state_dir);
  std::error_code ec;
  std::filesystem::create_directories(state_dir, ec);
  if (ec) {
    LogError("cannot create --state_dir ", state_dir, ": ", ec.message());
    return 1;
  }
  const std::string abs_state = std::filesystem::absolute(state_dir).lexically_normal().string();
  if (!LockStateDir(abs_state)) return 1;
  if (absl::GetFlag(FLAGS_migrate_state)) return MigrateState(abs_state);
  std::string checkpoint_root = absl::GetFlag(FLAGS_checkpoint_root);
  if (checkpoint_root.empty()) checkpoint_root = absl::StrCat("file://", abs_state, "/checkpoints");
  JobManagerOptions options;
  int64_t max_task_log_bytes = 0;
  if (absl::Status s = ReadManagerOptions(checkpoint_root, options, &max_task_log_bytes); !s.ok()) {
    LogError(s.message());
    return 1;
  }
  CoordinatorServerOptions server_options;
  server_options.listen = absl::GetFlag(FLAGS_listen);
  server_options.max_streams_per_caller = absl::GetFlag(FLAGS_max_streams_per_caller);
  server_options.health_listen = absl::GetFlag(FLAGS_health_listen);
  server_options.lease_ping_interval =
      std::max(absl::GetFlag(FLAGS_lease_ping_interval), absl::Milliseconds(10));
  server_options.lease_ping_timeout =
      std::max(absl::GetFlag(FLAGS_lease_ping_timeout), absl::Milliseconds(10));
  server_options.reflection = absl::GetFlag(FLAGS_reflection);
  if (server_options.max_streams_per_caller < 1) {
    LogError("--max_streams_per_caller: must be >= 1");
    return 1;
  }

  // Created before the manager, which reports events to it; served from the start, a standby's
  // with trainyard_coordinator_leader 0 and no cluster gauges.
  auto metrics = std::make_shared<CoordinatorMetrics>();
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> metrics_server = StartDaemonMetrics(
      DaemonMetricsFlagsFromCommandLine(absl::GetFlag(FLAGS_metrics_listen), kDefaultMetricsListen),
      metrics);
  if (!metrics_server.ok()) {
    LogError(metrics_server.status().message());
    return 1;
  }
  ServerTls tls;
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      ApiCredentials(server_options.listen, tls);
  if (!credentials.ok()) {
    LogError(credentials.status().message());
    return 1;
  }
  server_options.credentials = *credentials;
  // The console answers from the start: standing by, its API names the leader.
  std::string console_error;
  std::unique_ptr<ConsoleServer> console = StartConsole(tls, &console_error);
  if (!console_error.empty()) {
    LogError(console_error);
    return 1;
  }
  ConsoleServer* console_ptr = console.get();
  bool stopped = false;
  std::optional<StateStores> stores =
      OpenStores(abs_state, server_options.listen, *credentials, SignalWithin, &stopped,
                 [console_ptr](const std::string& leader) {
                   if (console_ptr != nullptr) console_ptr->SetLeader(leader);
                 });
  if (!stores.has_value()) {
    if (stopped) LogInfo("stopped while standing by");
    return stopped ? 0 : 1;
  }
  // Port 0: the port the kernel gave it standing by, where its clients already are.
  std::string& listen = server_options.listen;
  if (stores->standby_port != 0 && absl::EndsWith(listen, ":0")) {
    listen = absl::StrCat(listen.substr(0, listen.size() - 1), stores->standby_port);
  }
  metrics->SetLeader(true);
  return Lead(*stores, abs_state, std::move(options), max_task_log_bytes, *metrics, server_options,
              console.get(),
              absl::StrCat(tls.cert_file.empty() ? "" : " (TLS)", " (state ", abs_state,
                           ", checkpoints ", checkpoint_root, ")"));
}

}  // namespace
}  // namespace trainyard

int main(int argc, char** argv) {
  // absl's Mutex checks every lock for lock-order cycles unless told not to (this build of it
  // has the check on); gRPC's locks go through it too: 9 % of this process's CPU with 1,000 idle
  // agents (docs/benchmarks.md).
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  absl::SetProgramUsageMessage(
      "trainyard-coordinator: job queue, scheduler and state of a Trainyard cluster.\n"
      "Usage: trainyard-coordinator [--listen=HOST:PORT] [--state_dir=DIR] "
      "[--checkpoint_root=URI] [--worker_timeout=10s] [--port_file=PATH] "
      "[--metrics_listen=HOST:PORT] [--tls_cert=PEM --tls_key=PEM] [--client_ca=PEM] "
      "[--insecure]");
  absl::FlagsUsageConfig usage_config;
  // --help lists the coordinator's flags (server/flags.cc) and the shared metrics flags (by
  // default absl looks for a file named after the binary).
  usage_config.contains_help_flags = [](absl::string_view path) {
    return absl::EndsWith(path, "server/flags.cc") ||
           absl::EndsWith(path, trainyard::kDaemonMetricsFlagsFile);
  };
  usage_config.contains_helpshort_flags = usage_config.contains_help_flags;
  absl::SetFlagsUsageConfig(usage_config);
  absl::ParseCommandLine(argc, argv);
  trainyard::SetLogComponent("coordinator");
  return trainyard::Run();
}
