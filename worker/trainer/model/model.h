#ifndef TRAINYARD_WORKER_TRAINER_MODEL_MODEL_H_
#define TRAINYARD_WORKER_TRAINER_MODEL_MODEL_H_

// Part model/ of the trainer (worker/trainer/PARTS): models, their parameters and optimizer state,
// distillation's teacher, mixed precision. It may call no other part.
//
// Models, optimizers, and the conversion between LibTorch tensors and safetensors.

#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/safetensors.h"
#include "trainyard/v1/job.pb.h"

namespace trainyard::trainer {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// ---- safetensors <-> torch ----

// The safetensors dtype name of `type` ("F32", "I64", ...); empty for types the format lacks.
std::string SafetensorsDtype(torch::ScalarType type);
// The LibTorch type of a safetensors dtype name; nullopt for names it does not know.
std::optional<torch::ScalarType> ScalarTypeOf(const std::string& dtype);
// A CPU tensor holding a copy of `view`'s data. INVALID_ARGUMENT for an unknown dtype.
absl::StatusOr<torch::Tensor> TensorFromView(const TensorView& view);
// A safetensors object laid out over the tensors' own memory: the header, then each tensor's
// bytes, without a serialised copy (only a tensor not on the CPU or not contiguous is copied).
struct SafetensorsPieces {
  std::string header;
  std::vector<torch::Tensor> tensors;    // what `data` points into
  std::vector<absl::string_view> data;  // one per tensor, in order
  // The object's bytes in order: the header, then the data.
  std::vector<absl::string_view> Pieces() const;
};
// INVALID_ARGUMENT for unsupported dtypes or duplicate names.
absl::StatusOr<SafetensorsPieces> LayOutTensors(
    const NamedTensors& tensors, const std::map<std::string, std::string>& metadata);
// The same object in one buffer.
absl::StatusOr<std::string> EncodeTensors(const NamedTensors& tensors,
                                          const std::map<std::string, std::string>& metadata);
// Parses a safetensors buffer into tensors by name; `metadata` (if not null) receives the
// "__metadata__" map. Errors as DecodeSafetensors.
absl::StatusOr<std::map<std::string, torch::Tensor>> DecodeTensors(
    std::string buffer, std::map<std::string, std::string>* metadata = nullptr);

// A one-line description of an exception from LibTorch: the message of a c10::Error without its
// backtrace, or the final "RuntimeError: ..." line of a TorchScript interpreter error.
std::string DescribeTorchError(const std::exception& e);

// ---- models ----

// A trainable model: built-in (mlp, cnn, embedding_mlp) or a TorchScript module. Not
// thread-safe.
class Model {
 public:
  virtual ~Model() = default;
  // x: [N, ...] float32 features. Returns [N, outputs]. Throws c10::Error on shape errors.
  virtual torch::Tensor Forward(const torch::Tensor& x) = 0;
  // With the samples' categorical ids too ([N, fields] int64; undefined when the data has none),
  // which only embedding_mlp reads.
  virtual torch::Tensor Forward(const torch::Tensor& x, const torch::Tensor& categorical) {
    return Forward(x);
  }
  // An embedding table: a [rows, dim] parameter looked up by one column of the categorical ids.
  struct EmbeddingTable {
    std::string parameter;  // its name in NamedParameters()
    int field = 0;          // the column of the categorical ids
  };
  // The model's embedding tables, which a strategy may keep elsewhere (SetRowLookup); none by
  // default.
  virtual std::vector<EmbeddingTable> EmbeddingTables() { return {}; }
  // While set, Forward takes the rows of table `table` (EmbeddingTables' order) for `ids`
  // ([N] int64) from lookup(table, ids) ([N, dim]) instead of the table parameter itself; an
  // empty function restores the tables. Only models with tables use it.
  using RowLookup = std::function<torch::Tensor(int table, const torch::Tensor& ids)>;
  virtual void SetRowLookup(RowLookup lookup) {}
  // Parameters and buffers by their module path names; tensors alias the model's storage.
  virtual NamedTensors NamedParameters() = 0;
  virtual NamedTensors NamedBuffers() = 0;
  virtual void SetTraining(bool training) = 0;
  // Moves parameters and buffers to `device` (a no-op when they are there). Call it before taking
  // NamedParameters() for an optimizer: on another device they are new tensors. Throws
  // c10::Error when the device is not available.
  virtual void To(const torch::Device& device) = 0;
  // The exported form of the trained model: its bytes and file name ("model.pt" for TorchScript,
  // "model.safetensors" for built-in models), with CPU tensors whatever the model's device.
  virtual absl::StatusOr<std::string> Export() = 0;
  virtual std::string ExportName() const = 0;
  // "mlp", "cnn", "embedding_mlp" or "torchscript".
  virtual std::string Kind() const = 0;

