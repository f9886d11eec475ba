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
#include "common/channel.h"
#include "common/clock.h"
#include "common/credentials.h"
#include "common/daemon_metrics_flags.h"
#include "common/log.h"
#include "common/metrics_http.h"
#include "common/object_store.h"
#include "common/uri.h"
#include "server/api/coordinator_server.h"
#include "server/api/metrics.h"
#include "server/flags.h"
#include "server/jobs/job_manager.h"
#include "server/leadership/leader_lease.h"
#include "server/leadership/leadership.h"
#include "server/leadership/standby_copy.h"
#include "server/leadership/store_migration.h"
#include "server/searches/search_manager.h"
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

// The cluster's state: three connections to one store (the manager's, the tokens', the
// searches'), the key that signs task credentials, and with PostgreSQL the lease that makes this
// coordinator the leader, kept renewed.
struct StateStores {
  std::unique_ptr<JobStore> jobs;
  std::unique_ptr<JobStore> tokens;
  std::unique_ptr<JobStore> searches;
  std::unique_ptr<LogBackend> logs;  // task logs: files in the state folder, or the database's
  std::string task_key;
  std::unique_ptr<LeaderLease> lease;
  std::unique_ptr<LeaseKeeper> keeper;
  int standby_port = 0;  // the API port it stood by on: the leader's server binds the same
};

// The address others are told this coordinator serves at.
std::string AdvertisedAddress(const std::string& listen) {
  if (std::string flag = absl::GetFlag(FLAGS_advertise_address); !flag.empty()) return flag;
  const size_t colon = listen.rfind(':');
  const std::string host = listen.substr(0, colon);
  if (host == "0.0.0.0" || host == "[::]" || host.empty()) {
    char name[256] = {};
    gethostname(name, sizeof(name) - 1);
    return absl::StrCat(name, listen.substr(colon));
  }
  return listen;
}

// The connection options of a postgres:// --store, the password from --store_password_file;
// nullopt (logged) when they are not usable.
std::optional<pg::ConnectOptions> PostgresOptionsFromFlags() {
  const std::string store = absl::GetFlag(FLAGS_store);
  if (!absl::StartsWith(store, "postgres://") && !absl::StartsWith(store, "postgresql://")) {
    LogError("--store: '", pg::RedactConninfo(store),
             "' is neither empty (SQLite) nor a postgres:// address");
    return std::nullopt;
  }
  pg::ConnectOptions options;
  options.conninfo = store;
  if (absl::Status s = pg::ValidateConninfo(store); !s.ok()) {
    LogError("--store: ", s.message());
    return std::nullopt;
  }
  if (absl::StrContains(pg::RedactConninfo(store), "***")) {
    LogWarning(
        "--store carries a password, which anyone on this machine can read in the "
        "process list: prefer --store_password_file or PGPASSWORD");
  }
  if (const std::string file = absl::GetFlag(FLAGS_store_password_file); !file.empty()) {
    absl::StatusOr<std::string> password = ReadCredentialFile(file);
    if (!password.ok()) {
      LogError("--store_password_file: ", password.status().message());
      return std::nullopt;
    }
    options.password = *password;
  }
  return options;
}

// Holds --state_dir for this process (flock on its coordinator.lock, released at exit): two
// coordinators on one state folder would both schedule. False (logged) when another holds it.
bool LockStateDir(const std::string& abs_state) {
  const std::string path = abs_state + "/coordinator.lock";
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    LogError("cannot open ", path, ": ", std::strerror(errno));
    return false;
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    LogError("--state_dir ", abs_state, " is in use by another coordinator (", path,
             " is locked): stop it first, or give this one a --state_dir of its own");
    close(fd);
    return false;
  }
  const std::string pid = absl::StrCat(getpid(), "\n");
  if (ftruncate(fd, 0) == 0 && write(fd, pid.data(), pid.size()) < 0) {
    // The pid is for people; the lock is what counts.
  }
  return true;  // the descriptor stays open, and the lock held, until the process ends
}

// In a state folder whose state.db was migrated into PostgreSQL (--migrate_state).
constexpr char kMigratedMarker[] = "state.db.migrated";

