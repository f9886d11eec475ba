#include "common/job_spec.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <initializer_list>
#include <limits>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/restart_reason.h"
#include "common/uri.h"
#include "common/yaml_fields.h"
#include "yaml-cpp/yaml.h"

namespace trainyard {
namespace {

using trainyard::v1::JobSpec;

constexpr int kMaxNameLength = 63;
constexpr double kDefaultLr = 0.01;
constexpr double kDefaultBeta1 = 0.9;
constexpr double kDefaultBeta2 = 0.999;
constexpr double kDefaultEps = 1e-8;
constexpr double kDefaultAdamwWeightDecay = 0.01;
constexpr int kDefaultKeepLast = 3;
constexpr int kDefaultLogEverySteps = 10;
constexpr int kDefaultBatchSize = 32;
constexpr int64_t kDefaultCollectiveTimeoutSeconds = 60;
constexpr int kDefaultBucketSizeMb = 25;

// Reads `map[key]` with `reader` and hands it to `setter` when present and not null; a missing
// or null key leaves the field untouched.
template <typename T, typename Reader, typename Setter>
absl::Status ReadField(const YAML::Node& map, absl::string_view path, const char* key,
                       Reader reader, Setter setter) {
  const YAML::Node node = map[key];
  if (!IsSet(node)) return absl::OkStatus();
  const std::string field = Child(path, key);
  absl::StatusOr<T> value = reader(node, field);
  if (!value.ok()) return value.status();
  return setter(*value, field);
}

// A setter that cannot fail.
template <typename T, typename Fn>
auto Set(Fn fn) {
  return [fn](const T& value, const std::string&) {
    fn(value);
    return absl::OkStatus();
  };
}

template <typename Fn>
absl::Status String(const YAML::Node& map, absl::string_view path, const char* key, Fn fn) {
  return ReadField<std::string>(map, path, key, ReadString, Set<std::string>(fn));
}

// The pointer is taken even when the key is absent: not for oneof members, which that would set.
absl::Status String(const YAML::Node& map, absl::string_view path, const char* key,
                    std::string* out) {
  return String(map, path, key, [out](const std::string& v) { *out = v; });
}

template <typename Fn>
absl::Status Int64(const YAML::Node& map, absl::string_view path, const char* key, Fn fn) {
  return ReadField<int64_t>(map, path, key, ReadInt64, Set<int64_t>(fn));
}

template <typename Fn>
absl::Status Int32(const YAML::Node& map, absl::string_view path, const char* key, Fn fn) {
  return ReadField<int32_t>(map, path, key, ReadInt32, Set<int32_t>(fn));
}

template <typename Fn>
absl::Status Double(const YAML::Node& map, absl::string_view path, const char* key, Fn fn) {
  return ReadField<double>(map, path, key, ReadDouble, Set<double>(fn));
}

// Fields whose zero means "use the default": an explicit zero or less is refused here, because
// after ApplyJobSpecDefaults it could no longer be told apart from "unset".
template <typename T, typename Fn>
absl::Status Positive(const YAML::Node& map, absl::string_view path, const char* key,
                      absl::string_view problem, Fn fn) {
  auto reader = [](const YAML::Node& node, absl::string_view field) -> absl::StatusOr<T> {
    if constexpr (std::is_same_v<T, double>) {
      return ReadDouble(node, field);
    } else if constexpr (std::is_same_v<T, int64_t>) {
      return ReadInt64(node, field);
    } else {
      return ReadInt32(node, field);
    }
  };
  return ReadField<T>(map, path, key, reader,
                      [fn, problem](const T& value, const std::string& field) {
                        if (value <= 0) return FieldError(field, problem);
                        fn(value);
                        return absl::OkStatus();
                      });
}

class SpecParser {
 public:
  explicit SpecParser(JobSpec& spec) : spec_(spec) {}

  absl::Status Parse(const YAML::Node& root) {
    if (!IsSet(root)) return FieldError("spec", "the job spec is empty");
    TY_RETURN_IF_ERROR(ExpectMap(root, "spec"));
    TY_RETURN_IF_ERROR(CheckKeys(root, "",
                                 {"name",
                                  "strategy",
                                  "workers",
                                  "resources",
                                  "parameter_servers",
                                  "model",
                                  "data",
                                  "batch_size",
                                  "optimizer",
                                  "loss",
                                  "max_steps",
                                  "epochs",
                                  "seed",
                                  "checkpoint",
                                  "restart",
                                  "priority",
                                  "max_runtime",
                                  "log_every_steps",
                                  "collective_timeout",
                                  "stall_timeout",
                                  "accumulate_steps",
                                  "bucket_size_mb",
                                  "stop_at_step",
                                  "distill",
                                  "precision"}));
    TY_RETURN_IF_ERROR(String(root, "", "name", spec_.mutable_name()));
    TY_RETURN_IF_ERROR(ParseStrategy(root["strategy"]));
    TY_RETURN_IF_ERROR(ParseWorkers(root["workers"]));
    TY_RETURN_IF_ERROR(ParseResources(root["resources"]));
    TY_RETURN_IF_ERROR(ParseParameterServers(root["parameter_servers"]));
    TY_RETURN_IF_ERROR(ParseModel(root["model"]));
    TY_RETURN_IF_ERROR(ParseData(root["data"]));
    TY_RETURN_IF_ERROR(Positive<int32_t>(root, "", "batch_size", "must be > 0",
                                         [this](int32_t v) { spec_.set_batch_size(v); }));
    TY_RETURN_IF_ERROR(ParseOptimizer(root["optimizer"]));
    TY_RETURN_IF_ERROR(String(root, "", "loss", spec_.mutable_loss()));
    TY_RETURN_IF_ERROR(Int64(root, "", "max_steps", [this](int64_t v) { spec_.set_max_steps(v); }));
    TY_RETURN_IF_ERROR(Int32(root, "", "epochs", [this](int32_t v) { spec_.set_epochs(v); }));
    TY_RETURN_IF_ERROR(
        Int64(root, "", "stop_at_step", [this](int64_t v) { spec_.set_stop_at_step(v); }));
    TY_RETURN_IF_ERROR(Int64(root, "", "seed", [this](int64_t v) { spec_.set_seed(v); }));
    TY_RETURN_IF_ERROR(ParseCheckpoint(root["checkpoint"]));
    TY_RETURN_IF_ERROR(ParseRestart(root["restart"]));
    TY_RETURN_IF_ERROR(ParseDistill(root["distill"]));
    TY_RETURN_IF_ERROR(ParsePrecision(root["precision"]));
    TY_RETURN_IF_ERROR(Int32(root, "", "priority", [this](int32_t v) { spec_.set_priority(v); }));
    TY_RETURN_IF_ERROR(ParseDuration(root["max_runtime"], "max_runtime",
                                     [this](int64_t v) { spec_.set_max_runtime_seconds(v); }));
    TY_RETURN_IF_ERROR(
        ParseDuration(root["collective_timeout"], "collective_timeout",
                      [this](int64_t v) { spec_.set_collective_timeout_seconds(v); }));
    TY_RETURN_IF_ERROR(ParseDuration(root["stall_timeout"], "stall_timeout",
                                     [this](int64_t v) { spec_.set_stall_timeout_seconds(v); }));
    TY_RETURN_IF_ERROR(Positive<int32_t>(root, "", "accumulate_steps", "must be > 0",
                                         [this](int32_t v) { spec_.set_accumulate_steps(v); }));
    TY_RETURN_IF_ERROR(Positive<int32_t>(root, "", "bucket_size_mb", "must be > 0",
                                         [this](int32_t v) { spec_.set_bucket_size_mb(v); }));
    TY_RETURN_IF_ERROR(Positive<int64_t>(root, "", "log_every_steps", "must be > 0",
                                         [this](int64_t v) { spec_.set_log_every_steps(v); }));
    return absl::OkStatus();
  }

