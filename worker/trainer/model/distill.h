#ifndef TRAINYARD_WORKER_TRAINER_MODEL_DISTILL_H_
#define TRAINYARD_WORKER_TRAINER_MODEL_DISTILL_H_

// Knowledge distillation: a trained teacher's softened outputs join the loss of a classification
// job (JobSpec.distill).

#include <torch/torch.h>

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "trainyard/v1/job.pb.h"
#include "worker/trainer/model/model.h"

namespace trainyard::trainer {

// (1 - alpha) * cross_entropy(student, labels)
//   + alpha * temperature^2 * KL(softmax(teacher / temperature) || softmax(student / temperature))
// with the divergence summed over classes and averaged over samples (PyTorch's kl_div with
// reduction "batchmean"). Both terms are means over the samples, so micro-batches and ranks
// weighted by their share of the samples add up to the loss of the whole batch, as they do for
// plain cross_entropy. temperature^2 keeps the soft term's gradients on the scale of the hard
// term's whatever the temperature (Hinton, Vinyals and Dean, 2015).
// student, teacher: [N, C] logits; labels: [N] class ids. Gradients flow to `student` only.
// Throws c10::Error on shape mismatches.
torch::Tensor DistillationLoss(const torch::Tensor& student, const torch::Tensor& teacher,
                               const torch::Tensor& labels, double temperature, double alpha);

// The teacher of a job's distill spec: a TorchScript module, in evaluation mode, on the rank's
// device, run without gradients. Nothing of it is trained or checkpointed: every attempt of a job
// loads it again. Not thread-safe: one per rank.
class Teacher {
 public:
  // Loads spec.teacher (LoadTorchScript, through `stores`) onto `device` and checks temperature
  // and alpha.
  // INVALID_ARGUMENT naming the field ("distill.teacher: ...", "distill.temperature: ...",
  // "distill.alpha: ...") for a bad spec or module, NOT_FOUND when the module file does not exist,
  // UNAVAILABLE when the module cannot be moved to `device`.
  static absl::StatusOr<std::unique_ptr<Teacher>> Load(const trainyard::v1::DistillSpec& spec,
                                                       const torch::Device& device,
                                                       const ObjectStoreResolver& stores);

  // Checks that the teacher maps `features` (a few samples of the data, on the device) to
  // floating-point logits of shape [N, classes]: INVALID_ARGUMENT "distill.teacher: ..." otherwise.
  absl::Status Check(const torch::Tensor& features, int64_t classes);

  // DistillationLoss of the `student` logits for `features` with `labels`, the teacher's logits
  // computed here. Throws c10::Error when the teacher fails on the features.
  torch::Tensor Loss(const torch::Tensor& student, const torch::Tensor& features,
                     const torch::Tensor& labels);

  double temperature() const { return temperature_; }
  double alpha() const { return alpha_; }

 private:
  Teacher(std::unique_ptr<Model> model, double temperature, double alpha)
      : model_(std::move(model)), temperature_(temperature), alpha_(alpha) {}

  const std::unique_ptr<Model> model_;
  const double temperature_;
  const double alpha_;
};

}  // namespace trainyard::trainer

#endif  // TRAINYARD_WORKER_TRAINER_MODEL_DISTILL_H_
