#include "common/formats/safetensors.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace trainyard {
namespace {

constexpr char kMetadataKey[] = "__metadata__";
// The Python implementation refuses headers above 100 MB; so do we, before allocating.
constexpr uint64_t kMaxHeaderBytes = 100 * 1000 * 1000;

// product(shape) * element size, or an error on negative dimensions and overflow.
absl::StatusOr<uint64_t> ByteSize(absl::string_view name, const std::vector<int64_t>& shape,
                                  int element_size) {
  uint64_t n = static_cast<uint64_t>(element_size);
  for (int64_t dim : shape) {
    if (dim < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors: tensor '", name, "' has a negative dimension"));
    }
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(dim), &n)) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors: tensor '", name, "' is too large"));
    }
  }
  return n;
}

void PutLe64(uint64_t value, std::string& out) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

uint64_t GetLe64(const char* p) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | static_cast<unsigned char>(p[i]);
  return value;
}

}  // namespace

int SafetensorsDtypeSize(absl::string_view dtype) {
  static const auto* const kSizes = new std::map<std::string, int, std::less<>>{
      {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4},
      {"I16", 2}, {"I8", 1},  {"U16", 2}, {"U8", 1},   {"BOOL", 1}};
  auto it = kSizes->find(dtype);
  return it == kSizes->end() ? 0 : it->second;
}

namespace {

// What the header says of one tensor, and how many bytes of data the writer gives it.
struct HeaderEntry {
  const std::string* name;
  const std::string* dtype;
  const std::vector<int64_t>* shape;
  uint64_t data_size;
};

// The header is JSON, whose strings are UTF-8: INVALID_ARGUMENT naming `what` for text that is
// not (a tensor named from a CSV column of Latin-1, say), which JSON could not hold.
absl::Status CheckUtf8(absl::string_view what, const std::string& text) {
  try {
    nlohmann::json(text).dump();
  } catch (const nlohmann::json::type_error&) {
    return absl::InvalidArgumentError(
        absl::StrCat("safetensors: ", what, " '", absl::CHexEscape(text), "' is not UTF-8"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> EncodeHeader(const std::vector<HeaderEntry>& tensors,
                                         const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  for (const auto& [key, value] : metadata) {
    if (absl::Status ok = CheckUtf8("metadata key", key); !ok.ok()) return ok;
    if (absl::Status ok = CheckUtf8("metadata value", value); !ok.ok()) return ok;
  }
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const HeaderEntry& tensor : tensors) {
    const std::string& name = *tensor.name;
    if (name == kMetadataKey) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors: '", kMetadataKey, "' is not a valid tensor name"));
    }
    if (!names.insert(name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors: duplicate tensor name '", name, "'"));
    }
    if (absl::Status ok = CheckUtf8("tensor name", name); !ok.ok()) return ok;
    const int element_size = SafetensorsDtypeSize(*tensor.dtype);
    if (element_size == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors: tensor '", name, "' has unknown dtype '", *tensor.dtype, "'"));
    }
    absl::StatusOr<uint64_t> size = ByteSize(name, *tensor.shape, element_size);
    if (!size.ok()) return size.status();
    if (*size != tensor.data_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors: tensor '", name, "' has ", tensor.data_size,
                       " bytes of data, its shape and dtype need ", *size));
    }
    header[name] = {{"dtype", *tensor.dtype},
                    {"shape", *tensor.shape},
                    {"data_offsets", {offset, offset + *size}}};
    offset += *size;
  }
  if (!metadata.empty()) header[kMetadataKey] = metadata;

  std::string json = header.dump();
  // Pad with spaces so that the data section starts 8-byte aligned, as the Python writer does.
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string out;
  out.reserve(8 + json.size());
  PutLe64(json.size(), out);
  out += json;
  return out;
}

}  // namespace

absl::StatusOr<std::string> EncodeSafetensorsHeader(
    const std::vector<TensorView>& tensors, const std::map<std::string, std::string>& metadata) {
  std::vector<HeaderEntry> entries;
  entries.reserve(tensors.size());
  for (const TensorView& t : tensors)
    entries.push_back({&t.name, &t.dtype, &t.shape, t.data.size()});
  return EncodeHeader(entries, metadata);
}

absl::StatusOr<std::string> EncodeSafetensorsHeader(
    const std::vector<SafetensorsSlot>& tensors,
    const std::map<std::string, std::string>& metadata) {
  std::vector<HeaderEntry> entries;
  entries.reserve(tensors.size());
  for (const SafetensorsSlot& t : tensors) {
    if (t.end < t.begin) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors: tensor '", t.name, "' ends before it begins"));
    }
    entries.push_back({&t.name, &t.dtype, &t.shape, t.end - t.begin});
  }
  return EncodeHeader(entries, metadata);
}

absl::StatusOr<std::string> EncodeSafetensors(const std::vector<TensorView>& tensors,
                                              const std::map<std::string, std::string>& metadata) {
  absl::StatusOr<std::string> out = EncodeSafetensorsHeader(tensors, metadata);
  if (!out.ok()) return out.status();
  size_t size = out->size();
  for (const TensorView& tensor : tensors) size += tensor.data.size();
  out->reserve(size);
  for (const TensorView& tensor : tensors) out->append(tensor.data.data(), tensor.data.size());
  return out;
}

const TensorView* SafetensorsFile::Find(absl::string_view name) const {
  for (const TensorView& tensor : tensors) {
    if (tensor.name == name) return &tensor;
  }
  return nullptr;
}