 private:
  // A field whose value is one of `choices` (YAML name, enum value): "unknown FIELD 'x',
  // expected a, b or c" otherwise.
  template <typename Enum>
  absl::Status ParseChoice(const YAML::Node& node, const std::string& field,
                           std::initializer_list<std::pair<const char*, Enum>> choices,
                           void (JobSpec::*set)(Enum)) {
    if (!IsSet(node)) return absl::OkStatus();
    absl::StatusOr<std::string> name = ReadString(node, field);
    if (!name.ok()) return name.status();
    std::string expected;
    size_t i = 0;
    for (const auto& [choice, value] : choices) {
      if (*name == choice) {
        (spec_.*set)(value);
        return absl::OkStatus();
      }
      absl::StrAppend(&expected, i == 0 ? "" : (i + 1 == choices.size() ? " or " : ", "), choice);
      ++i;
    }
    return FieldError(field,
                      absl::StrCat("unknown ", field, " '", *name, "', expected ", expected));
  }

  absl::Status ParsePrecision(const YAML::Node& node) {
    return ParseChoice<v1::Precision>(node, "precision",
                                      {{"fp32", v1::FP32}, {"bf16", v1::BF16}, {"fp16", v1::FP16}},
                                      &JobSpec::set_precision);
  }

  absl::Status ParseStrategy(const YAML::Node& node) {
    return ParseChoice<v1::Strategy>(node, "strategy",
                                     {{"single", v1::SINGLE},
                                      {"data_parallel", v1::DATA_PARALLEL},
                                      {"parameter_server", v1::PARAMETER_SERVER}},
                                     &JobSpec::set_strategy);
  }

  absl::Status ParseWorkers(const YAML::Node& node) {
    if (!IsSet(node)) return absl::OkStatus();
    v1::WorkerRange& workers = *spec_.mutable_workers();
    if (node.IsScalar()) {
      absl::StatusOr<int32_t> n = ReadInt32(node, "workers");
      if (!n.ok()) return n.status();
      if (*n < 1) return FieldError("workers", "must be >= 1");
      workers.set_min(*n);
      workers.set_max(*n);
      return absl::OkStatus();
    }
    if (!node.IsMap()) {
      return FieldError("workers",
                        absl::StrCat("expected a number or {min, max}, got ", Describe(node)));
    }
    TY_RETURN_IF_ERROR(CheckKeys(node, "workers", {"min", "max"}));
    TY_RETURN_IF_ERROR(Positive<int32_t>(node, "workers", "min", "must be >= 1",
                                         [&](int32_t v) { workers.set_min(v); }));
    TY_RETURN_IF_ERROR(Positive<int32_t>(node, "workers", "max", "must be >= 1",
                                         [&](int32_t v) { workers.set_max(v); }));
    // {min: 2} is a fixed size; {max: 4} lets the job run on 1 to 4 workers.
    if (workers.max() == 0) workers.set_max(workers.min());
    if (workers.min() == 0) workers.set_min(1);
    return absl::OkStatus();
  }

  // `parameter_servers: N` is {shards: N, mode: sync}.
  absl::Status ParseParameterServers(const YAML::Node& node) {
    if (!IsSet(node)) return absl::OkStatus();
    const std::string path = "parameter_servers";
    v1::ParameterServerSpec& ps = *spec_.mutable_parameter_servers();
    if (node.IsScalar()) {
      absl::StatusOr<int32_t> n = ReadInt32(node, path);
      if (!n.ok()) return n.status();
      if (*n < 1) return FieldError(path, "must be >= 1");
      ps.set_shards(*n);
      return absl::OkStatus();
    }
    if (!node.IsMap()) {
      return FieldError(path, absl::StrCat("expected a number or {shards, mode, max_staleness, "
                                           "dense, slots}, got ",
                                           Describe(node)));
    }
    TY_RETURN_IF_ERROR(
        CheckKeys(node, path, {"shards", "mode", "max_staleness", "dense", "slots"}));
    TY_RETURN_IF_ERROR(Positive<int32_t>(node, path, "shards", "must be >= 1",
                                         [&](int32_t v) { ps.set_shards(v); }));
    TY_RETURN_IF_ERROR(String(node, path, "mode", ps.mutable_mode()));
    TY_RETURN_IF_ERROR(Positive<int32_t>(node, path, "max_staleness",
                                         "must be >= 1 (mode sync keeps workers in lock step)",
                                         [&](int32_t v) { ps.set_max_staleness(v); }));
    TY_RETURN_IF_ERROR(String(node, path, "dense", ps.mutable_dense()));
    return Positive<int32_t>(node, path, "slots", "must be >= 1",
                             [&](int32_t v) { ps.set_slots(v); });
  }

  absl::Status ParseResources(const YAML::Node& node) {
    if (!IsSet(node)) return absl::OkStatus();
    TY_RETURN_IF_ERROR(ExpectMap(node, "resources"));
    TY_RETURN_IF_ERROR(CheckKeys(node, "resources", {"gpus_per_worker"}));
    return Int32(node, "resources", "gpus_per_worker",
                 [this](int32_t v) { spec_.mutable_resources()->set_gpus_per_worker(v); });
  }

