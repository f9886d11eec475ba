#include "worker/trainer/model/model.h"

#include <caffe2/serialize/versions.h>
#include <torch/script.h>
#include <torch/version.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "common/formats/torchscript_archive.h"
#include "common/storage/file_object_store.h"
#include "common/storage/object_cache.h"
#include "common/storage/object_store.h"
#include "common/storage/uri.h"
#include "worker/trainer/model/transformer.h"

namespace trainyard::trainer {
namespace {

NamedTensors FromDict(const torch::OrderedDict<std::string, torch::Tensor>& dict) {
  NamedTensors out;
  for (const auto& item : dict) out.emplace_back(item.key(), item.value());
  return out;
}

// mlp and cnn: a Sequential with the input reshaped to what its first layer expects.
class BuiltinModel final : public Model {
 public:
  BuiltinModel(std::string kind, torch::nn::Sequential net, std::vector<int64_t> sample_shape)
      : kind_(std::move(kind)), net_(std::move(net)), sample_shape_(std::move(sample_shape)) {}

  torch::Tensor Forward(const torch::Tensor& x) override {
    std::vector<int64_t> shape = {x.size(0)};
    shape.insert(shape.end(), sample_shape_.begin(), sample_shape_.end());
    torch::Tensor input = x.reshape(shape);
    if (channels_last_) input = input.contiguous(torch::MemoryFormat::ChannelsLast);
    return net_->forward(input);
  }
  void SetChannelsLastInput(bool on) override { channels_last_ = on && sample_shape_.size() == 3; }
  NamedTensors NamedParameters() override { return FromDict(net_->named_parameters(true)); }
  NamedTensors NamedBuffers() override { return FromDict(net_->named_buffers(true)); }
  void SetTraining(bool training) override { net_->train(training); }
  void To(const torch::Device& device) override { net_->to(device); }
  absl::StatusOr<SafetensorsPieces> ExportPieces() override {  // copies to the CPU as needed
    NamedTensors tensors = NamedParameters();
    for (auto& buffer : NamedBuffers()) tensors.push_back(std::move(buffer));
    for (auto& [name, tensor] : tensors) tensor = tensor.detach().contiguous();
    return LayOutTensors(tensors, {{"format", "trainyard-model/1"}, {"model", kind_}});
  }
  std::string ExportName() const override { return "model.safetensors"; }
  std::string Kind() const override { return kind_; }

 private:
  const std::string kind_;
  torch::nn::Sequential net_;
  const std::vector<int64_t> sample_shape_;  // {-1} for mlp, {C, H, W} for cnn
  bool channels_last_ = false;               // the cnn's images NHWC
};

// embedding_mlp: one table per categorical field; the embeddings of a sample's ids and its dense
// features, concatenated, go through an MLP.
class EmbeddingMlp final : public Model {
 public:
  EmbeddingMlp(const trainyard::v1::ModelArgs& args, int64_t inputs, int64_t outputs)
      : inputs_(inputs) {
    for (int i = 0; i < args.vocab_size(); ++i) {
      tables_.push_back(root_->register_module(absl::StrCat("embedding", i),
                                               torch::nn::Embedding(args.vocab(i), args.dim())));
    }
    torch::nn::Sequential mlp;
    int64_t width = args.vocab_size() * static_cast<int64_t>(args.dim()) + inputs;
    for (int32_t h : args.hidden()) {
      mlp->push_back(torch::nn::Linear(width, h));
      mlp->push_back(torch::nn::ReLU());
      if (args.dropout() > 0) mlp->push_back(torch::nn::Dropout(args.dropout()));
      width = h;
    }
    mlp->push_back(torch::nn::Linear(width, outputs));
    mlp_ = root_->register_module("mlp", mlp);
  }

