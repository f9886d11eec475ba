// Reading a job spec from YAML: the fields, their types and their paths in errors. What the
// values mean (defaults, validation) is job_spec.cc's.
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
#include "common/byte_size.h"
#include "common/restart_reason.h"
#include "common/spec/job_spec.h"
#include "common/spec/job_spec_internal.h"
#include "common/spec/yaml_fields.h"
#include "common/storage/uri.h"
#include "yaml-cpp/yaml.h"

namespace trainyard {
namespace {

using trainyard::v1::JobSpec;

constexpr double kDefaultAdamwWeightDecay = 0.01;

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

// A size in bytes: a number, or text with a unit ("4GiB", "512Mi", "2G"). More than zero.
absl::StatusOr<int64_t> ReadByteSize(const YAML::Node& node, absl::string_view field) {
  absl::StatusOr<std::string> text = ReadString(node, field);
  if (!text.ok()) return text.status();
  absl::StatusOr<int64_t> bytes = ParseByteSize(*text);
  if (!bytes.ok()) return FieldError(field, bytes.status().message());
  return *bytes;
}

template <typename Fn>
absl::Status ByteSize(const YAML::Node& map, absl::string_view path, const char* key, Fn fn) {
  return ReadField<int64_t>(map, path, key, ReadByteSize, Set<int64_t>(fn));
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
                                  "pipeline",
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
                                  "queue",
                                  "preemptible",
                                  "max_runtime",
                                  "log_every_steps",
                                  "collective_timeout",
                                  "stall_timeout",
                                  "accumulate_steps",
                                  "bucket_size_mb",
                                  "stop_at_step",
                                  "distill",
                                  "precision",
                                  "cuda_graph",
                                  "program"}));
    TY_RETURN_IF_ERROR(String(root, "", "name", spec_.mutable_name()));
    TY_RETURN_IF_ERROR(ParseStrategy(root["strategy"]));
    TY_RETURN_IF_ERROR(ParseWorkers(root["workers"]));
    TY_RETURN_IF_ERROR(ParseResources(root["resources"]));
    TY_RETURN_IF_ERROR(ParseParameterServers(root["parameter_servers"]));
    TY_RETURN_IF_ERROR(ParsePipeline(root["pipeline"]));
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
    TY_RETURN_IF_ERROR(ParseChoice<v1::Precision>(
        root["precision"], "precision",
        {{"fp32", v1::FP32}, {"tf32", v1::TF32}, {"bf16", v1::BF16}, {"fp16", v1::FP16}},
        &JobSpec::set_precision));
    TY_RETURN_IF_ERROR(ReadField<bool>(root, "", "cuda_graph", ReadBool,
                                       Set<bool>([this](bool v) { spec_.set_cuda_graph(v); })));
    if (IsSet(root["program"])) {
      TY_RETURN_IF_ERROR(
          job_spec_internal::ParseProgram(root["program"], *spec_.mutable_program()));
    }
    TY_RETURN_IF_ERROR(Int32(root, "", "priority", [this](int32_t v) { spec_.set_priority(v); }));
    TY_RETURN_IF_ERROR(String(root, "", "queue", spec_.mutable_queue()));
    TY_RETURN_IF_ERROR(ReadField<bool>(root, "", "preemptible", ReadBool,
                                       Set<bool>([this](bool v) { spec_.set_preemptible(v); })));
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

  absl::Status ParseStrategy(const YAML::Node& node) {
    return ParseChoice<v1::Strategy>(node, "strategy",
                                     {{"single", v1::SINGLE},
                                      {"data_parallel", v1::DATA_PARALLEL},
                                      {"parameter_server", v1::PARAMETER_SERVER},
                                      {"pipeline", v1::PIPELINE}},
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
                                           "dense, slots, memory}, got ",
                                           Describe(node)));
    }
    TY_RETURN_IF_ERROR(
        CheckKeys(node, path, {"shards", "mode", "max_staleness", "dense", "slots", "memory"}));
    TY_RETURN_IF_ERROR(ByteSize(node, path, "memory", [&](int64_t v) { ps.set_memory_bytes(v); }));
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

  // pipeline: {stages, microbatches, schedule, partition}, partition a mode or a list of layer
  // counts per stage.
  absl::Status ParsePipeline(const YAML::Node& node) {
    if (!IsSet(node)) return absl::OkStatus();
    const std::string path = "pipeline";
    TY_RETURN_IF_ERROR(ExpectMap(node, path));
    TY_RETURN_IF_ERROR(
        CheckKeys(node, path, {"stages", "microbatches", "schedule", "partition", "memory"}));
    v1::PipelineSpec& pipeline = *spec_.mutable_pipeline();
    if (const YAML::Node memory = node["memory"]; IsSet(memory)) {
      if (!memory.IsSequence()) {
        return FieldError("pipeline.memory", "a list: one size per stage, e.g. [6GiB, 4GiB]");
      }
      for (size_t i = 0; i < memory.size(); ++i) {
        absl::StatusOr<int64_t> bytes =
            ReadByteSize(memory[i], absl::StrCat("pipeline.memory[", i, "]"));
        if (!bytes.ok()) return bytes.status();
        pipeline.add_memory_bytes(*bytes);
      }
    }
    TY_RETURN_IF_ERROR(Positive<int32_t>(node, path, "stages", "must be >= 1",
                                         [&](int32_t v) { pipeline.set_stages(v); }));
    TY_RETURN_IF_ERROR(Positive<int32_t>(node, path, "microbatches", "must be >= 1",
                                         [&](int32_t v) { pipeline.set_microbatches(v); }));
    TY_RETURN_IF_ERROR(String(node, path, "schedule", pipeline.mutable_schedule()));
    const YAML::Node partition = node["partition"];
    if (!IsSet(partition)) return absl::OkStatus();
    if (partition.IsSequence()) {
      for (size_t i = 0; i < partition.size(); ++i) {
        absl::StatusOr<int32_t> v =
            ReadInt32(partition[i], absl::StrCat("pipeline.partition[", i, "]"));
        if (!v.ok()) return v.status();
        pipeline.add_partition_counts(*v);
      }
      return absl::OkStatus();
    }
    return String(node, path, "partition", pipeline.mutable_partition());
  }

  absl::Status ParseResources(const YAML::Node& node) {
    if (!IsSet(node)) return absl::OkStatus();
    TY_RETURN_IF_ERROR(ExpectMap(node, "resources"));
    TY_RETURN_IF_ERROR(CheckKeys(node, "resources", {"gpus_per_worker", "cpus", "memory"}));
    v1::Resources& resources = *spec_.mutable_resources();
    TY_RETURN_IF_ERROR(Int32(node, "resources", "gpus_per_worker",
                             [&](int32_t v) { resources.set_gpus_per_worker(v); }));
    TY_RETURN_IF_ERROR(Positive<double>(node, "resources", "cpus", "must be > 0",
                                        [&](double v) { resources.set_cpus(v); }));
    return ByteSize(node, "resources", "memory", [&](int64_t v) { resources.set_memory_bytes(v); });
  }

  absl::Status ParseModel(const YAML::Node& node) {
    if (!IsSet(node)) return absl::OkStatus();
    TY_RETURN_IF_ERROR(ExpectMap(node, "model"));
    TY_RETURN_IF_ERROR(
        CheckKeys(node, "model", {"builtin", "torchscript", "stages", "args", "memory_format"}));
    v1::ModelSpec& model = *spec_.mutable_model();
    if (int(IsSet(node["builtin"])) + int(IsSet(node["torchscript"])) + int(IsSet(node["stages"])) >
        1) {
      return FieldError("model", "set only one of builtin, torchscript or stages");
    }
    if (const YAML::Node stages = node["stages"]; IsSet(stages)) {
      if (!stages.IsSequence()) {
        return FieldError(
            "model.stages",
            absl::StrCat("a list of TorchScript files, one per stage, got ", Describe(stages)));
      }
      for (size_t i = 0; i < stages.size(); ++i) {
        absl::StatusOr<std::string> uri =
            ReadString(stages[i], absl::StrCat("model.stages[", i, "]"));
        if (!uri.ok()) return uri.status();
        model.add_stages(*std::move(uri));
      }
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
    TY_RETURN_IF_ERROR(
        CheckKeys(args, "model.args",
                  {"inputs", "hidden", "classes", "channels", "height", "width", "dropout", "vocab",
                   "dim", "context", "layers", "heads", "mlp_ratio", "tie_embeddings"}));
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
    TY_RETURN_IF_ERROR(Int32(args, path, "context", [&](int32_t v) { out.set_context(v); }));
    TY_RETURN_IF_ERROR(Int32(args, path, "layers", [&](int32_t v) { out.set_layers(v); }));
    TY_RETURN_IF_ERROR(Int32(args, path, "heads", [&](int32_t v) { out.set_heads(v); }));
    TY_RETURN_IF_ERROR(Int32(args, path, "mlp_ratio", [&](int32_t v) { out.set_mlp_ratio(v); }));
    TY_RETURN_IF_ERROR(ReadField<bool>(args, path, "tie_embeddings", ReadBool,
                                       Set<bool>([&](bool v) { out.set_tie_embeddings(v); })));
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
                  {"train", "tokens", "synthetic", "features", "labels", "categorical",
                   "validation_split", "shuffle", "shuffle_window", "validation", "feature_scale",
                   "feature_offset", "prefetch_shards", "fetch_threads"}));
    v1::DataSpec& data = *spec_.mutable_data();
    if (IsSet(node["train"]) && IsSet(node["synthetic"])) {
      return FieldError("data", "set only one of train, tokens or synthetic");
    }
    TY_RETURN_IF_ERROR(String(node, "data", "train", data.mutable_train()));
    TY_RETURN_IF_ERROR(String(node, "data", "tokens", data.mutable_tokens()));
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
    TY_RETURN_IF_ERROR(
        CheckKeys(node, path, {"uri", "every_steps", "keep_last", "resume_from", "share_with"}));
    v1::CheckpointSpec& ckpt = *spec_.mutable_checkpoint();
    TY_RETURN_IF_ERROR(String(node, path, "uri", ckpt.mutable_uri()));
    TY_RETURN_IF_ERROR(
        Int64(node, path, "every_steps", [&](int64_t v) { ckpt.set_every_steps(v); }));
    TY_RETURN_IF_ERROR(Positive<int32_t>(node, path, "keep_last", "must be >= 1",
                                         [&](int32_t v) { ckpt.set_keep_last(v); }));
    TY_RETURN_IF_ERROR(String(node, path, "resume_from", ckpt.mutable_resume_from()));
    if (const YAML::Node users = node["share_with"]; IsSet(users)) {
      if (!users.IsSequence()) return FieldError("checkpoint.share_with", "a list of user names");
      for (size_t i = 0; i < users.size(); ++i) {
        absl::StatusOr<std::string> user =
            ReadString(users[i], absl::StrCat("checkpoint.share_with[", i, "]"));
        if (!user.ok()) return user.status();
        ckpt.add_share_with(*std::move(user));
      }
    }
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
