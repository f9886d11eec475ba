#include "worker/trainer/data/data.h"

#include <glob.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/formats/safetensors.h"
#include "common/formats/shard_index.h"
#include "common/formats/shard_reader.h"
#include "common/log.h"
#include "common/storage/object_cache.h"
#include "common/storage/object_store.h"
#include "common/storage/uri.h"
#include "worker/trainer/model/model.h"

namespace trainyard::trainer {
namespace {

std::string ShapeString(c10::IntArrayRef shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

bool IsIntegerDtype(const std::string& dtype) {
  return dtype == "I64" || dtype == "I32" || dtype == "I16" || dtype == "I8" || dtype == "U8";
}

std::string DisplayPath(const std::string& uri) {
  return absl::StartsWith(uri, "file://") ? uri.substr(7) : uri;
}

// One named tensor of every shard: its dtype and the shape of one sample.
struct Column {
  std::string field;  // "data.features", for errors
  std::string name;
  std::string dtype;
  torch::ScalarType type = torch::kFloat32;
  std::vector<int64_t> sample_shape;
  int64_t row_bytes = 0;
};

// The extremes of an integer column per field (the last dimension; one field for [N] labels)
// that `trainyard data pack` records in each shard's metadata as "trainyard.min.NAME" and
// "trainyard.max.NAME" (comma-separated); nullopt when a shard does not.
std::optional<std::pair<std::vector<int64_t>, std::vector<int64_t>>> RecordedExtremes(
    const ShardIndex& index, const std::string& name, size_t fields) {
  std::vector<int64_t> lo(fields, INT64_MAX), hi(fields, INT64_MIN);
  for (const ShardInfo& shard : index.shards) {
    auto min_it = shard.header.metadata.find("trainyard.min." + name);
    auto max_it = shard.header.metadata.find("trainyard.max." + name);
    if (min_it == shard.header.metadata.end() || max_it == shard.header.metadata.end()) {
      return std::nullopt;
    }
    const std::vector<std::string> mins = absl::StrSplit(min_it->second, ',');
    const std::vector<std::string> maxs = absl::StrSplit(max_it->second, ',');
    if (mins.size() != fields || maxs.size() != fields) return std::nullopt;
    for (size_t f = 0; f < fields; ++f) {
      int64_t a, b;
      if (!absl::SimpleAtoi(mins[f], &a) || !absl::SimpleAtoi(maxs[f], &b)) return std::nullopt;
      lo[f] = std::min(lo[f], a);
      hi[f] = std::max(hi[f], b);
    }
  }
  return std::make_pair(lo, hi);
}

// Data read from shards through a ShardReader: samples numbered shard after shard, the last
// ones held out for validation. What ShardData (named tensors, a row per sample) and TokenData
// (windows of a token stream) share.
class ShardedData : public TrainingData {
 public:
  int64_t ShardBytes(int shard) const override { return reader_->ColumnBytes(shard); }
  void Hold(const std::vector<int>& shards) override { reader_->Hold(shards); }
  int64_t bytes_fetched() const override { return reader_->bytes_fetched(); }
  bool remote() const override { return reader_->remote(); }

 protected:
  // `shard_samples`: the samples of each shard.
  ShardedData(std::unique_ptr<ShardReader> reader, std::vector<int64_t> shard_samples)
      : reader_(std::move(reader)), shard_samples_(std::move(shard_samples)) {
    int64_t first = 0;
    for (int64_t n : shard_samples_) {
      shard_first_.push_back(first);
      first += n;
    }
  }

  // Holds out the last round(fraction * N) samples. INVALID_ARGUMENT when there are none
  // (`empty`, the whole message) or none would be left to train on (`unit`: "samples",
  // "windows").
  absl::Status Split(double fraction, const std::string& empty, const char* unit) {
    const int64_t n = shard_first_.empty() ? 0 : shard_first_.back() + shard_samples_.back();
    if (n == 0) return absl::InvalidArgumentError(empty);
    validation_ = static_cast<int64_t>(std::llround(fraction * static_cast<double>(n)));
    if (validation_ >= n) {
      return absl::InvalidArgumentError(absl::StrCat("data.validation_split: ", fraction, " of ", n,
                                                     " ", unit, " leaves none to train on"));
    }
    train_ = n - validation_;
    for (size_t k = 0; k < shard_samples_.size(); ++k) {
      shard_train_samples_.push_back(
          std::clamp<int64_t>(train_ - shard_first_[k], 0, shard_samples_[k]));
    }
    return absl::OkStatus();
  }

  // Walks a batch's samples through their shards, keeping a shard mapped while consecutive
  // samples stay in it. Errors name `field`.
  class Cursor {
   public:
    Cursor(const ShardedData& data, const char* field) : data_(data), field_(field) {}
    // Maps the shard of global sample `index`; returns the sample's index within it.
    absl::StatusOr<int64_t> Seek(int64_t index) {
      const std::vector<int64_t>& first = data_.shard_first_;
      const int shard =
          static_cast<int>(std::upper_bound(first.begin(), first.end(), index) - first.begin() - 1);
      if (shard != current_) {
        absl::StatusOr<std::shared_ptr<const MappedShard>> got = data_.reader_->Get(shard);
        if (!got.ok()) {
          return absl::Status(got.status().code(),
                              absl::StrCat(field_, ": ", got.status().message()));
        }
        mapped_ = *std::move(got);
        current_ = shard;
      }
      return index - first[static_cast<size_t>(shard)];
    }
    const MappedShard& shard() const { return *mapped_; }

   private:
    const ShardedData& data_;
    const char* const field_;
    std::shared_ptr<const MappedShard> mapped_;
    int current_ = -1;
  };

  const std::unique_ptr<ShardReader> reader_;
  const std::vector<int64_t> shard_samples_;
  std::vector<int64_t> shard_first_;  // the global index of each shard's first sample
};

class ShardData final : public ShardedData {
 public:
  ShardData(std::shared_ptr<ObjectStore> store, std::unique_ptr<ShardReader> reader,
            ShardReaderOptions reader_options, std::vector<Column> columns,
            std::vector<int64_t> shard_samples, const trainyard::v1::DataSpec& spec,
            bool classification, const DataOptions& options)
      : ShardedData(std::move(reader), std::move(shard_samples)),
        store_(std::move(store)),
        reader_options_(std::move(reader_options)),
        columns_(std::move(columns)),
        classification_(classification),
        has_categorical_(columns_.size() > 2),
        scale_(spec.has_feature_scale() ? spec.feature_scale() : 1.0f),
        offset_(spec.feature_offset()),
        pin_(options.pin_memory) {
    sample_shape_ = columns_[0].sample_shape;
  }

  // The split, and what the model needs to know of the labels and ids.
  absl::Status Prepare(const trainyard::v1::DataSpec& spec, const ShardIndex& index) {
    if (absl::Status s = Split(
            spec.validation_split(),
            absl::StrCat("data.train: the files matching '", spec.train(), "' hold no samples"),
            "samples");
        !s.ok()) {
      return s;
    }
    if (classification_) {
      absl::StatusOr<std::pair<std::vector<int64_t>, std::vector<int64_t>>> labels =
          Extremes(index, 1);
      if (!labels.ok()) return labels.status();
      if (labels->first[0] < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "data.labels: negative class id ", labels->first[0], " in '", columns_[1].name, "'"));
      }
      outputs_ = labels->second[0] + 1;
    } else {
      outputs_ = 1;
      for (int64_t d : columns_[1].sample_shape) outputs_ *= d;
    }
    if (has_categorical_) {
      absl::StatusOr<std::pair<std::vector<int64_t>, std::vector<int64_t>>> ids =
          Extremes(index, 2);
      if (!ids.ok()) return ids.status();
      for (int64_t lo : ids->first) {
        if (lo < 0) {
          return absl::InvalidArgumentError(
              absl::StrCat("data.categorical: negative id ", lo, " in '", columns_[2].name, "'"));
        }
      }
      max_ids_ = ids->second;
    }
    return absl::OkStatus();
  }

