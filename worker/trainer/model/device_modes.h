#ifndef TRAINYARD_WORKER_TRAINER_MODEL_DEVICE_MODES_H_
#define TRAINYARD_WORKER_TRAINER_MODEL_DEVICE_MODES_H_

// The fast paths a rank takes on its device, chosen once before training: the layout of a
// convolutional model (channels-last), cuDNN's autotuning, TF32 arithmetic and the CUDA graph of
// the whole step. ChooseDeviceModes is a pure function of the spec, the model and the device, so
// that what a job gets on a GPU is decided, and tested, on any machine; ApplyDeviceModes and
// ApplyMemoryFormat then set them.

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "trainyard/v1/job.pb.h"
#include "worker/trainer/model/model.h"

namespace trainyard::trainer {

struct DeviceModes {
  // The model's 4-D weights, and so its convolutions' activations, NHWC; the cnn's input images
  // too. What cuDNN's convolution kernels are fastest on (model.memory_format).
  bool channels_last = false;
  // cuDNN times its convolution algorithms on each new input shape and keeps the fastest
  // (PyTorch's torch.backends.cudnn.benchmark): worth it where shapes do not change.
  bool cudnn_benchmark = false;
  // TF32 matrix products and convolutions (precision tf32: PyTorch's allow_tf32).
  bool tf32 = false;
  // The whole step as one CUDA graph (cuda_graph).
  bool cuda_graph = false;
};

// What the modes depend on besides the spec.
struct DeviceFacts {
  bool cuda = false;           // the rank trains on a GPU
  bool convolutional = false;  // the model has 4-D weights (HasConvolutions)
  // Every update's micro-batches have one shape (drop-last batches; accumulate_steps dividing
  // the rank's share of the batch).
  bool static_shapes = false;
};

// model.memory_format "channels_last" always; "auto" (the default) on a GPU for a convolutional
// model; "contiguous" never. cuDNN autotuning on a GPU for a convolutional model with static
// shapes. TF32 for precision tf32 on a GPU (on a CPU tf32 is fp32). cuda_graph as the spec says.
// INVALID_ARGUMENT naming the field: model.memory_format channels_last on a model without
// convolutions or unknown; cuda_graph on a rank without a GPU or with shapes that change.
absl::StatusOr<DeviceModes> ChooseDeviceModes(const trainyard::v1::JobSpec& spec,
                                              const DeviceFacts& facts);

// Sets LibTorch's process-wide switches for `modes`: TF32 in cuBLAS (and cuDNN, where LibTorch
// has it on already by default, as PyTorch has) and cuDNN's autotuning. Without tf32, matrix
// products stay float32, as PyTorch's default is. Nothing else: the layout is ApplyMemoryFormat's,
// the graph the training loop's.
void ApplyDeviceModes(const DeviceModes& modes);

// Whether `model` has 4-D weights (a convolution).
bool HasConvolutions(Model& model);

// With `channels_last`, lays every 4-D parameter out as NHWC in place (what PyTorch's
// model.to(memory_format=torch.channels_last) does) and has the model lay its input images out so
// (Model::SetChannelsLastInput); otherwise leaves the model as it is. Call it after the model is
// on its device and before an optimizer holds state. INVALID_ARGUMENT naming model.memory_format
// when the model has no 4-D weights.
absl::Status ApplyMemoryFormat(Model& model, bool channels_last);

}  // namespace trainyard::trainer

#endif  // TRAINYARD_WORKER_TRAINER_MODEL_DEVICE_MODES_H_
