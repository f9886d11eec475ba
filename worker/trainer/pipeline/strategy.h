#ifndef TRAINYARD_WORKER_TRAINER_PIPELINE_STRATEGY_H_
#define TRAINYARD_WORKER_TRAINER_PIPELINE_STRATEGY_H_

// Part pipeline/ of the trainer (worker/trainer/PARTS). What a rank of a pipeline job does around
// each update: it holds one stage (a consecutive run of the model's layers, plan.h) of one
// replica, runs that stage's forward and backward passes of the update's micro-batches in its
// schedule's order, passing activations to the next stage and gradients to the one before, then
// combines what must be combined before its optimizer steps.
//
// Ranks: rank = replica * stages + stage, so that rank 0 is the first stage of the first replica.
// Every stage of a replica reads the replica's share of the batch (the first stage its features,
// the last its labels).
//
// Communication, all of it bounded by the collective timeout:
// - activations forward and gradients backward between adjacent stages of a replica, sent as
//   they are (contiguous tensors; the first activation of each micro-batch size preceded by its
//   dtype and shape) on a thread per peer, received straight into the tensor the next pass reads;
// - with tied weights (the transformer's wte.weight with tied embeddings; a TorchScript
//   Sequential's parameter held by layers of the first and last stages), the first and last
//   stages of a replica each hold a copy: after the last backward each sends its gradients of
//   them to the other and adds the other's, so both step with the sum (a + b == b + a: the two
//   copies stay identical to the bit);
// - with replicas, each stage's gradients are averaged among its copies (the tied weight on its
//   own, so that the first and last stages reduce it alike);
// - at the end of the update one all-reduce over every rank of the loss (the last stages') and of
//   whether any rank was asked to stop.
// Every message belongs to one attempt: the connections are made through that attempt's
// rendezvous (keyed by its generation), so that a rank of an older attempt can reach no one.

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/flight_record.h"
#include "worker/trainer/collective/communicator.h"
#include "worker/trainer/model/model.h"
#include "worker/trainer/pipeline/plan.h"
#include "worker/trainer/strategy/strategy.h"

namespace trainyard::trainer::pipeline {

struct Topology {
  int stages = 1;
  int replicas = 1;
  int stage = 0;
  int replica = 0;
  int RankOf(int s, int r) const { return r * stages + s; }
  bool first() const { return stage == 0; }
  bool last() const { return stage == stages - 1; }
};

// The topology of `rank` in a world of `world` ranks split into `stages`; INVALID_ARGUMENT naming
// workers when world is not a multiple of stages.
absl::StatusOr<Topology> TopologyOf(int rank, int world, int stages);

// The layers [first, end) of each stage, from the layer counts PartitionLayers gives.
struct LayerRange {
  int first = 0;
  int end = 0;
};
std::vector<LayerRange> StageRanges(const std::vector<int>& counts);

// One stage's mean seconds per update (of its first replica), since the last TakeStageTimes:
// running its passes, and waiting to receive from the stages beside it.
struct StageTime {
  double busy = 0;
  double idle = 0;
};

class PipelineStrategy final : public Strategy {
 public:
  // `world` connects every rank of the attempt, with point-to-point connections; `replicas`
  // connects this stage's copies (null with one replica). `tied` names the parameters the first
  // and last stages share (empty: none). `ranges`: every stage's layers, or empty until
  // set_ranges (a TorchScript model's layers and ties are known once it is loaded: set_tied).
  PipelineStrategy(Topology topology, Schedule schedule, int microbatches,
                   std::vector<std::string> tied, std::vector<LayerRange> ranges,
                   std::unique_ptr<Communicator> world, std::unique_ptr<Communicator> replicas);
  ~PipelineStrategy() override;

  const Topology& topology() const { return topology_; }
  void set_ranges(std::vector<LayerRange> ranges) { ranges_ = std::move(ranges); }
  // Before Setup: the device of the stage's model, where RunPasses' features and labels are too
  // (the CPU by default).
  void set_device(torch::Device device) { device_ = device; }
  // Where RunPasses records its phases: each micro-batch's forward pass (and its loss on the
  // last stage) as kForward, its backward pass as kBackward. Not owned; null: none.
  void set_recorder(FlightRecorder* recorder) { recorder_ = recorder; }
  // Before Setup.
  void set_tied(std::vector<std::string> tied) {
    tied_names_ = topology_.stages > 1 ? std::move(tied) : std::vector<std::string>();
  }
  int rank() const override { return world_->rank(); }
  int world_size() const override { return world_->world_size(); }
  int data_rank() const override { return topology_.replica; }
  int data_world() const override { return topology_.replicas; }
  absl::Status Setup(Model& model) override;
  absl::Status SyncState(Model& model, int64_t start_step) override;
  void BeforeBackward(bool, const torch::Tensor&, bool) override {}
  // The tied weights' sums between the first and last stages, then each stage's mean over its
  // replicas.
  absl::Status AfterBackward(Model& model) override;
  absl::StatusOr<StepAgreement> EndStep() override;
  double TakeCommunicationSeconds() override;
  bool sums_over_ranks() const override { return true; }
  absl::StatusOr<std::vector<double>> SumOverRanks(std::vector<double> values) override;
  // {"stages": K, "replicas": R, "layers": [[first, end], ...]}: each stage's layers, the end
  // excluded (TrainerState::pipeline).
  std::string Layout() const override;

