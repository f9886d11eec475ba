// `trainyard data pack` on files a user was given: NumPy .npy arrays and CSV tables, through
// PackShards as the CLI calls it. The first byte picks the input: .npy (one array, or two after
// "|NPY|", which must agree on their samples) or CSV (the first line is the --columns spec, the
// rest the file). What it writes must be what it says: shards that decode, holding the samples it
// counted, and nothing at all when it fails.

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "client/data_pack.h"
#include "common/formats/safetensors.h"
#include "tests/fuzz/fuzz_support.h"

namespace fs = std::filesystem;
using trainyard::cli::PackColumn;
using trainyard::cli::PackOptions;

namespace {

const std::string& Sandbox() {
  static const std::string dir = trainyard::fuzz::MakeScratchDir("pack");
  return dir;
}

std::string Write(const std::string& name, absl::string_view bytes) {
  const std::string path = Sandbox() + "/in/" + name;
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), bytes.size());
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const absl::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  fs::remove_all(Sandbox() + "/in");
  fs::remove_all(Sandbox() + "/out");
  fs::create_directories(Sandbox() + "/in");
  fs::create_directories(Sandbox() + "/out");
  PackOptions options;
  options.prefix = Sandbox() + "/out/set";
  options.shard_bytes = 64;  // many small shards: the cuts between them are exercised too
  if (data[0] & 1) {
    const size_t eol = rest.find('\n');
    if (eol == absl::string_view::npos) return 0;
    absl::StatusOr<std::vector<PackColumn>> columns =
        trainyard::cli::ParseCsvColumns(std::string(rest.substr(0, eol)));
    if (!columns.ok()) return 0;
    options.tensors = *std::move(columns);
    options.csv_path = Write("table.csv", rest.substr(eol + 1));
  } else {
    const std::vector<absl::string_view> arrays = absl::StrSplit(rest, "|NPY|");
    for (size_t i = 0; i < arrays.size() && i < 2; ++i) {
      PackColumn column;
      column.tensor = i == 0 ? "x" : "y";
      column.npy_path = Write(column.tensor + ".npy", arrays[i]);
      options.tensors.push_back(column);
    }
  }
  absl::StatusOr<trainyard::cli::PackResult> packed = trainyard::cli::PackShards(options);
  if (!packed.ok()) {
    if (!fs::is_empty(Sandbox() + "/out")) __builtin_trap();  // an error leaves nothing behind
    return 0;
  }
  int64_t samples = 0;
  for (const std::string& shard : packed->shards) {
    std::ifstream in(shard, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    absl::StatusOr<trainyard::SafetensorsFile> file = trainyard::DecodeSafetensors(bytes);
    if (!file.ok() || file->tensors.empty()) __builtin_trap();
    samples += file->tensors.front().shape.empty() ? 0 : file->tensors.front().shape.front();
  }
  if (samples != packed->samples) __builtin_trap();
  return 0;
}