  absl::StatusOr<Batch> Gather(const std::vector<int64_t>& indices) override {
    const int64_t n = static_cast<int64_t>(indices.size());
    std::vector<torch::Tensor> out;
    std::vector<char*> dst;
    for (const Column& c : columns_) {
      std::vector<int64_t> shape = {n};
      shape.insert(shape.end(), c.sample_shape.begin(), c.sample_shape.end());
      torch::Tensor t =
          torch::empty(shape, torch::TensorOptions().dtype(c.type).pinned_memory(pin_));
      dst.push_back(static_cast<char*>(t.data_ptr()));
      out.push_back(std::move(t));
    }
    Cursor cursor(*this, "data.train");
    for (int64_t i = 0; i < n; ++i) {
      absl::StatusOr<int64_t> row = cursor.Seek(indices[static_cast<size_t>(i)]);
      if (!row.ok()) return row.status();
      for (size_t c = 0; c < columns_.size(); ++c) {
        const int64_t bytes = columns_[c].row_bytes;
        std::memcpy(dst[c] + i * bytes, cursor.shard().column(c).data() + *row * bytes,
                    static_cast<size_t>(bytes));
      }
    }
    Batch batch;
    batch.features = out[0].scalar_type() == torch::kFloat32 ? out[0] : out[0].to(torch::kFloat32);
    if (scale_ != 1.0f) batch.features.mul_(scale_);
    if (offset_ != 0.0f) batch.features.add_(offset_);
    batch.labels =
        classification_ ? out[1].reshape({n}).to(torch::kInt64) : out[1].to(torch::kFloat32);
    if (has_categorical_) batch.categorical = out[2].to(torch::kInt64);
    if (pin_) {
      batch.features = batch.features.is_pinned() ? batch.features : batch.features.pin_memory();
      batch.labels = batch.labels.is_pinned() ? batch.labels : batch.labels.pin_memory();
    }
    return batch;
  }

