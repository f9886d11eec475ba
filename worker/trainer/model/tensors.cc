#include "worker/trainer/model/tensors.h"

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace trainyard::trainer {
namespace {

struct DtypeEntry {
  const char* name;
  torch::ScalarType type;
};

constexpr DtypeEntry kDtypes[] = {
    {"F64", torch::kFloat64},   {"F32", torch::kFloat32}, {"F16", torch::kFloat16},
    {"BF16", torch::kBFloat16}, {"I64", torch::kInt64},   {"I32", torch::kInt32},
    {"I16", torch::kInt16},     {"I8", torch::kInt8},     {"U8", torch::kUInt8},
    {"BOOL", torch::kBool},
};

}  // namespace

std::string DescribeTorchError(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  const std::string text = c10_error != nullptr ? c10_error->what_without_backtrace() : e.what();
  std::vector<std::string> lines;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipWhitespace())) {
    lines.emplace_back(absl::StripAsciiWhitespace(line));
  }
  if (lines.empty()) return "unknown error";
  // The interpreter prints both tracebacks first and the cause last.
  if (text.find("Traceback of TorchScript") != std::string::npos) return lines.back();
  return lines.front();
}

std::string SafetensorsDtype(torch::ScalarType type) {
  for (const auto& entry : kDtypes) {
    if (entry.type == type) return entry.name;
  }
  return "";
}

std::optional<torch::ScalarType> ScalarTypeOf(const std::string& dtype) {
  for (const auto& entry : kDtypes) {
    if (dtype == entry.name) return entry.type;
  }
  return std::nullopt;
}

absl::StatusOr<torch::Tensor> TensorFromView(const TensorView& view) {
  for (const auto& entry : kDtypes) {
    if (view.dtype != entry.name) continue;
    torch::Tensor t = torch::empty(view.shape, torch::TensorOptions().dtype(entry.type));
    if (static_cast<size_t>(t.nbytes()) != view.data.size()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", view.name, "': ", view.data.size(),
                                                     " bytes for shape [",
                                                     absl::StrJoin(view.shape, ","), "]"));
    }
    if (!view.data.empty()) std::memcpy(t.data_ptr(), view.data.data(), view.data.size());
    return t;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("tensor '", view.name, "': unsupported dtype ", view.dtype));
}

std::vector<absl::string_view> SafetensorsPieces::Pieces() const {
  std::vector<absl::string_view> pieces = {header};
  pieces.insert(pieces.end(), data.begin(), data.end());
  return pieces;
}

absl::StatusOr<SafetensorsPieces> LayOutTensors(
    const NamedTensors& tensors, const std::map<std::string, std::string>& metadata) {
  SafetensorsPieces object;
  std::vector<TensorView> views;
  object.tensors.reserve(tensors.size());
  for (const auto& [name, tensor] : tensors) {
    TensorView view;
    view.name = name;
    view.dtype = SafetensorsDtype(tensor.scalar_type());
    if (view.dtype.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': dtype ",
                                                     c10::toString(tensor.scalar_type()),
                                                     " has no safetensors form"));
    }
    object.tensors.push_back(tensor.detach().to(torch::kCPU).contiguous());
    const torch::Tensor& t = object.tensors.back();
    view.shape = t.sizes().vec();
    // A tensor of no elements may have no storage (a null data pointer): its view points at ""
    // instead, as whoever copies the pieces (memcpy) must not be handed a null pointer.
    view.data = t.nbytes() == 0
                    ? absl::string_view("", 0)
                    : absl::string_view(static_cast<const char*>(t.data_ptr()), t.nbytes());
    object.data.push_back(view.data);
    views.push_back(std::move(view));
  }
  absl::StatusOr<std::string> header = EncodeSafetensorsHeader(views, metadata);
  if (!header.ok()) return header.status();
  object.header = *std::move(header);
  return object;
}

absl::StatusOr<std::string> EncodeTensors(const NamedTensors& tensors,
                                          const std::map<std::string, std::string>& metadata) {
  return JoinPieces(LayOutTensors(tensors, metadata));
}

absl::StatusOr<std::string> JoinPieces(const absl::StatusOr<SafetensorsPieces>& object) {
  if (!object.ok()) return object.status();
  return absl::StrJoin(object->Pieces(), "");
}

absl::StatusOr<std::map<std::string, torch::Tensor>> DecodeTensors(
    std::string buffer, std::map<std::string, std::string>* metadata) {
  absl::StatusOr<SafetensorsFile> file = DecodeSafetensors(std::move(buffer));
  if (!file.ok()) return file.status();
  std::map<std::string, torch::Tensor> out;
  for (const TensorView& view : file->tensors) {
    absl::StatusOr<torch::Tensor> t = TensorFromView(view);
    if (!t.ok()) return t.status();
    out.emplace(view.name, *std::move(t));
  }
  if (metadata != nullptr) *metadata = file->metadata;
  return out;
}

// ---- models ----

torch::Tensor CopyTo(const torch::Tensor& tensor, const torch::Device& device) {
  if (tensor.device() == device) return tensor.detach().clone();
  return tensor.detach().to(device, /*non_blocking=*/false, /*copy=*/true);
}

torch::Tensor ToHost(const torch::Tensor& tensor, bool share) {
  if (share && tensor.device().is_cpu()) return tensor.detach();
  return CopyTo(tensor, torch::kCPU);
}

// ---- optimizers ----

}  // namespace trainyard::trainer