  absl::Status ParseModel(const YAML::Node& node) {
    if (!IsSet(node)) return absl::OkStatus();
    TY_RETURN_IF_ERROR(ExpectMap(node, "model"));
    TY_RETURN_IF_ERROR(
        CheckKeys(node, "model", {"builtin", "torchscript", "args", "memory_format"}));
    v1::ModelSpec& model = *spec_.mutable_model();
    if (IsSet(node["builtin"]) && IsSet(node["torchscript"])) {
      return FieldError("model", "set only one of builtin or torchscript");
    }
    TY_RETURN_IF_ERROR(
        String(node, "model", "builtin", [&](const std::string& v) { model.set_builtin(v); }));
    TY_RETURN_IF_ERROR(String(node, "model", "torchscript",
                              [&](const std::string& v) { model.set_torchscript(v); }));
    TY_RETURN_IF_ERROR(String(node, "model", "memory_format",
                              [&](const std::string& v) { model.set_memory_format(v); }));
    const YAML::Node args = node["args"];
    if (!IsSet(args)) return absl::OkStatus();
    TY_RETURN_IF_ERROR(ExpectMap(args, "model.args"));
    TY_RETURN_IF_ERROR(CheckKeys(
        args, "model.args",
        {"inputs", "hidden", "classes", "channels", "height", "width", "dropout", "vocab", "dim"}));
    v1::ModelArgs& out = *model.mutable_args();
    const std::string path = "model.args";
    TY_RETURN_IF_ERROR(Int32(args, path, "inputs", [&](int32_t v) { out.set_inputs(v); }));
    TY_RETURN_IF_ERROR(Int32(args, path, "classes", [&](int32_t v) { out.set_classes(v); }));
    TY_RETURN_IF_ERROR(Int32(args, path, "channels", [&](int32_t v) { out.set_channels(v); }));
    TY_RETURN_IF_ERROR(Int32(args, path, "height", [&](int32_t v) { out.set_height(v); }));
    TY_RETURN_IF_ERROR(Int32(args, path, "width", [&](int32_t v) { out.set_width(v); }));
    TY_RETURN_IF_ERROR(
        Double(args, path, "dropout", [&](double v) { out.set_dropout(static_cast<float>(v)); }));
    TY_RETURN_IF_ERROR(Int32(args, path, "dim", [&](int32_t v) { out.set_dim(v); }));
    TY_RETURN_IF_ERROR(Int64List(args["vocab"], "model.args.vocab", out.mutable_vocab()));
    const YAML::Node hidden = args["hidden"];
    if (IsSet(hidden)) {
      if (hidden.IsScalar()) {
        absl::StatusOr<int32_t> v = ReadInt32(hidden, "model.args.hidden");
        if (!v.ok()) return v.status();
        out.add_hidden(*v);
      } else if (hidden.IsSequence()) {
        for (size_t i = 0; i < hidden.size(); ++i) {
          absl::StatusOr<int32_t> v =
              ReadInt32(hidden[i], absl::StrCat("model.args.hidden[", i, "]"));
          if (!v.ok()) return v.status();
          out.add_hidden(*v);
        }
      } else {
        return FieldError("model.args.hidden",
                          absl::StrCat("expected a list of integers, got ", Describe(hidden)));
      }
    }
    return absl::OkStatus();
  }

  // A list of integers, or one integer.
  static absl::Status Int64List(const YAML::Node& node, const std::string& path,
                                google::protobuf::RepeatedField<int64_t>* out) {
    if (!IsSet(node)) return absl::OkStatus();
    if (node.IsScalar()) {
      absl::StatusOr<int64_t> v = ReadInt64(node, path);
      if (!v.ok()) return v.status();
      out->Add(*v);
      return absl::OkStatus();
    }
    if (!node.IsSequence()) {
      return FieldError(path, absl::StrCat("expected a list of integers, got ", Describe(node)));
    }
    for (size_t i = 0; i < node.size(); ++i) {
      absl::StatusOr<int64_t> v = ReadInt64(node[i], absl::StrCat(path, "[", i, "]"));
      if (!v.ok()) return v.status();
      out->Add(*v);
    }
    return absl::OkStatus();
  }

  absl::Status ParseData(const YAML::Node& node) {
    if (!IsSet(node)) return absl::OkStatus();
    TY_RETURN_IF_ERROR(ExpectMap(node, "data"));
    TY_RETURN_IF_ERROR(
        CheckKeys(node, "data",
                  {"train", "synthetic", "features", "labels", "categorical", "validation_split",
                   "shuffle", "shuffle_window", "validation", "feature_scale", "feature_offset",
                   "prefetch_shards", "fetch_threads"}));
    v1::DataSpec& data = *spec_.mutable_data();
    if (IsSet(node["train"]) && IsSet(node["synthetic"])) {
      return FieldError("data", "set only one of train or synthetic");
    }
    TY_RETURN_IF_ERROR(String(node, "data", "train", data.mutable_train()));
    TY_RETURN_IF_ERROR(String(node, "data", "features", data.mutable_features()));
    TY_RETURN_IF_ERROR(String(node, "data", "labels", data.mutable_labels()));
    TY_RETURN_IF_ERROR(String(node, "data", "categorical", data.mutable_categorical()));
    TY_RETURN_IF_ERROR(Double(node, "data", "validation_split",
                              [&](double v) { data.set_validation_split(static_cast<float>(v)); }));
    TY_RETURN_IF_ERROR(ReadField<bool>(node, "data", "shuffle", ReadBool,
                                       Set<bool>([&](bool v) { data.set_shuffle(v); })));
    TY_RETURN_IF_ERROR(
        Int64(node, "data", "shuffle_window", [&](int64_t v) { data.set_shuffle_window(v); }));
    TY_RETURN_IF_ERROR(Double(node, "data", "feature_scale",
                              [&](double v) { data.set_feature_scale(static_cast<float>(v)); }));
    TY_RETURN_IF_ERROR(Double(node, "data", "feature_offset",
                              [&](double v) { data.set_feature_offset(static_cast<float>(v)); }));
    TY_RETURN_IF_ERROR(
        Int32(node, "data", "prefetch_shards", [&](int32_t v) { data.set_prefetch_shards(v); }));
    TY_RETURN_IF_ERROR(
        Int32(node, "data", "fetch_threads", [&](int32_t v) { data.set_fetch_threads(v); }));
    const YAML::Node validation = node["validation"];
    if (IsSet(validation)) {
      TY_RETURN_IF_ERROR(ExpectMap(validation, "data.validation"));
      TY_RETURN_IF_ERROR(
          CheckKeys(validation, "data.validation", {"every_steps", "every_epoch", "max_samples"}));
      v1::ValidationSpec& v = *data.mutable_validation();
      const std::string path = "data.validation";
      TY_RETURN_IF_ERROR(
          Int64(validation, path, "every_steps", [&](int64_t x) { v.set_every_steps(x); }));
      TY_RETURN_IF_ERROR(ReadField<bool>(validation, path, "every_epoch", ReadBool,
                                         Set<bool>([&](bool x) { v.set_every_epoch(x); })));
      TY_RETURN_IF_ERROR(
          Int64(validation, path, "max_samples", [&](int64_t x) { v.set_max_samples(x); }));
    }
    const YAML::Node synthetic = node["synthetic"];
    if (!synthetic.IsDefined()) return absl::OkStatus();
    if (synthetic.IsNull()) {
      data.mutable_synthetic();
      return absl::OkStatus();
    }
    TY_RETURN_IF_ERROR(ExpectMap(synthetic, "data.synthetic"));
    TY_RETURN_IF_ERROR(CheckKeys(synthetic, "data.synthetic",
                                 {"samples", "features", "classes", "noise", "vocab"}));
    v1::SyntheticData& out = *data.mutable_synthetic();
    const std::string path = "data.synthetic";
    TY_RETURN_IF_ERROR(Int64(synthetic, path, "samples", [&](int64_t v) { out.set_samples(v); }));
    TY_RETURN_IF_ERROR(Int32(synthetic, path, "features", [&](int32_t v) { out.set_features(v); }));
    TY_RETURN_IF_ERROR(Int32(synthetic, path, "classes", [&](int32_t v) { out.set_classes(v); }));
    TY_RETURN_IF_ERROR(
        Double(synthetic, path, "noise", [&](double v) { out.set_noise(static_cast<float>(v)); }));
    return Int64List(synthetic["vocab"], "data.synthetic.vocab", out.mutable_vocab());
  }