 private:
  // Column `c`'s extremes per field: from the shards' metadata, or read from the column.
  absl::StatusOr<std::pair<std::vector<int64_t>, std::vector<int64_t>>> Extremes(
      const ShardIndex& index, size_t c) {
    const Column& column = columns_[c];
    const size_t fields =
        column.sample_shape.empty() ? 1 : static_cast<size_t>(column.sample_shape.back());
    if (auto recorded = RecordedExtremes(index, column.name, fields)) return *recorded;
    // Read this column alone, shard by shard, through a reader of its own: a remote data set's
    // other tensors are not fetched for it, and each shard is let go once read.
    LogInfo(column.field, ": the shards do not record the extremes of '", column.name,
            "' (trainyard data pack does): reading them");
    absl::StatusOr<std::unique_ptr<ShardReader>> reader =
        ShardReader::Open(store_, index, {column.name}, reader_options_);
    if (!reader.ok()) return reader.status();
    std::vector<int64_t> lo(fields, INT64_MAX), hi(fields, INT64_MIN);
    for (size_t k = 0; k < shard_samples_.size(); ++k) {
      if (shard_samples_[k] == 0) continue;
      (*reader)->Hold({static_cast<int>(k)});
      absl::StatusOr<std::shared_ptr<const MappedShard>> mapped =
          (*reader)->Get(static_cast<int>(k));
      if (!mapped.ok()) {
        return absl::Status(mapped.status().code(),
                            absl::StrCat(column.field, ": ", mapped.status().message()));
      }
      const absl::string_view bytes = (*mapped)->column(0);
      torch::Tensor t = torch::from_blob(const_cast<char*>(bytes.data()),
                                         {shard_samples_[k], static_cast<int64_t>(fields)},
                                         torch::TensorOptions().dtype(column.type))
                            .to(torch::kInt64);
      const torch::Tensor mins = std::get<0>(t.min(0));
      const torch::Tensor maxs = std::get<0>(t.max(0));
      for (size_t f = 0; f < fields; ++f) {
        lo[f] = std::min(lo[f], mins[static_cast<int64_t>(f)].item<int64_t>());
        hi[f] = std::max(hi[f], maxs[static_cast<int64_t>(f)].item<int64_t>());
      }
    }
    return std::make_pair(lo, hi);
  }

