// Opening the coordinator's state: SQLite, or PostgreSQL after waiting to lead.

#include "server/state_stores.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/rpc/channel.h"
#include "common/rpc/credentials.h"
#include "server/api/coordinator_server.h"
#include "server/flags.h"
#include "server/leadership/standby_copy.h"
#include "server/leadership/store_migration.h"
#include "server/store/postgres_job_store.h"
#include "server/store/postgres_log_backend.h"
#include "server/store/sqlite_job_store.h"

namespace trainyard {
namespace {

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

// In a state folder whose state.db was migrated into PostgreSQL (--migrate_state).
constexpr char kMigratedMarker[] = "state.db.migrated";

// Three connections to the state folder's state.db (the later ones open it with its schema
// current), its task credential key, and its logs.
std::optional<StateStores> OpenSqlite(const std::string& abs_state) {
  StateStores stores;
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

// The leader's lease row, as `holder`, once the database answers (it may not be up yet, started
// together). Null (logged) when it cannot be opened, or when a stop signal came (`stopped` set).
std::unique_ptr<LeaderLease> OpenLease(const pg::ConnectOptions& options, const std::string& holder,
                                       absl::Duration lease_length, const SignalWait& signal_within,
                                       bool* stopped) {
  // The lease's calls must end well within a renewal period.
  pg::ConnectOptions lease_options = options;
  lease_options.timeout = lease_length / 4;
  lease_options.application_name = "trainyard-coordinator-lease";
  absl::StatusOr<std::unique_ptr<LeaderLease>> lease;
  std::string last_warning;
  while (!(lease = LeaderLease::Open(lease_options, holder,
                                     AdvertisedAddress(absl::GetFlag(FLAGS_listen)), lease_length,
                                     RealClock::Get()))
              .ok()) {
    if (lease.status().code() != absl::StatusCode::kUnavailable) {
      LogError("--store: ", lease.status().ToString());
      return nullptr;
    }
    if (lease.status().message() != last_warning) {
      last_warning = std::string(lease.status().message());
      LogWarning("waiting for the database: ", last_warning);
    }
    if (signal_within(absl::Seconds(1))) {
      *stopped = true;
      return nullptr;
    }
  }
  return *std::move(lease);
}

// Stands by until this coordinator leads. Standing by, it answers on the API address: clients
// given this coordinator alone are told where the leader serves; those given several see it
// NOT_SERVING and keep to the leader. On --health_listen, probes see it alive but not ready. It
// keeps a warm copy of the state meanwhile (`copy`, with --warm_standby), read again from the
// change feed at every poll, so that taking over reads only what changed since. False (logged)
// when it cannot stand by, or when a stop signal came (`stopped` set).
bool StandBy(StateStores& stores, const pg::ConnectOptions& options, const std::string& listen,
             std::shared_ptr<grpc::ServerCredentials> credentials, absl::Duration lease_length,
             const SignalWait& signal_within, const LeaderSeen& leader_seen,
             std::unique_ptr<StandbyCopy>* copy, bool* stopped) {
  absl::StatusOr<std::unique_ptr<StandbyServer>> standby_api =
      StandbyServer::Start(listen, credentials);
  if (!standby_api.ok()) {
    LogError("--listen: ", standby_api.status().message());
    return false;
  }
  stores.standby_port = (*standby_api)->port();
  std::unique_ptr<StandbyServer> standby_health;
  if (const std::string health = absl::GetFlag(FLAGS_health_listen); !health.empty()) {
    absl::StatusOr<std::unique_ptr<StandbyServer>> started = StandbyServer::Start(health);
    if (!started.ok()) {
      LogError("--health_listen: ", started.status().message());
      return false;
    }
    standby_health = *std::move(started);
  }
  const absl::Duration poll = std::min(lease_length / 6, absl::Milliseconds(500));
  if (absl::GetFlag(FLAGS_warm_standby)) {
    pg::ConnectOptions copy_options = options;
    copy_options.application_name = "trainyard-coordinator-standby-copy";
    absl::StatusOr<std::unique_ptr<PostgresJobStore>> reader = PostgresJobStore::Open(copy_options);
    if (reader.ok()) {
      *copy = std::make_unique<StandbyCopy>(*std::move(reader), poll);
    } else {
      LogWarning("standby: no warm copy of the state (", reader.status().message(),
                 "); it will be loaded on taking over");
    }
  }
  const bool led = WaitToLead(*stores.lease, poll, signal_within, [&](const std::string& leader) {
    (*standby_api)->SetLeader(leader);
    if (standby_health != nullptr) standby_health->SetLeader(leader);
    if (leader_seen) leader_seen(leader);
  });
  // The leader's own servers take the ports.
  standby_api->reset();
  standby_health.reset();
  if (!led) *stopped = true;
  return led;
}

// The warm copy, brought up to date now that no earlier leader can write: what the stores' first
// loads return. Empty where there is no copy or it cannot be brought up to date.
WarmStart TakeWarmCopy(std::unique_ptr<StandbyCopy> copy) {
  WarmStart warm;
  if (copy == nullptr) return warm;
  const auto taking = MonotonicNow();
  const StandbyCopy::Stats before = copy->stats();
  absl::StatusOr<WarmStart> taken = copy->Take();
  if (taken.ok()) {
    warm = *std::move(taken);
    const StandbyCopy::Stats after = copy->stats();
    LogInfo("took over the warm copy of the state (", warm.contents->jobs.size(), " jobs; kept by ",
            after.full_reads, " full and ", after.change_reads,
            " change reads), brought up to date in ", SecondsSince(taking), " s reading ",
            after.jobs_reread - before.jobs_reread, " changed jobs");
  } else {
    LogWarning("the warm copy of the state cannot be brought up to date (",
               taken.status().message(), "); loading the state from the database");
  }
  return warm;
}

// The leader's stores, fenced by its lease: the three connections (each handing out the pieces
// of the warm copy its user loads first), the task logs and the shared task credential key.
absl::Status OpenLeaderStores(StateStores& stores, const pg::ConnectOptions& options,
                              WarmStart warm) {
  const LeaseFence fence = stores.lease->fence();
  PostgresJobStore* token_store = nullptr;
  for (std::unique_ptr<JobStore>* slot : {&stores.jobs, &stores.tokens, &stores.searches}) {
    absl::StatusOr<std::unique_ptr<PostgresJobStore>> opened =
        PostgresJobStore::Open(options, fence);
    if (!opened.ok()) return opened.status();
    if (slot == &stores.tokens) token_store = opened->get();
    // The jobs and queues (JobManager), the tokens (Authenticator), the searches (SearchManager).
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
  if (!logs.ok()) return logs.status();
  stores.logs = *std::move(logs);
  // Every coordinator signs task credentials with the one key, so that trainers keep theirs
  // across a takeover.
  absl::StatusOr<std::string> key =
      token_store->SharedSecret("task-credential-key", [] { return RandomBytes(32); });
  if (!key.ok()) {
    return absl::Status(key.status().code(),
                        absl::StrCat("task credential key: ", key.status().message()));
  }
  stores.task_key = *key;
  return absl::OkStatus();
}

}  // namespace

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

std::optional<StateStores> OpenStores(const std::string& abs_state, const std::string& listen,
                                      std::shared_ptr<grpc::ServerCredentials> credentials,
                                      const SignalWait& signal_within, bool* stopped,
                                      const LeaderSeen& leader_seen) {
  const std::string store = absl::GetFlag(FLAGS_store);
  if (store.empty()) return OpenSqlite(abs_state);
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
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  const std::string holder =
      absl::StrCat(host, "/", getpid(), "/", absl::BytesToHexString(RandomBytes(4)));
  StateStores stores;
  stores.lease = OpenLease(options, holder, lease_length, signal_within, stopped);
  if (stores.lease == nullptr) return std::nullopt;
  // The database's view of who wrote what (pg_stat_activity, audit triggers) names this process.
  options.application_name = absl::StrCat("trainyard-coordinator ", holder).substr(0, 63);
  LogInfo("store: PostgreSQL at ", pg::RedactConninfo(store), " as ", holder, "; waiting to lead");
  const auto waited = MonotonicNow();
  std::unique_ptr<StandbyCopy> copy;
  if (!StandBy(stores, options, listen, std::move(credentials), lease_length, signal_within,
               leader_seen, &copy, stopped)) {
    return std::nullopt;
  }
  LogInfo("leading (lease token ", stores.lease->fence().token, ") after ", SecondsSince(waited),
          " s standing by");
  // Kept from now on: a lease lost while loading is as lost as one lost later.
  stores.keeper =
      std::make_unique<LeaseKeeper>(*stores.lease, RealClock::Get(), [](const absl::Status& why) {
        LogError("no longer the leader: ", why.message(),
                 "; exiting so that nothing more is done as leader (a supervisor starts this "
                 "coordinator again as a standby)");
        std::_Exit(3);
      });
  if (absl::Status opened = OpenLeaderStores(stores, options, TakeWarmCopy(std::move(copy)));
      !opened.ok()) {
    // A leader that cannot open its stores lets go of the lease: a standby may do better, and
    // need not wait for the lease to run out.
    LogError("cannot open the PostgreSQL store: ", opened.ToString());
    stores.keeper.reset();
    stores.lease->Release().IgnoreError();
    return std::nullopt;
  }
  return stores;
}

}  // namespace trainyard
