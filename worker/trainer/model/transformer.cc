#include "worker/trainer/model/transformer.h"

#include <torch/torch.h>
#include <torch/version.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace trainyard::trainer {
namespace {

namespace F = torch::nn::functional;

struct Shape {
  int64_t vocab = 0;
  int64_t context = 0;
  int64_t layers = 0;
  int64_t dim = 0;
  int64_t heads = 0;
  int64_t hidden = 0;  // the MLP's width
  double dropout = 0;
  bool tied = true;
};

// Causal self-attention of q, k, v [N, heads, T, head_dim] with dropout p on the weights.
torch::Tensor CausalAttention(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, double p) {
#if TORCH_VERSION_MAJOR >= 2
  // The fused kernels (flash and memory-efficient attention on GPUs) where LibTorch has them.
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, p, /*is_causal=*/true);
#else
  const int64_t t = q.size(-2);
  torch::Tensor weights = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(q.size(-1)));
  const torch::Tensor future =
      torch::ones({t, t}, torch::TensorOptions().dtype(torch::kBool).device(q.device())).triu(1);
  weights =
      torch::softmax(weights.masked_fill(future, -std::numeric_limits<float>::infinity()), -1);
  if (p > 0) weights = torch::dropout(weights, p, /*train=*/true);
  return torch::matmul(weights, v);
#endif
}

class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(const Shape& shape) : heads_(shape.heads), dropout_(shape.dropout) {
    ln_1 = register_module("ln_1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({shape.dim})));
    attn = register_module("attn", torch::nn::Linear(shape.dim, 3 * shape.dim));
    proj = register_module("proj", torch::nn::Linear(shape.dim, shape.dim));
    ln_2 = register_module("ln_2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({shape.dim})));
    fc = register_module("fc", torch::nn::Linear(shape.dim, shape.hidden));
    fc_proj = register_module("fc_proj", torch::nn::Linear(shape.hidden, shape.dim));
  }

  torch::Tensor forward(const torch::Tensor& x) {
    const int64_t n = x.size(0), t = x.size(1), c = x.size(2);
    const double p = is_training() ? dropout_ : 0.0;
    std::vector<torch::Tensor> qkv = attn->forward(ln_1->forward(x)).split(c, 2);
    auto heads = [&](const torch::Tensor& a) {
      return a.view({n, t, heads_, c / heads_}).transpose(1, 2);
    };
    const torch::Tensor y =
        CausalAttention(heads(qkv[0]), heads(qkv[1]), heads(qkv[2]), p).transpose(1, 2);
    torch::Tensor h =
        x + torch::dropout(proj->forward(y.contiguous().view({n, t, c})), p, is_training());
    return h + torch::dropout(fc_proj->forward(torch::gelu(fc->forward(ln_2->forward(h)))), p,
                              is_training());
  }

  // GPT-2's initialisation; `residual_std` for the projections into the residual stream.
  void Initialise(double residual_std) {
    attn->weight.normal_(0, 0.02);
    attn->bias.zero_();
    proj->weight.normal_(0, residual_std);
    proj->bias.zero_();
    fc->weight.normal_(0, 0.02);
    fc->bias.zero_();
    fc_proj->weight.normal_(0, residual_std);
    fc_proj->bias.zero_();
  }

  torch::nn::LayerNorm ln_1{nullptr}, ln_2{nullptr};
  torch::nn::Linear attn{nullptr}, proj{nullptr}, fc{nullptr}, fc_proj{nullptr};

 private:
  const int64_t heads_;
  const double dropout_;
};
TORCH_MODULE(Block);

// The shape, so that the exported file alone rebuilds the model (examples/transformer/sample.py).
std::map<std::string, std::string> ExportMetadata(const Shape& shape) {
  return {{"format", "trainyard-model/1"},
          {"model", "transformer"},
          {"vocab", absl::StrCat(shape.vocab)},
          {"context", absl::StrCat(shape.context)},
          {"layers", absl::StrCat(shape.layers)},
          {"dim", absl::StrCat(shape.dim)},
          {"heads", absl::StrCat(shape.heads)},
          {"mlp_ratio", absl::StrCat(shape.hidden / shape.dim)},
          {"tie_embeddings", shape.tied ? "true" : "false"}};
}

// Layers [first, end) of the model (all of them: [0, layers + 2)). A stage without layer 0 takes
// the hidden states [N, T, dim] of the stage before it; one without the head returns its own.
// With tied embeddings the stage holding the head and not the embeddings keeps its own copy of
// the token embedding, wte.weight, initialised as layer 0 initialises it (its first draw), whose
// gradient the pipeline adds to the first stage's before each update.
class Transformer final : public Model {
 public:
  Transformer(const Shape& shape, int64_t seed, int first, int end)
      : shape_(shape), first_(first), end_(end) {
    const int head = static_cast<int>(shape.layers) + 1;
    const bool embeddings = first == 0;
    const bool has_head = end == head + 1;
    if (embeddings || (has_head && shape.tied)) {
      wte_ = root_->register_module("wte", torch::nn::Embedding(shape.vocab, shape.dim));
    }
    if (embeddings) {
      wpe_ = root_->register_module("wpe", torch::nn::Embedding(shape.context, shape.dim));
    }
    const int first_block = std::max(first, 1), end_block = std::min(end, head);
    if (first_block < end_block) {
      // Named by their index in the whole model (h.3 on a stage that starts there).
      auto h = root_->register_module("h", std::make_shared<torch::nn::Module>());
      for (int layer = first_block; layer < end_block; ++layer) {
        blocks_.push_back(h->register_module(std::to_string(layer - 1), Block(shape)));
      }
    }
    if (has_head) {
      ln_f_ = root_->register_module(
          "ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({shape.dim})));
      if (!shape.tied) {
        lm_head_ = root_->register_module(
            "lm_head",
            torch::nn::Linear(torch::nn::LinearOptions(shape.dim, shape.vocab).bias(false)));
      }
    }
    torch::NoGradGuard no_grad;
    const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(shape.layers));
    if (wte_ && !embeddings) {
      // The tied copy: what layer 0 draws first.
      torch::manual_seed(LayerSeed(seed, 0));
      wte_->weight.normal_(0, 0.02);
    }
    for (int layer = first; layer < end; ++layer) {
      torch::manual_seed(LayerSeed(seed, layer));
      if (layer == 0) {
        wte_->weight.normal_(0, 0.02);
        wpe_->weight.normal_(0, 0.02);
      } else if (layer < head) {
        blocks_[static_cast<size_t>(layer - first_block)]->Initialise(residual_std);
      } else if (!shape.tied) {
        lm_head_->weight.normal_(0, 0.02);
      }
    }
  }

