#include "worker/trainer/ps_task.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "worker/trainer/ps_service.h"
#include "worker/trainer/strategy.h"

namespace trainyard::trainer {

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
  ShardConfig config;
  config.generation = task.generation();
  config.workers = std::max(1, task.world_size());
  config.synchronous = spec.parameter_servers().mode() != "async";
  config.max_staleness = spec.parameter_servers().max_staleness();
  config.optimizer = spec.optimizer();
  absl::StatusOr<std::unique_ptr<PsServer>> server = PsServer::StartEmpty(config, options.listen);
  if (!server.ok()) return server.status();
  const std::string host =
      task.worker_address().empty() ? options.default_hostname : task.worker_address();
  const std::string address = absl::StrCat(host, ":", (*server)->port());
  absl::Status published = options.rendezvous->Set(ParameterServerKey(task.shard()), address);
  if (!published.ok()) {
    return absl::UnavailableError(
        absl::StrCat("parameter server ", task.shard(), ": ", published.message()));
  }
  LogInfo("parameter server ", task.shard(), " of ", spec.parameter_servers().shards(), " serving ",
          config.workers, " ranks at ", address);
  while (options.stop_signal->load() == 0) absl::SleepFor(options.poll_interval);
  LogInfo("parameter server ", task.shard(), " stopping");
  return absl::OkStatus();
}

}  // namespace trainyard::trainer
