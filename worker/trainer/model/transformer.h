#ifndef TRAINYARD_WORKER_TRAINER_MODEL_TRANSFORMER_H_
#define TRAINYARD_WORKER_TRAINER_MODEL_TRANSFORMER_H_

// Part model/ of the trainer (worker/trainer/PARTS). The built-in transformer: a decoder-only
// causal language model as PyTorch users write it (GPT-2's layout), named as they name it:
//   wte.weight [vocab, dim], wpe.weight [context, dim]       token and position embeddings
//   h.{i}.ln_1, h.{i}.attn (dim -> 3 dim: q, k, v), h.{i}.proj     causal self-attention
//   h.{i}.ln_2, h.{i}.fc (dim -> mlp_ratio dim), h.{i}.fc_proj     the MLP, GELU between
//   ln_f, lm_head.weight [vocab, dim]                          final norm and head
// With tie_embeddings (the default) the head is the token embedding, listed once as wte.weight.
// Pre-norm blocks: x + proj(attention(ln_1(x))), then x + fc_proj(gelu(fc(ln_2(x)))); dropout
// after the embeddings, on the attention weights and after each residual branch.
//
// The model is a list of layers, what a pipeline splits into stages: layer 0 the embeddings,
// layers 1..L the blocks, layer L+1 the final norm and head. Each layer is initialised from a
// generator seeded by the job's seed and the layer's index alone (LayerSeed), so that any range
// of layers starts exactly as it does in the whole model: Linear and Embedding weights
// ~ N(0, 0.02), the two projections into the residual stream ~ N(0, 0.02 / sqrt(2 L)), biases 0,
// LayerNorms 1 and 0 (GPT-2's initialisation), drawn layer by layer in the order listed above.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "trainyard/v1/job.pb.h"
#include "worker/trainer/model/model.h"

namespace trainyard::trainer {

// The seed of layer `layer`'s initialisation: seed * 1000003 + layer, modulo 2^64.
uint64_t LayerSeed(int64_t seed, int layer);

// The whole model of `args` (checked: vocab, context, layers, dim, heads; INVALID_ARGUMENT naming
// the field otherwise). Forward takes token ids [N, T] (any integer dtype, T <= context) and
// returns the logits of each next token, [N, T, vocab]. `max_token` is the largest id in the
// data: it must be below vocab.
absl::StatusOr<std::unique_ptr<Model>> BuildTransformer(const trainyard::v1::ModelArgs& args,
                                                        int64_t seed, int64_t max_token);

// Layers [first, end) of that model, a pipeline stage, initialised and named exactly as in the
// whole model (h.3.* on a stage whose first block is the fourth). A stage without layer 0 takes
// the hidden states [N, T, dim] of the one before it; a stage without the head (layer
// layers + 1) returns its hidden states. With tied embeddings a stage with the head and without
// layer 0 holds its own wte.weight, which starts equal to layer 0's. Only the whole model
// exports. INVALID_ARGUMENT naming pipeline.partition for a range that is not the model's.
absl::StatusOr<std::unique_ptr<Model>> BuildTransformerLayers(const trainyard::v1::ModelArgs& args,
                                                              int64_t seed, int64_t max_token,
                                                              int first, int end);

// The metadata of the model.safetensors that the whole model exports for `args`'s model (a
// pipeline's export writes it over its stages' tensors). INVALID_ARGUMENT for bad args.
absl::StatusOr<std::map<std::string, std::string>> TransformerExportMetadata(
    const trainyard::v1::ModelArgs& args);

// The bytes of each layer's float32 parameters (layers + 2 of them; the head's counting the tied
// copy of the token embedding a stage of its own keeps); empty for args that are not a model.
std::vector<int64_t> TransformerLayerBytes(const trainyard::v1::ModelArgs& args);

}  // namespace trainyard::trainer

#endif  // TRAINYARD_WORKER_TRAINER_MODEL_TRANSFORMER_H_