  absl::Status ParseOptimizer(const YAML::Node& node) {
    if (!IsSet(node)) return absl::OkStatus();
    v1::OptimizerSpec& opt = *spec_.mutable_optimizer();
    if (node.IsScalar()) {  // optimizer: adam
      opt.set_name(node.Scalar());
      ApplyYamlOnlyOptimizerDefaults(/*weight_decay_set=*/false);
      return absl::OkStatus();
    }
    TY_RETURN_IF_ERROR(ExpectMap(node, "optimizer"));
    TY_RETURN_IF_ERROR(CheckKeys(
        node, "optimizer",
        {"name", "lr", "momentum", "nesterov", "weight_decay", "betas", "eps", "schedule"}));
    const std::string path = "optimizer";
    TY_RETURN_IF_ERROR(String(node, path, "name", opt.mutable_name()));
    TY_RETURN_IF_ERROR(
        Positive<double>(node, path, "lr", "must be > 0", [&](double v) { opt.set_lr(v); }));
    TY_RETURN_IF_ERROR(Double(node, path, "momentum", [&](double v) { opt.set_momentum(v); }));
    TY_RETURN_IF_ERROR(ReadField<bool>(node, path, "nesterov", ReadBool,
                                       Set<bool>([&](bool v) { opt.set_nesterov(v); })));
    TY_RETURN_IF_ERROR(
        Double(node, path, "weight_decay", [&](double v) { opt.set_weight_decay(v); }));
    TY_RETURN_IF_ERROR(
        Positive<double>(node, path, "eps", "must be > 0", [&](double v) { opt.set_eps(v); }));
    const YAML::Node betas = node["betas"];
    if (IsSet(betas)) {
      if (!betas.IsSequence() || betas.size() != 2) {
        return FieldError("optimizer.betas",
                          absl::StrCat("expected a list of 2 numbers, got ", Describe(betas)));
      }
      absl::StatusOr<double> b1 = ReadDouble(betas[0], "optimizer.betas[0]");
      if (!b1.ok()) return b1.status();
      absl::StatusOr<double> b2 = ReadDouble(betas[1], "optimizer.betas[1]");
      if (!b2.ok()) return b2.status();
      opt.set_beta1(*b1);
      opt.set_beta2(*b2);
    }
    TY_RETURN_IF_ERROR(ParseSchedule(node["schedule"]));
    ApplyYamlOnlyOptimizerDefaults(IsSet(node["weight_decay"]));
    return absl::OkStatus();
  }

  // AdamW decays by 0.01 unless the spec says otherwise. Done here rather than in
  // ApplyJobSpecDefaults so that an explicit "weight_decay: 0" keeps its meaning.
  void ApplyYamlOnlyOptimizerDefaults(bool weight_decay_set) {
    v1::OptimizerSpec& opt = *spec_.mutable_optimizer();
    if (opt.name() == "adamw" && !weight_decay_set) opt.set_weight_decay(kDefaultAdamwWeightDecay);
  }

  absl::Status ParseSchedule(const YAML::Node& node) {
    if (!IsSet(node)) return absl::OkStatus();
    v1::LrSchedule& schedule = *spec_.mutable_optimizer()->mutable_schedule();
    if (node.IsScalar()) {  // schedule: cosine
      schedule.set_name(node.Scalar());
      return absl::OkStatus();
    }
    const std::string path = "optimizer.schedule";
    TY_RETURN_IF_ERROR(ExpectMap(node, path));
    TY_RETURN_IF_ERROR(CheckKeys(node, path, {"name", "warmup_steps", "min_lr"}));
    TY_RETURN_IF_ERROR(String(node, path, "name", schedule.mutable_name()));
    TY_RETURN_IF_ERROR(
        Int64(node, path, "warmup_steps", [&](int64_t v) { schedule.set_warmup_steps(v); }));
    TY_RETURN_IF_ERROR(Double(node, path, "min_lr", [&](double v) { schedule.set_min_lr(v); }));
    return absl::OkStatus();
  }

  absl::Status ParseCheckpoint(const YAML::Node& node) {
    if (!IsSet(node)) return absl::OkStatus();
    const std::string path = "checkpoint";
    TY_RETURN_IF_ERROR(ExpectMap(node, path));
    TY_RETURN_IF_ERROR(CheckKeys(node, path, {"uri", "every_steps", "keep_last", "resume_from"}));
    v1::CheckpointSpec& ckpt = *spec_.mutable_checkpoint();
    TY_RETURN_IF_ERROR(String(node, path, "uri", ckpt.mutable_uri()));
    TY_RETURN_IF_ERROR(
        Int64(node, path, "every_steps", [&](int64_t v) { ckpt.set_every_steps(v); }));
    TY_RETURN_IF_ERROR(Positive<int32_t>(node, path, "keep_last", "must be >= 1",
                                         [&](int32_t v) { ckpt.set_keep_last(v); }));
    TY_RETURN_IF_ERROR(String(node, path, "resume_from", ckpt.mutable_resume_from()));
    return absl::OkStatus();
  }