  const std::shared_ptr<ObjectStore> store_;  // where the shards are
  const ShardReaderOptions reader_options_;
  const std::vector<Column> columns_;  // features, labels[, categorical]
  const bool classification_;
  const bool has_categorical_;
  const float scale_;
  const float offset_;
  const bool pin_;
};

// Token shards: one 1-D tensor of ids per shard; sample i of a shard is the window of
// context + 1 tokens from token i * context, so consecutive windows share one token (the last
// target of one is the first input of the next) and a shard's last partial window is unused.
class TokenData final : public ShardedData {
 public:
  // `shard_tokens`: the tokens of each shard, of `dtype` (U8, U16, I32 or I64).
  TokenData(std::unique_ptr<ShardReader> reader, std::string name, const std::string& dtype,
            const std::vector<int64_t>& shard_tokens, int64_t context, bool pin)
      : ShardedData(std::move(reader), Windows(shard_tokens, context)),
        name_(std::move(name)),
        element_bytes_(SafetensorsDtypeSize(dtype)),
        context_(context),
        pin_(pin) {
    sample_shape_ = {context};
    tokens_ = true;
  }

  absl::Status Prepare(const trainyard::v1::DataSpec& spec, const ShardIndex& index) {
    if (absl::Status s = Split(
            spec.validation_split(),
            absl::StrCat("data.tokens: the files matching '", spec.tokens(), "' hold no window of ",
                         context_ + 1, " tokens (model.args.context + 1)"),
            "windows");
        !s.ok()) {
      return s;
    }
    int64_t lo = 0, hi = 0;
    if (auto recorded = RecordedExtremes(index, name_, 1)) {
      lo = recorded->first[0];
      hi = recorded->second[0];
    } else {
      LogInfo("data.tokens: the shards do not record the extremes of '", name_,
              "' (trainyard data pack does): reading them");
      lo = INT64_MAX;
      hi = INT64_MIN;
      for (size_t k = 0; k < shard_samples_.size(); ++k) {
        reader_->Hold({static_cast<int>(k)});
        absl::StatusOr<std::shared_ptr<const MappedShard>> mapped =
            reader_->Get(static_cast<int>(k));
        if (!mapped.ok()) {
          return absl::Status(mapped.status().code(),
                              absl::StrCat("data.tokens: ", mapped.status().message()));
        }
        const absl::string_view bytes = (*mapped)->column(0);
        const int64_t count = static_cast<int64_t>(bytes.size()) / element_bytes_;
        for (int64_t i = 0; i < count; ++i) {
          const int64_t v = Token(bytes.data(), i);
          lo = std::min(lo, v);
          hi = std::max(hi, v);
        }
      }
      reader_->Hold({});
    }
    if (lo < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("data.tokens: negative token id ", lo, " in '", name_, "'"));
    }
    outputs_ = hi + 1;
    return absl::OkStatus();
  }

  // Each window's tokens are read once, as int64, straight into the features (the first
  // `context`) and the labels (the last `context`).
  absl::StatusOr<Batch> Gather(const std::vector<int64_t>& indices) override {
    const int64_t n = static_cast<int64_t>(indices.size());
    auto options = torch::TensorOptions().dtype(torch::kInt64).pinned_memory(pin_);
    Batch batch;
    batch.features = torch::empty({n, context_}, options);
    batch.labels = torch::empty({n, context_}, options);
    int64_t* features = batch.features.data_ptr<int64_t>();
    int64_t* labels = batch.labels.data_ptr<int64_t>();
    Cursor cursor(*this, "data.tokens");
    for (int64_t i = 0; i < n; ++i) {
      absl::StatusOr<int64_t> window = cursor.Seek(indices[static_cast<size_t>(i)]);
      if (!window.ok()) return window.status();
      const char* tokens = cursor.shard().column(0).data();
      const int64_t start = *window * context_;
      int64_t* x = features + i * context_;
      for (int64_t j = 0; j < context_; ++j) x[j] = Token(tokens, start + j);
      std::memcpy(labels + i * context_, x + 1, static_cast<size_t>(context_ - 1) * 8);
      labels[i * context_ + context_ - 1] = Token(tokens, start + context_);
    }
    return batch;
  }

