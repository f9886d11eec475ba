#include "worker/trainer/pipeline/strategy.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/clock.h"
#include "worker/trainer/model/tensors.h"

namespace trainyard::trainer::pipeline {
namespace {

using Steady = std::chrono::steady_clock;

// What Gloo sends: a contiguous host tensor (`t`'s own storage on the CPU, a copy of a GPU
// tensor).
torch::Tensor Host(const torch::Tensor& t) { return ToHost(t, /*share=*/true).contiguous(); }

// Runs `op` (a collective over host tensors) on `tensors`, on any device: in place where they are
// contiguous host tensors, through host copies written back otherwise.
absl::Status ThroughHost(std::vector<torch::Tensor> tensors,
                         const std::function<absl::Status(std::vector<torch::Tensor>&)>& op) {
  std::vector<torch::Tensor> host;
  for (const torch::Tensor& t : tensors) host.push_back(Host(t));
  if (absl::Status s = op(host); !s.ok()) return s;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (host[i].data_ptr() != tensors[i].data_ptr()) tensors[i].copy_(host[i]);
  }
  return absl::OkStatus();
}

// Each of `tensors` becomes its mean over `group`.
absl::Status AllReduceMean(Communicator& group, std::vector<torch::Tensor> tensors) {
  return ThroughHost(std::move(tensors), [&group](std::vector<torch::Tensor>& host) {
    return group.AllReduce(host, ReduceOp::kMean);
  });
}

}  // namespace

absl::StatusOr<Topology> TopologyOf(int rank, int world, int stages) {
  if (stages < 1 || world < 1 || world % stages != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "workers: ", world, " ranks are not a multiple of the ", stages, " pipeline.stages"));
  }
  if (rank < 0 || rank >= world) {
    return absl::InvalidArgumentError(
        absl::StrCat("task: rank ", rank, " outside world size ", world));
  }
  Topology t;
  t.stages = stages;
  t.replicas = world / stages;
  t.stage = rank % stages;
  t.replica = rank / stages;
  return t;
}

std::vector<LayerRange> StageRanges(const std::vector<int>& counts) {
  std::vector<LayerRange> ranges;
  int first = 0;
  for (int count : counts) {
    ranges.push_back({first, first + count});
    first += count;
  }
  return ranges;
}

PipelineStrategy::PipelineStrategy(Topology topology, Schedule schedule, int microbatches,
                                   std::vector<std::string> tied, std::vector<LayerRange> ranges,
                                   std::unique_ptr<Communicator> world,
                                   std::unique_ptr<Communicator> replicas)
    : topology_(topology),
      schedule_(schedule),
      microbatches_(std::max(1, microbatches)),
      tied_names_(topology.stages > 1 ? std::move(tied) : std::vector<std::string>()),
      ranges_(std::move(ranges)),
      world_(std::move(world)),
      replicas_(std::move(replicas)),
      actions_(StageActions(schedule, topology.stage, topology.stages, microbatches_)) {}

PipelineStrategy::~PipelineStrategy() {
  // Sends still going hold tensors of the model; they end with the connections' timeout at most.
  for (const std::unique_ptr<Work>& send : sends_) send->Wait().IgnoreError();
}

absl::Status PipelineStrategy::Setup(Model& model) {
  const bool holds_tied = topology_.first() || topology_.last();
  std::map<std::string, torch::Tensor> tied;
  for (auto& [name, p] : model.NamedParameters()) {
    if (holds_tied &&
        std::find(tied_names_.begin(), tied_names_.end(), name) != tied_names_.end()) {
      tied[name] = p;
    } else {
      params_.push_back(p);
    }
  }
  if (!holds_tied) return absl::OkStatus();
  // In the one order on both stages.
  for (const std::string& name : tied_names_) {
    auto it = tied.find(name);
    if (it == tied.end()) {
      return absl::InternalError(
          absl::StrCat("pipeline: stage ", topology_.stage, " lacks the tied ", name));
    }
    tied_.push_back(it->second);
  }
  return absl::OkStatus();
}

absl::Status PipelineStrategy::SyncState(Model& model, int64_t start_step) {
  const Steady::time_point start = MonotonicNow();
  // Every rank resumed at the same step: the largest and the smallest agree.
  torch::Tensor steps = torch::tensor(
      {static_cast<double>(start_step), -static_cast<double>(start_step)}, torch::kDouble);
  if (absl::Status s = world_->AllReduce({steps}, ReduceOp::kMax); !s.ok()) return s;
  if (steps[0].item<double>() != -steps[1].item<double>()) {
    return absl::AbortedError(absl::StrCat("pipeline: stages resumed at steps from ",
                                           -steps[1].item<double>(), " to ",
                                           steps[0].item<double>()));
  }
  // A stage's copies take its first replica's parameters.
  if (replicas_ != nullptr) {
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> tensors;
    for (auto& [name, p] : model.NamedParameters()) tensors.push_back(p.detach());
    for (auto& [name, b] : model.NamedBuffers()) tensors.push_back(b.detach());
    absl::Status s = ThroughHost(std::move(tensors), [this](std::vector<torch::Tensor>& host) {
      return replicas_->Broadcast(host, 0);
    });
    if (!s.ok()) return s;
  }
  communication_seconds_ += SecondsSince(start);
  return absl::OkStatus();
}