  // Every key is required: no temperature or weight suits every teacher, and an alpha of 0 (the
  // teacher ignored) could not be told from one left out.
  absl::Status ParseDistill(const YAML::Node& node) {
    if (!IsSet(node)) return absl::OkStatus();
    const std::string path = "distill";
    TY_RETURN_IF_ERROR(ExpectMap(node, path));
    TY_RETURN_IF_ERROR(CheckKeys(node, path, {"teacher", "temperature", "alpha"}));
    for (const char* key : {"teacher", "temperature", "alpha"}) {
      if (!IsSet(node[key])) return FieldError(Child(path, key), "required");
    }
    v1::DistillSpec& distill = *spec_.mutable_distill();
    TY_RETURN_IF_ERROR(String(node, path, "teacher", distill.mutable_teacher()));
    TY_RETURN_IF_ERROR(Positive<double>(node, path, "temperature", "must be > 0",
                                        [&](double v) { distill.set_temperature(v); }));
    return Double(node, path, "alpha", [&](double v) { distill.set_alpha(v); });
  }

  absl::Status ParseRestart(const YAML::Node& node) {
    if (!IsSet(node)) return absl::OkStatus();
    const std::string path = "restart";
    TY_RETURN_IF_ERROR(ExpectMap(node, path));
    TY_RETURN_IF_ERROR(
        CheckKeys(node, path, {"max_failures", "max_preemptions", "max_infrastructure_errors"}));
    v1::RestartPolicy& restart = *spec_.mutable_restart();
    TY_RETURN_IF_ERROR(
        Int32(node, path, "max_failures", [&](int32_t v) { restart.set_max_failures(v); }));
    TY_RETURN_IF_ERROR(
        Int32(node, path, "max_preemptions", [&](int32_t v) { restart.set_max_preemptions(v); }));
    TY_RETURN_IF_ERROR(Int32(node, path, "max_infrastructure_errors",
                             [&](int32_t v) { restart.set_max_infrastructure_errors(v); }));
    return absl::OkStatus();
  }

  // A duration ("12h", see ParseDurationSeconds) or plain seconds.
  template <typename Fn>
  absl::Status ParseDuration(const YAML::Node& node, const std::string& field, Fn set) {
    if (!IsSet(node)) return absl::OkStatus();
    if (!node.IsScalar()) {
      return FieldError(field,
                        absl::StrCat("expected a duration such as 12h, got ", Describe(node)));
    }
    int64_t seconds;
    if (!absl::SimpleAtoi(node.Scalar(), &seconds)) {
      absl::StatusOr<int64_t> parsed = ParseDurationSeconds(node.Scalar());
      if (!parsed.ok()) return FieldError(field, parsed.status().message());
      seconds = *parsed;
    }
    set(seconds);
    return absl::OkStatus();
  }

  JobSpec& spec_;
};

bool ValidName(absl::string_view name) {
  if (name.empty() || name.size() > kMaxNameLength) return false;
  if (name[0] < 'a' || name[0] > 'z') return false;
  for (char c : name) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) return false;
  }
  return true;
}

absl::Status ValidateModel(const v1::ModelSpec& model) {
  switch (model.source_case()) {
    case v1::ModelSpec::SOURCE_NOT_SET:
      return FieldError("model", "set builtin or torchscript");
    case v1::ModelSpec::kTorchscript:
      if (model.torchscript().empty()) return FieldError("model.torchscript", "must not be empty");
      break;
    case v1::ModelSpec::kBuiltin:
      break;
  }
  if (!model.memory_format().empty() && model.memory_format() != "contiguous" &&
      model.memory_format() != "channels_last") {
    return FieldError("model.memory_format",
                      absl::StrCat("unknown memory format '", model.memory_format(),
                                   "', expected contiguous or channels_last"));
  }
  if (model.memory_format() == "channels_last" && model.source_case() == v1::ModelSpec::kBuiltin &&
      model.builtin() != "cnn") {
    return FieldError("model.memory_format",
                      "channels_last is for convolutional models (cnn, or a TorchScript model with "
                      "4-D weights)");
  }
  const v1::ModelArgs& args = model.args();
  for (int i = 0; i < args.hidden_size(); ++i) {
    if (args.hidden(i) <= 0)
      return FieldError(absl::StrCat("model.args.hidden[", i, "]"), "must be > 0");
  }
  if (!(args.dropout() >= 0 && args.dropout() < 1)) {
    return FieldError("model.args.dropout", "must be in [0, 1)");
  }
  const bool embedding =
      model.source_case() == v1::ModelSpec::kBuiltin && model.builtin() == "embedding_mlp";
  if (!embedding && args.vocab_size() > 0) {
    return FieldError("model.args.vocab", "only for model embedding_mlp");
  }
  if (!embedding && args.dim() != 0) {
    return FieldError("model.args.dim", "only for model embedding_mlp");
  }
  if (model.source_case() != v1::ModelSpec::kBuiltin) return absl::OkStatus();
  if (embedding) {
    if (args.vocab_size() == 0) {
      return FieldError("model.args.vocab",
                        "embedding_mlp needs the rows of each table, one per categorical field");
    }
    for (int i = 0; i < args.vocab_size(); ++i) {
      if (args.vocab(i) <= 0 || args.vocab(i) > kMaxEmbeddingRows) {
        return FieldError(absl::StrCat("model.args.vocab[", i, "]"),
                          absl::StrCat("must be in [1, ", kMaxEmbeddingRows, "]"));
      }
    }
    if (args.dim() <= 0) return FieldError("model.args.dim", "must be > 0 for embedding_mlp");
    if (args.inputs() < 0) return FieldError("model.args.inputs", "must be >= 0");
    if (args.classes() <= 0) {
      return FieldError("model.args.classes", "must be > 0 for embedding_mlp");
    }
  } else if (model.builtin() == "mlp") {
    if (args.inputs() <= 0) return FieldError("model.args.inputs", "must be > 0 for mlp");
    if (args.classes() <= 0) return FieldError("model.args.classes", "must be > 0 for mlp");
  } else if (model.builtin() == "cnn") {
    if (args.channels() <= 0) return FieldError("model.args.channels", "must be > 0 for cnn");
    if (args.height() <= 0) return FieldError("model.args.height", "must be > 0 for cnn");
    if (args.width() <= 0) return FieldError("model.args.width", "must be > 0 for cnn");
    if (args.classes() <= 0) return FieldError("model.args.classes", "must be > 0 for cnn");
  } else {
    return FieldError("model.builtin", absl::StrCat("unknown model '", model.builtin(),
                                                    "', expected mlp, cnn or embedding_mlp"));
  }
  return absl::OkStatus();
}