  torch::Tensor Forward(const torch::Tensor& x) override {
    TORCH_CHECK(false, "embedding_mlp needs categorical ids (data.categorical)");
  }
  torch::Tensor Forward(const torch::Tensor& x, const torch::Tensor& categorical) override {
    TORCH_CHECK(categorical.defined() && categorical.dim() == 2 &&
                    categorical.size(1) == static_cast<int64_t>(tables_.size()),
                "embedding_mlp needs categorical ids of shape [N, ", tables_.size(), "]");
    std::vector<torch::Tensor> parts;
    parts.reserve(tables_.size() + 1);
    for (size_t i = 0; i < tables_.size(); ++i) {
      const torch::Tensor ids = categorical.select(1, static_cast<int64_t>(i));
      parts.push_back(lookup_ ? lookup_(static_cast<int>(i), ids) : tables_[i]->forward(ids));
    }
    if (inputs_ > 0) parts.push_back(x.reshape({x.size(0), -1}));
    return mlp_->forward(torch::cat(parts, 1));
  }
  std::vector<EmbeddingTable> EmbeddingTables() override {
    std::vector<EmbeddingTable> tables;
    for (size_t i = 0; i < tables_.size(); ++i) {
      tables.push_back({absl::StrCat("embedding", i, ".weight"), static_cast<int>(i)});
    }
    return tables;
  }
  void SetRowLookup(RowLookup lookup) override { lookup_ = std::move(lookup); }
  NamedTensors NamedParameters() override { return FromDict(root_->named_parameters(true)); }
  NamedTensors NamedBuffers() override { return FromDict(root_->named_buffers(true)); }
  void SetTraining(bool training) override { root_->train(training); }
  void To(const torch::Device& device) override { root_->to(device); }
  absl::StatusOr<SafetensorsPieces> ExportPieces() override {
    NamedTensors tensors = NamedParameters();
    for (auto& [name, tensor] : tensors) tensor = tensor.detach().contiguous();
    return LayOutTensors(tensors, {{"format", "trainyard-model/1"}, {"model", "embedding_mlp"}});
  }
  std::string ExportName() const override { return "model.safetensors"; }
  std::string Kind() const override { return "embedding_mlp"; }

 private:
  const int64_t inputs_;
  std::shared_ptr<torch::nn::Module> root_ = std::make_shared<torch::nn::Module>();
  std::vector<torch::nn::Embedding> tables_;
  torch::nn::Sequential mlp_{nullptr};
  RowLookup lookup_;
};

// Appends `module`'s parameters to `out`, each tensor once: a parameter that two submodules share
// (a language model's head tied to its embedding) under its first name, as PyTorch's
// named_parameters() gives it, so that the optimizer does not step it twice nor a collective
// reduce its gradient twice (LibTorch's lists it under every name). `seen` carries the tensors
// listed by earlier calls. A tensor is named as `names` calls it, or else "<prefix><name>".
void AppendParameters(const torch::jit::Module& module, const std::string& prefix,
                      const std::map<const void*, std::string>& names, std::set<const void*>& seen,
                      NamedTensors& out) {
  for (const auto& p : module.named_parameters(true)) {
    const void* impl = p.value.unsafeGetTensorImpl();
    if (!seen.insert(impl).second) continue;
    auto named = names.find(impl);
    out.emplace_back(named != names.end() ? named->second : prefix + p.name, p.value);
  }
}

void AppendBuffers(const torch::jit::Module& module, const std::string& prefix, NamedTensors& out) {
  for (const auto& b : module.named_buffers(true)) out.emplace_back(prefix + b.name, b.value);
}

// Saves `module`, which is on `device`, to `path` with its tensors on the CPU: a module saved
// with CUDA tensors cannot be loaded where there is no GPU. `what` names it in the error.
absl::Status SaveOnCpu(torch::jit::Module& module, const torch::Device& device,
                       const std::string& path, absl::string_view what) {
  try {
    if (!device.is_cpu()) module.to(torch::kCPU);
    module.save(path);
    if (!device.is_cpu()) module.to(device);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("saving ", what, " to ", path, ": ", DescribeTorchError(e)));
  }
  return absl::OkStatus();
}

class ScriptModel final : public Model {
 public:
  explicit ScriptModel(torch::jit::Module module) : module_(std::move(module)) {}

  torch::Tensor Forward(const torch::Tensor& x) override {
    torch::IValue out = module_.forward({x});
    TORCH_CHECK(out.isTensor(), "forward() must return a Tensor, got ", out.tagKind());
    return out.toTensor();
  }
  NamedTensors NamedParameters() override {
    NamedTensors out;
    std::set<const void*> seen;
    AppendParameters(module_, "", {}, seen, out);
    return out;
  }
  NamedTensors NamedBuffers() override {
    NamedTensors out;
    AppendBuffers(module_, "", out);
    return out;
  }
  void SetTraining(bool training) override { module_.train(training); }
  void To(const torch::Device& device) override {
    module_.to(device);
    device_ = device;
  }
  absl::Status ExportToFile(const std::string& path) override {
    return SaveOnCpu(module_, device_, path, "the TorchScript module");
  }
  std::string ExportName() const override { return "model.pt"; }
  std::string Kind() const override { return "torchscript"; }
  torch::jit::Module& module() { return module_; }

