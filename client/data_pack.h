#ifndef TRAINYARD_CLIENT_DATA_PACK_H_
#define TRAINYARD_CLIENT_DATA_PACK_H_

// `trainyard data pack`: writes a data set as sharded safetensors, the form trainers stream
// (worker/trainer/data/data.h), from NumPy .npy files, a CSV file, or text as token shards
// (data.tokens).

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace trainyard::cli {

struct PackColumn {
  std::string tensor;                // name in the shards
  std::string npy_path;              // .npy input: the whole array, first dimension = samples
  std::vector<std::string> columns;  // CSV input: the columns, in order, that make the tensor
  std::string dtype;                 // CSV input: safetensors dtype (F32, I64, U8, ...)
};

struct PackOptions {
  // Shards are "{prefix}-00000.safetensors", ... (five digits, more when needed).
  std::string prefix;
  std::vector<PackColumn> tensors;
  std::string csv_path;  // set for CSV input (every tensor names columns of it)
  // Text input (then `tensors` is empty): the files, in order, as one stream of token ids, cut
  // into shards of one 1-D tensor "tokens" each. The tokenizer: "bytes" (each byte one id,
  // U8, vocabulary 256).
  std::vector<std::string> text_paths;
  std::string tokenizer;
  int64_t shard_bytes = int64_t{256} << 20;  // target size of a shard's data
  // Called after each shard is written: shards and samples so far.
  std::function<void(int64_t shards, int64_t samples)> progress;
};

struct PackResult {
  std::vector<std::string> shards;  // paths, in order
  int64_t samples = 0;              // text input: tokens
  int64_t bytes = 0;                // of all shards
};

// Parses "x=a,b,c:F32;y=label:I64" (tensor = columns : dtype, separated by ';') for CSV input.
// INVALID_ARGUMENT naming the part that is wrong.
absl::StatusOr<std::vector<PackColumn>> ParseCsvColumns(const std::string& spec);

// Writes the shards. Everything is checked first where it can be (files readable, .npy headers,
// the same number of samples in every array, CSV columns present, no shard of the prefix
// already there); shards are written under temporary names and renamed once all are written,
// so an error leaves nothing behind. Integer tensors of one or two dimensions get their
// per-field extremes in each shard's metadata ("trainyard.min.NAME", "trainyard.max.NAME"),
// which trainers read instead of scanning labels and ids. Errors: INVALID_ARGUMENT for bad
// input (naming the file, and the line and column for CSV), ALREADY_EXISTS for an existing
// shard, NOT_FOUND for a missing input, UNAVAILABLE for I/O errors.
absl::StatusOr<PackResult> PackShards(const PackOptions& options);

}  // namespace trainyard::cli

#endif  // TRAINYARD_CLIENT_DATA_PACK_H_