// --migrate_state: the state folder's SQLite state into the empty database of --store.
int MigrateState(const std::string& abs_state) {
  if (absl::GetFlag(FLAGS_store).empty()) {
    LogError("--migrate_state: name the PostgreSQL database to migrate into with --store");
    return 1;
  }
  std::optional<pg::ConnectOptions> options = PostgresOptionsFromFlags();
  if (!options.has_value()) return 1;
  LogInfo("migrating ", abs_state, " into ", pg::RedactConninfo(options->conninfo));
  absl::StatusOr<MigrationCounts> counts =
      MigrateSqliteToPostgres(abs_state, *options, [](absl::string_view what) { LogInfo(what); });
  if (!counts.ok()) {
    LogError("--migrate_state: ", counts.status().message());
    return 1;
  }
  // Said once: later starts on --store do not take the folder's state.db for one left behind.
  if (absl::Status s = WriteSecretFile(
          abs_state + "/" + kMigratedMarker,
          absl::StrCat("migrated into ", pg::RedactConninfo(options->conninfo), "\n"));
      !s.ok()) {
    LogWarning("cannot mark ", abs_state, " as migrated: ", s.message());
  }
  LogInfo("migrated: ", counts->jobs, " jobs, ", counts->tokens, " tokens, ", counts->searches,
          " searches, ", counts->queues, " queues, ", counts->workers, " workers, the logs of ",
          counts->logs,
          " tasks and the task-credential key. Start the coordinators with --store; "
          "their agents and trainers carry on. ",
          abs_state, "/state.db is no longer used: keep it as a backup.");
  return 0;
}