 private:
  torch::jit::Module module_;
  torch::Device device_ = torch::kCPU;
};

// Whether `module` is a scripted torch.nn.Sequential: its type is
// __torch__.torch.nn.modules.container.Sequential, with a mangling step before the last part when
// one program scripted several ("...container.___torch_mangle_3.Sequential").
bool IsSequential(const torch::jit::Module& module) {
  const auto name = module.type()->name();
  return name.has_value() && name->name() == "Sequential" &&
         absl::StartsWith(name->prefix(), "__torch__.torch.nn.modules.container");
}

// Scripted modules applied in order, each to what the one before returns, their tensors named
// "<part's name>.<name>" as a torch.nn.Sequential of them names them. Two kinds:
// - a pipeline stage of a scripted Sequential: a run of its children, named as in the whole
//   module ("3.weight"), with `names` giving the whole module's name of each parameter (by
//   tensor), so that a weight shared with another stage's layer has the one name in both; holds
//   only its children, so the rest of the module is freed once the whole one goes; does not
//   export alone;
// - model.stages: some consecutive files of the model's, named by their index; exports one file
//   per module (ExportPart), in the folder kScriptStagesExport.
class ScriptLayers final : public Model {
 public:
  struct Part {
    std::string name;   // "3"
    std::string label;  // for errors: "layer 3", "model.stages[3]"
    torch::jit::Module module;
  };
  ScriptLayers(std::vector<Part> parts, std::map<const void*, std::string> names, bool files)
      : parts_(std::move(parts)), names_(std::move(names)), files_(files) {}

  torch::Tensor Forward(const torch::Tensor& x) override {
    torch::Tensor out = x;
    for (Part& part : parts_) {
      torch::IValue value = part.module.forward({out});
      TORCH_CHECK(value.isTensor(), part.label, ": forward() must return a Tensor, got ",
                  value.tagKind());
      out = value.toTensor();
    }
    return out;
  }
  NamedTensors NamedParameters() override {
    NamedTensors out;
    std::set<const void*> seen;
    for (Part& part : parts_) AppendParameters(part.module, part.name + ".", names_, seen, out);
    return out;
  }
  NamedTensors NamedBuffers() override {
    NamedTensors out;
    for (Part& part : parts_) AppendBuffers(part.module, part.name + ".", out);
    return out;
  }
  void SetTraining(bool training) override {
    for (Part& part : parts_) part.module.train(training);
  }
  void To(const torch::Device& device) override {
    for (Part& part : parts_) part.module.to(device);
    device_ = device;
  }
  absl::Status ExportToFile(const std::string&) override {
    return absl::FailedPreconditionError(
        files_ ? "model.stages: exported one file per stage"
               : "torchscript: a stage of layers does not export alone");
  }
  // Saves the module of model.stages[index] to `path`, with CPU tensors. NOT_FOUND when this
  // model does not hold it.
  absl::Status ExportPart(int index, const std::string& path) {
    const std::string name = absl::StrCat(index);
    for (Part& part : parts_) {
      if (files_ && part.name == name) return SaveOnCpu(part.module, device_, path, part.label);
    }
    return absl::NotFoundError(absl::StrCat("this model does not hold model.stages[", index, "]"));
  }
  std::string ExportName() const override { return files_ ? kScriptStagesExport : "model.pt"; }
  std::string Kind() const override { return "torchscript"; }

