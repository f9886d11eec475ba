// Data held whole in memory: a synthetic data set, one loaded whole, the split of one for
// validation, and the TrainingData over them.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/trainer/data/data.h"

namespace trainyard::trainer {
namespace {

// Standard normal draws from mt19937_64 by Box-Muller, identical on every platform.
class NormalSource {
 public:
  explicit NormalSource(uint64_t seed) : rng_(seed) {}
  double Next() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double u1 = 1.0 - static_cast<double>(rng_() >> 11) * 0x1.0p-53;  // (0, 1]
    const double u2 = static_cast<double>(rng_() >> 11) * 0x1.0p-53;        // [0, 1)
    const double r = std::sqrt(-2.0 * std::log(u1));
    spare_ = r * std::sin(2.0 * M_PI * u2);
    has_spare_ = true;
    return r * std::cos(2.0 * M_PI * u2);
  }

 private:
  std::mt19937_64 rng_;
  bool has_spare_ = false;
  double spare_ = 0;
};

class MemoryData final : public TrainingData {
 public:
  MemoryData(Dataset train, Dataset validation) {
    train_ = train.size();
    validation_ = validation.size();
    if (train.features.defined()) {
      const auto shape = train.features.sizes().slice(1);
      sample_shape_.assign(shape.begin(), shape.end());
    }
    outputs_ = std::max(train.OutputWidth(), validation.OutputWidth());
    auto join = [&](const torch::Tensor& a, const torch::Tensor& b) {
      return b.defined() && b.size(0) > 0 ? torch::cat({a, b}, 0) : a;
    };
    all_.features = join(train.features, validation.features);
    all_.labels = join(train.labels, validation.labels);
    if (train.categorical.defined()) {
      all_.categorical = join(train.categorical, validation.categorical);
      if (all_.categorical.size(0) > 0) {
        torch::Tensor most = std::get<0>(all_.categorical.max(0));
        max_ids_.assign(most.data_ptr<int64_t>(), most.data_ptr<int64_t>() + most.numel());
      }
    }
  }

  absl::StatusOr<Batch> Gather(const std::vector<int64_t>& indices) override {
    torch::NoGradGuard no_grad;
    torch::Tensor index = torch::from_blob(const_cast<int64_t*>(indices.data()),
                                           {static_cast<int64_t>(indices.size())}, torch::kInt64);
    Batch batch;
    batch.features = all_.features.index_select(0, index);
    batch.labels = all_.labels.index_select(0, index);
    if (all_.categorical.defined()) batch.categorical = all_.categorical.index_select(0, index);
    return batch;
  }

 private:
  Dataset all_;
};

}  // namespace

int64_t Dataset::FeatureWidth() const {
  return size() == 0 ? 0 : features.numel() / features.size(0);
}

int64_t Dataset::OutputWidth() const {
  if (!labels.defined() || labels.size(0) == 0) return 0;
  if (labels.scalar_type() == torch::kInt64) return labels.max().item<int64_t>() + 1;
  return labels.numel() / labels.size(0);
}

absl::StatusOr<Dataset> MakeSyntheticDataset(const trainyard::v1::SyntheticData& spec,
                                             int64_t seed) {
  if (spec.samples() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.synthetic.samples: must be >= 1, got ", spec.samples()));
  }
  if (spec.features() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.synthetic.features: must be >= 1, got ", spec.features()));
  }
  if (spec.classes() < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.synthetic.classes: must be >= 2, got ", spec.classes()));
  }
  if (spec.noise() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.synthetic.noise: must be >= 0, got ", spec.noise()));
  }
  const int64_t n = spec.samples();
  const int64_t f = spec.features();
  const int64_t k = spec.classes();
  NormalSource normal(static_cast<uint64_t>(seed) * 0x9E3779B97F4A7C15ULL + 17);
  std::vector<double> centres(static_cast<size_t>(k * f));
  for (double& c : centres) c = normal.Next();
  Dataset data;
  data.features = torch::empty({n, f}, torch::kFloat32);
  data.labels = torch::empty({n}, torch::kInt64);
  float* x = data.features.data_ptr<float>();
  int64_t* y = data.labels.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t label = i % k;
    y[i] = label;
    for (int64_t j = 0; j < f; ++j) {
      x[i * f + j] = static_cast<float>(centres[label * f + j] + spec.noise() * normal.Next());
    }
  }
  if (spec.vocab_size() > 0) {
    const int64_t fields = spec.vocab_size();
    for (int64_t v : spec.vocab()) {
      if (v < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("data.synthetic.vocab: every field needs >= 1 id, got ", v));
      }
    }
    std::mt19937_64 ids(static_cast<uint64_t>(seed) * 0xD1B54A32D192ED03ULL + 29);
    data.categorical = torch::empty({n, fields}, torch::kInt64);
    int64_t* c = data.categorical.data_ptr<int64_t>();
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < fields; ++j) {
        const uint64_t vocab = static_cast<uint64_t>(spec.vocab(static_cast<int>(j)));
        const uint64_t draw = ids();
        // The class's id for this field, or a uniform one; both from one 64-bit draw.
        const uint64_t class_id = (static_cast<uint64_t>(y[i]) * 0x9E3779B97F4A7C15ULL +
                                   static_cast<uint64_t>(j) * 0xBF58476D1CE4E5B9ULL) %
                                  vocab;
        c[i * fields + j] = static_cast<int64_t>((draw & 1) ? class_id : (draw >> 1) % vocab);
      }
    }
  }
  return data;
}

std::unique_ptr<TrainingData> InMemoryData(Dataset train, Dataset validation) {
  return std::make_unique<MemoryData>(std::move(train), std::move(validation));
}

absl::StatusOr<Dataset> LoadDataset(const trainyard::v1::DataSpec& spec, int64_t seed,
                                    bool classification, const DataOptions& options) {
  trainyard::v1::DataSpec whole = spec;
  whole.set_validation_split(0);
  absl::StatusOr<std::unique_ptr<TrainingData>> data =
      OpenTrainingData(whole, seed, classification, options);
  if (!data.ok()) return data.status();
  std::vector<int64_t> all(static_cast<size_t>((*data)->train_size()));
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int64_t>(i);
  absl::StatusOr<Batch> batch = (*data)->Gather(all);
  if (!batch.ok()) return batch.status();
  Dataset out;
  out.features = batch->features;
  out.labels = batch->labels;
  out.categorical = batch->categorical;
  return out;
}

absl::StatusOr<SplitDataset> SplitValidation(const Dataset& data, double fraction) {
  if (!(fraction >= 0 && fraction < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.validation_split: must be in [0, 1), got ", fraction));
  }
  const int64_t n = data.size();
  const int64_t held = static_cast<int64_t>(std::llround(fraction * static_cast<double>(n)));
  if (held >= n) {
    return absl::InvalidArgumentError(absl::StrCat("data.validation_split: ", fraction, " of ", n,
                                                   " samples leaves none to train on"));
  }
  SplitDataset split;
  split.train.features = data.features.narrow(0, 0, n - held);
  split.train.labels = data.labels.narrow(0, 0, n - held);
  if (data.categorical.defined()) split.train.categorical = data.categorical.narrow(0, 0, n - held);
  if (held > 0) {
    split.validation.features = data.features.narrow(0, n - held, held);
    split.validation.labels = data.labels.narrow(0, n - held, held);
    if (data.categorical.defined()) {
      split.validation.categorical = data.categorical.narrow(0, n - held, held);
    }
  }
  return split;
}

}  // namespace trainyard::trainer