// SQLite in the state folder; or PostgreSQL, after waiting to lead. Returns nullopt after logging
// why when it cannot, or when a stop signal came while standing by (`stopped` set).
std::optional<StateStores> OpenStores(const std::string& abs_state, const std::string& listen,
                                      std::shared_ptr<grpc::ServerCredentials> credentials,
                                      bool* stopped) {
  StateStores stores;
  const std::string store = absl::GetFlag(FLAGS_store);
  if (store.empty()) {
    // Three connections to the same file (the later ones open it with its schema current).
    for (std::unique_ptr<JobStore>* slot : {&stores.jobs, &stores.tokens, &stores.searches}) {
      absl::StatusOr<std::unique_ptr<SqliteJobStore>> opened =
          SqliteJobStore::Open(abs_state + "/state.db");
      if (!opened.ok()) {
        LogError("cannot open the state database: ", opened.status().ToString());
        return std::nullopt;
      }
      *slot = *std::move(opened);
    }
    absl::StatusOr<std::string> key = LoadOrCreateKey(abs_state + "/task-credential.key");
    if (!key.ok()) {
      LogError("task credential key: ", key.status().ToString());
      return std::nullopt;
    }
    stores.task_key = *key;
    stores.logs = NewFileLogBackend(abs_state + "/logs");
    return stores;
  }
  std::optional<pg::ConnectOptions> parsed = PostgresOptionsFromFlags();
  if (!parsed.has_value()) return std::nullopt;
  pg::ConnectOptions options = *std::move(parsed);
  if (std::filesystem::exists(abs_state + "/state.db") &&
      !std::filesystem::exists(abs_state + "/" + kMigratedMarker)) {
    LogWarning("--state_dir ", abs_state,
               " holds a SQLite state (state.db) that --store does not use; to carry it over, "
               "run this coordinator once with --migrate_state (docs/operations.md)");
  }
  const absl::Duration lease_length = absl::GetFlag(FLAGS_leader_lease);
  if (lease_length < absl::Milliseconds(300)) {
    LogError("--leader_lease: must be at least 300ms");
    return std::nullopt;
  }
  // A write of a leader frozen or cut off in mid-transaction holds the lease row (the fence's
  // share lock) until the server ends it: no longer than a lease, so the takeover is not held up.
  options.idle_in_transaction_timeout = lease_length;
  // The lease's calls must end well within a renewal period.
  pg::ConnectOptions lease_options = options;
  lease_options.timeout = lease_length / 4;
  lease_options.application_name = "trainyard-coordinator-lease";
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  const std::string holder =
      absl::StrCat(host, "/", getpid(), "/", absl::BytesToHexString(RandomBytes(4)));
  absl::StatusOr<std::unique_ptr<LeaderLease>> lease;
  std::string last_warning;
  // The database may not be up yet (started together): wait for it as for the lease.
  while (!(lease = LeaderLease::Open(lease_options, holder,
                                     AdvertisedAddress(absl::GetFlag(FLAGS_listen)), lease_length,
                                     RealClock::Get()))
              .ok()) {
    if (lease.status().code() != absl::StatusCode::kUnavailable) {
      LogError("--store: ", lease.status().ToString());
      return std::nullopt;
    }
    if (lease.status().message() != last_warning) {
      last_warning = std::string(lease.status().message());
      LogWarning("waiting for the database: ", last_warning);
    }
    if (SignalWithin(absl::Seconds(1))) {
      *stopped = true;
      return std::nullopt;
    }
  }
  stores.lease = *std::move(lease);
  // The database's view of who wrote what (pg_stat_activity, audit triggers) names this process.
  options.application_name = absl::StrCat("trainyard-coordinator ", holder).substr(0, 63);
  LogInfo("store: PostgreSQL at ", pg::RedactConninfo(store), " as ", holder, "; waiting to lead");
  const auto waited = MonotonicNow();
  // Standing by, it answers on the API address: clients given this coordinator alone are told
  // where the leader serves; those given several see it NOT_SERVING and keep to the leader. On
  // --health_listen, probes see it alive but not ready.
  absl::StatusOr<std::unique_ptr<StandbyServer>> standby_api =
      StandbyServer::Start(listen, credentials);
  if (!standby_api.ok()) {
    LogError("--listen: ", standby_api.status().message());
    return std::nullopt;
  }
  stores.standby_port = (*standby_api)->port();
  std::unique_ptr<StandbyServer> standby_health;
  if (const std::string health = absl::GetFlag(FLAGS_health_listen); !health.empty()) {
    absl::StatusOr<std::unique_ptr<StandbyServer>> started = StandbyServer::Start(health);
    if (!started.ok()) {
      LogError("--health_listen: ", started.status().message());
      return std::nullopt;
    }
    standby_health = *std::move(started);
  }
  const absl::Duration poll = std::min(lease_length / 6, absl::Milliseconds(500));
  // While it stands by it keeps a warm copy of the state, read again from the change feed at
  // every poll, so that taking over reads only what changed since.
  std::unique_ptr<StandbyCopy> copy;
  if (absl::GetFlag(FLAGS_warm_standby)) {
    pg::ConnectOptions copy_options = options;
    copy_options.application_name = "trainyard-coordinator-standby-copy";
    absl::StatusOr<std::unique_ptr<PostgresJobStore>> reader = PostgresJobStore::Open(copy_options);
    if (reader.ok()) {
      copy = std::make_unique<StandbyCopy>(*std::move(reader), poll);
    } else {
      LogWarning("standby: no warm copy of the state (", reader.status().message(),
                 "); it will be loaded on taking over");
    }
  }
  const bool led = WaitToLead(*stores.lease, poll, SignalWithin, [&](const std::string& leader) {
    (*standby_api)->SetLeader(leader);
    if (standby_health != nullptr) standby_health->SetLeader(leader);
  });
  // The leader's own servers take the ports.
  standby_api->reset();
  standby_health.reset();
  if (!led) {
    *stopped = true;
    return std::nullopt;
  }
  const LeaseFence fence = stores.lease->fence();
  LogInfo("leading (lease token ", fence.token, ") after ", SecondsSince(waited), " s standing by");
  // Kept from now on: a lease lost while loading is as lost as one lost later.
  stores.keeper =
      std::make_unique<LeaseKeeper>(*stores.lease, RealClock::Get(), [](const absl::Status& why) {
        LogError("no longer the leader: ", why.message(),
                 "; exiting so that nothing more is done as leader (a supervisor starts this "
                 "coordinator again as a standby)");
        std::_Exit(3);
      });
  // A leader that cannot open its stores lets go of the lease: a standby may do better, and need
  // not wait for the lease to run out.
  auto cannot_open = [&stores](const absl::Status& why) -> std::optional<StateStores> {
    LogError("cannot open the PostgreSQL store: ", why.ToString());
    stores.keeper.reset();
    stores.lease->Release().IgnoreError();
    return std::nullopt;
  };
  // The warm copy, brought up to date now that no earlier leader can write: what the stores'
  // first loads return.
  WarmStart warm;
  if (copy != nullptr) {
    const auto taking = MonotonicNow();
    const StandbyCopy::Stats before = copy->stats();
    absl::StatusOr<WarmStart> taken = copy->Take();
    if (taken.ok()) {
      warm = *std::move(taken);
      const StandbyCopy::Stats after = copy->stats();
      LogInfo("took over the warm copy of the state (", warm.contents->jobs.size(),
              " jobs; kept by ", after.full_reads, " full and ", after.change_reads,
              " change reads), brought up to date in ", SecondsSince(taking), " s reading ",
              after.jobs_reread - before.jobs_reread, " changed jobs");
    } else {
      LogWarning("the warm copy of the state cannot be brought up to date (",
                 taken.status().message(), "); loading the state from the database");
    }
    copy.reset();
  }
  PostgresJobStore* token_store = nullptr;
  for (std::unique_ptr<JobStore>* slot : {&stores.jobs, &stores.tokens, &stores.searches}) {
    absl::StatusOr<std::unique_ptr<PostgresJobStore>> opened =
        PostgresJobStore::Open(options, fence);
    if (!opened.ok()) return cannot_open(opened.status());
    if (slot == &stores.tokens) token_store = opened->get();
    // Each store hands out the pieces its user loads first: the jobs and queues (JobManager),
    // the tokens (Authenticator), the searches (SearchManager).
    WarmStart pieces;
    if (slot == &stores.jobs) {
      pieces.contents = std::move(warm.contents);
      pieces.queues = std::move(warm.queues);
    } else if (slot == &stores.tokens) {
      pieces.tokens = std::move(warm.tokens);
    } else {
      pieces.searches = std::move(warm.searches);
    }
    *slot = std::make_unique<PreloadedJobStore>(*std::move(opened), std::move(pieces));
  }
  // Task logs in the database too: a coordinator that takes over serves every log.
  absl::StatusOr<std::unique_ptr<PostgresLogBackend>> logs =
      PostgresLogBackend::Open(options, fence);
  if (!logs.ok()) return cannot_open(logs.status());
  stores.logs = *std::move(logs);
  // Every coordinator signs task credentials with the one key, so that trainers keep theirs
  // across a takeover.
  absl::StatusOr<std::string> key =
      token_store->SharedSecret("task-credential-key", [] { return RandomBytes(32); });
  if (!key.ok()) {
    LogError("task credential key: ", key.status().ToString());
    return std::nullopt;
  }
  stores.task_key = *key;
  return stores;
}

