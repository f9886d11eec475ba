// The data commands, which need no coordinator: data pack and data inspect.

#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "client/commands.h"
#include "client/data_pack.h"
#include "client/format.h"
#include "common/byte_size.h"
#include "common/formats/safetensors.h"
#include "common/formats/shard_index.h"
#include "nlohmann/json.hpp"

namespace trainyard::cli {
namespace {

// A local path made absolute (from the current folder); URIs and absolute paths as they are.
std::string AbsoluteLocal(const std::string& path) {
  if (path.empty() || absl::StrContains(path, "://") || path[0] == '/') return path;
  return (std::filesystem::current_path() / path).lexically_normal().string();
}

// `trainyard data pack PREFIX INPUT...`.
int Pack(const ParsedArgs& args) {
  if (args.args.size() < 3) {
    std::cerr << "error: data pack needs PREFIX and TENSOR=FILE.npy... or FILE.csv, or --text "
                 "FILE... PREFIX\n";
    return kExitUsage;
  }
  PackOptions options;
  // As an absolute path, so that the pattern it prints can go into a spec as it is.
  options.prefix = AbsoluteLocal(args.args[1]);
  if (args.Has("shard-size")) {
    absl::StatusOr<int64_t> size = ParseByteSize(args.Get("shard-size"));
    if (!size.ok()) {
      std::cerr << "error: --shard-size: " << size.status().message() << "\n";
      return kExitUsage;
    }
    options.shard_bytes = *size;
  }
  const std::vector<std::string> inputs(args.args.begin() + 2, args.args.end());
  if (args.Has("tokenizer") && !args.Has("text")) {
    std::cerr << "error: --tokenizer is for --text\n";
    return kExitUsage;
  }
  if (args.Has("text")) {
    if (args.Has("columns")) {
      std::cerr << "error: --columns is for a CSV input, not --text\n";
      return kExitUsage;
    }
    // data pack --text FILE... PREFIX
    options.prefix = AbsoluteLocal(args.args.back());
    options.text_paths.assign(args.args.begin() + 1, args.args.end() - 1);
    options.tokenizer = args.Get("tokenizer", "bytes");
  } else if (inputs.size() == 1 && absl::EndsWithIgnoreCase(inputs[0], ".csv")) {
    if (!args.Has("columns")) {
      std::cerr << "error: packing " << inputs[0] << " needs --columns "
                << "(e.g. 'x=age,income:F32;y=label:I64')\n";
      return kExitUsage;
    }
    absl::StatusOr<std::vector<PackColumn>> columns = ParseCsvColumns(args.Get("columns"));
    if (!columns.ok()) {
      std::cerr << "error: " << columns.status().message() << "\n";
      return kExitUsage;
    }
    options.csv_path = inputs[0];
    options.tensors = *std::move(columns);
  } else {
    if (args.Has("columns")) {
      std::cerr << "error: --columns is for a CSV input\n";
      return kExitUsage;
    }
    for (const std::string& input : inputs) {
      const size_t eq = input.find('=');
      if (eq == std::string::npos || eq == 0 || eq + 1 == input.size()) {
        std::cerr << "error: '" << input << "' is not TENSOR=FILE.npy (or one FILE.csv)\n";
        return kExitUsage;
      }
      PackColumn column;
      column.tensor = input.substr(0, eq);
      column.npy_path = input.substr(eq + 1);
      options.tensors.push_back(std::move(column));
    }
  }
  const bool terminal = IsTerminal();
  const std::string unit = options.text_paths.empty() ? "sample" : "token";
  options.progress = [terminal, unit](int64_t shards, int64_t samples) {
    if (terminal) {
      std::cerr << "\rwrote " << Counted(shards, "shard") << ", " << Counted(samples, unit)
                << std::flush;
    }
  };
  absl::StatusOr<PackResult> result = PackShards(options);
  if (terminal) std::cerr << "\r\033[K";
  if (!result.ok()) {
    std::cerr << "error: " << result.status().message() << "\n";
    return absl::IsUnavailable(result.status()) ? kExitStorageError : kExitUsage;
  }
  std::cout << "wrote " << Counted(static_cast<int64_t>(result->shards.size()), "shard") << ", "
            << Counted(result->samples, unit) << ", " << HumanBytes(result->bytes) << ": "
            << options.prefix << "-*.safetensors\n";
  return kExitSucceeded;
}

}  // namespace

// `trainyard data inspect URI` and `data pack`: need no coordinator.
int Data(const ParsedArgs& args, const ObjectStoreResolver& stores) {
  if (args.args[0] == "pack") return Pack(args);
  if (args.args[0] != "inspect") {
    std::cerr << "error: data takes inspect or pack, got '" << args.args[0] << "'\n";
    return kExitUsage;
  }
  if (args.args.size() != 2) {
    std::cerr << "error: data inspect takes one pattern or URI, got " << args.args.size() - 1
              << (args.args.size() > 2 ? ": put a pattern in quotes "
                                         "('/data/train-*.safetensors') so that the shell "
                                         "passes it as it is"
                                       : "")
              << "\n";
    return kExitUsage;
  }
  absl::StatusOr<ShardIndex> index = IndexShards(stores, AbsoluteLocal(args.args[1]));
  if (!index.ok()) {
    std::cerr << "error: " << index.status().message() << "\n";
    return absl::IsNotFound(index.status()) || absl::IsInvalidArgument(index.status())
               ? kExitUsage
               : kExitStorageError;
  }
  if (args.Get("output", "table") == "json") {
    nlohmann::json out;
    out["samples"] = index->samples;
    out["bytes"] = index->bytes;
    out["header_bytes_read"] = index->header_bytes_read;
    out["shards"] = nlohmann::json::array();
    for (const ShardInfo& shard : index->shards) {
      nlohmann::json s;
      s["uri"] = shard.uri;
      s["bytes"] = shard.size_bytes;
      s["samples"] = shard.samples;
      s["tensors"] = nlohmann::json::array();
      for (const SafetensorsSlot& t : shard.header.tensors) {
        s["tensors"].push_back({{"name", t.name},
                                {"dtype", t.dtype},
                                {"shape", t.shape},
                                {"begin", shard.header.data_start + t.begin},
                                {"end", shard.header.data_start + t.end}});
      }
      out["shards"].push_back(std::move(s));
    }
    std::cout << out.dump(2) << "\n";
    return kExitSucceeded;
  }
  std::cout << Counted(static_cast<int64_t>(index->shards.size()), "shard") << ", "
            << Counted(index->samples, "sample") << ", " << HumanBytes(index->bytes)
            << " (headers read: " << HumanBytes(index->header_bytes_read) << ")\n\n";
  std::vector<std::vector<std::string>> shard_rows;
  for (const ShardInfo& shard : index->shards) {
    shard_rows.push_back({shard.uri, shard.samples < 0 ? "mixed" : GroupThousands(shard.samples),
                          HumanBytes(shard.size_bytes)});
  }
  std::cout << Table({"SHARD", "SAMPLES", "BYTES"}, shard_rows) << "\n";
  // The tensors of the first shard, per sample; shards that differ are named.
  const ShardInfo& first = index->shards.front();
  std::vector<std::vector<std::string>> tensor_rows;
  for (const SafetensorsSlot& t : first.header.tensors) {
    std::vector<std::string> dims;
    for (size_t i = 1; i < t.shape.size(); ++i) dims.push_back(absl::StrCat(t.shape[i]));
    int64_t bytes = 0;
    for (const ShardInfo& shard : index->shards) {
      for (const SafetensorsSlot& u : shard.header.tensors) {
        if (u.name == t.name) bytes += static_cast<int64_t>(u.end - u.begin);
      }
    }
    tensor_rows.push_back(
        {t.name, t.dtype, absl::StrCat("[", absl::StrJoin(dims, ", "), "]"), HumanBytes(bytes)});
  }
  std::cout << Table({"TENSOR", "DTYPE", "SHAPE PER SAMPLE", "BYTES (ALL SHARDS)"}, tensor_rows);
  for (const ShardInfo& shard : index->shards) {
    bool same = shard.header.tensors.size() == first.header.tensors.size();
    for (size_t i = 0; same && i < shard.header.tensors.size(); ++i) {
      const SafetensorsSlot& a = shard.header.tensors[i];
      const SafetensorsSlot& b = first.header.tensors[i];
      same = a.name == b.name && a.dtype == b.dtype &&
             std::vector<int64_t>(a.shape.begin() + (a.shape.empty() ? 0 : 1), a.shape.end()) ==
                 std::vector<int64_t>(b.shape.begin() + (b.shape.empty() ? 0 : 1), b.shape.end());
    }
    if (!same) std::cout << "warning: " << shard.uri << " holds other tensors than the first\n";
  }
  return kExitSucceeded;
}

}  // namespace trainyard::cli
