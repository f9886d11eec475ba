#ifndef TRAINYARD_WORKER_TRAINER_LOOP_MAKE_STRATEGY_H_
#define TRAINYARD_WORKER_TRAINER_LOOP_MAKE_STRATEGY_H_

// Which Strategy a task runs, connected to its peers: single, data-parallel over NCCL or Gloo,
// parameter-server (with its dense layers all-reduced or on the shards), or pipeline.

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/flight_record.h"
#include "common/rpc/ps_tls.h"
#include "trainyard/v1/agent_service.pb.h"
#include "worker/trainer/collective/recording_communicator.h"
#include "worker/trainer/coordinator/rendezvous_client.h"
#include "worker/trainer/model/model.h"
#include "worker/trainer/pipeline/strategy.h"
#include "worker/trainer/strategy/strategy.h"

namespace trainyard::trainer {

struct StrategyOptions {
  // Where ranks meet; required for world sizes above 1. Not owned; used only during
  // MakeStrategy.
  RendezvousClient* rendezvous = nullptr;
  // Start gradient all-reduces from autograd hooks during backward (true) or all after it.
  bool overlap = true;
  // Where peers reach this rank when the task does not say (task.worker_address).
  std::string default_hostname = "127.0.0.1";
  // How ranks reach parameter-server shards that serve TLS (TrainerOptions::ps_tls).
  PsTls ps_tls;
  // The rank's flight record (TrainerOptions::recorder): the communicators whose collectives
  // every rank of the attempt shares are wrapped in a RecordingCommunicator with `recording`
  // (data-parallel, parameter-server dense layers, a pipeline's connections among all its ranks;
  // not a pipeline stage's group of replicas, whose collectives the other stages do not share,
  // so that collective #N stays the same collective on every rank). Not owned; null: none.
  FlightRecorder* recorder = nullptr;
  RecordingOptions recording;
};

// The strategy of `task.spec.strategy` (a spec with its defaults, ApplyJobSpecDefaults),
// connected to its peers (blocks until they all joined; parameter_server: until every shard
// published its address). INVALID_ARGUMENT for a world size the strategy cannot run or a missing
// rendezvous; the communicator's or the rendezvous' errors otherwise.
absl::StatusOr<std::unique_ptr<Strategy>> MakeStrategy(const trainyard::v1::Task& task,
                                                       const StrategyOptions& options);

// A pipeline job's split of the model's layers: [first, end) of each stage, from
// pipeline.partition over the layers' parameter bytes (`layer_bytes`; empty: the built-in
// transformer's, from model.args). INVALID_ARGUMENT naming the field.
absl::StatusOr<std::vector<pipeline::LayerRange>> PipelineStages(
    const trainyard::v1::JobSpec& spec, std::vector<int64_t> layer_bytes = {});

// The parameters of a TorchScript Sequential (`model`, whole) that layers of different stages of
// `ranges` share: the names the first and last stages tie (PipelineStrategy::set_tied).
// INVALID_ARGUMENT naming model.torchscript for one that other stages would share.
absl::StatusOr<std::vector<std::string>> SequentialTies(
    Model& model, const std::vector<pipeline::LayerRange>& ranges);

}  // namespace trainyard::trainer

#endif  // TRAINYARD_WORKER_TRAINER_LOOP_MAKE_STRATEGY_H_
