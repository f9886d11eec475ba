#ifndef TRAINYARD_COMMON_FORMATS_SAFETENSORS_H_
#define TRAINYARD_COMMON_FORMATS_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace trainyard {

// The safetensors format (https://github.com/huggingface/safetensors): an 8-byte little-endian
// header length, a JSON header mapping names to {dtype, shape, data_offsets} plus an optional
// "__metadata__" string map, then the raw little-endian tensor bytes. Files we write are readable
// by the Python `safetensors` package. This layer knows nothing of LibTorch.

// dtype names as in the format: "F64" "F32" "F16" "BF16" "I64" "I32" "I16" "I8" "U8" "BOOL".
// Returns 0 for an unknown dtype.
int SafetensorsDtypeSize(absl::string_view dtype);

struct TensorView {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  absl::string_view data;  // not owned; size must equal product(shape) * dtype size
};

// Serialises tensors (sorted by name in the header, data in the given order, 8-byte aligned
// header). INVALID_ARGUMENT for duplicate names, unknown dtypes or a data size that does not
// match the shape.
absl::StatusOr<std::string> EncodeSafetensors(const std::vector<TensorView>& tensors,
                                              const std::map<std::string, std::string>& metadata);

// The part of the file EncodeSafetensors would write before the tensor data: the 8-byte header
// length and the padded JSON header. The file is this followed by each tensor's data in the
// given order, so a writer can send the tensors from where they are instead of copying them into
// one buffer. Errors as EncodeSafetensors.
absl::StatusOr<std::string> EncodeSafetensorsHeader(
    const std::vector<TensorView>& tensors, const std::map<std::string, std::string>& metadata);

// A parsed file. Views point into `buffer`, which the struct owns: do not copy the struct and
// keep using views of the copy's source; move it instead.
struct SafetensorsFile {
  std::string buffer;
  std::map<std::string, std::string> metadata;
  std::vector<TensorView> tensors;  // in data-offset order
  const TensorView* Find(absl::string_view name) const;
};

// Where one tensor's bytes are: [begin, end) from the start of the data section.
struct SafetensorsSlot {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0;
  uint64_t end = 0;
};

// The header EncodeSafetensorsHeader writes for tensors given by where they are instead of by
// their data (each `end - begin` bytes), in the given order: to stream tensors from other files.
absl::StatusOr<std::string> EncodeSafetensorsHeader(
    const std::vector<SafetensorsSlot>& tensors,
    const std::map<std::string, std::string>& metadata);

// A file's header alone: enough to know its tensors without reading their data.
struct SafetensorsHeader {
  uint64_t data_start = 0;  // file offset of the data section (8 + header length)
  std::map<std::string, std::string> metadata;
  std::vector<SafetensorsSlot> tensors;  // in data-offset order
};

// The header length the first 8 bytes of a file announce. DATA_LOSS for fewer than 8 bytes,
// INVALID_ARGUMENT for a length over the format's limit (100 MB).
absl::StatusOr<uint64_t> SafetensorsHeaderSize(absl::string_view first_bytes);

// Parses and checks the header of a file of `file_size` bytes from `prefix`, its first
// 8 + header-length bytes (or more): dtypes, shapes, offsets inside the file, no overlaps.
// Errors as DecodeSafetensors.
absl::StatusOr<SafetensorsHeader> DecodeSafetensorsHeader(absl::string_view prefix,
                                                          uint64_t file_size);

// Parses and checks the whole file: header JSON, dtypes, offsets inside the buffer, sizes that
// match shapes, no overlaps. INVALID_ARGUMENT (DATA_LOSS for truncated data) on any violation.
absl::StatusOr<SafetensorsFile> DecodeSafetensors(std::string buffer);

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_FORMATS_SAFETENSORS_H_
