#include "worker/trainer/loop/make_strategy.h"

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "worker/trainer/collective/gloo_communicator.h"
#include "worker/trainer/ps/strategy.h"
#if TRAINYARD_WITH_NCCL
#include "worker/trainer/collective/nccl_communicator.h"
#endif

namespace trainyard::trainer {
namespace {

// Meeting the peers waits for the slowest rank to start, load its data and build its model.
constexpr absl::Duration kMinConnectTimeout = absl::Minutes(5);

absl::Duration CollectiveTimeout(const trainyard::v1::JobSpec& spec) {
  return absl::Seconds(spec.collective_timeout_seconds());
}

// The data-parallel strategy of `task`'s ranks (world > 1), over NCCL or Gloo.
absl::StatusOr<std::unique_ptr<DataParallelStrategy>> MakeDataParallel(
    const trainyard::v1::Task& task, const StrategyOptions& options, int world) {
  const trainyard::v1::JobSpec& spec = task.spec();
  const absl::Duration timeout = CollectiveTimeout(spec);
  const int64_t bucket_bytes =
      int64_t{spec.bucket_size_mb()} << 20;
  std::unique_ptr<Communicator> communicator;
  const bool wants_gpu = task.gpus() > 0 || spec.resources().gpus_per_worker() > 0;
#if TRAINYARD_WITH_NCCL
  if (TrainingDevice(task).is_cuda()) {
    absl::StatusOr<std::unique_ptr<Communicator>> nccl = NewNcclCommunicator(
        task.rank(), world, *options.rendezvous, timeout, std::max(kMinConnectTimeout, timeout));
    if (!nccl.ok()) return nccl.status();
    communicator = *std::move(nccl);
  }
#endif
  if (communicator == nullptr) {
    if (wants_gpu && spec.strategy() == trainyard::v1::DATA_PARALLEL) {
      LogWarning(
          "resources.gpus_per_worker is set but this trainer has no CUDA or no NCCL; ranks "
          "train on CPU and reduce with Gloo");
    }
    GlooOptions gloo;
    gloo.hostname =
        task.worker_address().empty() ? options.default_hostname : task.worker_address();
    gloo.timeout = timeout;
    gloo.connect_timeout = std::max(kMinConnectTimeout, timeout);
    absl::StatusOr<std::unique_ptr<Communicator>> made =
        NewGlooCommunicator(task.rank(), world, *options.rendezvous, gloo);
    if (!made.ok()) return made.status();
    communicator = *std::move(made);
  }
  return std::make_unique<DataParallelStrategy>(std::move(communicator), bucket_bytes,
                                                options.overlap);
}

absl::StatusOr<std::unique_ptr<Strategy>> MakeParameterServerStrategy(
    const trainyard::v1::Task& task, const StrategyOptions& options) {
  const trainyard::v1::JobSpec& spec = task.spec();
  const int world = std::max(1, task.world_size());
  if (task.rank() < 0 || task.rank() >= world) {
    return absl::InvalidArgumentError(
        absl::StrCat("task: rank ", task.rank(), " outside world size ", world));
  }
  if (options.rendezvous == nullptr) {
    return absl::InvalidArgumentError(
        "strategy: parameter_server needs the coordinator's rendezvous (run with --coordinator)");
  }
  const absl::Duration timeout = CollectiveTimeout(spec);
  // dense: allreduce: the layers other than the tables are all-reduced among the ranks.
  std::unique_ptr<Strategy> dense;
  if (spec.parameter_servers().dense() == "allreduce") {
    if (world == 1) {
      dense = std::make_unique<SingleStrategy>();
    } else {
      if (spec.batch_size() % world != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "batch_size: ", spec.batch_size(), " does not divide across ", world, " ranks"));
      }
      absl::StatusOr<std::unique_ptr<DataParallelStrategy>> made =
          MakeDataParallel(task, options, world);
      if (!made.ok()) return made.status();
      dense = *std::move(made);
    }
  }
  std::vector<std::unique_ptr<PsClient>> shards;
  for (int s = 0; s < std::max(1, spec.parameter_servers().shards()); ++s) {
    absl::StatusOr<std::string> address =
        options.rendezvous->Get(ParameterServerKey(s), std::max(kMinConnectTimeout, timeout));
    if (!address.ok()) return address.status();
    shards.push_back(std::make_unique<PsClient>(*address, s, task.generation(), task.rank(),
                                                timeout, task.attempt_secret()));
  }
  return std::make_unique<ParameterServerStrategy>(task.rank(), world, std::move(shards),
                                                   spec.parameter_servers().mode() != "async",
                                                   std::move(dense));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Strategy>> MakeStrategy(const trainyard::v1::Task& task,
                                                       const StrategyOptions& options) {
  const trainyard::v1::JobSpec& spec = task.spec();
  switch (spec.strategy()) {
    case trainyard::v1::STRATEGY_UNSPECIFIED:
    case trainyard::v1::SINGLE:
      if (task.world_size() > 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "strategy: single runs one rank, the task has world size ", task.world_size()));
      }
      return std::make_unique<SingleStrategy>();
    case trainyard::v1::DATA_PARALLEL:
      break;
    case trainyard::v1::PARAMETER_SERVER:
      return MakeParameterServerStrategy(task, options);
    default:
      return absl::InvalidArgumentError("strategy: unknown strategy");
  }
  const int world = std::max(1, task.world_size());
  if (task.rank() < 0 || task.rank() >= world) {
    return absl::InvalidArgumentError(
        absl::StrCat("task: rank ", task.rank(), " outside world size ", world));
  }
  // One rank has nobody to talk to; it trains exactly as the single strategy does.
  if (world == 1) return std::make_unique<SingleStrategy>();
  if (spec.batch_size() % world != 0) {
    return absl::InvalidArgumentError(absl::StrCat("batch_size: ", spec.batch_size(),
                                                   " does not divide across ", world, " ranks"));
  }
  if (options.rendezvous == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("strategy: data_parallel with ", world,
                     " ranks needs the coordinator's rendezvous (run with --coordinator)"));
  }
  absl::StatusOr<std::unique_ptr<DataParallelStrategy>> made =
      MakeDataParallel(task, options, world);
  if (!made.ok()) return made.status();
  return std::unique_ptr<Strategy>(*std::move(made));
}

}  // namespace trainyard::trainer