absl::Status PipelineStrategy::SendActivation(const torch::Tensor& tensor, int peer, int64_t rows,
                                              bool wait) {
  torch::Tensor out = Host(tensor);
  const std::pair<int, int64_t> key(peer, rows);
  auto it = sent_shapes_.find(key);
  if (it == sent_shapes_.end()) {
    // The first of its size: its dtype and shape go first, which the receiver keeps.
    if (out.dim() > kMaxActivationDims) {
      return absl::InvalidArgumentError(
          absl::StrCat("model: pipeline stage ", topology_.stage, " outputs a ", out.dim(),
                       "-dimensional tensor; stages pass at most ", kMaxActivationDims));
    }
    torch::Tensor header = torch::zeros({kMaxActivationDims + 2}, torch::kInt64);
    header[0] = static_cast<int64_t>(out.scalar_type());
    header[1] = out.dim();
    for (int64_t d = 0; d < out.dim(); ++d) header[2 + d] = out.size(d);
    sends_.push_back(world_->SendAsync(header, peer));
    it = sent_shapes_.emplace(key, ActivationShape{out.scalar_type(), out.sizes().vec()}).first;
  } else if (it->second.dtype != out.scalar_type() || it->second.sizes != out.sizes().vec()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model: pipeline stage ", topology_.stage, " output [", absl::StrJoin(out.sizes(), ", "),
        "] where an earlier micro-batch of the same size gave [",
        absl::StrJoin(it->second.sizes, ", "),
        "]; the layers between stages must keep their shapes"));
  }
  std::unique_ptr<Work> sent = world_->SendAsync(out, peer);
  if (wait) return sent->Wait();
  sends_.push_back(std::move(sent));
  return absl::OkStatus();
}

absl::StatusOr<torch::Tensor> PipelineStrategy::ReceiveActivation(int peer, int64_t rows) {
  const Steady::time_point start = MonotonicNow();
  const std::pair<int, int64_t> key(peer, rows);
  auto it = received_shapes_.find(key);
  absl::Status status;
  if (it == received_shapes_.end()) {
    torch::Tensor header = torch::empty({kMaxActivationDims + 2}, torch::kInt64);
    status = world_->Recv(header, peer);
    if (status.ok()) {
      const int64_t* h = header.data_ptr<int64_t>();
      if (h[1] < 0 || h[1] > kMaxActivationDims) {
        status = absl::DataLossError(absl::StrCat("pipeline: stage ", topology_.stage,
                                                  " received a malformed activation header"));
      } else {
        ActivationShape shape{static_cast<torch::ScalarType>(h[0]),
                              std::vector<int64_t>(h + 2, h + 2 + h[1])};
        it = received_shapes_.emplace(key, std::move(shape)).first;
      }
    }
  }
  torch::Tensor in;
  if (status.ok()) {
    in = torch::empty(it->second.sizes, torch::TensorOptions().dtype(it->second.dtype));
    status = world_->Recv(in, peer);
  }
  const double waited = SecondsSince(start);
  receive_wait_ += waited;
  communication_seconds_ += waited;
  if (!status.ok()) return status;
  return in;
}

absl::StatusOr<torch::Tensor> PipelineStrategy::ReceiveLike(int peer, const torch::Tensor& like) {
  const Steady::time_point start = MonotonicNow();
  torch::Tensor in = torch::empty(like.sizes(), like.options().device(torch::kCPU));
  absl::Status status = world_->Recv(in, peer);
  const double waited = SecondsSince(start);
  receive_wait_ += waited;
  communication_seconds_ += waited;
  if (!status.ok()) return status;
  return in;
}

absl::Status PipelineStrategy::WaitSends() {
  const Steady::time_point start = MonotonicNow();
  absl::Status status;
  for (const std::unique_ptr<Work>& send : sends_) status.Update(send->Wait());
  sends_.clear();
  communication_seconds_ += SecondsSince(start);
  return status;
}

