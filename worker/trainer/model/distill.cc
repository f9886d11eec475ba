#include "worker/trainer/model/distill.h"

#include <cmath>
#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace trainyard::trainer {

namespace F = torch::nn::functional;

torch::Tensor DistillationLoss(const torch::Tensor& student, const torch::Tensor& teacher,
                               const torch::Tensor& labels, double temperature, double alpha) {
  const torch::Tensor hard = F::cross_entropy(student, labels);
  // Both distributions as log-probabilities (log_target): softmax followed by log underflows for
  // classes the teacher rules out, log_softmax does not.
  const torch::Tensor soft =
      F::kl_div(torch::log_softmax(student / temperature, 1),
                torch::log_softmax(teacher.to(student.scalar_type()) / temperature, 1),
                F::KLDivFuncOptions().reduction(torch::kBatchMean).log_target(true));
  return (1 - alpha) * hard + alpha * temperature * temperature * soft;
}

absl::StatusOr<std::unique_ptr<Teacher>> Teacher::Load(const trainyard::v1::DistillSpec& spec,
                                                       const torch::Device& device,
                                                       const ObjectStoreResolver& stores) {
  if (spec.teacher().empty()) {
    return absl::InvalidArgumentError("distill.teacher: must not be empty");
  }
  if (!(spec.temperature() > 0) || !std::isfinite(spec.temperature())) {
    return absl::InvalidArgumentError(
        absl::StrCat("distill.temperature: must be > 0, got ", spec.temperature()));
  }
  if (!(spec.alpha() >= 0 && spec.alpha() <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("distill.alpha: must be in [0, 1], got ", spec.alpha()));
  }
  absl::StatusOr<std::unique_ptr<Model>> model =
      LoadTorchScript(stores, spec.teacher(), "distill.teacher");
  if (!model.ok()) return model.status();
  // Evaluation mode: dropout off, batch norm on its running statistics, so that the teacher
  // gives every sample the same targets at every step and on every attempt.
  (*model)->SetTraining(false);
  try {
    (*model)->To(device);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("distill.teacher: moving it to ", device.str(), ": ", DescribeTorchError(e)));
  }
  return std::unique_ptr<Teacher>(new Teacher(*std::move(model), spec.temperature(), spec.alpha()));
}

absl::Status Teacher::Check(const torch::Tensor& features, int64_t classes) {
  torch::Tensor out;
  try {
    torch::NoGradGuard no_grad;
    out = model_->Forward(features);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("distill.teacher: forward() fails on the data: ", DescribeTorchError(e)));
  }
  if (out.dim() != 2 || out.size(0) != features.size(0) || out.size(1) != classes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "distill.teacher: forward() returns shape [", absl::StrJoin(out.sizes(), ","), "] for ",
        features.size(0), " samples, the student gives [", features.size(0), ",", classes, "]"));
  }
  if (!out.is_floating_point()) {
    return absl::InvalidArgumentError(absl::StrCat("distill.teacher: forward() returns ",
                                                   c10::toString(out.scalar_type()),
                                                   ", not floating-point logits"));
  }
  return absl::OkStatus();
}

torch::Tensor Teacher::Loss(const torch::Tensor& student, const torch::Tensor& features,
                            const torch::Tensor& labels) {
  torch::Tensor teacher;
  {
    torch::NoGradGuard no_grad;
    teacher = model_->Forward(features);
  }
  return DistillationLoss(student, teacher, labels, temperature_, alpha_);
}

}  // namespace trainyard::trainer