  torch::Tensor Forward(const torch::Tensor& x) override {
    const bool training = root_->is_training();
    const double p = training ? shape_.dropout : 0.0;
    torch::Tensor h;
    if (first_ == 0) {
      TORCH_CHECK(x.dim() == 2, "transformer takes token ids [N, T], got ", x.sizes());
      TORCH_CHECK(x.size(1) <= shape_.context, "transformer: ", x.size(1),
                  " tokens exceed model.args.context ", shape_.context);
      const torch::Tensor ids = x.scalar_type() == torch::kLong ? x : x.to(torch::kLong);
      const torch::Tensor positions =
          torch::arange(x.size(1), torch::TensorOptions().dtype(torch::kLong).device(x.device()));
      h = torch::dropout(wte_->forward(ids) + wpe_->forward(positions), p, training);
    } else {
      TORCH_CHECK(x.dim() == 3 && x.size(2) == shape_.dim, "transformer layers from ", first_,
                  " take hidden states [N, T, ", shape_.dim, "], got ", x.sizes());
      h = x;
    }
    for (Block& block : blocks_) h = block->forward(h);
    if (!ln_f_) return h;
    h = ln_f_->forward(h);
    return shape_.tied ? F::linear(h, wte_->weight) : lm_head_->forward(h);
  }
  NamedTensors NamedParameters() override {
    NamedTensors out;
    for (const auto& item : root_->named_parameters(true))
      out.emplace_back(item.key(), item.value());
    return out;
  }
  NamedTensors NamedBuffers() override { return {}; }
  void SetTraining(bool training) override { root_->train(training); }
  void To(const torch::Device& device) override { root_->to(device); }
  absl::StatusOr<SafetensorsPieces> ExportPieces() override {
    if (first_ != 0 || !ln_f_) {
      return absl::FailedPreconditionError("transformer: a stage of layers does not export alone");
    }
    NamedTensors tensors = NamedParameters();
    for (auto& [name, tensor] : tensors) tensor = tensor.detach().contiguous();
    return LayOutTensors(tensors, ExportMetadata(shape_));
  }
  std::string ExportName() const override { return "model.safetensors"; }
  std::string Kind() const override { return "transformer"; }