 private:
  std::vector<Part> parts_;
  const std::map<const void*, std::string> names_;
  const bool files_;
  torch::Device device_ = torch::kCPU;
};

// The children of `model`'s module when it is a scripted torch.nn.Sequential.
absl::StatusOr<std::vector<torch::jit::NameModule>> SequentialChildren(Model& model) {
  auto* script = dynamic_cast<ScriptModel*>(&model);
  if (script == nullptr || !IsSequential(script->module())) {
    return absl::InvalidArgumentError(
        "model.torchscript: a pipeline splits a scripted torch.nn.Sequential into its layers; "
        "this module is not one (script the Sequential itself: "
        "torch.jit.script(nn.Sequential(...)))");
  }
  std::vector<torch::jit::NameModule> children;
  for (const torch::jit::NameModule& child : script->module().named_children()) {
    children.push_back(child);
  }
  if (children.empty()) {
    return absl::InvalidArgumentError("model.torchscript: the Sequential has no layers");
  }
  return children;
}

absl::StatusOr<std::unique_ptr<Model>> BuildMlp(const trainyard::v1::ModelArgs& args,
                                                int64_t inputs, int64_t outputs) {
  torch::nn::Sequential net;
  int64_t width = inputs;
  for (int i = 0; i < args.hidden_size(); ++i) {
    if (args.hidden(i) < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.args.hidden[", i, "]: must be >= 1, got ", args.hidden(i)));
    }
    net->push_back(torch::nn::Linear(width, args.hidden(i)));
    net->push_back(torch::nn::ReLU());
    if (args.dropout() > 0) net->push_back(torch::nn::Dropout(args.dropout()));
    width = args.hidden(i);
  }
  net->push_back(torch::nn::Linear(width, outputs));
  return std::make_unique<BuiltinModel>("mlp", std::move(net), std::vector<int64_t>{-1});
}

absl::StatusOr<std::unique_ptr<Model>> BuildCnn(const trainyard::v1::ModelArgs& args,
                                                int64_t inputs, int64_t outputs) {
  const int64_t channels = args.channels() > 0 ? args.channels() : 1;
  int64_t height = args.height();
  int64_t width = args.width();
  if (height == 0 && width == 0) {
    // A square image when the spec leaves the size out.
    const int64_t side = static_cast<int64_t>(std::llround(std::sqrt(inputs / channels)));
    height = width = side;
  }
  if (channels * height * width != inputs) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.args: channels * height * width = ", channels, " * ", height, " * ",
                     width, " does not match the ", inputs, " features per sample"));
  }
  std::vector<int64_t> hidden(args.hidden().begin(), args.hidden().end());
  if (hidden.empty()) hidden = {16, 32};
  torch::nn::Sequential net;
  int64_t in_channels = channels;
  int64_t h = height, w = width;
  for (size_t i = 0; i < hidden.size(); ++i) {
    if (hidden[i] < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.args.hidden[", i, "]: must be >= 1, got ", hidden[i]));
    }
    net->push_back(
        torch::nn::Conv2d(torch::nn::Conv2dOptions(in_channels, hidden[i], 3).padding(1)));
    net->push_back(torch::nn::ReLU());
    net->push_back(torch::nn::MaxPool2d(2));
    in_channels = hidden[i];
    h /= 2;
    w /= 2;
    if (h < 1 || w < 1) {
      return absl::InvalidArgumentError(absl::StrCat("model.args.hidden: ", hidden.size(),
                                                     " conv blocks are too many for a ", height,
                                                     "x", width, " input"));
    }
  }
  if (args.dropout() > 0) net->push_back(torch::nn::Dropout(args.dropout()));
  net->push_back(torch::nn::Flatten());
  net->push_back(torch::nn::Linear(in_channels * h * w, outputs));
  return std::make_unique<BuiltinModel>("cnn", std::move(net),
                                        std::vector<int64_t>{channels, height, width});
}

}  // namespace

absl::StatusOr<std::vector<int64_t>> SequentialLayerBytes(Model& model) {
  absl::StatusOr<std::vector<torch::jit::NameModule>> children = SequentialChildren(model);
  if (!children.ok()) return children.status();
  std::vector<int64_t> bytes;
  for (torch::jit::NameModule& child : *children) {
    int64_t sum = 0;
    for (const auto& p : child.value.named_parameters(true)) sum += p.value.nbytes();
    bytes.push_back(sum);
  }
  return bytes;
}

