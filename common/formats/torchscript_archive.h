#ifndef TRAINYARD_COMMON_FORMATS_TORCHSCRIPT_ARCHIVE_H_
#define TRAINYARD_COMMON_FORMATS_TORCHSCRIPT_ARCHIVE_H_

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/storage/object_store.h"

namespace trainyard {

// What a TorchScript model asks of the LibTorch that loads it, read from its archive (the zip
// file torch.jit.save writes) without LibTorch: the coordinator reads it at submission, the
// trainer before it loads a model.
struct TorchScriptNeeds {
  // Every operator its code calls, sorted: "aten::linear", "prim::RaiseException".
  std::vector<std::string> ops;
  // The archive's file-format version (its "version" record); 0 when it has none.
  int64_t format_version = 0;
  // Bytes of its tensors (the records under data/: parameters and buffers, stored uncompressed).
  int64_t tensor_bytes = 0;
};

// Reads `length` bytes at `offset` of the archive.
using ArchiveReader = std::function<absl::StatusOr<std::string>(int64_t offset, int64_t length)>;

// The needs of the archive of `size` bytes that `read` reads: its central directory (zip or
// zip64), then each code file (stored or deflated). INVALID_ARGUMENT when it is not a TorchScript
// archive (no zip, no code/ folder) or is damaged; RESOURCE_EXHAUSTED past the limits below;
// what `read` returns otherwise.
absl::StatusOr<TorchScriptNeeds> ReadTorchScriptNeeds(int64_t size, const ArchiveReader& read);

// The same for the object at `uri`, read in ranges (a large model is not read whole).
absl::StatusOr<TorchScriptNeeds> ReadTorchScriptNeeds(ObjectStore& store, absl::string_view uri);

// Adds the operators that one code file of an archive calls to `ops`: torch.NAME(...) is
// aten::NAME, ops.NS.NAME(...) is NS::NAME (as LibTorch prints a graph as code); strings and
// comments are skipped.
void CollectTorchScriptOps(absl::string_view code, std::set<std::string>& ops);

// What `needs` asks that a LibTorch lacks whose operators are `sorted_ops` and which loads
// archive formats up to `max_format_version` (0: not checked): empty when nothing, else
// "aten::a, aten::b", "archive format 11 (it loads up to 10)" or both, joined by "; ".
std::string MissingFromRuntime(const TorchScriptNeeds& needs,
                               const std::vector<std::string>& sorted_ops,
                               int64_t max_format_version);

// The limits: a central directory of at most kMaxArchiveEntries entries, code of at most
// kMaxArchiveCodeBytes bytes in all once inflated.
inline constexpr int64_t kMaxArchiveEntries = 1'000'000;
inline constexpr int64_t kMaxArchiveCodeBytes = 64 << 20;

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_FORMATS_TORCHSCRIPT_ARCHIVE_H_