 private:
  const Shape shape_;
  const int first_;
  const int end_;
  std::shared_ptr<torch::nn::Module> root_ = std::make_shared<torch::nn::Module>();
  torch::nn::Embedding wte_{nullptr}, wpe_{nullptr};
  std::vector<Block> blocks_;
  torch::nn::LayerNorm ln_f_{nullptr};
  torch::nn::Linear lm_head_{nullptr};
};

// The shape of `args`, checked (INVALID_ARGUMENT naming the field).
absl::StatusOr<Shape> ShapeOf(const trainyard::v1::ModelArgs& args) {
  if (args.vocab_size() != 1 || args.vocab(0) < 2) {
    return absl::InvalidArgumentError(
        "model.args.vocab: transformer needs one number >= 2: the tokens it knows");
  }
  const std::pair<const char*, int64_t> sizes[] = {{"model.args.context", args.context()},
                                                   {"model.args.layers", args.layers()},
                                                   {"model.args.dim", args.dim()},
                                                   {"model.args.heads", args.heads()}};
  for (const auto& [field, value] : sizes) {
    if (value < 1) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": must be >= 1, got ", value));
    }
  }
  if (args.dim() % args.heads() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.args.heads: ", args.heads(), " heads do not divide dim ", args.dim()));
  }
  if (args.dropout() < 0 || args.dropout() >= 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.args.dropout: must be in [0, 1), got ", args.dropout()));
  }
  Shape shape;
  shape.vocab = args.vocab(0);
  shape.context = args.context();
  shape.layers = args.layers();
  shape.dim = args.dim();
  shape.heads = args.heads();
  shape.hidden = int64_t{args.mlp_ratio() > 0 ? args.mlp_ratio() : 4} * args.dim();
  shape.dropout = args.dropout();
  shape.tied = !args.has_tie_embeddings() || args.tie_embeddings();
  return shape;
}

}  // namespace

uint64_t LayerSeed(int64_t seed, int layer) {
  return static_cast<uint64_t>(seed) * 1000003u + static_cast<uint64_t>(layer);
}

absl::StatusOr<std::unique_ptr<Model>> BuildTransformer(const trainyard::v1::ModelArgs& args,
                                                        int64_t seed, int64_t max_token) {
  return BuildTransformerLayers(args, seed, max_token, 0, args.layers() + 2);
}

absl::StatusOr<std::unique_ptr<Model>> BuildTransformerLayers(const trainyard::v1::ModelArgs& args,
                                                              int64_t seed, int64_t max_token,
                                                              int first, int end) {
  absl::StatusOr<Shape> shape = ShapeOf(args);
  if (!shape.ok()) return shape.status();
  if (max_token >= shape->vocab) {
    return absl::InvalidArgumentError(absl::StrCat("data.tokens: token id ", max_token,
                                                   " is outside the ", shape->vocab,
                                                   " tokens of model.args.vocab"));
  }
  if (first < 0 || end > shape->layers + 2 || first >= end) {
    return absl::InvalidArgumentError(absl::StrCat("pipeline.partition: layers [", first, ", ", end,
                                                   ") are not a range of the model's ",
                                                   shape->layers + 2, " layers"));
  }
  return std::make_unique<Transformer>(*shape, seed, first, end);
}

absl::StatusOr<std::map<std::string, std::string>> TransformerExportMetadata(
    const trainyard::v1::ModelArgs& args) {
  absl::StatusOr<Shape> shape = ShapeOf(args);
  if (!shape.ok()) return shape.status();
  return ExportMetadata(*shape);
}

std::vector<int64_t> TransformerLayerBytes(const trainyard::v1::ModelArgs& args) {
  absl::StatusOr<Shape> shape = ShapeOf(args);
  if (!shape.ok()) return {};
  const int64_t d = shape->dim, h = shape->hidden, v = shape->vocab;
  const int64_t block = 2 * 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * h + h) + (h * d + d);
  std::vector<int64_t> bytes;
  bytes.push_back((v * d + shape->context * d) * 4);
  for (int64_t i = 0; i < shape->layers; ++i) bytes.push_back(block * 4);
  // The head: its own weight, or the tied copy of the token embedding a separate stage keeps.
  bytes.push_back((2 * d + v * d) * 4);
  return bytes;
}

}  // namespace trainyard::trainer