absl::StatusOr<std::unique_ptr<Model>> SequentialStage(std::unique_ptr<Model> model, int first,
                                                       int end) {
  absl::StatusOr<std::vector<torch::jit::NameModule>> children = SequentialChildren(*model);
  if (!children.ok()) return children.status();
  if (first < 0 || first >= end || end > static_cast<int>(children->size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pipeline: layers [", first, ", ", end, ") outside the Sequential's ", children->size()));
  }
  std::map<const void*, std::string> names;
  for (const auto& [name, p] : model->NamedParameters()) names[p.unsafeGetTensorImpl()] = name;
  std::vector<ScriptLayers::Part> mine;
  for (int i = first; i < end; ++i) {
    torch::jit::NameModule& child = (*children)[i];
    mine.push_back({child.name, absl::StrCat("layer ", child.name), child.value});
  }
  children->clear();
  model.reset();  // the other layers go with the whole module
  return std::make_unique<ScriptLayers>(std::move(mine), std::move(names), /*files=*/false);
}

absl::StatusOr<std::vector<SharedParameter>> SequentialSharedParameters(Model& model) {
  absl::StatusOr<std::vector<torch::jit::NameModule>> children = SequentialChildren(model);
  if (!children.ok()) return children.status();
  std::vector<SharedParameter> out;
  std::map<const void*, size_t> index;
  for (const auto& [name, p] : model.NamedParameters()) {
    index[p.unsafeGetTensorImpl()] = out.size();
    out.push_back({name, {}});
  }
  for (size_t layer = 0; layer < children->size(); ++layer) {
    std::set<const void*> held;
    for (const auto& p : (*children)[layer].value.named_parameters(true)) {
      const void* impl = p.value.unsafeGetTensorImpl();
      auto it = index.find(impl);
      if (it != index.end() && held.insert(impl).second) {
        out[it->second].layers.push_back(static_cast<int>(layer));
      }
    }
  }
  out.erase(std::remove_if(out.begin(), out.end(),
                           [](const SharedParameter& p) { return p.layers.size() < 2; }),
            out.end());
  return out;
}

absl::Status Model::ExportToFile(const std::string& path) {
  absl::StatusOr<SafetensorsPieces> pieces = ExportPieces();
  if (!pieces.ok()) return pieces.status();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  for (absl::string_view piece : pieces->Pieces()) {
    out.write(piece.data(), static_cast<std::streamsize>(piece.size()));
  }
  out.close();
  if (!out) return absl::UnavailableError(absl::StrCat("cannot write the export to ", path));
  return absl::OkStatus();
}

int64_t Model::ParameterCount() {
  int64_t n = 0;
  for (const auto& [name, p] : NamedParameters()) n += p.numel();
  return n;
}

absl::StatusOr<std::unique_ptr<Model>> BuildEmbeddingMlp(const trainyard::v1::ModelArgs& args,
                                                         int64_t data_inputs, int64_t outputs,
                                                         const std::vector<int64_t>& max_ids) {
  if (args.vocab_size() == 0 || args.dim() < 1) {
    return absl::InvalidArgumentError(
        "model.args: embedding_mlp needs vocab (rows per categorical field) and dim >= 1");
  }
  if (static_cast<int>(max_ids.size()) != args.vocab_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.categorical: the data has ", max_ids.size(),
                     " categorical fields, model.args.vocab ", args.vocab_size()));
  }
  for (int i = 0; i < args.vocab_size(); ++i) {
    if (args.vocab(i) < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.args.vocab[", i, "]: must be >= 1, got ", args.vocab(i)));
    }
    if (max_ids[i] >= args.vocab(i)) {
      return absl::InvalidArgumentError(absl::StrCat("data.categorical: field ", i, " has id ",
                                                     max_ids[i], ", outside the ", args.vocab(i),
                                                     " rows of model.args.vocab[", i, "]"));
    }
  }
  for (int i = 0; i < args.hidden_size(); ++i) {
    if (args.hidden(i) < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.args.hidden[", i, "]: must be >= 1, got ", args.hidden(i)));
    }
  }
  // inputs 0 reads no dense features; otherwise they must match the data's.
  if (args.inputs() > 0 && args.inputs() != data_inputs) {
    return absl::InvalidArgumentError(absl::StrCat("model.args.inputs: ", args.inputs(),
                                                   " does not match the ", data_inputs,
                                                   " features per sample in the data"));
  }
  return std::make_unique<EmbeddingMlp>(args, args.inputs(), outputs);
}

absl::Mutex& ModelBuildMutex() {
  static absl::Mutex* const build_mu = new absl::Mutex();
  return *build_mu;
}

