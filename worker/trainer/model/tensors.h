#ifndef TRAINYARD_WORKER_TRAINER_MODEL_TENSORS_H_
#define TRAINYARD_WORKER_TRAINER_MODEL_TENSORS_H_

// Named LibTorch tensors and their safetensors form (common/formats/safetensors.h has the format
// itself), which checkpoints, exported models and the parameter servers' state share; and the
// one-line description of LibTorch's errors.

#include <torch/torch.h>

#include <exception>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/formats/safetensors.h"

namespace trainyard::trainer {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

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
  std::vector<torch::Tensor> tensors;   // what `data` points into
  std::vector<absl::string_view> data;  // one per tensor, in order
  // The object's bytes in order: the header, then the data.
  std::vector<absl::string_view> Pieces() const;
};
// INVALID_ARGUMENT for unsupported dtypes or duplicate names.
absl::StatusOr<SafetensorsPieces> LayOutTensors(const NamedTensors& tensors,
                                                const std::map<std::string, std::string>& metadata);
// The same object in one buffer.
absl::StatusOr<std::string> EncodeTensors(const NamedTensors& tensors,
                                          const std::map<std::string, std::string>& metadata);
// An object laid out by LayOutTensors, in one buffer (its error as it is).
absl::StatusOr<std::string> JoinPieces(const absl::StatusOr<SafetensorsPieces>& object);
// Parses a safetensors buffer into tensors by name; `metadata` (if not null) receives the
// "__metadata__" map. Errors as DecodeSafetensors.
absl::StatusOr<std::map<std::string, torch::Tensor>> DecodeTensors(
    std::string buffer, std::map<std::string, std::string>* metadata = nullptr);

// A one-line description of an exception from LibTorch: the message of a c10::Error without its
// backtrace, or the final "RuntimeError: ..." line of a TorchScript interpreter error.
std::string DescribeTorchError(const std::exception& e);

// A copy of `tensor` on `device`, detached; a plain clone when it is already there.
torch::Tensor CopyTo(const torch::Tensor& tensor, const torch::Device& device);
// `tensor` on the host for a checkpoint: a copy (CopyTo), or with `share` the tensor itself
// (detached) when it already is on the host: for a snapshot that nothing updates any more.
torch::Tensor ToHost(const torch::Tensor& tensor, bool share);

}  // namespace trainyard::trainer

#endif  // TRAINYARD_WORKER_TRAINER_MODEL_TENSORS_H_