absl::Status ValidateData(const v1::DataSpec& data) {
  const bool has_train = !data.train().empty();
  if (!has_train && !data.has_synthetic()) return FieldError("data", "set train or synthetic");
  if (has_train && data.has_synthetic()) {
    return FieldError("data", "set only one of train or synthetic");
  }
  if (data.has_synthetic()) {
    const v1::SyntheticData& s = data.synthetic();
    if (s.samples() <= 0) return FieldError("data.synthetic.samples", "must be > 0");
    if (s.features() <= 0) return FieldError("data.synthetic.features", "must be > 0");
    if (s.classes() <= 0) return FieldError("data.synthetic.classes", "must be > 0");
    if (!(s.noise() >= 0)) return FieldError("data.synthetic.noise", "must be >= 0");
    for (int i = 0; i < s.vocab_size(); ++i) {
      if (s.vocab(i) <= 0) {
        return FieldError(absl::StrCat("data.synthetic.vocab[", i, "]"), "must be > 0");
      }
    }
    if (!data.categorical().empty()) {
      return FieldError("data.categorical",
                        "names a tensor of data.train's files; data.synthetic has vocab instead");
    }
  }
  if (data.features().empty()) return FieldError("data.features", "must not be empty");
  if (data.labels().empty()) return FieldError("data.labels", "must not be empty");
  if (!(data.validation_split() >= 0 && data.validation_split() < 1)) {
    return FieldError("data.validation_split", "must be in [0, 1)");
  }
  if (data.shuffle_window() < 0) return FieldError("data.shuffle_window", "must be >= 0");
  if (data.shuffle_window() > 0 && data.train().empty()) {
    return FieldError("data.shuffle_window", "windows of shards need data.train");
  }
  if (data.has_feature_scale() && !std::isfinite(data.feature_scale())) {
    return FieldError("data.feature_scale", "must be a finite number");
  }
  if (!std::isfinite(data.feature_offset())) {
    return FieldError("data.feature_offset", "must be a finite number");
  }
  if (data.prefetch_shards() < 0 || data.prefetch_shards() > 64) {
    return FieldError("data.prefetch_shards", "must be in [0, 64]");
  }
  if (data.fetch_threads() < 0 || data.fetch_threads() > 64) {
    return FieldError("data.fetch_threads", "must be in [0, 64]");
  }
  const v1::ValidationSpec& validation = data.validation();
  if (validation.every_steps() < 0) {
    return FieldError("data.validation.every_steps", "must be >= 0");
  }
  if (validation.max_samples() < 0) {
    return FieldError("data.validation.max_samples", "must be >= 0");
  }
  if (data.has_validation() && data.validation_split() == 0) {
    return FieldError("data.validation", "needs data.validation_split > 0");
  }
  return absl::OkStatus();
}

// embedding_mlp reads categorical ids, and only it does.
absl::Status ValidateCategorical(const v1::ModelSpec& model, const v1::DataSpec& data) {
  const bool embedding =
      model.source_case() == v1::ModelSpec::kBuiltin && model.builtin() == "embedding_mlp";
  const v1::SyntheticData& synthetic = data.synthetic();
  if (!embedding) {
    if (!data.categorical().empty()) {
      return FieldError("data.categorical", "only for model embedding_mlp");
    }
    if (synthetic.vocab_size() > 0) {
      return FieldError("data.synthetic.vocab", "only for model embedding_mlp");
    }
    return absl::OkStatus();
  }
  const v1::ModelArgs& args = model.args();
  if (data.has_synthetic()) {
    if (synthetic.vocab_size() != args.vocab_size()) {
      return FieldError("data.synthetic.vocab",
                        absl::StrCat("has ", synthetic.vocab_size(), " fields; model.args.vocab ",
                                     args.vocab_size()));
    }
    for (int i = 0; i < synthetic.vocab_size(); ++i) {
      if (synthetic.vocab(i) > args.vocab(i)) {
        return FieldError(absl::StrCat("data.synthetic.vocab[", i, "]"),
                          absl::StrCat(synthetic.vocab(i), " ids do not fit the ", args.vocab(i),
                                       " rows of model.args.vocab[", i, "]"));
      }
    }
  } else if (data.categorical().empty()) {
    return FieldError("data.categorical",
                      "embedding_mlp needs the name of the tensor of categorical ids");
  }
  return absl::OkStatus();
}

absl::Status ValidateDistill(const v1::JobSpec& spec) {
  if (!spec.has_distill()) return absl::OkStatus();
  const v1::DistillSpec& distill = spec.distill();
  if (distill.teacher().empty()) return FieldError("distill.teacher", "must not be empty");
  if (!(distill.temperature() > 0) || !std::isfinite(distill.temperature())) {
    return FieldError("distill.temperature", "must be > 0");
  }
  if (!(distill.alpha() >= 0 && distill.alpha() <= 1)) {
    return FieldError("distill.alpha", "must be in [0, 1]");
  }
  // The teacher's targets are a distribution over classes.
  if (spec.loss() != "cross_entropy") {
    return FieldError("distill",
                      absl::StrCat("only with loss cross_entropy, not '", spec.loss(), "'"));
  }
  return absl::OkStatus();
}