  // The loss of one micro-batch from the last stage's outputs and its labels.
  using LossFn =
      std::function<torch::Tensor(const torch::Tensor& out, const torch::Tensor& labels)>;
  // One update's passes of this stage over the replica's batch (`features` [n, T] token ids,
  // `labels`), in the schedule's micro-batches of n / microbatches samples: gradients accumulate
  // in the stage's parameters (each micro-batch's loss weighted 1 / microbatches, so they add up
  // to the gradient of the batch's mean loss). The last stage keeps the update's loss for
  // EndStep; `stop_requested` joins EndStep's agreement. INVALID_ARGUMENT naming the model when
  // a pass fails; the communicator's errors.
  absl::Status RunPasses(Model& model, const torch::Tensor& features, const torch::Tensor& labels,
                         const LossFn& loss, bool stop_requested);
  // A forward pass without gradients over `features` through every stage of this replica (all of
  // them call it with the same samples): the model's outputs on the last stage, an undefined
  // tensor on the others.
  absl::StatusOr<torch::Tensor> Evaluate(Model& model, const torch::Tensor& features);
  // The parameters this stage holds that another stage saves: the tied weights on the last stage
  // (the first stage saves them); none elsewhere.
  std::vector<std::string> saved_elsewhere() const {
    return !tied_.empty() && topology_.last() && !topology_.first() ? tied_names_
                                                                    : std::vector<std::string>();
  }
  // Every stage's time per update since the last call (the sums travel with EndStep's
  // agreement, so every rank has them); empty before the first update. Resets the count.
  std::vector<StageTime> TakeStageTimes();

 private:
  absl::Status WaitSends();
  // Activations forward: the first one of each micro-batch size (`rows` samples) to a peer is
  // preceded by its dtype and shape, which the receiver keeps for the later ones; a later one of
  // that size must have the same (INVALID_ARGUMENT naming the stage otherwise). Sends are
  // asynchronous unless `wait`. Receives count their wait.
  absl::Status SendActivation(const torch::Tensor& tensor, int peer, int64_t rows,
                              bool wait = false);
  absl::StatusOr<torch::Tensor> ReceiveActivation(int peer, int64_t rows);
  // A gradient backward: the shape and dtype of the activation it belongs to.
  absl::StatusOr<torch::Tensor> ReceiveLike(int peer, const torch::Tensor& like);

  static constexpr int64_t kMaxActivationDims = 8;
  struct ActivationShape {
    torch::ScalarType dtype;
    std::vector<int64_t> sizes;
  };

  const Topology topology_;
  const Schedule schedule_;
  const int microbatches_;
  std::vector<std::string> tied_names_;
  std::vector<LayerRange> ranges_;
  const std::unique_ptr<Communicator> world_;
  const std::unique_ptr<Communicator> replicas_;
  const std::vector<Action> actions_;

  // Where the stage's model is (set_device): activations and gradients come and go through host
  // memory (Gloo's TCP pairs) and are moved there.
  torch::Device device_ = torch::kCPU;
  FlightRecorder* recorder_ = nullptr;  // set_recorder
  // Fixed by Setup.
  // The tied parameters on the first and last stages, in tied_names_' order; none elsewhere.
  std::vector<torch::Tensor> tied_;
  std::vector<torch::Tensor> params_;  // the stage's, the tied ones left out

  std::vector<std::unique_ptr<Work>> sends_;  // this update's, not yet waited for
  // By peer and micro-batch size (PipelineStrategy::SendActivation).
  std::map<std::pair<int, int64_t>, ActivationShape> sent_shapes_;
  std::map<std::pair<int, int64_t>, ActivationShape> received_shapes_;
  StepAgreement local_;
  double communication_seconds_ = 0;
  double receive_wait_ = 0;  // in this update's passes
  StageTime this_update_;    // this rank's, for EndStep
  std::vector<StageTime> stage_sums_;
  int64_t stage_updates_ = 0;
};

}  // namespace trainyard::trainer::pipeline

#endif  // TRAINYARD_WORKER_TRAINER_PIPELINE_STRATEGY_H_