 private:
  // Windows of context + 1 tokens, one every `context` tokens, in shards of these many tokens.
  static std::vector<int64_t> Windows(const std::vector<int64_t>& shard_tokens, int64_t context) {
    std::vector<int64_t> windows;
    for (int64_t n : shard_tokens) windows.push_back(n > context ? (n - 1) / context : 0);
    return windows;
  }

  // Token `i` of a shard's ids (little-endian, as safetensors stores them). The dtype's size
  // tells it: U8, U16, I32, I64.
  int64_t Token(const char* tokens, int64_t i) const {
    const char* p = tokens + i * element_bytes_;
    switch (element_bytes_) {
      case 1:
        return static_cast<unsigned char>(*p);
      case 2: {
        uint16_t v;
        std::memcpy(&v, p, 2);
        return v;
      }
      case 4: {
        int32_t v;
        std::memcpy(&v, p, 4);
        return v;
      }
      default: {
        int64_t v;
        std::memcpy(&v, p, 8);
        return v;
      }
    }
  }

  const std::string name_;
  const int64_t element_bytes_;  // 1 (U8), 2 (U16), 4 (I32) or 8 (I64)
  const int64_t context_;
  const bool pin_;
};

// The shards' column `name` for `field`, checked to be the same dtype and sample shape in
// every shard and to have `samples[k]` samples (filled from the first column when empty).
absl::StatusOr<Column> CheckColumn(const ShardIndex& index, const std::string& field,
                                   const std::string& name, std::vector<int64_t>& samples) {
  Column column;
  column.field = field;
  column.name = name;
  const bool first_column = samples.empty();
  for (size_t k = 0; k < index.shards.size(); ++k) {
    const ShardInfo& shard = index.shards[k];
    const std::string path = DisplayPath(shard.uri);
    auto slot = std::find_if(shard.header.tensors.begin(), shard.header.tensors.end(),
                             [&](const SafetensorsSlot& t) { return t.name == name; });
    if (slot == shard.header.tensors.end()) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": tensor '", name, "' not in ", path));
    }
    const std::optional<torch::ScalarType> type = ScalarTypeOf(slot->dtype);
    if (!type.has_value() || slot->dtype == "BOOL" || slot->shape.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": tensor '", name, "' in ", path,
                                                     " must be a numeric tensor with a sample "
                                                     "dimension, got ",
                                                     slot->dtype, " ", ShapeString(slot->shape)));
    }
    const std::vector<int64_t> sample(slot->shape.begin() + 1, slot->shape.end());
    if (k == 0) {
      column.dtype = slot->dtype;
      column.type = *type;
      column.sample_shape = sample;
    } else if (sample != column.sample_shape || slot->dtype != column.dtype) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": ", path, " has ", slot->dtype, " ", ShapeString(slot->shape),
                       ", expected ", column.dtype, " [*", column.sample_shape.empty() ? "" : ",",
                       absl::StrJoin(column.sample_shape, ","), "] like ",
                       DisplayPath(index.shards.front().uri)));
    }
    if (first_column) {
      samples.push_back(slot->shape[0]);
    } else if (slot->shape[0] != samples[k]) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": ", path, ": '", name, "' has shape ", ShapeString(slot->shape),
                       " but the features have ", samples[k], " samples"));
    }
  }
  column.row_bytes = SafetensorsDtypeSize(column.dtype);
  for (int64_t d : column.sample_shape) column.row_bytes *= d;
  return column;
}

// The shards matching `pattern` (the spec's `field`), indexed from their headers, and the store
// they are in.
absl::StatusOr<std::pair<std::shared_ptr<ObjectStore>, ShardIndex>> IndexPattern(
    const std::string& field, const std::string& pattern, const DataOptions& options) {
  if (absl::StrContains(pattern, "://") && !absl::StartsWith(pattern, "file://") &&
      !absl::StartsWith(pattern, "s3://")) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": only local paths, file:// and s3:// URIs are supported, got '", pattern, "'"));
  }
  if (!absl::StrContains(pattern, "://") && !absl::StartsWith(pattern, "/")) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": '", pattern, "' is not an absolute path or URI"));
  }
  const std::string uri = absl::StartsWith(pattern, "/") ? "file://" + pattern : pattern;
  if (options.stores == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(field, ": no object stores to read it from"));
  }
  absl::StatusOr<std::shared_ptr<ObjectStore>> store = options.stores->Open(uri);
  if (!store.ok()) {
    return absl::Status(store.status().code(), absl::StrCat(field, ": ", store.status().message()));
  }
  absl::StatusOr<ShardIndex> index = IndexShards(**store, uri);
  if (!index.ok()) {
    if (index.status().code() == absl::StatusCode::kNotFound &&
        absl::StrContains(index.status().message(), "match")) {
      return absl::NotFoundError(absl::StrCat(field, ": no files match '", pattern, "'"));
    }
    return absl::Status(index.status().code(), absl::StrCat(field, ": ", index.status().message()));
  }
  return std::make_pair(*std::move(store), *std::move(index));
}