absl::StatusOr<std::unique_ptr<Model>> BuildModel(const trainyard::v1::ModelSpec& spec,
                                                  int64_t seed, int64_t data_inputs,
                                                  int64_t data_outputs,
                                                  const std::vector<int64_t>& max_ids,
                                                  const ObjectStoreResolver* stores) {
  absl::MutexLock lock(&ModelBuildMutex());
  torch::manual_seed(static_cast<uint64_t>(seed));
  if (spec.stages_size() > 0) {
    if (stores == nullptr) {
      return absl::FailedPreconditionError("model.stages: no object stores to read them from");
    }
    return LoadScriptStages(*stores, spec, 0, -1);
  }
  if (spec.source_case() == trainyard::v1::ModelSpec::kTorchscript) {
    if (spec.torchscript().empty()) {
      return absl::InvalidArgumentError("model.torchscript: empty path");
    }
    if (stores == nullptr) {
      return absl::FailedPreconditionError("model.torchscript: no object stores to read it from");
    }
    return LoadTorchScript(*stores, spec.torchscript(), "model.torchscript");
  }
  const auto& args = spec.args();
  // The data's outputs are its largest token id + 1.
  if (spec.builtin() == "transformer") return BuildTransformer(args, seed, data_outputs - 1);
  const int64_t outputs = args.classes() > 0 ? args.classes() : data_outputs;
  if (spec.builtin() == "embedding_mlp") {
    if (outputs < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.args.classes: must be >= 1, got ", outputs));
    }
    return BuildEmbeddingMlp(args, data_inputs, outputs, max_ids);
  }
  const int64_t inputs = args.inputs() > 0 ? args.inputs() : data_inputs;
  if (inputs != data_inputs) {
    return absl::InvalidArgumentError(absl::StrCat("model.args.inputs: ", inputs,
                                                   " does not match the ", data_inputs,
                                                   " features per sample in the data"));
  }
  if (outputs < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.args.classes: must be >= 1, got ", outputs));
  }
  if (args.dropout() < 0 || args.dropout() >= 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.args.dropout: must be in [0, 1), got ", args.dropout()));
  }
  if (spec.builtin() == "mlp") return BuildMlp(args, inputs, outputs);
  if (spec.builtin() == "cnn") return BuildCnn(args, inputs, outputs);
  return absl::InvalidArgumentError(absl::StrCat("model.builtin: unknown model '", spec.builtin(),
                                                 "' (mlp, cnn, embedding_mlp, transformer)"));
}

namespace {

// The module at `uri` (LoadTorchScript's rules and errors).
absl::StatusOr<torch::jit::Module> LoadModule(const ObjectStoreResolver& stores,
                                              const std::string& uri, absl::string_view field) {
  absl::StatusOr<std::shared_ptr<ObjectStore>> store = stores.Open(uri);
  if (!store.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", store.status().message()));
  }
  // A local file, which LibTorch reads record by record: the module's tensors are the one copy of
  // it in memory, not also the archive's bytes and a stream over them.
  absl::StatusOr<std::string> local;
  if (absl::StartsWith(uri, "s3://")) {
    // Through the local cache (keyed by ETag): a restart does not download the model again.
    ObjectCache cache(ObjectCache::DefaultDir());
    local = cache.Fetch(**store, uri);
  } else if (absl::StatusOr<ObjectInfo> head = (*store)->Head(uri);
             absl::IsPermissionDenied(head.status())) {
    // Outside the folders the job may use (a link leading out, seen only here).
    return absl::PermissionDeniedError(absl::StrCat(field, ": ", head.status().message()));
  } else {
    local = LocalPath(uri);
  }
  // What LibTorch would say of the first operator it lacks (Unknown builtin op), said of all of
  // them, with the versions. An archive this cannot read is left to LibTorch's own error.
  FileObjectStore files;
  absl::StatusOr<TorchScriptNeeds> needs =
      local.ok() ? ReadTorchScriptNeeds(files, absl::StrCat("file://", *local)) : local.status();
  if (!local.ok() || absl::IsNotFound(needs.status())) {
    const absl::Status& error = local.ok() ? needs.status() : local.status();
    return absl::Status(error.code() == absl::StatusCode::kNotFound
                            ? absl::StatusCode::kNotFound
                            : absl::StatusCode::kInvalidArgument,
                        absl::StrCat(field, ": ", error.message()));
  }
  if (needs.ok()) {
    static const trainyard::v1::TrainerRuntime* const runtime =
        new trainyard::v1::TrainerRuntime(DescribeRuntime());
    const std::string missing =
        MissingFromRuntime(*needs, {runtime->ops().begin(), runtime->ops().end()},
                           runtime->max_model_format_version());
    if (!missing.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat(field, ": '", uri, "' needs what this worker's LibTorch ",
                       runtime->libtorch_version(), " lacks: ", missing,
                       " (the model was saved by a newer PyTorch; run it on workers with a newer "
                       "LibTorch)"));
    }
  }
  try {
    return torch::jit::load(*local);
  } catch (const std::exception& e) {
    // What a finished job with a built-in model exports is a likely mistake here.
    const char* hint = absl::EndsWith(uri, ".safetensors")
                           ? " (a built-in model's export, model.safetensors, holds its tensors "
                             "but not its code: only a job with a TorchScript model exports one, "
                             "model.pt)"
                           : "";
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": cannot load '", uri, "': ", DescribeTorchError(e), hint));
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> LoadTorchScript(const ObjectStoreResolver& stores,
                                                       const std::string& uri,
                                                       absl::string_view field) {
  absl::StatusOr<torch::jit::Module> module = LoadModule(stores, uri, field);
  if (!module.ok()) return module.status();
  return std::make_unique<ScriptModel>(*std::move(module));
}

