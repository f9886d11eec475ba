#include "worker/trainer/strategy/strategy.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <chrono>
#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/log.h"

namespace trainyard::trainer {
namespace {

// Runs `done` after autograd has added a backward's gradient into a parameter's .grad.
class AccumulatedHook final : public torch::autograd::FunctionPostHook {
 public:
  explicit AccumulatedHook(std::function<void()> done) : done_(std::move(done)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    done_();
    return outputs;
  }

 private:
  const std::function<void()> done_;
};

}  // namespace

DataParallelStrategy::DataParallelStrategy(std::unique_ptr<Communicator> communicator,
                                           int64_t bucket_bytes, bool overlap)
    : communicator_(std::move(communicator)),
      bucket_bytes_(std::max<int64_t>(1, bucket_bytes)),
      overlap_(overlap) {}

// Waits for collectives still in flight: they write into buckets this object owns. The
// parameters keep their gradients, which keep the buckets' memory alive.
DataParallelStrategy::~DataParallelStrategy() {
  for (size_t i = 0; i < accumulators_.size(); ++i) {
    accumulators_[i]->del_post_hook(hook_keys_[i]);
  }
  absl::MutexLock lock(&mu_);
  for (Bucket& bucket : buckets_) {
    if (bucket.work != nullptr) bucket.work->Wait().IgnoreError();
  }
}

absl::Status DataParallelStrategy::Setup(Model& model) {
  for (auto& [name, p] : model.NamedParameters()) {
    if (p.requires_grad() && left_out_.count(name) == 0) params_.push_back(p);
  }
  if (!params_.empty()) device_ = params_.front().device();
  absl::MutexLock lock(&mu_);
  slots_.assign(params_.size(), Slot{});
  // Backward produces gradients roughly from the last parameter to the first.
  int64_t bytes = 0;
  std::vector<int64_t> elements;
  for (int i = static_cast<int>(params_.size()) - 1; i >= 0; --i) {
    const torch::Tensor& p = params_[i];
    const bool fits = !buckets_.empty() && bytes < bucket_bytes_ &&
                      params_[buckets_.back().params.front()].scalar_type() == p.scalar_type() &&
                      params_[buckets_.back().params.front()].device() == p.device();
    if (!fits) {
      buckets_.emplace_back();
      elements.push_back(0);
      bytes = 0;
    }
    slots_[i].bucket = static_cast<int>(buckets_.size()) - 1;
    slots_[i].offset = elements.back();
    buckets_.back().params.push_back(i);
    elements.back() += p.numel();
    bytes += p.numel() * static_cast<int64_t>(p.element_size());
  }
  // The last bucket to be reduced also carries the update's loss and stop flag, which saves a
  // collective per update; not in a half-precision bucket, where the loss would lose digits.
  if (!buckets_.empty()) {
    const torch::ScalarType type = params_[buckets_.back().params.front()].scalar_type();
    if (type == torch::kFloat32 || type == torch::kFloat64) {
      report_offset_ = elements.back();
      elements.back() += 2;
    }
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    buckets_[b].flat = torch::zeros(
        {elements[b]}, params_[buckets_[b].params.front()].options().requires_grad(false));
  }
  // Each parameter's gradient lives in its bucket: autograd adds into it in place, the all-reduce
  // leaves the mean there and the optimizer reads it, with no copy in between. A plain alias
  // (detach() of the slice, not a view), since zero_grad() detaches gradients in place.
  torch::NoGradGuard no_grad;
  for (int i = 0; i < static_cast<int>(params_.size()); ++i) {
    torch::Tensor& p = params_[i];
    torch::Tensor grad = SliceOf(i).view(p.sizes()).detach();
    if (p.grad().defined()) grad.copy_(p.grad());
    p.mutable_grad() = grad;
    grads_.push_back(grad);
    std::shared_ptr<torch::autograd::Node> accumulator = torch::autograd::impl::grad_accumulator(p);
    if (accumulator == nullptr) {
      return absl::InvalidArgumentError("data_parallel: a trainable parameter is not a leaf");
    }
    hook_keys_.push_back(accumulator->add_post_hook(
        std::make_unique<AccumulatedHook>([this, i] { OnGradientAccumulated(i); })));
    accumulators_.push_back(std::move(accumulator));
  }
  LogInfo("data_parallel: rank ", rank(), " of ", world_size(), " (", communicator_->backend(),
          "), ", params_.size(), " parameters in ", buckets_.size(), " gradient buckets of up to ",
          bucket_bytes_ >> 20, " MiB, overlap ", overlap_ ? "on" : "off");
  return absl::OkStatus();
}

absl::Status DataParallelStrategy::SyncState(Model& model, int64_t start_step) {
  const auto start = MonotonicNow();
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> tensors;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> copy_back;  // (target, contiguous copy)
  auto add = [&](const torch::Tensor& t) {
    torch::Tensor data = t.detach();
    if (data.is_contiguous()) {
      tensors.push_back(data);
    } else {
      copy_back.emplace_back(data, data.contiguous());
      tensors.push_back(copy_back.back().second);
    }
  };
  for (auto& [name, p] : model.NamedParameters()) {
    if (left_out_.count(name) == 0) add(p);
  }
  for (auto& [name, b] : model.NamedBuffers()) add(b);
  torch::Tensor step = torch::tensor({start_step}, torch::kInt64).to(device_);
  tensors.push_back(step);
  absl::Status status = communicator_->Broadcast(tensors, 0);
  communication_seconds_ += SecondsSince(start);
  if (!status.ok()) return status;
  for (auto& [target, copy] : copy_back) target.copy_(copy);
  const int64_t root_step = step.item<int64_t>();
  if (root_step != start_step) {
    return absl::AbortedError(absl::StrCat("data_parallel: rank ", rank(), " resumed at step ",
                                           start_step, ", rank 0 at step ", root_step,
                                           "; every rank must resume from the same checkpoint"));
  }
  return absl::OkStatus();
}

void DataParallelStrategy::BeforeBackward(bool last_micro_batch, const torch::Tensor& update_loss,
                                          bool stop_requested) {
  absl::MutexLock lock(&mu_);
  reduce_this_backward_ = last_micro_batch;
  if (!last_micro_batch) return;
  local_ = StepAgreement{update_loss, stop_requested};
  agreed_.reset();
  if (report_offset_ >= 0) {
    // Written on the device: no copy through the host.
    torch::NoGradGuard no_grad;
    torch::Tensor report = buckets_.back().flat.narrow(0, report_offset_, 2);
    report.narrow(0, 0, 1).copy_(update_loss.reshape({1}));
    report.narrow(0, 1, 1).fill_(stop_requested ? 1.0 : 0.0);
  }
  for (Bucket& bucket : buckets_) {
    bucket.pending = static_cast<int>(bucket.params.size());
    bucket.work.reset();
  }
  for (Slot& slot : slots_) slot.ready = false;
  next_launch_ = 0;
}

torch::Tensor DataParallelStrategy::SliceOf(int index) {
  const Slot& slot = slots_[index];
  return buckets_[slot.bucket].flat.narrow(0, slot.offset, params_[index].numel());
}

// Runs inside backward(), once autograd has added this backward's gradient to .grad, which is
// normally the parameter's slice of its bucket already.
void DataParallelStrategy::OnGradientAccumulated(int index) {
  absl::MutexLock lock(&mu_);
  if (!overlap_ || !reduce_this_backward_ || slots_[index].ready) return;
  MarkReadyLocked(index);
  if (buckets_[slots_[index].bucket].pending == 0) LaunchReadyLocked();
}

void DataParallelStrategy::MarkReadyLocked(int index) {
  const torch::Tensor& grad = params_[index].grad();
  if (!grad.is_same(grads_[index])) {
    // Something replaced or reset the gradient (set_to_none): bring it into the bucket.
    torch::NoGradGuard no_grad;
    torch::Tensor slice = SliceOf(index);
    if (grad.defined()) {
      slice.copy_(grad.reshape({-1}));
    } else {
      slice.zero_();
    }
  }
  slots_[index].ready = true;
  --buckets_[slots_[index].bucket].pending;
}

void DataParallelStrategy::LaunchReadyLocked() {
  // In bucket order on every rank, so that the ranks' collectives pair up.
  while (next_launch_ < static_cast<int>(buckets_.size()) && buckets_[next_launch_].pending == 0) {
    Bucket& bucket = buckets_[next_launch_];
    bucket.work = communicator_->AllReduceAsync({bucket.flat}, ReduceOp::kMean);
    ++next_launch_;
  }
}

absl::Status DataParallelStrategy::AfterBackward(Model&) {
  absl::MutexLock lock(&mu_);
  if (!reduce_this_backward_) return absl::OkStatus();
  // Whatever the hooks did not mark (overlap off, parameters without a gradient this time).
  for (int b = next_launch_; b < static_cast<int>(buckets_.size()); ++b) {
    for (int index : buckets_[b].params) {
      if (!slots_[index].ready) MarkReadyLocked(index);
    }
  }
  LaunchReadyLocked();
  const auto start = MonotonicNow();
  absl::Status status;
  for (Bucket& bucket : buckets_) {
    absl::Status s = bucket.work->Wait();
    if (status.ok()) status = s;
  }
  communication_seconds_ += SecondsSince(start);
  reduce_this_backward_ = false;
  if (!status.ok()) return status;
  for (int i = 0; i < static_cast<int>(params_.size()); ++i) {
    if (!params_[i].grad().is_same(grads_[i])) params_[i].mutable_grad() = grads_[i];
  }
  if (report_offset_ >= 0) {
    // A copy: the bucket is next update's. A mean of 0/1 flags is above 0 when any rank was asked
    // to stop.
    torch::Tensor report = buckets_.back()
                               .flat.narrow(0, report_offset_, 2)
                               .to(torch::kDouble, /*non_blocking=*/false, /*copy=*/true);
    agreed_ = StepAgreement{report[0], report[1].item<double>() > 0};
  }
  return absl::OkStatus();
}

absl::StatusOr<StepAgreement> DataParallelStrategy::EndStep() {
  if (agreed_.has_value()) return *std::exchange(agreed_, std::nullopt);
  const auto start = MonotonicNow();
  // On the parameters' device: NCCL reduces CUDA tensors only.
  torch::Tensor t = torch::empty({2}, torch::TensorOptions(device_).dtype(torch::kDouble));
  t.narrow(0, 0, 1).copy_(local_.loss.reshape({1}));
  t.narrow(0, 1, 1).fill_(local_.stop ? 1.0 : 0.0);
  absl::Status status = communicator_->AllReduce({t}, ReduceOp::kSum);
  communication_seconds_ += SecondsSince(start);
  if (!status.ok()) return status;
  return StepAgreement{t[0] / world_size(), t[1].item<double>() > 0};
}

absl::StatusOr<std::vector<double>> DataParallelStrategy::SumOverRanks(std::vector<double> values) {
  torch::Tensor t = torch::tensor(values, torch::kFloat64).to(device_);
  if (absl::Status s = communicator_->AllReduce({t}, ReduceOp::kSum); !s.ok()) return s;
  t = t.to(torch::kCPU);
  return std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
}

double DataParallelStrategy::TakeCommunicationSeconds() {
  const double seconds = communication_seconds_;
  communication_seconds_ = 0;
  return seconds;
}

torch::Device TrainingDevice(const trainyard::v1::Task& task) {
  const bool wants_gpu = task.gpus() > 0 || task.spec().resources().gpus_per_worker() > 0;
  if (!wants_gpu || !torch::cuda::is_available()) return torch::kCPU;
  // The parameter servers hold and update CPU tensors.
  if (task.spec().strategy() == trainyard::v1::PARAMETER_SERVER) return torch::kCPU;
  const bool reduces =
      task.world_size() > 1 && task.spec().strategy() == trainyard::v1::DATA_PARALLEL;
  if (reduces && !TRAINYARD_WITH_NCCL) return torch::kCPU;
  return torch::Device(torch::kCUDA, 0);
}

}  // namespace trainyard::trainer
