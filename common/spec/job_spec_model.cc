// The model section of a job spec: its source and its arguments.

#include <cstdint>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/spec/job_spec.h"
#include "common/spec/job_spec_internal.h"
#include "common/spec/yaml_fields.h"
#include "common/storage/uri.h"

namespace trainyard::job_spec_internal {

namespace {

// The transformer's bounds: far beyond what trains on one machine, well short of overflow.
constexpr int64_t kMaxTransformerVocab = int64_t{1} << 24;
constexpr int64_t kMaxTransformerContext = int64_t{1} << 16;
constexpr int64_t kMaxTransformerLayers = 1024;
constexpr int kMaxModelStages = 1024;  // files of model.stages
constexpr int64_t kMaxTransformerDim = int64_t{1} << 16;

}  // namespace

absl::Status CheckAbsolute(absl::string_view field, const std::string& value) {
  if (absl::StartsWith(value, "/") || absl::StrContains(value, "://")) {
    absl::StatusOr<Uri> uri = ParseUri(value);
    if (!uri.ok()) return FieldError(field, uri.status().message());
    return absl::OkStatus();
  }
  return FieldError(field, absl::StrCat("'", value,
                                        "' is not an absolute path or URI (a relative path means "
                                        "nothing on the workers)"));
}

namespace {

// The transformer's shape: every size set and within bounds (a typo of a few digits must not
// make a worker allocate terabytes), heads dividing the width.
absl::Status ValidateTransformer(const trainyard::v1::ModelArgs& args) {
  if (args.vocab_size() != 1) {
    return FieldError("model.args.vocab", "transformer needs one number: the tokens it knows");
  }
  if (args.vocab(0) < 2 || args.vocab(0) > kMaxTransformerVocab) {
    return FieldError("model.args.vocab",
                      absl::StrCat("must be in [2, ", kMaxTransformerVocab, "]"));
  }
  const std::tuple<const char*, int64_t, int64_t> sizes[] = {
      {"model.args.context", args.context(), kMaxTransformerContext},
      {"model.args.layers", args.layers(), kMaxTransformerLayers},
      {"model.args.dim", args.dim(), kMaxTransformerDim},
      {"model.args.heads", args.heads(), kMaxTransformerDim}};
  for (const auto& [field, value, most] : sizes) {
    if (value < 1 || value > most) {
      return FieldError(field, absl::StrCat("must be in [1, ", most, "] for transformer"));
    }
  }
  if (args.dim() % args.heads() != 0) {
    return FieldError("model.args.heads",
                      absl::StrCat(args.heads(), " heads do not divide dim ", args.dim()));
  }
  if (args.mlp_ratio() < 0 || args.mlp_ratio() > 16) {
    return FieldError("model.args.mlp_ratio", "must be in [1, 16] (0: 4)");
  }
  if (args.inputs() != 0 || args.classes() != 0 || args.hidden_size() > 0 || args.channels() != 0 ||
      args.height() != 0 || args.width() != 0) {
    return FieldError("model.args",
                      "transformer takes vocab, context, layers, dim, heads, mlp_ratio, dropout "
                      "and tie_embeddings");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateModel(const trainyard::v1::ModelSpec& model) {
  if (model.source_case() != trainyard::v1::ModelSpec::SOURCE_NOT_SET && model.stages_size() > 0) {
    return FieldError("model", "set only one of builtin, torchscript or stages");
  }
  switch (model.source_case()) {
    case trainyard::v1::ModelSpec::SOURCE_NOT_SET:
      if (model.stages_size() == 0)
        return FieldError("model", "set builtin, torchscript or stages");
      if (model.stages_size() > kMaxModelStages) {
        return FieldError("model.stages",
                          absl::StrCat(model.stages_size(), " files; at most ", kMaxModelStages));
      }
      for (int i = 0; i < model.stages_size(); ++i) {
        const std::string field = absl::StrCat("model.stages[", i, "]");
        if (model.stages(i).empty()) return FieldError(field, "must not be empty");
        if (absl::Status s = CheckAbsolute(field, model.stages(i)); !s.ok()) return s;
      }
      break;
    case trainyard::v1::ModelSpec::kTorchscript:
      if (model.torchscript().empty()) return FieldError("model.torchscript", "must not be empty");
      if (absl::Status s = CheckAbsolute("model.torchscript", model.torchscript()); !s.ok()) {
        return s;
      }
      break;
    case trainyard::v1::ModelSpec::kBuiltin:
      break;
  }
  if (!model.memory_format().empty() && model.memory_format() != "auto" &&
      model.memory_format() != "contiguous" && model.memory_format() != "channels_last") {
    return FieldError("model.memory_format",
                      absl::StrCat("unknown memory format '", model.memory_format(),
                                   "', expected auto, contiguous or channels_last"));
  }
  if (model.memory_format() == "channels_last" &&
      model.source_case() == trainyard::v1::ModelSpec::kBuiltin && model.builtin() != "cnn") {
    return FieldError("model.memory_format",
                      "channels_last is for convolutional models (cnn, or a TorchScript model with "
                      "4-D weights)");
  }
  const trainyard::v1::ModelArgs& args = model.args();
  for (int i = 0; i < args.hidden_size(); ++i) {
    if (args.hidden(i) <= 0)
      return FieldError(absl::StrCat("model.args.hidden[", i, "]"), "must be > 0");
  }
  if (!(args.dropout() >= 0 && args.dropout() < 1)) {
    return FieldError("model.args.dropout", "must be in [0, 1)");
  }
  const bool builtin = model.source_case() == trainyard::v1::ModelSpec::kBuiltin;
  const bool embedding = builtin && model.builtin() == "embedding_mlp";
  const bool transformer = builtin && model.builtin() == "transformer";
  if (!embedding && !transformer && args.vocab_size() > 0) {
    return FieldError("model.args.vocab", "only for models embedding_mlp and transformer");
  }
  if (!embedding && !transformer && args.dim() != 0) {
    return FieldError("model.args.dim", "only for models embedding_mlp and transformer");
  }
  if (!transformer) {
    const std::pair<const char*, bool> transformer_only[] = {
        {"model.args.context", args.context() != 0},
        {"model.args.layers", args.layers() != 0},
        {"model.args.heads", args.heads() != 0},
        {"model.args.mlp_ratio", args.mlp_ratio() != 0},
        {"model.args.tie_embeddings", args.has_tie_embeddings()}};
    for (const auto& [field, set] : transformer_only) {
      if (set) return FieldError(field, "only for model transformer");
    }
  }
  if (!builtin) return absl::OkStatus();
  if (transformer) return ValidateTransformer(args);
  if (embedding) {
    if (args.vocab_size() == 0) {
      return FieldError("model.args.vocab",
                        "embedding_mlp needs the rows of each table, one per categorical field");
    }
    for (int i = 0; i < args.vocab_size(); ++i) {
      if (args.vocab(i) <= 0 || args.vocab(i) > kMaxEmbeddingRows) {
        return FieldError(absl::StrCat("model.args.vocab[", i, "]"),
                          absl::StrCat("must be in [1, ", kMaxEmbeddingRows, "]"));
      }
    }
    if (args.dim() <= 0) return FieldError("model.args.dim", "must be > 0 for embedding_mlp");
    if (args.inputs() < 0) return FieldError("model.args.inputs", "must be >= 0");
    if (args.classes() <= 0) {
      return FieldError("model.args.classes", "must be > 0 for embedding_mlp");
    }
  } else if (model.builtin() == "mlp") {
    if (args.inputs() <= 0) return FieldError("model.args.inputs", "must be > 0 for mlp");
    if (args.classes() <= 0) return FieldError("model.args.classes", "must be > 0 for mlp");
  } else if (model.builtin() == "cnn") {
    if (args.channels() <= 0) return FieldError("model.args.channels", "must be > 0 for cnn");
    if (args.height() <= 0) return FieldError("model.args.height", "must be > 0 for cnn");
    if (args.width() <= 0) return FieldError("model.args.width", "must be > 0 for cnn");
    if (args.classes() <= 0) return FieldError("model.args.classes", "must be > 0 for cnn");
  } else {
    return FieldError("model.builtin",
                      absl::StrCat("unknown model '", model.builtin(),
                                   "', expected mlp, cnn, embedding_mlp or transformer"));
  }
  return absl::OkStatus();
}

}  // namespace trainyard::job_spec_internal