absl::StatusOr<std::unique_ptr<Model>> LoadScriptStages(const ObjectStoreResolver& stores,
                                                        const trainyard::v1::ModelSpec& spec,
                                                        int first, int end) {
  if (end < 0) end = spec.stages_size();
  if (first < 0 || first >= end || end > spec.stages_size()) {
    return absl::InvalidArgumentError(absl::StrCat("model.stages: files [", first, ", ", end,
                                                   ") outside its ", spec.stages_size()));
  }
  std::vector<ScriptLayers::Part> parts;
  for (int i = first; i < end; ++i) {
    const std::string field = absl::StrCat("model.stages[", i, "]");
    absl::StatusOr<torch::jit::Module> module = LoadModule(stores, spec.stages(i), field);
    if (!module.ok()) return module.status();
    parts.push_back({absl::StrCat(i), field, *std::move(module)});
  }
  return std::make_unique<ScriptLayers>(std::move(parts), std::map<const void*, std::string>{},
                                        /*files=*/true);
}

absl::StatusOr<std::vector<int64_t>> ScriptStageBytes(const ObjectStoreResolver& stores,
                                                      const trainyard::v1::ModelSpec& spec) {
  std::vector<int64_t> bytes;
  for (int i = 0; i < spec.stages_size(); ++i) {
    const std::string field = absl::StrCat("model.stages[", i, "]");
    absl::StatusOr<std::shared_ptr<ObjectStore>> store = stores.Open(spec.stages(i));
    if (!store.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": ", store.status().message()));
    }
    absl::StatusOr<TorchScriptNeeds> needs = ReadTorchScriptNeeds(**store, spec.stages(i));
    if (!needs.ok()) {
      return absl::Status(needs.status().code(),
                          absl::StrCat(field, ": ", needs.status().message()));
    }
    bytes.push_back(needs->tensor_bytes);
  }
  return bytes;
}

absl::Status ExportScriptStage(Model& model, int index, const std::string& path) {
  auto* chain = dynamic_cast<ScriptLayers*>(&model);
  if (chain == nullptr) {
    return absl::FailedPreconditionError("the model is not one of model.stages' files");
  }
  return chain->ExportPart(index, path);
}

trainyard::v1::TrainerRuntime DescribeRuntime() {
  trainyard::v1::TrainerRuntime runtime;
  runtime.set_libtorch_version(TORCH_VERSION);
  runtime.set_cuda(torch::cuda::is_available());
  runtime.set_nccl(TRAINYARD_WITH_NCCL && runtime.cuda());
  runtime.set_max_model_format_version(
      static_cast<int64_t>(caffe2::serialize::kMaxSupportedFileFormatVersion));
  std::vector<std::string> ops;
  for (const std::shared_ptr<torch::jit::Operator>& op : torch::jit::getAllOperators()) {
    ops.push_back(op->schema().name());
  }
  std::sort(ops.begin(), ops.end());
  ops.erase(std::unique(ops.begin(), ops.end()), ops.end());
  for (std::string& op : ops) runtime.add_ops(std::move(op));
  return runtime;
}

}  // namespace trainyard::trainer