int Run() {
  if (pipe(g_signal_pipe) != 0) {
    LogError("pipe: ", std::strerror(errno));
    return 1;
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
  std::string listen = absl::GetFlag(FLAGS_listen);
  ServerTls tls;
  tls.cert_file = absl::GetFlag(FLAGS_tls_cert);
  tls.key_file = absl::GetFlag(FLAGS_tls_key);
  tls.client_ca_file = absl::GetFlag(FLAGS_client_ca);
  if (tls.cert_file.empty() && !IsLoopbackAddress(listen)) {
    if (!absl::GetFlag(FLAGS_insecure)) {
      LogError("--listen=", listen,
               " is not loopback and there is no TLS: give --tls_cert and --tls_key, or "
               "--insecure to serve plaintext (tokens then travel in clear)");
      return 1;
    }
    LogWarning("serving plaintext on ", listen,
               " (--insecure): tokens and job data travel in clear");
  }
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials = NewServerCredentials(tls);
  if (!credentials.ok()) {
    LogError("TLS: ", credentials.status().message());
    return 1;
  }
  bool stopped = false;
  std::optional<StateStores> stores = OpenStores(abs_state, listen, *credentials, &stopped);
  if (!stores.has_value()) {
    if (stopped) LogInfo("stopped while standing by");
    return stopped ? 0 : 1;
  }
  // Port 0: the port the kernel gave it standing by, where its clients already are.
  if (stores->standby_port != 0 && absl::EndsWith(listen, ":0")) {
    listen = absl::StrCat(listen.substr(0, listen.size() - 1), stores->standby_port);
  }
  metrics->SetLeader(true);
  JobManagerOptions options;
  options.event_sink = metrics.get();
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
  if (options.max_active_jobs < 1) {
    LogError("--max_active_jobs: must be at least 1");
    return 1;
  }
  options.job_retention = absl::GetFlag(FLAGS_job_retention);
  options.lost_worker_retention = absl::GetFlag(FLAGS_lost_worker_retention);
  if (options.job_retention <= absl::ZeroDuration()) {
    LogError("--job_retention: must be positive (or 'inf' to keep finished jobs)");
    return 1;
  }
  const int64_t max_task_log_bytes = absl::GetFlag(FLAGS_max_task_log_bytes);
  if (max_task_log_bytes < 4096) {
    LogError("--max_task_log_bytes: must be at least 4096");
    return 1;
  }
  options.max_job_events = absl::GetFlag(FLAGS_max_job_events);
  options.max_job_restart_records = absl::GetFlag(FLAGS_max_job_restart_records);
  if (options.max_job_events < 20) {
    LogError("--max_job_events: must be at least 20");
    return 1;
  }
  if (options.max_job_restart_records < 1) {
    LogError("--max_job_restart_records: must be at least 1");
    return 1;
  }
  if (options.lost_worker_retention <= absl::ZeroDuration()) {
    LogError("--lost_worker_retention: must be positive");
    return 1;
  }
  options.scheduler_policy.backfill = absl::GetFlag(FLAGS_backfill);
  options.scheduler_policy.fair_share = absl::GetFlag(FLAGS_fair_share);
  options.scheduler_policy.preemption = absl::GetFlag(FLAGS_preemption);
  options.preemption_grace = absl::GetFlag(FLAGS_preemption_grace);
  options.preemption_exempt =
      std::max(absl::GetFlag(FLAGS_preemption_exempt_time), absl::ZeroDuration());
  if (options.preemption_grace <= absl::ZeroDuration()) {
    LogError("--preemption_grace: must be positive");
    return 1;
  }
  if (options.start_timeout <= absl::ZeroDuration()) {
    LogError("--start_timeout: must be positive");
    return 1;
  }
  options.task_credential_key = stores->task_key;
  if (const std::string path = absl::GetFlag(FLAGS_worker_limits_file); !path.empty()) {
    absl::StatusOr<WorkerLimits> limits = WorkerLimits::Load(path);
    if (!limits.ok()) {
      LogError("--worker_limits_file: ", limits.status().message());
      return 1;
    }
    options.worker_limits = *std::move(limits);
  }
  if (const std::string allowed = absl::GetFlag(FLAGS_allowed_local_paths); allowed != "*") {
    std::vector<std::string> folders;
    for (absl::string_view part : absl::StrSplit(allowed, ',', absl::SkipWhitespace())) {
      absl::StatusOr<std::string> path = LocalPath(absl::StripAsciiWhitespace(part));
      if (!path.ok() || !absl::StartsWith(*path, "/")) {
        LogError("--allowed_local_paths: '", part, "' is not an absolute folder");
        return 1;
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
  // s3:// models are read at submission with the S3 settings of this process's environment (as
  // workers read them), when it has them: their operators decide which workers can run a job.
  const std::unique_ptr<ObjectStoreResolver> model_stores =
      NewObjectStoreResolver([](const char* name) { return std::getenv(name); });
  options.model_stores = model_stores.get();
  absl::StatusOr<std::unique_ptr<Authenticator>> auth =
      Authenticator::Create(*stores->tokens, stores->task_key, RealClock::Get());
  if (!auth.ok()) {
    LogError("cannot load tokens: ", auth.status().ToString());
    return 1;
  }
  std::string admin_token_file = absl::GetFlag(FLAGS_admin_token_file);
  if (admin_token_file.empty()) admin_token_file = abs_state + "/admin.token";
  absl::StatusOr<std::optional<std::string>> admin = (*auth)->EnsureAdminToken();
  if (!admin.ok()) {
    LogError("cannot make the first admin token: ", admin.status().ToString());
    return 1;
  }
  if (admin->has_value()) {
    if (absl::Status s = WriteSecretFile(admin_token_file, **admin + "\n"); !s.ok()) {
      LogError("--admin_token_file: ", s.ToString());
      return 1;
    }
    LogInfo("no admin token was valid: made one, in ", admin_token_file);
  }
  absl::StatusOr<std::unique_ptr<JobManager>> manager = JobManager::Create(
      RealClock::Get(), std::move(stores->jobs),
      std::make_unique<LogStore>(std::move(stores->logs), max_task_log_bytes), options);
  if (!manager.ok()) {
    LogError("cannot load state: ", manager.status().ToString());
    return 1;
  }
  JobManager* manager_ptr = manager->get();
  std::unique_ptr<TrialJobs> trial_jobs = TrialJobsOf(**manager);
  absl::StatusOr<std::unique_ptr<SearchManager>> searches =
      SearchManager::Create(RealClock::Get(), *trial_jobs, std::move(stores->searches));
  if (!searches.ok()) {
    LogError("cannot load searches: ", searches.status().ToString());
    return 1;
  }
  SearchManager* searches_ptr = searches->get();
  metrics->SetSnapshotSource([manager_ptr, searches_ptr] {
    ClusterMetricsSnapshot snap = manager_ptr->MetricsSnapshot();
    snap.searches = searches_ptr->MetricsSnapshot();
    return snap;
  });
  // Scrapes stop reading the manager and the searches before they go, on every way out.
  absl::Cleanup no_snapshots = [&metrics] { metrics->SetSnapshotSource(nullptr); };
  CoordinatorServerOptions server_options;
  server_options.listen = listen;
  server_options.max_streams_per_caller = absl::GetFlag(FLAGS_max_streams_per_caller);
  server_options.health_listen = absl::GetFlag(FLAGS_health_listen);
  server_options.lease_ping_interval =
      std::max(absl::GetFlag(FLAGS_lease_ping_interval), absl::Milliseconds(10));
  server_options.lease_ping_timeout =
      std::max(absl::GetFlag(FLAGS_lease_ping_timeout), absl::Milliseconds(10));
  server_options.searches = searches->get();
  server_options.reflection = absl::GetFlag(FLAGS_reflection);
  if (server_options.max_streams_per_caller < 1) {
    LogError("--max_streams_per_caller: must be >= 1");
    return 1;
  }
  server_options.credentials = *credentials;
  absl::StatusOr<std::unique_ptr<CoordinatorServer>> server =
      CoordinatorServer::Start(**manager, **auth, server_options);
  if (!server.ok()) {
    LogError(server.status().ToString());
    return 1;
  }
  const std::string host = listen.substr(0, listen.rfind(':'));
  LogInfo("listening on ", host, ":", (*server)->port(), tls.cert_file.empty() ? "" : " (TLS)",
          " (state ", abs_state, ", checkpoints ", checkpoint_root, ")");
  if (const std::string port_file = absl::GetFlag(FLAGS_port_file); !port_file.empty()) {
    if (absl::Status s = WritePortFile(port_file, (*server)->port()); !s.ok()) {
      LogError("--port_file: ", s.ToString());
      return 1;
    }
  }

  const int signal_number = WaitForSignal();
  LogInfo("signal ", signal_number, ": shutting down");
  (*server)->Shutdown(absl::Seconds(5));
  server->reset();
  std::move(no_snapshots).Invoke();
  searches->reset();
  manager->reset();  // flushes progress, closes the database
  if (stores->lease != nullptr) {
    stores->keeper.reset();
    // A standby takes over now rather than when the lease would have run out.
    if (absl::Status s = stores->lease->Release(); !s.ok()) {
      LogWarning("releasing the leader lease: ", s.message());
    } else {
      LogInfo("released the leader lease");
    }
  }
  LogInfo("stopped");
  return 0;
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