absl::Status PipelineStrategy::RunPasses(Model& model, const torch::Tensor& features,
                                         const torch::Tensor& labels, const LossFn& loss_fn,
                                         bool stop_requested) {
  const Steady::time_point update_start = MonotonicNow();
  receive_wait_ = 0;
  const int64_t n = features.size(0);
  const int m_count = microbatches_;
  if (n % m_count != 0) {
    return absl::InvalidArgumentError(absl::StrCat("pipeline.microbatches: ", m_count,
                                                   " micro-batches do not divide a replica's ", n,
                                                   " samples"));
  }
  const int64_t size = n / m_count;
  const int prev =
      topology_.first() ? -1 : topology_.RankOf(topology_.stage - 1, topology_.replica);
  const int next = topology_.last() ? -1 : topology_.RankOf(topology_.stage + 1, topology_.replica);
  // Per micro-batch, from its forward to its backward: what the stage took in (its gradient goes
  // back), and what it gave out (the next stage's gradient comes back to it), or its loss.
  std::vector<torch::Tensor> inputs(static_cast<size_t>(m_count));
  std::vector<torch::Tensor> outputs(static_cast<size_t>(m_count));
  torch::Tensor update_loss =
      torch::zeros({}, torch::TensorOptions().dtype(torch::kDouble).device(device_));
  try {
    for (const Action& action : actions_) {
      const size_t m = static_cast<size_t>(action.microbatch);
      if (recorder_ != nullptr) {
        recorder_->SetPhase(action.kind == Action::kForward ? RankPhase::kForward
                                                            : RankPhase::kBackward);
      }
      if (action.kind == Action::kForward) {
        torch::Tensor in;
        if (topology_.first()) {
          in = features.narrow(0, static_cast<int64_t>(m) * size, size);
        } else {
          absl::StatusOr<torch::Tensor> received = ReceiveActivation(prev, size);
          if (!received.ok()) return received.status();
          in = received->to(device_);
          if (in.is_floating_point()) in.requires_grad_(true);
        }
        torch::Tensor out = model.Forward(in);
        if (topology_.last()) {
          const torch::Tensor loss =
              loss_fn(out, labels.narrow(0, static_cast<int64_t>(m) * size, size)) /
              static_cast<double>(m_count);
          update_loss += loss.detach().to(torch::kDouble);
          outputs[m] = loss;
        } else {
          if (absl::Status s = SendActivation(out.detach(), next, size); !s.ok()) return s;
          outputs[m] = out;
        }
        inputs[m] = in;
      } else {
        if (topology_.last()) {
          outputs[m].backward();
        } else {
          absl::StatusOr<torch::Tensor> grad = ReceiveLike(next, outputs[m]);
          if (!grad.ok()) return grad.status();
          torch::autograd::backward({outputs[m]}, {grad->to(device_)});
        }
        if (!topology_.first()) {
          // The gradient of what the previous stage sent: zeros where this stage's layers did
          // not use its input.
          const torch::Tensor grad =
              inputs[m].grad().defined() ? inputs[m].grad() : torch::zeros_like(inputs[m]);
          sends_.push_back(world_->SendAsync(Host(grad), prev));
        }
        // What the schedule keeps of this micro-batch goes now (1F1B's saving over GPipe).
        inputs[m] = torch::Tensor();
        outputs[m] = torch::Tensor();
      }
    }
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("model: pipeline stage ", topology_.stage,
                                                   " failed: ", DescribeTorchError(e)));
  }
  local_ = StepAgreement{update_loss, stop_requested};
  this_update_.idle = receive_wait_;
  this_update_.busy = std::max(0.0, SecondsSince(update_start) - receive_wait_);
  return absl::OkStatus();
}

absl::Status PipelineStrategy::AfterBackward(Model& model) {
  const Steady::time_point start = MonotonicNow();
  torch::NoGradGuard no_grad;
  // The tied weights' gradients, summed between the first and last stages of this replica: one
  // message each way.
  if (!tied_.empty()) {
    std::vector<torch::Tensor> grads;
    for (torch::Tensor& t : tied_) {
      if (!t.grad().defined()) t.mutable_grad() = torch::zeros_like(t);
      grads.push_back(t.grad().reshape({-1}));
    }
    torch::Tensor mine = Host(torch::cat(grads));
    const int peer =
        topology_.RankOf(topology_.first() ? topology_.stages - 1 : 0, topology_.replica);
    torch::Tensor theirs = torch::empty_like(mine);
    std::unique_ptr<Work> sent = world_->SendAsync(mine, peer);
    absl::Status status = world_->Recv(theirs, peer);
    status.Update(sent->Wait());
    if (!status.ok()) return status;
    theirs = theirs.to(device_);
    int64_t offset = 0;
    for (torch::Tensor& t : tied_) {
      t.mutable_grad().add_(theirs.narrow(0, offset, t.numel()).view_as(t));
      offset += t.numel();
    }
  }
  // Each stage's mean over its replicas; the tied weights alone first, so that the first and last
  // stages reduce them alike.
  if (replicas_ != nullptr) {
    if (!tied_.empty()) {
      std::vector<torch::Tensor> grads;
      for (torch::Tensor& t : tied_) grads.push_back(t.grad());
      if (absl::Status s = AllReduceMean(*replicas_, grads); !s.ok()) return s;
    }
    std::vector<torch::Tensor> grads;
    for (torch::Tensor& p : params_) {
      if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
      grads.push_back(p.grad().reshape({-1}));
    }
    if (!grads.empty()) {
      torch::Tensor flat = torch::cat(grads);
      if (absl::Status s = AllReduceMean(*replicas_, {flat}); !s.ok()) return s;
      int64_t offset = 0;
      for (torch::Tensor& p : params_) {
        const int64_t numel = p.numel();
        p.mutable_grad().copy_(flat.narrow(0, offset, numel).view_as(p));
        offset += numel;
      }
    }
  }
  communication_seconds_ += SecondsSince(start);
  return absl::OkStatus();
}