  int64_t ParameterCount();
};

// Builds the model of `spec`. Built-in models take their widths from model.args, with `inputs`
// (features per sample) and `classes` (outputs) filled in from the data when the args leave them
// 0. Parameters are initialised deterministically from torch::manual_seed(seed), which this call
// sets; builds are serialised process-wide so that concurrent ones each get that initialisation.
// TorchScript modules are read through the object store (a path or file:// URI).
// INVALID_ARGUMENT naming the field (model.builtin, model.args.inputs, model.torchscript) for a
// bad spec or an unreadable module; NOT_FOUND when the module file does not exist.
// embedding_mlp also checks the data's categorical ids: `max_ids` holds the largest id of each
// field (empty when the data has none), which must fit model.args.vocab.
absl::StatusOr<std::unique_ptr<Model>> BuildModel(const trainyard::v1::ModelSpec& spec,
                                                  int64_t seed, int64_t data_inputs,
                                                  int64_t data_outputs,
                                                  const std::vector<int64_t>& max_ids = {});

// The TorchScript module at `uri` (a path, file:// or s3:// URI; s3 through the worker's object
// cache, so that a restart does not download it again), on the CPU and in training mode.
// `field` names the spec field in errors: INVALID_ARGUMENT "<field>: ..." for a bad URI or a file
// that is not a module, NOT_FOUND when there is no such file.
absl::StatusOr<std::unique_ptr<Model>> LoadTorchScript(const std::string& uri,
                                                       absl::string_view field);

// model.memory_format: "channels_last" lays every 4-D parameter out as NHWC in place (what
// PyTorch's model.to(memory_format=torch.channels_last) does), so that convolutions take and give
// channels-last activations; "contiguous" or empty leaves the model as it is. Call it after the
// model is on its device and before an optimizer holds state. INVALID_ARGUMENT naming
// model.memory_format for an unknown format, or channels_last on a model without 4-D weights.
absl::Status ApplyMemoryFormat(Model& model, const std::string& format);

// A copy of `tensor` on `device`, detached; a plain clone when it is already there.
torch::Tensor CopyTo(const torch::Tensor& tensor, const torch::Device& device);

// ---- optimizers ----

// sgd (momentum, nesterov, weight_decay), adam and adamw (beta1, beta2, eps, weight_decay), with
// beta1/beta2/eps of 0 meaning the usual defaults (0.9, 0.999, 1e-8).
// INVALID_ARGUMENT "optimizer.name: ..." for anything else.
absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>> BuildOptimizer(
    const trainyard::v1::OptimizerSpec& spec, const std::vector<torch::Tensor>& parameters);

void SetLearningRate(torch::optim::Optimizer& optimizer, double lr);

// Per-parameter optimizer state as "<param>.momentum_buffer", "<param>.exp_avg",
// "<param>.exp_avg_sq", "<param>.max_exp_avg_sq" and "<param>.step" (I64, shape [1]). CPU copies
// of the state, whatever the parameters' device; parameters without state are absent.
NamedTensors OptimizerStateTensors(const torch::optim::Optimizer& optimizer,
                                   const NamedTensors& parameters);

// Checks that `state` fits `optimizer` over `parameters` (names, shapes, the kind of state)
// without changing anything. INVALID_ARGUMENT naming the offending entry.
absl::Status CheckOptimizerState(const torch::optim::Optimizer& optimizer,
                                 const NamedTensors& parameters,
                                 const std::map<std::string, torch::Tensor>& state);
// Replaces the optimizer's state with copies of `state` (which CheckOptimizerState accepted) on
// each parameter's device.
void LoadOptimizerState(torch::optim::Optimizer& optimizer, const NamedTensors& parameters,
                        const std::map<std::string, torch::Tensor>& state);

}  // namespace trainyard::trainer

#endif  // TRAINYARD_WORKER_TRAINER_MODEL_MODEL_H_