absl::StatusOr<uint64_t> SafetensorsHeaderSize(absl::string_view first_bytes) {
  if (first_bytes.size() < 8) {
    return absl::DataLossError(
        absl::StrCat("safetensors: file is truncated (", first_bytes.size(), " bytes)"));
  }
  const uint64_t header_size = GetLe64(first_bytes.data());
  if (header_size > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("safetensors: header size ", header_size, " is too large"));
  }
  return header_size;
}

absl::StatusOr<SafetensorsHeader> DecodeSafetensorsHeader(absl::string_view prefix,
                                                          uint64_t file_size) {
  absl::StatusOr<uint64_t> header_size = SafetensorsHeaderSize(prefix);
  if (!header_size.ok()) return header_size.status();
  if (*header_size > file_size - 8 || *header_size > prefix.size() - 8) {
    return absl::DataLossError(absl::StrCat("safetensors: header of ", *header_size,
                                            " bytes does not fit in a file of ", file_size,
                                            " bytes (truncated?)"));
  }
  nlohmann::json header = nlohmann::json::parse(
      prefix.begin() + 8, prefix.begin() + 8 + static_cast<std::ptrdiff_t>(*header_size),
      /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded()) {
    return absl::InvalidArgumentError("safetensors: header is not valid JSON");
  }
  if (!header.is_object()) {
    return absl::InvalidArgumentError("safetensors: header is not a JSON object");
  }

  SafetensorsHeader out;
  out.data_start = 8 + *header_size;
  const uint64_t data_size = file_size - out.data_start;
  bool truncated = false;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& value = it.value();
    if (name == kMetadataKey) {
      if (value.is_null()) continue;
      if (!value.is_object()) {
        return absl::InvalidArgumentError("safetensors: __metadata__ is not an object");
      }
      for (auto m = value.begin(); m != value.end(); ++m) {
        if (!m.value().is_string()) {
          return absl::InvalidArgumentError(
              absl::StrCat("safetensors: __metadata__ value for '", m.key(), "' is not a string"));
        }
        out.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = absl::StrCat("safetensors: tensor '", name, "'");
    if (!value.is_object()) return absl::InvalidArgumentError(where + " is not an object");
    auto dtype = value.find("dtype");
    auto shape = value.find("shape");
    auto offsets = value.find("data_offsets");
    if (dtype == value.end() || !dtype->is_string()) {
      return absl::InvalidArgumentError(where + " has no string dtype");
    }
    if (shape == value.end() || !shape->is_array()) {
      return absl::InvalidArgumentError(where + " has no shape list");
    }
    if (offsets == value.end() || !offsets->is_array() || offsets->size() != 2 ||
        !(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned()) {
      return absl::InvalidArgumentError(where + " needs data_offsets [begin, end]");
    }
    SafetensorsSlot entry;
    entry.name = name;
    entry.dtype = dtype->get<std::string>();
    for (const nlohmann::json& dim : *shape) {
      if (!dim.is_number_integer()) {
        return absl::InvalidArgumentError(where + " has a non-integer dimension");
      }
      entry.shape.push_back(dim.get<int64_t>());
    }
    entry.begin = (*offsets)[0].get<uint64_t>();
    entry.end = (*offsets)[1].get<uint64_t>();
    const int element_size = SafetensorsDtypeSize(entry.dtype);
    if (element_size == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " has unknown dtype '", entry.dtype, "'"));
    }
    if (entry.end < entry.begin) {
      return absl::InvalidArgumentError(where + " has data_offsets with end < begin");
    }
    absl::StatusOr<uint64_t> size = ByteSize(name, entry.shape, element_size);
    if (!size.ok()) return size.status();
    if (*size != entry.end - entry.begin) {
      return absl::InvalidArgumentError(absl::StrCat(where, " spans ", entry.end - entry.begin,
                                                     " bytes, its shape and dtype need ", *size));
    }
    if (entry.end > data_size) truncated = true;
    out.tensors.push_back(std::move(entry));
  }
  std::sort(out.tensors.begin(), out.tensors.end(),
            [](const SafetensorsSlot& a, const SafetensorsSlot& b) {
              return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
            });
  for (size_t i = 1; i < out.tensors.size(); ++i) {
    if (out.tensors[i].begin < out.tensors[i - 1].end) {
      return absl::InvalidArgumentError(absl::StrCat("safetensors: tensors '",
                                                     out.tensors[i - 1].name, "' and '",
                                                     out.tensors[i].name, "' overlap"));
    }
  }
  if (truncated) {
    return absl::DataLossError(
        absl::StrCat("safetensors: data section has ", data_size, " bytes, the header needs ",
                     out.tensors.empty() ? 0 : out.tensors.back().end, " (truncated?)"));
  }
  return out;
}

absl::StatusOr<SafetensorsFile> DecodeSafetensors(std::string buffer) {
  absl::StatusOr<SafetensorsHeader> header = DecodeSafetensorsHeader(buffer, buffer.size());
  if (!header.ok()) return header.status();
  SafetensorsFile file;
  file.metadata = std::move(header->metadata);
  file.buffer = std::move(buffer);
  const char* data = file.buffer.data() + header->data_start;
  file.tensors.reserve(header->tensors.size());
  for (SafetensorsSlot& entry : header->tensors) {
    TensorView view;
    view.name = std::move(entry.name);
    view.dtype = std::move(entry.dtype);
    view.shape = std::move(entry.shape);
    view.data = absl::string_view(data + entry.begin, entry.end - entry.begin);
    file.tensors.push_back(std::move(view));
  }
  return file;
}

}  // namespace trainyard
