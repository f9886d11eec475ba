#include "worker/trainer/data.h"

#include <glob.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/log.h"
#include "common/object_cache.h"
#include "common/object_store.h"
#include "common/safetensors.h"
#include "common/uri.h"
#include "worker/trainer/model.h"

namespace trainyard::trainer {
namespace {

std::string ShapeString(c10::IntArrayRef shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

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

absl::StatusOr<std::string> ReadLocalFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("data.train: cannot open ", path));
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return absl::UnavailableError(absl::StrCat("data.train: error reading ", path));
  return buffer.str();
}

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

absl::StatusOr<std::vector<std::string>> ExpandDataGlob(const std::string& pattern) {
  std::string local = pattern;
  if (absl::StartsWith(pattern, "s3://")) {
    // Remote files come through the local cache (keyed by ETag): a restart reads them from disk.
    absl::StatusOr<std::unique_ptr<ObjectStore>> store = OpenObjectStore(pattern);
    if (!store.ok()) {
      return absl::Status(store.status().code(),
                          absl::StrCat("data.train: ", store.status().message()));
    }
    absl::StatusOr<std::vector<std::string>> uris = ExpandObjectGlob(**store, pattern);
    if (!uris.ok()) {
      return absl::Status(uris.status().code(),
                          absl::StrCat("data.train: ", uris.status().message()));
    }
    ObjectCache cache(ObjectCache::DefaultDir());
    std::vector<std::string> files;
    for (const std::string& uri : *uris) {
      absl::StatusOr<std::string> path = cache.Fetch(**store, uri);
      if (!path.ok()) {
        return absl::Status(path.status().code(),
                            absl::StrCat("data.train: ", path.status().message()));
      }
      files.push_back(*std::move(path));
    }
    return files;
  }
  if (absl::StrContains(pattern, "://")) {
    if (!absl::StartsWith(pattern, "file://")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "data.train: only local paths and file:// URIs are supported, got '", pattern, "'"));
    }
    local = pattern.substr(std::string("file://").size());
  }
  glob_t matches;
  const int rc = glob(local.c_str(), 0, nullptr, &matches);
  std::vector<std::string> files;
  if (rc == 0) {
    for (size_t i = 0; i < matches.gl_pathc; ++i) files.emplace_back(matches.gl_pathv[i]);
  }
  globfree(&matches);
  if (rc == GLOB_NOMATCH || (rc == 0 && files.empty())) {
    return absl::NotFoundError(absl::StrCat("data.train: no files match '", pattern, "'"));
  }
  if (rc != 0) {
    return absl::UnavailableError(absl::StrCat("data.train: cannot expand '", pattern, "'"));
  }
  std::sort(files.begin(), files.end());
  return files;
}