absl::Status ValidateOptimizer(const v1::OptimizerSpec& opt) {
  if (opt.name() != "sgd" && opt.name() != "adam" && opt.name() != "adamw") {
    return FieldError("optimizer.name", absl::StrCat("unknown optimizer '", opt.name(),
                                                     "', expected sgd, adam or adamw"));
  }
  if (!(opt.lr() > 0)) return FieldError("optimizer.lr", "must be > 0");
  if (!(opt.momentum() >= 0)) return FieldError("optimizer.momentum", "must be >= 0");
  if (opt.nesterov() && (opt.name() != "sgd" || opt.momentum() <= 0)) {
    return FieldError("optimizer.nesterov", "needs optimizer sgd with momentum > 0");
  }
  if (!(opt.weight_decay() >= 0)) return FieldError("optimizer.weight_decay", "must be >= 0");
  if (!(opt.beta1() >= 0 && opt.beta1() < 1)) {
    return FieldError("optimizer.betas[0]", "must be in [0, 1)");
  }
  if (!(opt.beta2() >= 0 && opt.beta2() < 1)) {
    return FieldError("optimizer.betas[1]", "must be in [0, 1)");
  }
  if (!(opt.eps() >= 0)) return FieldError("optimizer.eps", "must be >= 0");
  const v1::LrSchedule& schedule = opt.schedule();
  if (schedule.name() != "constant" && schedule.name() != "cosine") {
    return FieldError("optimizer.schedule.name", absl::StrCat("unknown schedule '", schedule.name(),
                                                              "', expected constant or cosine"));
  }
  if (schedule.warmup_steps() < 0) {
    return FieldError("optimizer.schedule.warmup_steps", "must be >= 0");
  }
  if (!(schedule.min_lr() >= 0)) return FieldError("optimizer.schedule.min_lr", "must be >= 0");
  if (schedule.min_lr() > opt.lr()) {
    return FieldError("optimizer.schedule.min_lr", "must be <= optimizer.lr");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<JobSpec> ParseJobSpecYaml(absl::string_view yaml) {
  JobSpec spec;
  absl::Status parsed = ParseYamlDocument(
      yaml, [&spec](const YAML::Node& root) { return SpecParser(spec).Parse(root); });
  if (!parsed.ok()) return parsed;
  ApplyJobSpecDefaults(spec);
  absl::Status status = ValidateJobSpec(spec);
  if (!status.ok()) return status;
  return spec;
}

void ApplyJobSpecDefaults(JobSpec& spec) {
  if (spec.strategy() == v1::STRATEGY_UNSPECIFIED) spec.set_strategy(v1::SINGLE);
  if (spec.precision() == v1::PRECISION_UNSPECIFIED) spec.set_precision(v1::FP32);
  if (spec.has_model() && spec.model().memory_format().empty()) {
    spec.mutable_model()->set_memory_format("contiguous");
  }
  v1::WorkerRange& workers = *spec.mutable_workers();
  if (workers.min() == 0 && workers.max() == 0) {
    workers.set_min(1);
    workers.set_max(1);
  } else if (workers.max() == 0) {
    workers.set_max(workers.min());
  } else if (workers.min() == 0) {
    workers.set_min(1);
  }
  if (spec.strategy() == v1::PARAMETER_SERVER) {
    v1::ParameterServerSpec& ps = *spec.mutable_parameter_servers();
    if (ps.shards() == 0) ps.set_shards(1);
    if (ps.mode().empty()) ps.set_mode("sync");
    if (ps.mode() == "async" && ps.max_staleness() == 0) {
      ps.set_max_staleness(kDefaultMaxStaleness);
    }
    if (ps.dense().empty()) ps.set_dense("shards");
    if (ps.slots() == 0) ps.set_slots(1);
  }
  if (spec.loss().empty()) spec.set_loss("cross_entropy");
  v1::DataSpec& data = *spec.mutable_data();
  if (data.features().empty()) data.set_features("x");
  if (data.labels().empty()) data.set_labels("y");
  if (!data.has_shuffle()) data.set_shuffle(true);
  if (data.prefetch_shards() == 0) data.set_prefetch_shards(kDefaultPrefetchShards);
  v1::OptimizerSpec& opt = *spec.mutable_optimizer();
  if (opt.name().empty()) opt.set_name("sgd");
  if (opt.lr() == 0) opt.set_lr(kDefaultLr);
  if (opt.name() == "adam" || opt.name() == "adamw") {
    if (opt.beta1() == 0 && opt.beta2() == 0) {
      opt.set_beta1(kDefaultBeta1);
      opt.set_beta2(kDefaultBeta2);
    }
    if (opt.eps() == 0) opt.set_eps(kDefaultEps);
  }
  if (opt.schedule().name().empty()) opt.mutable_schedule()->set_name("constant");
  if (spec.checkpoint().keep_last() == 0)
    spec.mutable_checkpoint()->set_keep_last(kDefaultKeepLast);
  if (spec.log_every_steps() == 0) spec.set_log_every_steps(kDefaultLogEverySteps);
  if (spec.batch_size() == 0) spec.set_batch_size(kDefaultBatchSize);
  if (spec.collective_timeout_seconds() == 0) {
    spec.set_collective_timeout_seconds(kDefaultCollectiveTimeoutSeconds);
  }
  if (spec.stall_timeout_seconds() == 0)
    spec.set_stall_timeout_seconds(kDefaultStallTimeoutSeconds);
  if (spec.accumulate_steps() == 0) spec.set_accumulate_steps(1);
  if (spec.bucket_size_mb() == 0) spec.set_bucket_size_mb(kDefaultBucketSizeMb);
  if (!spec.restart().has_max_infrastructure_errors()) {
    spec.mutable_restart()->set_max_infrastructure_errors(kDefaultMaxInfrastructureErrors);
  }
}

namespace {

absl::Status ValidateParameterServers(const v1::ParameterServerSpec& ps) {
  const std::string path = "parameter_servers";
  if (ps.shards() < 1 || ps.shards() > kMaxParameterServerShards) {
    return FieldError(path + ".shards",
                      absl::StrCat("must be between 1 and ", kMaxParameterServerShards));
  }
  if (ps.mode() != "sync" && ps.mode() != "async") {
    return FieldError(path + ".mode", absl::StrCat("must be sync or async, got '", ps.mode(), "'"));
  }
  if (ps.mode() == "sync" && ps.max_staleness() != 0) {
    return FieldError(path + ".max_staleness", "only with mode async");
  }
  if (ps.mode() == "async" && ps.max_staleness() < 1) {
    return FieldError(path + ".max_staleness", "must be >= 1");
  }
  if (ps.dense() != "shards" && ps.dense() != "allreduce") {
    return FieldError(path + ".dense",
                      absl::StrCat("must be shards or allreduce, got '", ps.dense(), "'"));
  }
  if (ps.slots() < 1) return FieldError(path + ".slots", "must be >= 1");
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateJobSpec(const JobSpec& spec) {
  if (spec.name().empty()) return FieldError("name", "required");
  if (!ValidName(spec.name())) return FieldError("name", "must match [a-z][a-z0-9-]{0,62}");

  const v1::Strategy strategy = spec.strategy();
  if (strategy != v1::SINGLE && strategy != v1::DATA_PARALLEL && strategy != v1::PARAMETER_SERVER) {
    return FieldError("strategy", "set single, data_parallel or parameter_server");
  }
  const v1::WorkerRange& workers = spec.workers();
  if (workers.min() < 1) return FieldError("workers.min", "must be >= 1");
  if (workers.min() > workers.max()) return FieldError("workers", "min must be <= max");
  if (strategy == v1::SINGLE && workers.max() != 1) {
    return FieldError("workers", "strategy single runs exactly 1 worker");
  }
  if (spec.resources().gpus_per_worker() < 0) {
    return FieldError("resources.gpus_per_worker", "must be >= 0");
  }
  if (spec.has_parameter_servers() && strategy != v1::PARAMETER_SERVER) {
    return FieldError("parameter_servers", "only with strategy parameter_server");
  }
  if (strategy == v1::PARAMETER_SERVER) {
    absl::Status status = ValidateParameterServers(spec.parameter_servers());
    if (!status.ok()) return status;
    if (spec.parameter_servers().dense() == "allreduce" &&
        spec.model().builtin() != "embedding_mlp") {
      return FieldError("parameter_servers.dense",
                        "allreduce keeps only embedding tables on the shards, and only model "
                        "embedding_mlp has them; use strategy: data_parallel");
    }
  }

  absl::Status status = ValidateModel(spec.model());
  if (!status.ok()) return status;
  status = ValidateData(spec.data());
  if (!status.ok()) return status;
  status = ValidateCategorical(spec.model(), spec.data());
  if (!status.ok()) return status;

  if (spec.batch_size() <= 0) return FieldError("batch_size", "must be > 0");
  if (strategy != v1::SINGLE && spec.batch_size() % workers.max() != 0) {
    return FieldError("batch_size", absl::StrCat(spec.batch_size(), " does not divide across ",
                                                 workers.max(), " workers"));
  }
  status = ValidateOptimizer(spec.optimizer());
  if (!status.ok()) return status;
  if (spec.loss() != "cross_entropy" && spec.loss() != "mse") {
    return FieldError(
        "loss", absl::StrCat("unknown loss '", spec.loss(), "', expected cross_entropy or mse"));
  }
  status = ValidateDistill(spec);
  if (!status.ok()) return status;
  if (spec.precision() == v1::FP16) {
    // float16 on a CPU is emulated and slow, and a job that asked for it must not quietly train
    // in another precision: refused here rather than failed on a worker.
    if (spec.resources().gpus_per_worker() <= 0) {
      return FieldError("precision",
                        "fp16 needs GPUs (resources.gpus_per_worker > 0); on CPUs use bf16");
    }
    if (strategy == v1::PARAMETER_SERVER) {
      return FieldError(
          "precision", "fp16 (with loss scaling) is not supported with parameter_server; use bf16");
    }
  }

  if (spec.max_steps() < 0) return FieldError("max_steps", "must be >= 0");
  if (spec.epochs() < 0) return FieldError("epochs", "must be >= 0");
  if (spec.max_steps() == 0 && spec.epochs() == 0) {
    return FieldError("max_steps", "set max_steps or epochs");
  }
  if (spec.stop_at_step() < 0) return FieldError("stop_at_step", "must be >= 0");
  if (spec.max_steps() > 0 && spec.stop_at_step() > spec.max_steps()) {
    return FieldError("stop_at_step",
                      absl::StrCat("must be <= max_steps (", spec.max_steps(), ")"));
  }

  const v1::CheckpointSpec& ckpt = spec.checkpoint();
  if (!ckpt.uri().empty()) {
    absl::StatusOr<Uri> uri = ParseUri(ckpt.uri());
    if (!uri.ok()) return FieldError("checkpoint.uri", uri.status().message());
  }
  if (ckpt.every_steps() < 0) return FieldError("checkpoint.every_steps", "must be >= 0");
  if (ckpt.keep_last() < 1) return FieldError("checkpoint.keep_last", "must be >= 1");

  const v1::RestartPolicy& restart = spec.restart();
  if (restart.max_failures() < 0) return FieldError("restart.max_failures", "must be >= 0");
  if (restart.has_max_preemptions() && restart.max_preemptions() < 0) {
    return FieldError("restart.max_preemptions", "must be >= 0");
  }
  if (restart.max_infrastructure_errors() < 0) {
    return FieldError("restart.max_infrastructure_errors", "must be >= 0");
  }
  if (spec.max_runtime_seconds() < 0) return FieldError("max_runtime", "must be >= 0");
  if (spec.log_every_steps() < 1) return FieldError("log_every_steps", "must be > 0");
  if (spec.collective_timeout_seconds() < 1) {
    return FieldError("collective_timeout", "must be at least 1s");
  }
  if (spec.stall_timeout_seconds() < 1) return FieldError("stall_timeout", "must be at least 1s");
  if (spec.accumulate_steps() < 1) return FieldError("accumulate_steps", "must be > 0");
  // Each rank splits its share of the batch (smallest with the most workers) into micro-batches.
  if (spec.batch_size() / workers.max() < spec.accumulate_steps()) {
    return FieldError(
        "accumulate_steps",
        absl::StrCat(spec.accumulate_steps(), " micro-batches do not fit in a rank's ",
                     spec.batch_size() / workers.max(), " samples"));
  }
  if (spec.bucket_size_mb() < 1) return FieldError("bucket_size_mb", "must be > 0");
  return absl::OkStatus();
}

absl::Status CheckLocalPaths(const v1::JobSpec& spec, const std::vector<std::string>& allowed) {
  const std::pair<const char*, const std::string*> fields[] = {
      {"data.train", &spec.data().train()},
      {"model.torchscript", &spec.model().torchscript()},
      {"distill.teacher", &spec.distill().teacher()},
      {"checkpoint.uri", &spec.checkpoint().uri()}};
  for (const auto& [field, value] : fields) {
    if (value->empty()) continue;
    // Object storage is not the worker's disk; anything else is read from it.
    if (absl::StrContains(*value, "://") && !absl::StartsWith(*value, "file://")) continue;
    absl::StatusOr<std::string> path = LocalPath(*value);
    if (!path.ok()) path = *value;  // a relative path: still the worker's disk
    const std::string where =
        allowed.empty() ? "no local paths are allowed here: use object storage (s3://)"
                        : absl::StrCat("local paths must be under ", absl::StrJoin(allowed, ", "));
    if (!absl::StartsWith(*path, "/")) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": '", *value, "' is not an absolute path; ", where));
    }
    const std::string normal = std::filesystem::path(*path).lexically_normal().string();
    bool inside = false;
    for (const std::string& folder : allowed) {
      const std::string prefix = absl::StrCat(absl::StripSuffix(folder, "/"), "/");
      inside |= absl::StartsWith(normal + "/", prefix);
    }
    if (!inside) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": '", *value,
                                                     "' is outside the "
                                                     "folders this coordinator allows; ",
                                                     where));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> ParseDurationSeconds(absl::string_view text) {
  const auto bad = [&] {
    return absl::InvalidArgumentError(absl::StrCat(
        "invalid duration '", text, "', expected for example 90s, 15m, 12h, 2d or 1h30m"));
  };
  absl::string_view rest = absl::StripAsciiWhitespace(text);
  if (rest.empty()) return bad();
  constexpr struct {
    char unit;
    int64_t seconds;
  } kUnits[] = {{'d', 86400}, {'h', 3600}, {'m', 60}, {'s', 1}};
  int64_t total = 0;
  size_t next_unit = 0;  // units must come largest first, each at most once
  while (!rest.empty()) {
    size_t digits = 0;
    while (digits < rest.size() && absl::ascii_isdigit(rest[digits])) ++digits;
    if (digits == 0 || digits > 12 || digits == rest.size()) return bad();
    int64_t count;
    if (!absl::SimpleAtoi(rest.substr(0, digits), &count)) return bad();
    const char unit = rest[digits];
    rest.remove_prefix(digits + 1);
    size_t i = next_unit;
    while (i < std::size(kUnits) && kUnits[i].unit != unit) ++i;
    if (i == std::size(kUnits)) return bad();
    next_unit = i + 1;
    total += count * kUnits[i].seconds;
    if (total > std::numeric_limits<int64_t>::max() / 2) return bad();
  }
  return total;
}

}  // namespace trainyard