ShardReaderOptions ReaderOptions(const trainyard::v1::DataSpec& spec, const DataOptions& options) {
  ShardReaderOptions reader_options;
  reader_options.cache_dir =
      options.cache_dir.empty() ? ObjectCache::DefaultDir() + "/shards" : options.cache_dir;
  reader_options.cache_bytes = options.cache_bytes;
  if (spec.fetch_threads() > 0) reader_options.fetch_threads = spec.fetch_threads();
  return reader_options;
}

absl::StatusOr<std::unique_ptr<TrainingData>> OpenShards(const trainyard::v1::DataSpec& spec,
                                                         bool classification,
                                                         const DataOptions& options) {
  absl::StatusOr<std::pair<std::shared_ptr<ObjectStore>, ShardIndex>> indexed =
      IndexPattern("data.train", spec.train(), options);
  if (!indexed.ok()) return indexed.status();
  std::shared_ptr<ObjectStore> store = std::move(indexed->first);
  ShardIndex index = std::move(indexed->second);
  std::vector<int64_t> samples;
  std::vector<Column> columns;
  const std::string features = spec.features().empty() ? "x" : spec.features();
  const std::string labels = spec.labels().empty() ? "y" : spec.labels();
  absl::StatusOr<Column> x = CheckColumn(index, "data.features", features, samples);
  if (!x.ok()) return x.status();
  columns.push_back(*std::move(x));
  absl::StatusOr<Column> y = CheckColumn(index, "data.labels", labels, samples);
  if (!y.ok()) return y.status();
  if (classification) {
    if (!IsIntegerDtype(y->dtype)) {
      return absl::InvalidArgumentError(
          absl::StrCat("data.labels: cross_entropy needs integer class ids, '", labels, "' in ",
                       DisplayPath(index.shards.front().uri), " is ", y->dtype));
    }
    int64_t width = 1;
    for (int64_t d : y->sample_shape) width *= d;
    if (width != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("data.labels: class ids in ", DisplayPath(index.shards.front().uri),
                       " must have shape [N], got [N,", absl::StrJoin(y->sample_shape, ","), "]"));
    }
  }
  columns.push_back(*std::move(y));
  if (!spec.categorical().empty()) {
    absl::StatusOr<Column> ids =
        CheckColumn(index, "data.categorical", spec.categorical(), samples);
    if (!ids.ok()) return ids.status();
    if (!IsIntegerDtype(ids->dtype) || ids->sample_shape.size() != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "data.categorical: '", spec.categorical(), "' in ", DisplayPath(index.shards.front().uri),
          " must be integer ids of shape [N, fields], got ", ids->dtype, " [N",
          ids->sample_shape.empty() ? "" : ",", absl::StrJoin(ids->sample_shape, ","), "]"));
    }
    columns.push_back(*std::move(ids));
  }
  const ShardReaderOptions reader_options = ReaderOptions(spec, options);
  std::vector<std::string> names;
  for (const Column& c : columns) names.push_back(c.name);
  const ShardIndex kept = index;
  absl::StatusOr<std::unique_ptr<ShardReader>> reader =
      ShardReader::Open(store, std::move(index), names, reader_options);
  if (!reader.ok()) {
    return absl::Status(reader.status().code(),
                        absl::StrCat("data.train: ", reader.status().message()));
  }
  auto data = std::make_unique<ShardData>(std::move(store), *std::move(reader), reader_options,
                                          std::move(columns), std::move(samples), spec,
                                          classification, options);
  if (absl::Status s = data->Prepare(spec, kept); !s.ok()) return s;
  return data;
}