absl::StatusOr<Dataset> LoadDataset(const trainyard::v1::DataSpec& spec, int64_t seed,
                                    bool classification) {
  if (spec.train().empty()) {
    if (spec.synthetic().samples() == 0 && spec.synthetic().features() == 0) {
      return absl::InvalidArgumentError("data: set data.train or data.synthetic");
    }
    absl::StatusOr<Dataset> data = MakeSyntheticDataset(spec.synthetic(), seed);
    if (data.ok() && !classification) data->labels = data->labels.to(torch::kFloat32);
    return data;
  }
  absl::StatusOr<std::vector<std::string>> files = ExpandDataGlob(spec.train());
  if (!files.ok()) return files.status();
  const std::string features_name = spec.features().empty() ? "x" : spec.features();
  const std::string labels_name = spec.labels().empty() ? "y" : spec.labels();
  std::vector<torch::Tensor> features, labels, categorical;
  for (const std::string& path : *files) {
    absl::StatusOr<std::string> bytes = ReadLocalFile(path);
    if (!bytes.ok()) return bytes.status();
    absl::StatusOr<SafetensorsFile> file = DecodeSafetensors(*std::move(bytes));
    if (!file.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("data.train: ", path, ": ", file.status().message()));
    }
    const TensorView* fv = file->Find(features_name);
    if (fv == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("data.features: tensor '", features_name, "' not in ", path));
    }
    const TensorView* lv = file->Find(labels_name);
    if (lv == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("data.labels: tensor '", labels_name, "' not in ", path));
    }
    absl::StatusOr<torch::Tensor> x = TensorFromView(*fv);
    if (!x.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("data.features: ", path, ": ", x.status().message()));
    }
    absl::StatusOr<torch::Tensor> y = TensorFromView(*lv);
    if (!y.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("data.labels: ", path, ": ", y.status().message()));
    }
    if (x->dim() < 1 || x->scalar_type() == torch::kBool) {
      return absl::InvalidArgumentError(absl::StrCat("data.features: tensor '", features_name,
                                                     "' in ", path,
                                                     " must be a numeric "
                                                     "tensor with a sample dimension"));
    }
    if (!features.empty() && x->sizes().slice(1) != features.front().sizes().slice(1)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "data.features: ", path, " has shape ", ShapeString(x->sizes()), ", expected [*",
          features.front().dim() > 1 ? "," : "",
          absl::StrJoin(features.front().sizes().slice(1), ","), "] like ", files->front()));
    }
    if (y->dim() < 1 || y->size(0) != x->size(0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "data.labels: ", path, ": '", labels_name, "' has shape ", ShapeString(y->sizes()),
          " but '", features_name, "' has ", x->size(0), " samples"));
    }
    torch::Tensor label;
    if (classification) {
      if (torch::isFloatingType(y->scalar_type()) || y->scalar_type() == torch::kBool) {
        return absl::InvalidArgumentError(
            absl::StrCat("data.labels: cross_entropy needs integer class ids, '", labels_name,
                         "' in ", path, " is ", lv->dtype));
      }
      if (y->numel() != y->size(0)) {
        return absl::InvalidArgumentError(absl::StrCat("data.labels: class ids in ", path,
                                                       " must have shape [N], got ",
                                                       ShapeString(y->sizes())));
      }
      label = y->reshape({y->size(0)}).to(torch::kInt64);
      if (label.numel() > 0 && label.min().item<int64_t>() < 0) {
        return absl::InvalidArgumentError(absl::StrCat("data.labels: negative class id in ", path));
      }
    } else {
      label = y->to(torch::kFloat32);
    }
    if (!spec.categorical().empty()) {
      const TensorView* cv = file->Find(spec.categorical());
      if (cv == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("data.categorical: tensor '", spec.categorical(), "' not in ", path));
      }
      absl::StatusOr<torch::Tensor> ids = TensorFromView(*cv);
      if (!ids.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("data.categorical: ", path, ": ", ids.status().message()));
      }
      if (torch::isFloatingType(ids->scalar_type()) || ids->scalar_type() == torch::kBool ||
          ids->dim() != 2 || ids->size(0) != x->size(0)) {
        return absl::InvalidArgumentError(
            absl::StrCat("data.categorical: '", spec.categorical(), "' in ", path,
                         " must be integer ids of shape [", x->size(0), ", fields], got ",
                         cv->dtype, " ", ShapeString(ids->sizes())));
      }
      if (!categorical.empty() && ids->size(1) != categorical.front().size(1)) {
        return absl::InvalidArgumentError(absl::StrCat("data.categorical: ", path, " has ",
                                                       ids->size(1), " fields, ", files->front(),
                                                       " has ", categorical.front().size(1)));
      }
      torch::Tensor as_int64 = ids->to(torch::kInt64);
      if (as_int64.numel() > 0 && as_int64.min().item<int64_t>() < 0) {
        return absl::InvalidArgumentError(absl::StrCat("data.categorical: negative id in ", path));
      }
      categorical.push_back(std::move(as_int64));
    }
    features.push_back(x->to(torch::kFloat32));
    labels.push_back(std::move(label));
  }
  Dataset data;
  data.features = torch::cat(features, 0).contiguous();
  data.labels = torch::cat(labels, 0).contiguous();
  if (!categorical.empty()) data.categorical = torch::cat(categorical, 0).contiguous();
  if (data.size() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.train: the files matching '", spec.train(), "' hold no samples"));
  }
  return data;
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

BatchPrefetcher::BatchPrefetcher(Dataset data, const StepPlan& plan, int64_t seed, bool shuffle,
                                 int rank, int world_size, int64_t first_step, int64_t end_step,
                                 int depth)
    : data_(std::move(data)),
      order_(plan, seed, shuffle),
      rank_(rank),
      world_size_(world_size),
      first_step_(first_step),
      end_step_(end_step),
      depth_(static_cast<size_t>(std::max(1, depth))) {
  thread_ = std::thread([this] { Loop(); });
}

BatchPrefetcher::~BatchPrefetcher() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void BatchPrefetcher::Loop() {
  try {
    BuildBatches();
  } catch (const std::exception& e) {
    // Next() then reports the end of the data early, which the training loop treats as an
    // internal error.
    LogError("the data thread failed: ", DescribeTorchError(e));
  }
  absl::MutexLock lock(&mu_);
  done_ = true;
}

void BatchPrefetcher::BuildBatches() {
  torch::NoGradGuard no_grad;
  for (int64_t step = first_step_; step < end_step_; ++step) {
    const std::vector<int64_t> indices = order_.RankBatch(step, rank_, world_size_);
    torch::Tensor index = torch::from_blob(const_cast<int64_t*>(indices.data()),
                                           {static_cast<int64_t>(indices.size())}, torch::kInt64);
    Batch batch;
    batch.step = step;
    batch.features = data_.features.index_select(0, index);
    batch.labels = data_.labels.index_select(0, index);
    if (data_.categorical.defined()) batch.categorical = data_.categorical.index_select(0, index);
    absl::MutexLock lock(&mu_);
    auto room = [this]()
                    ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || queue_.size() < depth_; };
    mu_.Await(absl::Condition(&room));
    if (stop_) return;
    queue_.push_back(std::move(batch));
  }
}

std::optional<Batch> BatchPrefetcher::Next() {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_ || !queue_.empty(); };
  mu_.Await(absl::Condition(&ready));
  if (queue_.empty()) return std::nullopt;
  Batch batch = std::move(queue_.front());
  queue_.pop_front();
  return batch;
}

}  // namespace trainyard::trainer