absl::StatusOr<StepAgreement> PipelineStrategy::EndStep() {
  if (absl::Status s = WaitSends(); !s.ok()) return s;
  const Steady::time_point start = MonotonicNow();
  // The last stages' losses (the others add 0), any rank's stop, and the first replica's stages'
  // busy and idle seconds.
  const int stages = topology_.stages;
  torch::Tensor values = torch::zeros({2 + 2 * stages}, torch::kDouble);
  if (topology_.last() && local_.loss.defined()) values[0] = local_.loss;
  values[1] = local_.stop ? 1.0 : 0.0;
  if (topology_.replica == 0) {
    values[2 + 2 * topology_.stage] = this_update_.busy;
    values[3 + 2 * topology_.stage] = this_update_.idle;
  }
  absl::Status status = world_->AllReduce({values}, ReduceOp::kSum);
  communication_seconds_ += SecondsSince(start);
  if (!status.ok()) return status;
  StepAgreement agreed;
  agreed.loss = values[0] / static_cast<double>(topology_.replicas);
  const double* v = values.data_ptr<double>();
  agreed.stop = v[1] > 0;
  stage_sums_.resize(static_cast<size_t>(stages));
  for (int s = 0; s < stages; ++s) {
    stage_sums_[static_cast<size_t>(s)].busy += v[2 + 2 * s];
    stage_sums_[static_cast<size_t>(s)].idle += v[3 + 2 * s];
  }
  ++stage_updates_;
  return agreed;
}

absl::StatusOr<torch::Tensor> PipelineStrategy::Evaluate(Model& model,
                                                         const torch::Tensor& features) {
  const int64_t n = features.size(0);
  torch::NoGradGuard no_grad;
  try {
    torch::Tensor in;
    if (topology_.first()) {
      in = features.to(device_);
    } else {
      absl::StatusOr<torch::Tensor> received =
          ReceiveActivation(topology_.RankOf(topology_.stage - 1, topology_.replica), n);
      if (!received.ok()) return received.status();
      in = received->to(device_);
    }
    torch::Tensor out = model.Forward(in);
    if (topology_.last()) return out;
    // The next stage reads it before this one can call again: wait for it here.
    if (absl::Status s = SendActivation(
            out, topology_.RankOf(topology_.stage + 1, topology_.replica), n, /*wait=*/true);
        !s.ok()) {
      return s;
    }
    return torch::Tensor();
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("model: validation on pipeline stage ",
                                                   topology_.stage,
                                                   " failed: ", DescribeTorchError(e)));
  }
}

absl::StatusOr<std::vector<double>> PipelineStrategy::SumOverRanks(std::vector<double> values) {
  torch::Tensor t = torch::tensor(values, torch::kDouble);
  if (absl::Status s = world_->AllReduce({t}, ReduceOp::kSum); !s.ok()) return s;
  std::vector<double> out(values.size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = t[static_cast<int64_t>(i)].item<double>();
  return out;
}

double PipelineStrategy::TakeCommunicationSeconds() {
  const double seconds = communication_seconds_;
  communication_seconds_ = 0;
  return seconds;
}

std::vector<StageTime> PipelineStrategy::TakeStageTimes() {
  std::vector<StageTime> means;
  if (stage_updates_ == 0) return means;
  for (const StageTime& sum : stage_sums_) {
    means.push_back({sum.busy / static_cast<double>(stage_updates_),
                     sum.idle / static_cast<double>(stage_updates_)});
  }
  stage_sums_.assign(stage_sums_.size(), StageTime());
  stage_updates_ = 0;
  return means;
}

std::string PipelineStrategy::Layout() const {
  std::vector<std::string> layers;
  for (const LayerRange& r : ranges_) layers.push_back(absl::StrCat("[", r.first, ",", r.end, "]"));
  return absl::StrCat("{\"stages\":", topology_.stages, ",\"replicas\":", topology_.replicas,
                      ",\"layers\":[", absl::StrJoin(layers, ","), "]}");
}

}  // namespace trainyard::trainer::pipeline
