#include "common/spec/memory_estimate.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/byte_size.h"
#include "common/spec/pipeline_partition.h"

namespace trainyard {
namespace {

namespace v1 = trainyard::v1;

constexpr int64_t kFloat = 4;

// A model's parameters (counts) and what one sample keeps for the backward pass (floats).
struct Shape {
  int64_t params = 0;
  int64_t table_params = 0;     // embedding tables a parameter server keeps
  std::vector<int64_t> layers;  // parameters per pipeline layer, where known
  int64_t tied_copy = 0;        // what the last of several stages adds: a tied embedding
  int64_t activations = 0;      // floats per sample, forward kept and its gradients
  bool known = true;            // false: some width could not be known here
};

int64_t Linear(int64_t in, int64_t out) { return in * out + out; }

// The width of the data's features and classes where the spec says them.
int64_t Inputs(const v1::JobSpec& spec) {
  if (spec.model().args().inputs() > 0) return spec.model().args().inputs();
  return spec.data().has_synthetic() ? spec.data().synthetic().features() : 0;
}
int64_t Classes(const v1::JobSpec& spec) {
  if (spec.model().args().classes() > 0) return spec.model().args().classes();
  return spec.data().has_synthetic() ? spec.data().synthetic().classes() : 0;
}

// Dense layers from `width` through `hidden` to `outputs` (0: unknown, left out).
void Dense(int64_t width, const std::vector<int64_t>& hidden, int64_t outputs, Shape& s) {
  for (int64_t h : hidden) {
    if (width > 0) s.params += Linear(width, h);
    s.activations += 2 * h;  // the layer's output and its ReLU
    width = h;
  }
  if (outputs > 0) {
    s.params += Linear(width, outputs);
    s.activations += outputs;
  } else {
    s.known = false;
  }
}

Shape MlpShape(const v1::JobSpec& spec) {
  Shape s;
  const v1::ModelArgs& args = spec.model().args();
  const int64_t inputs = Inputs(spec);
  if (inputs <= 0) s.known = false;
  Dense(inputs, std::vector<int64_t>(args.hidden().begin(), args.hidden().end()), Classes(spec), s);
  s.activations += inputs;
  return s;
}

Shape CnnShape(const v1::JobSpec& spec) {
  Shape s;
  const v1::ModelArgs& args = spec.model().args();
  const int64_t channels = args.channels() > 0 ? args.channels() : 1;
  int64_t h = args.height(), w = args.width();
  if (h == 0 && w == 0 && Inputs(spec) > 0) {
    h = w = static_cast<int64_t>(std::llround(std::sqrt(Inputs(spec) / channels)));
  }
  if (h <= 0 || w <= 0) {
    s.known = false;
    return s;
  }
  std::vector<int64_t> hidden(args.hidden().begin(), args.hidden().end());
  if (hidden.empty()) hidden = {16, 32};
  int64_t in = channels;
  s.activations += channels * h * w;
  for (int64_t out : hidden) {
    s.params += in * out * 9 + out;
    s.activations += 2 * out * h * w;  // convolution and ReLU
    h = std::max<int64_t>(h / 2, 1);
    w = std::max<int64_t>(w / 2, 1);
    s.activations += out * h * w;  // the pooled map
    in = out;
  }
  const int64_t classes = Classes(spec);
  if (classes > 0) {
    s.params += Linear(in * h * w, classes);
    s.activations += classes;
  } else {
    s.known = false;
  }
  return s;
}

Shape EmbeddingMlpShape(const v1::JobSpec& spec) {
  Shape s;
  const v1::ModelArgs& args = spec.model().args();
  for (int64_t rows : args.vocab()) s.table_params += rows * args.dim();
  const int64_t embedded = static_cast<int64_t>(args.vocab_size()) * args.dim();
  const int64_t dense = Inputs(spec);
  s.activations += embedded + dense;
  Dense(embedded + dense, std::vector<int64_t>(args.hidden().begin(), args.hidden().end()),
        Classes(spec), s);
  s.params += s.table_params;
  return s;
}

Shape TransformerShape(const v1::JobSpec& spec) {
  Shape s;
  const v1::ModelArgs& args = spec.model().args();
  const int64_t vocab = args.vocab_size() > 0 ? args.vocab(0) : 0;
  const int64_t context = args.context(), d = args.dim(), layers = args.layers();
  const int64_t hidden = int64_t{args.mlp_ratio() > 0 ? args.mlp_ratio() : 4} * d;
  const bool tied = !args.has_tie_embeddings() || args.tie_embeddings();
  const int64_t block =
      2 * d + Linear(d, 3 * d) + Linear(d, d) + 2 * d + Linear(d, hidden) + Linear(hidden, d);
  s.layers.push_back(vocab * d + context * d);
  for (int64_t i = 0; i < layers; ++i) s.layers.push_back(block);
  // The head; with tied embeddings a stage without layer 0 keeps its own copy of them.
  s.layers.push_back(2 * d + (tied ? 0 : vocab * d));
  s.params = std::accumulate(s.layers.begin(), s.layers.end(), int64_t{0});
  if (tied) s.tied_copy = vocab * d;
  // Per token: a block keeps its norms, q/k/v, attention output, projection, MLP and GELU, and
  // the attention weights over the context; then the logits, their softmax and gradient.
  s.activations =
      context * (layers * (10 * d + 2 * hidden + std::max(args.heads(), 1) * context) + 3 * vocab);
  return s;
}

Shape ModelShape(const v1::JobSpec& spec, const v1::ModelNeeds* needs) {
  const v1::ModelSpec& model = spec.model();
  if (model.source_case() == v1::ModelSpec::kTorchscript || model.stages_size() > 0) {
    Shape s;
    // Its tensors' bytes are float32 parameters and buffers alike; its activations are unknown.
    if (needs != nullptr && needs->model_tensor_bytes() > 0) {
      s.params = needs->model_tensor_bytes() / kFloat;
    }
    // model.stages: each file is a layer that a pipeline's partition places.
    if (needs != nullptr && needs->stage_tensor_bytes_size() == model.stages_size()) {
      for (int64_t bytes : needs->stage_tensor_bytes()) s.layers.push_back(bytes / kFloat);
    }
    s.known = false;
    return s;
  }
  if (model.builtin() == "cnn") return CnnShape(spec);
  if (model.builtin() == "embedding_mlp") return EmbeddingMlpShape(spec);
  if (model.builtin() == "transformer") return TransformerShape(spec);
  return MlpShape(spec);
}

// State values per parameter: Adam and AdamW two, SGD one with momentum, none without.
int64_t OptimizerStates(const v1::OptimizerSpec& optimizer) {
  if (optimizer.name() == "adam" || optimizer.name() == "adamw") return 2;
  return optimizer.momentum() > 0 ? 1 : 0;
}

int64_t CeilDiv(int64_t a, int64_t b) { return b <= 0 ? a : (a + b - 1) / b; }

// Each stage's parameters, split as the trainer splits the layers (PartitionLayers over each
// layer's bytes, the last of several stages with its tied embedding's copy); even shares where
// the layers are unknown (a TorchScript Sequential) or the split is refused.
std::vector<int64_t> StageParams(const Shape& shape, const v1::PipelineSpec& pipeline) {
  const int stages = std::max(pipeline.stages(), 1);
  if (shape.layers.empty()) return std::vector<int64_t>(stages, CeilDiv(shape.params, stages));
  std::vector<int64_t> layers = shape.layers;
  if (stages > 1) layers.back() += shape.tied_copy;
  std::vector<int64_t> bytes;
  for (int64_t n : layers) bytes.push_back(n * kFloat);
  const std::vector<int> counts(pipeline.partition_counts().begin(),
                                pipeline.partition_counts().end());
  absl::StatusOr<std::vector<int>> split =
      PartitionLayers(bytes, stages, pipeline.partition(), counts);
  if (!split.ok()) {
    return std::vector<int64_t>(
        stages, CeilDiv(std::accumulate(layers.begin(), layers.end(), int64_t{0}), stages));
  }
  std::vector<int64_t> out;
  size_t at = 0;
  for (int count : *split) {
    int64_t stage = 0;
    for (int i = 0; i < count && at < layers.size(); ++i) stage += layers[at++];
    out.push_back(stage);
  }
  return out;
}

}  // namespace

int64_t TaskMemory::Total() const {
  return parameters + gradients + optimizer + teacher + activations + runtime;
}

std::string TaskMemory::Detail() const {
  std::vector<std::string> parts;
  parts.push_back(absl::StrCat("parameters ", HumanBytes(parameters)));
  if (gradients > 0) parts.push_back(absl::StrCat("gradients ", HumanBytes(gradients)));
  if (optimizer > 0) {
    parts.push_back(absl::StrCat(optimizer_name.empty() ? "optimizer" : optimizer_name, " state ",
                                 HumanBytes(optimizer)));
  }
  if (teacher > 0) parts.push_back(absl::StrCat("teacher ", HumanBytes(teacher)));
  if (activations > 0) parts.push_back(absl::StrCat("activations ", HumanBytes(activations)));
  parts.push_back(absl::StrCat("runtime ", HumanBytes(runtime)));
  return absl::StrJoin(parts, ", ");
}

v1::TaskMemoryEstimate TaskMemory::ToProto() const {
  v1::TaskMemoryEstimate out;
  out.set_total_bytes(Total());
  out.set_detail(Detail());
  out.set_lower_bound(lower_bound);
  return out;
}

JobMemory EstimateJobMemory(const v1::JobSpec& spec, const v1::ModelNeeds* needs) {
  const Shape shape = ModelShape(spec, needs);
  const int64_t states = OptimizerStates(spec.optimizer());
  const std::string optimizer_name =
      spec.optimizer().name().empty() ? "sgd" : spec.optimizer().name();
  const int ranks = std::max(spec.workers().max(), 1);
  const int64_t batch = std::max<int64_t>(spec.batch_size(), 1);
  JobMemory out;
  TaskMemory& rank = out.rank;
  rank.optimizer_name = optimizer_name;
  rank.lower_bound = !shape.known;
  if (needs != nullptr) rank.teacher = needs->teacher_tensor_bytes();
  if (!spec.distill().teacher().empty() && rank.teacher == 0) rank.lower_bound = true;

  switch (spec.strategy()) {
    case v1::PIPELINE: {
      const v1::PipelineSpec& pipeline = spec.pipeline();
      const int stages = std::max(pipeline.stages(), 1);
      const int replicas = std::max(ranks / stages, 1);
      const int micro = std::max(pipeline.microbatches() > 0 ? pipeline.microbatches() : stages, 1);
      const int64_t micro_batch = CeilDiv(CeilDiv(batch, replicas), micro);
      // GPipe keeps every micro-batch's activations until its backward passes; 1F1B at most one
      // per stage in flight.
      const int in_flight = pipeline.schedule() == "gpipe" ? micro : std::min(micro, stages);
      // Each stage holds its layers; the rank estimate is the largest stage's.
      for (int64_t params : StageParams(shape, pipeline)) {
        TaskMemory stage = rank;
        stage.parameters = params * kFloat;
        stage.gradients = params * kFloat;
        stage.optimizer = states * params * kFloat;
        stage.activations = CeilDiv(in_flight * micro_batch * shape.activations, stages) * kFloat;
        out.stages.push_back(stage);
      }
      for (const TaskMemory& stage : out.stages) {
        if (stage.Total() >= rank.Total()) rank = stage;
      }
      break;
    }
    case v1::PARAMETER_SERVER: {
      const v1::ParameterServerSpec& ps = spec.parameter_servers();
      const bool tables_only = ps.dense() == "allreduce";
      const int64_t dense = shape.params - shape.table_params;
      const int64_t per_rank_batch = CeilDiv(batch, ranks);
      // The rank pulls the dense layers (and, all-reducing them, applies their optimizer); of the
      // tables only the rows its batch looks up, in the activations.
      rank.parameters = dense * kFloat;
      rank.gradients = dense * kFloat;
      rank.optimizer = tables_only ? states * dense * kFloat : 0;
      rank.activations = per_rank_batch * shape.activations * kFloat;
      out.has_shard = true;
      TaskMemory& shard = out.shard;
      shard.optimizer_name = optimizer_name;
      shard.lower_bound = !shape.known;
      const int shards = std::max(ps.shards(), 1);
      const int64_t held = CeilDiv(tables_only ? shape.table_params : shape.params, shards);
      shard.parameters = held * kFloat;
      shard.gradients = held * kFloat;  // the sum of a step's pushes
      shard.optimizer = states * held * kFloat;
      shard.activations = 0;
      break;
    }
    default: {
      const int64_t per_rank_batch =
          spec.strategy() == v1::DATA_PARALLEL ? CeilDiv(batch, ranks) : batch;
      rank.parameters = shape.params * kFloat;
      rank.gradients = shape.params * kFloat;
      rank.optimizer = states * shape.params * kFloat;
      rank.activations = per_rank_batch * shape.activations * kFloat;
      break;
    }
  }
  return out;
}

std::string DescribeEstimate(const v1::TaskMemoryEstimate& estimate) {
  return absl::StrCat(estimate.lower_bound() ? "at least " : "", HumanBytes(estimate.total_bytes()),
                      " (", estimate.detail(), ")");
}

}  // namespace trainyard
