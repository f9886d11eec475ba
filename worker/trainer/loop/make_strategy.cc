#include "worker/trainer/loop/make_strategy.h"

#include <algorithm>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/log.h"
#include "worker/trainer/collective/gloo_communicator.h"
#include "worker/trainer/model/transformer.h"
#include "worker/trainer/pipeline/plan.h"
#include "worker/trainer/pipeline/strategy.h"
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
  const int64_t bucket_bytes = int64_t{spec.bucket_size_mb()} << 20;
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
  return std::make_unique<DataParallelStrategy>(
      WithRecorder(std::move(communicator), options.recorder, options.recording), bucket_bytes,
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
                                                timeout, task.attempt_secret(), options.ps_tls));
  }
  return std::make_unique<ParameterServerStrategy>(task.rank(), world, std::move(shards),
                                                   spec.parameter_servers().mode() != "async",
                                                   std::move(dense));
}

// Pipelines connect over Gloo, on CPUs and GPUs alike (a GPU stage's activations and gradients go
// through host memory): every rank of the attempt, with point-to-point connections, and each
// stage's replicas apart.
absl::StatusOr<std::unique_ptr<Strategy>> MakePipelineStrategy(const trainyard::v1::Task& task,
                                                               const StrategyOptions& options) {
  const trainyard::v1::JobSpec& spec = task.spec();
  const int world = std::max(1, task.world_size());
  absl::StatusOr<pipeline::Topology> topology =
      pipeline::TopologyOf(task.rank(), world, spec.pipeline().stages());
  if (!topology.ok()) return topology.status();
  absl::StatusOr<pipeline::Schedule> schedule = pipeline::ParseSchedule(spec.pipeline().schedule());
  if (!schedule.ok()) return schedule.status();
  // A TorchScript model's layers are known once the trainer has loaded or measured it
  // (set_ranges).
  const bool script = !spec.model().torchscript().empty() || spec.model().stages_size() > 0;
  absl::StatusOr<std::vector<pipeline::LayerRange>> ranges =
      script ? std::vector<pipeline::LayerRange>() : PipelineStages(spec);
  if (!ranges.ok()) return ranges.status();
  if (world > 1 && options.rendezvous == nullptr) {
    return absl::InvalidArgumentError(
        "strategy: pipeline needs the coordinator's rendezvous (run with --coordinator)");
  }
  const absl::Duration timeout = CollectiveTimeout(spec);
  GlooOptions gloo;
  gloo.hostname = task.worker_address().empty() ? options.default_hostname : task.worker_address();
  gloo.timeout = timeout;
  gloo.connect_timeout = std::max(kMinConnectTimeout, timeout);
  std::unique_ptr<Communicator> all;
  std::unique_ptr<Communicator> replicas;
  if (world > 1) {
    gloo.point_to_point = true;
    absl::StatusOr<std::unique_ptr<Communicator>> made =
        NewGlooCommunicator(task.rank(), world, *options.rendezvous, gloo);
    if (!made.ok()) return made.status();
    all = WithRecorder(*std::move(made), options.recorder, options.recording);
  }
  if (topology->replicas > 1) {
    gloo.point_to_point = false;
    gloo.key_prefix = absl::StrCat("stage", topology->stage, "/");
    absl::StatusOr<std::unique_ptr<Communicator>> made =
        NewGlooCommunicator(topology->replica, topology->replicas, *options.rendezvous, gloo);
    if (!made.ok()) return made.status();
    replicas = *std::move(made);
  }
  if (all == nullptr) return std::unique_ptr<Strategy>(std::make_unique<SingleStrategy>());
  const trainyard::v1::ModelArgs& args = spec.model().args();
  const bool tied = !script && (!args.has_tie_embeddings() || args.tie_embeddings());
  return std::unique_ptr<Strategy>(std::make_unique<pipeline::PipelineStrategy>(
      *topology, *schedule, spec.pipeline().microbatches(),
      tied ? std::vector<std::string>{"wte.weight"} : std::vector<std::string>(),
      *std::move(ranges), std::move(all), std::move(replicas)));
}

}  // namespace

absl::StatusOr<std::vector<pipeline::LayerRange>> PipelineStages(const trainyard::v1::JobSpec& spec,
                                                                 std::vector<int64_t> bytes) {
  if (bytes.empty()) bytes = TransformerLayerBytes(spec.model().args());
  if (bytes.empty()) {
    return absl::InvalidArgumentError(
        "strategy: pipeline splits model builtin transformer or a TorchScript Sequential");
  }
  const std::vector<int> counts(spec.pipeline().partition_counts().begin(),
                                spec.pipeline().partition_counts().end());
  absl::StatusOr<std::vector<int>> split = pipeline::PartitionLayers(
      bytes, spec.pipeline().stages(), spec.pipeline().partition(), counts);
  if (!split.ok()) return split.status();
  return pipeline::StageRanges(*split);
}

absl::StatusOr<std::vector<std::string>> SequentialTies(
    Model& model, const std::vector<pipeline::LayerRange>& ranges) {
  absl::StatusOr<std::vector<SharedParameter>> shared = SequentialSharedParameters(model);
  if (!shared.ok()) return shared.status();
  const int last = static_cast<int>(ranges.size()) - 1;
  auto stage_of = [&ranges](int layer) {
    for (size_t s = 0; s < ranges.size(); ++s) {
      if (layer >= ranges[s].first && layer < ranges[s].end) return static_cast<int>(s);
    }
    return -1;
  };
  std::vector<std::string> tied;
  for (const SharedParameter& p : *shared) {
    std::set<int> stages;
    for (int layer : p.layers) stages.insert(stage_of(layer));
    if (stages.size() < 2) continue;  // within one stage: nothing to tie
    if (stages != std::set<int>{0, last}) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.torchscript: layers ", absl::StrJoin(p.layers, ", "), " share ",
                       p.name, ", which would tie stages ", absl::StrJoin(stages, ", "),
                       ": a pipeline ties weights between its first and last stages only (choose "
                       "pipeline.partition counts that put those layers there, or in one stage)"));
    }
    tied.push_back(p.name);
  }
  return tied;
}

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
    case trainyard::v1::PIPELINE:
      return MakePipelineStrategy(task, options);
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
