#include "worker/trainer/loop/shard_task.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "common/log.h"
#include "worker/trainer/loop/trainer.h"
#include "worker/trainer/ps/server.h"
#include "worker/trainer/ps/strategy.h"
#include "worker/trainer/ps/wire.h"

namespace trainyard::trainer {
namespace {

// How long before a stop's deadline a shard still serving gives up (the agent kills at it).
constexpr absl::Duration kShardExitAhead = absl::Milliseconds(200);

// How often the counters are written out.
constexpr absl::Duration kMetricsInterval = absl::Seconds(1);

// Replaces `path` with the counters, one "name value" line each; a failure is logged once.
void WriteStats(const std::string& path, const ShardStats& stats) {
  if (path.empty()) return;
  const std::string text = absl::StrCat(
      "pushes ", stats.pushes, "\nstale_pushes ", stats.stale_pushes, "\nstaleness_sum ",
      stats.staleness_sum, "\npulls ", stats.pulls, "\nbytes_received ", stats.bytes_received,
      "\nbytes_sent ", stats.bytes_sent, "\npull_wait_seconds ", stats.pull_wait_seconds,
      "\nversion ", stats.version, "\n");
  const std::string tmp = path + ".tmp";
  static bool warned = false;
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
    out.close();
    if (out && std::rename(tmp.c_str(), path.c_str()) == 0) return;
  }
  if (!warned) LogWarning("cannot write ", path, ": its metrics are not exported");
  warned = true;
}

PsServerOptions ShardServerOptions(const trainyard::v1::Task& task,
                                   const ShardTaskOptions& options) {
  PsServerOptions server;
  server.caller_secret = task.attempt_secret();
  server.tls_cert_file = options.tls.cert_file;
  server.tls_key_file = options.tls.key_file;
  // No message the shard handles is larger than the memory it may hold.
  const int64_t memory = task.spec().parameter_servers().memory_bytes();
  server.max_message_bytes =
      memory > 0 ? std::min(memory, ps_wire::kMaxMessageBytes) : ps_wire::kMaxMessageBytes;
  return server;
}

// Serves on `listen`, or when it is empty on `host` (every address when that cannot be bound).
absl::StatusOr<std::unique_ptr<PsServer>> StartShardServer(const ShardConfig& config,
                                                           const PsServerOptions& server,
                                                           const std::string& listen,
                                                           const std::string& host) {
  if (!listen.empty()) return PsServer::StartEmpty(config, listen, server);
  const bool ipv6 = host.find(':') != std::string::npos && host.front() != '[';
  const std::string own = ipv6 ? absl::StrCat("[", host, "]:0") : absl::StrCat(host, ":0");
  absl::StatusOr<std::unique_ptr<PsServer>> started = PsServer::StartEmpty(config, own, server);
  if (started.ok() || started.status().code() != absl::StatusCode::kUnavailable) return started;
  LogWarning("parameter server ", config.shard, ": cannot listen on ", own,
             "; listening on every address");
  return PsServer::StartEmpty(config, "0.0.0.0:0", server);
}

}  // namespace

absl::Status RunShardTask(const trainyard::v1::Task& task, const ShardTaskOptions& options) {
  const trainyard::v1::JobSpec& spec = task.spec();
  if (task.role() != trainyard::v1::TASK_ROLE_SHARD ||
      spec.strategy() != trainyard::v1::PARAMETER_SERVER) {
    return absl::InvalidArgumentError("task: not a shard of a parameter_server job");
  }
  if (task.shard() < 0 || task.shard() >= std::max(1, spec.parameter_servers().shards())) {
    return absl::InvalidArgumentError(
        absl::StrCat("task: shard ", task.shard(), " of ", spec.parameter_servers().shards()));
  }
  if (options.rendezvous == nullptr || options.stop_signal == nullptr) {
    return absl::InvalidArgumentError(
        "a parameter-server shard needs the coordinator's rendezvous (run with --coordinator)");
  }
  // Every push and pull allocates and frees buffers of the model's size: keep them in the heap.
  KeepStepMemory();
  ShardConfig config;
  config.generation = task.generation();
  config.shard = task.shard();
  config.shards = std::max(1, spec.parameter_servers().shards());
  config.workers = std::max(1, task.world_size());
  config.synchronous = spec.parameter_servers().mode() != "async";
  config.max_staleness = spec.parameter_servers().max_staleness();
  config.optimizer = spec.optimizer();
  const std::string host =
      task.worker_address().empty() ? options.default_hostname : task.worker_address();
  absl::StatusOr<std::unique_ptr<PsServer>> server =
      StartShardServer(config, ShardServerOptions(task, options), options.listen, host);
  if (!server.ok()) return server.status();
  const std::string address = (*server)->AddressFor(host);
  absl::Status published = options.rendezvous->Set(ParameterServerKey(task.shard()), address);
  if (!published.ok()) {
    return absl::UnavailableError(
        absl::StrCat("parameter server ", task.shard(), ": ", published.message()));
  }
  LogInfo("parameter server ", task.shard(), " of ", spec.parameter_servers().shards(), " serving ",
          config.workers, " ranks at ", address);
  std::optional<absl::Time> deadline;
  absl::Time stopped_at;
  absl::Time stats_written = absl::InfinitePast();
  // Written whichever way the loop ends.
  struct FinalStats {
    const PsServer& server;
    const std::string& path;
    ~FinalStats() { WriteStats(path, server.Stats()); }
  } final_stats{**server, options.metrics_file};
  while (!(*server)->WaitUntilFinished(RealClock::Get().Now() + options.poll_interval)) {
    if (RealClock::Get().Now() - stats_written >= kMetricsInterval) {
      WriteStats(options.metrics_file, (*server)->Stats());
      stats_written = RealClock::Get().Now();
    }
    if (options.stop_signal->load() == 0) continue;
    if (!deadline.has_value()) {
      deadline = options.stop_deadline_file.empty() ? std::nullopt
                                                    : ReadStopDeadline(options.stop_deadline_file);
      if (!deadline.has_value()) deadline = absl::InfiniteFuture();
      stopped_at = RealClock::Get().Now();
      LogInfo("parameter server ", task.shard(),
              " asked to stop: serving until the ranks have saved and finished");
    }
    if (RealClock::Get().Now() >= *deadline - kShardExitAhead) {
      LogWarning("parameter server ", task.shard(), ": the stop's deadline came first");
      return absl::OkStatus();
    }
    // A plain stop (no deadline: the attempt ended or the job was cancelled) may come after
    // ranks that will never finish are gone.
    const absl::Duration quiet = options.quiet_after_plain_stop;
    if (*deadline == absl::InfiniteFuture() && RealClock::Get().Now() - stopped_at >= quiet &&
        (*server)->Quiet(quiet)) {
      LogInfo("parameter server ", task.shard(), ": no rank called for ",
              absl::FormatDuration(quiet), " since the stop; ending");
      return absl::OkStatus();
    }
  }
  const ShardStats stats = (*server)->Stats();
  LogInfo("parameter server ", task.shard(), ": every rank finished at version ", stats.version,
          "; pushes=", stats.pushes, " pulls=", stats.pulls,
          " bytes_received=", stats.bytes_received, " bytes_sent=", stats.bytes_sent,
          " stale_pushes=", stats.stale_pushes);
  return absl::OkStatus();
}

}  // namespace trainyard::trainer