absl::StatusOr<std::unique_ptr<TrainingData>> OpenTokens(const trainyard::v1::DataSpec& spec,
                                                         const DataOptions& options) {
  if (options.token_context < 1) {
    return absl::InvalidArgumentError(
        "data.tokens: needs the model's context (model.args.context)");
  }
  absl::StatusOr<std::pair<std::shared_ptr<ObjectStore>, ShardIndex>> indexed =
      IndexPattern("data.tokens", spec.tokens(), options);
  if (!indexed.ok()) return indexed.status();
  std::shared_ptr<ObjectStore> store = std::move(indexed->first);
  ShardIndex index = std::move(indexed->second);
  const std::string name = spec.features().empty() ? "tokens" : spec.features();
  std::string dtype;
  std::vector<int64_t> shard_tokens;
  for (const ShardInfo& shard : index.shards) {
    const std::string path = DisplayPath(shard.uri);
    auto slot = std::find_if(shard.header.tensors.begin(), shard.header.tensors.end(),
                             [&](const SafetensorsSlot& t) { return t.name == name; });
    if (slot == shard.header.tensors.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("data.tokens: tensor '", name, "' not in ", path));
    }
    if (slot->shape.size() != 1 || (slot->dtype != "U8" && slot->dtype != "U16" &&
                                    slot->dtype != "I32" && slot->dtype != "I64")) {
      return absl::InvalidArgumentError(
          absl::StrCat("data.tokens: '", name, "' in ", path,
                       " must be 1-D token ids of U8, U16, I32 or I64, got ", slot->dtype, " ",
                       ShapeString(slot->shape)));
    }
    if (!dtype.empty() && slot->dtype != dtype) {
      return absl::InvalidArgumentError(
          absl::StrCat("data.tokens: ", path, " has ", slot->dtype, " tokens, ",
                       DisplayPath(index.shards.front().uri), " ", dtype));
    }
    dtype = slot->dtype;
    shard_tokens.push_back(slot->shape[0]);
  }
  const ShardIndex kept = index;
  absl::StatusOr<std::unique_ptr<ShardReader>> reader =
      ShardReader::Open(store, std::move(index), {name}, ReaderOptions(spec, options));
  if (!reader.ok()) {
    return absl::Status(reader.status().code(),
                        absl::StrCat("data.tokens: ", reader.status().message()));
  }
  auto data = std::make_unique<TokenData>(*std::move(reader), name, dtype, std::move(shard_tokens),
                                          options.token_context, options.pin_memory);
  if (absl::Status s = data->Prepare(spec, kept); !s.ok()) return s;
  return data;
}

}  // namespace

int64_t TrainingData::FeatureWidth() const {
  int64_t width = 1;
  for (int64_t d : sample_shape_) width *= d;
  return width;
}

DataOptions DataOptions::FromEnvironment() {
  DataOptions options;
  const char* bytes = std::getenv("TRAINYARD_DATA_CACHE_BYTES");
  int64_t value;
  if (bytes != nullptr && absl::SimpleAtoi(bytes, &value) && value > 0) options.cache_bytes = value;
  return options;
}

absl::StatusOr<std::unique_ptr<TrainingData>> OpenTrainingData(const trainyard::v1::DataSpec& spec,
                                                               int64_t seed, bool classification,
                                                               const DataOptions& options) {
  if (!spec.train().empty()) return OpenShards(spec, classification, options);
  if (!spec.tokens().empty()) return OpenTokens(spec, options);
  if (spec.synthetic().samples() == 0 && spec.synthetic().features() == 0) {
    return absl::InvalidArgumentError("data: set data.train or data.synthetic");
  }
  absl::StatusOr<Dataset> data = MakeSyntheticDataset(spec.synthetic(), seed);
  if (!data.ok()) return data.status();
  if (!classification) data->labels = data->labels.to(torch::kFloat32);
  absl::StatusOr<SplitDataset> split = SplitValidation(*data, spec.validation_split());
  if (!split.ok()) return split.status();
  return InMemoryData(std::move(split->train), std::move(split->validation));
}

}  // namespace trainyard::trainer
