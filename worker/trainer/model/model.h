#ifndef TRAINYARD_WORKER_TRAINER_MODEL_MODEL_H_
#define TRAINYARD_WORKER_TRAINER_MODEL_MODEL_H_

// Part model/ of the trainer (worker/trainer/PARTS): models, their parameters and optimizer state,
// distillation's teacher, mixed precision. It may call no other part.
//
// Models: the built-in ones and TorchScript modules, built from the spec, exported when trained.
// Tensors and their safetensors form are in tensors.h, optimizers in optimizer.h.

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
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/storage/object_store.h"
#include "trainyard/v1/agent_service.pb.h"
#include "trainyard/v1/job.pb.h"
#include "worker/trainer/model/tensors.h"

namespace trainyard::trainer {

// A trainable model: built-in (mlp, cnn, embedding_mlp, transformer: transformer.h) or a
// TorchScript module. Not thread-safe.
class Model {
 public:
  virtual ~Model() = default;
  // x: [N, ...] float32 features (a language model: int64 token ids [N, T]). Returns
  // [N, outputs] ([N, T, vocab] for a language model). Throws c10::Error on shape errors.
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
  // Writes the exported form of the trained model to the file `path` (replaced), with CPU
  // tensors whatever the model's device: a TorchScript module saved straight into it (ExportName
  // "model.pt"), a built-in model's safetensors object from ExportPieces ("model.safetensors").
  // UNAVAILABLE naming the path when it cannot be written; FAILED_PRECONDITION for a model that
  // does not export alone (a pipeline stage).
  virtual absl::Status ExportToFile(const std::string& path);
  // A built-in model's export as a safetensors object laid out over the model's own tensors
  // (LayOutTensors: a CPU model's are not copied), for a writer that sends it from there
  // (ObjectStore::PutPieces) instead of holding the model twice; UNIMPLEMENTED for a model that
  // exports another form (TorchScript).
  virtual absl::StatusOr<SafetensorsPieces> ExportPieces() {
    return absl::UnimplementedError(absl::StrCat(Kind(), ": exports ", ExportName()));
  }
  virtual std::string ExportName() const = 0;
  // A model that shapes its features into images itself (the cnn) lays them out NHWC while set,
  // for convolutions over channels-last weights (ApplyMemoryFormat sets it); others ignore it.
  virtual void SetChannelsLastInput(bool channels_last) {}
  // "mlp", "cnn", "embedding_mlp", "transformer" or "torchscript".
  virtual std::string Kind() const = 0;

  int64_t ParameterCount();
};

// Builds the model of `spec`. Built-in models take their widths from model.args, with `inputs`
// (features per sample) and `classes` (outputs) filled in from the data when the args leave them
// 0; the transformer checks that the data's tokens (ids below data_outputs) fit its vocab.
// Parameters are initialised deterministically from torch::manual_seed(seed), which this call sets;
// builds are serialised process-wide so that concurrent ones each get that initialisation.
// TorchScript modules (model.torchscript, or model.stages' files chained: LoadScriptStages) are
// read through `stores` (FAILED_PRECONDITION when it is null); builtin models need none.
// INVALID_ARGUMENT naming the field (model.builtin, model.args.inputs, model.torchscript) for a
// bad spec or an unreadable module; NOT_FOUND when the module file does not exist.
// embedding_mlp also checks the data's categorical ids: `max_ids` holds the largest id of each
// field (empty when the data has none), which must fit model.args.vocab.
absl::StatusOr<std::unique_ptr<Model>> BuildModel(const trainyard::v1::ModelSpec& spec,
                                                  int64_t seed, int64_t data_inputs,
                                                  int64_t data_outputs,
                                                  const std::vector<int64_t>& max_ids = {},
                                                  const ObjectStoreResolver* stores = nullptr);

// Held while a model is built: seeding and the initialisers' draws must not interleave with
// another build's (ranks run as threads of one process share the generator), or the initial
// parameters would vary. BuildModel takes it; so must any other builder.
absl::Mutex& ModelBuildMutex();

// The TorchScript module at `uri` (a path, file:// or s3:// URI; s3 through the worker's object
// cache, so that a restart does not download it again), on the CPU and in training mode.
// `field` names the spec field in errors: INVALID_ARGUMENT "<field>: ..." for a bad URI or a file
// that is not a module, NOT_FOUND when there is no such file. A module that calls operators this
// LibTorch lacks (or is of a newer archive format) is FAILED_PRECONDITION naming them and the
// version, before LibTorch tries to load it.
absl::StatusOr<std::unique_ptr<Model>> LoadTorchScript(const ObjectStoreResolver& stores,
                                                       const std::string& uri,
                                                       absl::string_view field);

// A pipeline over a TorchScript model: its module must be a scripted torch.nn.Sequential, whose
// children are the layers. SequentialLayerBytes gives each layer's parameter bytes;
// SequentialStage keeps the layers [first, end) of `model` and lets the rest go (a model whose
// forward applies them in order, with the whole module's tensor names; it does not export
// alone). INVALID_ARGUMENT naming model.torchscript when the module is not a Sequential.
absl::StatusOr<std::vector<int64_t>> SequentialLayerBytes(Model& model);
absl::StatusOr<std::unique_ptr<Model>> SequentialStage(std::unique_ptr<Model> model, int first,
                                                       int end);
// A parameter that several layers of a TorchScript Sequential hold (a head tied to an
// embedding): its name in the whole module (its first, as named_parameters gives it, which is
// also what a stage holding it calls it) and the layers holding it, in order.
struct SharedParameter {
  std::string name;
  std::vector<int> layers;
};
absl::StatusOr<std::vector<SharedParameter>> SequentialSharedParameters(Model& model);

// model.stages: a model in TorchScript files, applied in order. LoadScriptStages loads the files
// [first, end) (end -1: to the last) as one model whose tensors are named "<file index>.<name>"
// (as torch.nn.Sequential(*files) names them; ExportName kScriptStagesExport); errors as
// LoadTorchScript's, naming model.stages[i]. ScriptStageBytes reads each file's tensor bytes from
// its archive's entries, without loading it (what a balanced partition weighs, as the
// coordinator's memory estimate does). ExportScriptStage saves the module of model.stages[index]
// that `model` holds to `path` (NOT_FOUND when it holds no such file, FAILED_PRECONDITION for
// another kind of model).
inline constexpr char kScriptStagesExport[] = "stages";
absl::StatusOr<std::unique_ptr<Model>> LoadScriptStages(const ObjectStoreResolver& stores,
                                                        const trainyard::v1::ModelSpec& spec,
                                                        int first, int end);
absl::StatusOr<std::vector<int64_t>> ScriptStageBytes(const ObjectStoreResolver& stores,
                                                      const trainyard::v1::ModelSpec& spec);
absl::Status ExportScriptStage(Model& model, int index, const std::string& path);

// What this trainer runs: its LibTorch's version, whether it has CUDA (built with it, and a GPU
// it can use) and NCCL, the newest TorchScript archive format it loads, and every operator it
// has, sorted. What `trainyard-trainer --runtime` prints and the agent reports at registration.
trainyard::v1::TrainerRuntime DescribeRuntime();

}  // namespace trainyard::trainer

#endif  // TRAINYARD_WORKER_TRAINER_MODEL_MODEL_H_
