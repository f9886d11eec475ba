#include "worker/trainer/checkpoint/checkpoint.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/log.h"
#include "common/safetensors.h"
#include "common/sha256.h"
#include "common/uri.h"
#include "worker/trainer/model/optimizer.h"
#include "worker/trainer/model/tensors.h"

namespace trainyard::trainer {
namespace {

using nlohmann::json;

constexpr char kModelObject[] = "model.safetensors";
constexpr char kOptimizerObject[] = "optimizer.safetensors";
constexpr char kStateObject[] = "trainer_state.json";
constexpr char kModelBase[] = "model";
constexpr char kOptimizerBase[] = "optimizer";

// A pipeline stage's objects carry the stage and the attempt's generation, so that an attempt
// never writes over a key an earlier one left ("model.stage-2-g3.safetensors"); the whole model's
// is "model.safetensors".
std::string ObjectName(absl::string_view base, int part, int64_t generation) {
  return part < 0 ? absl::StrCat(base, ".safetensors")
                  : absl::StrCat(base, ".stage-", part, "-g", generation, ".safetensors");
}
bool IsObjectOf(absl::string_view name, absl::string_view base) {
  if (name == ObjectName(base, -1, 0)) return true;
  const std::string prefix = absl::StrCat(base, ".stage-");
  if (!absl::StartsWith(name, prefix) || !absl::EndsWith(name, ".safetensors")) return false;
  const absl::string_view middle =
      name.substr(prefix.size(), name.size() - prefix.size() - strlen(".safetensors"));
  const size_t g = middle.find("-g");
  int part = 0;
  int64_t generation = 0;
  return g != absl::string_view::npos && absl::SimpleAtoi(middle.substr(0, g), &part) &&
         part >= 0 && absl::SimpleAtoi(middle.substr(g + 2), &generation);
}
// Where stage `part` of attempt `generation` lists the objects it wrote, once they all are.
std::string PartListName(int part, int64_t generation) {
  return absl::StrCat("PART-", part, "-g", generation, ".json");
}
constexpr char kManifestObject[] = "MANIFEST.json";

template <typename T>
bool ReadField(const json& j, const char* key, T& out) {
  auto it = j.find(key);
  if (it == j.end()) return false;
  try {
    out = it->get<T>();
  } catch (const json::exception&) {
    return false;
  }
  return true;
}

absl::StatusOr<std::map<std::string, torch::Tensor>> DecodeObject(
    const std::string& name, std::string bytes, std::map<std::string, std::string>* metadata) {
  absl::StatusOr<std::map<std::string, torch::Tensor>> tensors =
      DecodeTensors(std::move(bytes), metadata);
  if (!tensors.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": ", tensors.status().message()));
  }
  return tensors;
}

// A safetensors object laid out over the snapshot's tensors: its header, then each tensor's bytes
// where the tensor holds them, so that the store reads them from there and they are never copied
// into one buffer.
// Restricts the calling thread (and the threads it starts later) to `cpus`.
void PinThisThread(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int cpu : cpus) {
    if (cpu >= 0 && cpu < CPU_SETSIZE) CPU_SET(cpu, &set);
  }
  if (sched_setaffinity(0, sizeof(set), &set) != 0) {
    LogWarning("checkpoint upload: cannot restrict the thread to CPUs ", absl::StrJoin(cpus, ","),
               ": ", std::strerror(errno));
  }
}

}  // namespace

std::string EncodeTrainerState(const TrainerState& s) {
  json j = {{"format", "trainyard-trainer-state/1"},
            {"job_id", s.job_id},
            {"generation", s.generation},
            {"step", s.step},
            {"epoch", s.epoch},
            {"data_cursor", s.data_cursor},
            {"world_size", s.world_size},
            {"global_batch_size", s.global_batch_size},
            {"total_steps", s.total_steps},
            {"rng",
             {{"torch_cpu_generator", s.torch_rng_state},
              {"data_order",
               {{"kind", "mt19937_64(seed*1000003+epoch) fisher-yates"},
                {"seed", s.seed},
                {"shuffle", s.shuffle}}}}},
            {"lr_scheduler", {{"name", s.lr_schedule}, {"last_lr", s.last_lr}, {"step", s.step}}}};
  if (!s.parameter_servers.empty()) {
    j["parameter_servers"] = json::parse(s.parameter_servers, nullptr, /*allow_exceptions=*/false);
  }
  if (!s.pipeline.empty()) {
    j["pipeline"] = json::parse(s.pipeline, nullptr, /*allow_exceptions=*/false);
  }
  if (s.loss_scale > 0) {
    // torch.cuda.amp.GradScaler.state_dict()'s names.
    j["loss_scaler"] = {{"scale", s.loss_scale}, {"_growth_tracker", s.loss_scale_growth_tracker}};
  }
  return j.dump(2);
}

absl::StatusOr<TrainerState> DecodeTrainerState(absl::string_view text) {
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError("trainer_state.json: not a JSON object");
  }
  TrainerState s;
  const json& rng = j.contains("rng") ? j["rng"] : json::object();
  const json& order = rng.contains("data_order") ? rng["data_order"] : json::object();
  const json& lr = j.contains("lr_scheduler") ? j["lr_scheduler"] : json::object();
  if (!ReadField(j, "job_id", s.job_id) || !ReadField(j, "generation", s.generation) ||
      !ReadField(j, "step", s.step) || !ReadField(j, "epoch", s.epoch) ||
      !ReadField(j, "data_cursor", s.data_cursor) || !ReadField(j, "world_size", s.world_size) ||
      !ReadField(j, "global_batch_size", s.global_batch_size) ||
      !ReadField(j, "total_steps", s.total_steps) ||
      !ReadField(rng, "torch_cpu_generator", s.torch_rng_state) ||
      !ReadField(order, "seed", s.seed) || !ReadField(order, "shuffle", s.shuffle) ||
      !ReadField(lr, "name", s.lr_schedule) || !ReadField(lr, "last_lr", s.last_lr)) {
    return absl::InvalidArgumentError("trainer_state.json: missing or mistyped fields");
  }
  if (j.contains("parameter_servers")) s.parameter_servers = j["parameter_servers"].dump();
  if (j.contains("pipeline")) s.pipeline = j["pipeline"].dump();
  if (j.contains("loss_scaler")) {
    const json& scaler = j["loss_scaler"];
    if (!ReadField(scaler, "scale", s.loss_scale) ||
        !ReadField(scaler, "_growth_tracker", s.loss_scale_growth_tracker)) {
      return absl::InvalidArgumentError("trainer_state.json: loss_scaler is missing fields");
    }
  }
  return s;
}

std::string TorchRngState() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  torch::Tensor state;
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    state = gen.get_state();
  }
  return absl::BytesToHexString(absl::string_view(static_cast<const char*>(state.data_ptr()),
                                                  static_cast<size_t>(state.nbytes())));
}

absl::Status RestoreTorchRngState(const std::string& hex) {
  if (hex.empty() || hex.size() % 2 != 0 ||
      hex.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos) {
    return absl::InvalidArgumentError("torch_cpu_generator: not a hex string");
  }
  // Decoded here: Abseil's HexStringToBytes changed its signature (newer releases return a bool
  // and deprecate the old form), and the text is already checked.
  auto nibble = [](char c) {
    return static_cast<uint8_t>(c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
  };
  torch::Tensor state = torch::empty({static_cast<int64_t>(hex.size() / 2)}, torch::kUInt8);
  uint8_t* bytes = state.data_ptr<uint8_t>();
  for (size_t i = 0; i < hex.size() / 2; ++i) {
    bytes[i] = static_cast<uint8_t>(nibble(hex[2 * i]) << 4 | nibble(hex[2 * i + 1]));
  }
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  try {
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(state);
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("torch_cpu_generator: ", e.what_without_backtrace()));
  }
  return absl::OkStatus();
}

namespace {

// One object a manifest lists.
struct ManifestObject {
  std::string name;
  int64_t size = -1;
  std::string sha256;
};

absl::StatusOr<std::vector<ManifestObject>> ReadManifest(ObjectStore& store,
                                                         const std::string& step_uri) {
  absl::StatusOr<std::string> manifest_bytes = store.Get(JoinUri(step_uri, kManifestObject));
  if (!manifest_bytes.ok()) return manifest_bytes.status();
  json manifest = json::parse(*manifest_bytes, nullptr, /*allow_exceptions=*/false);
  std::string format;
  if (manifest.is_discarded() || !manifest.is_object() || !ReadField(manifest, "format", format) ||
      format != kCheckpointFormat || !manifest.contains("objects") ||
      !manifest["objects"].is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat(step_uri, "/MANIFEST.json: not a ", kCheckpointFormat, " manifest"));
  }
  std::vector<ManifestObject> objects;
  for (const json& entry : manifest["objects"]) {
    ManifestObject object;
    if (!ReadField(entry, "name", object.name) || !ReadField(entry, "size", object.size) ||
        !ReadField(entry, "sha256", object.sha256) || object.size < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(step_uri, "/MANIFEST.json: malformed object entry"));
    }
    objects.push_back(std::move(object));
  }
  return objects;
}

// Objects too large to hold whole are read this much at a time.
constexpr int64_t kReadChunk = int64_t{8} << 20;

// Reads `length` bytes of `uri` from `offset`; DATA_LOSS when the object ends sooner.
absl::StatusOr<std::string> ReadExactly(ObjectStore& store, const std::string& uri, int64_t offset,
                                        int64_t length) {
  absl::StatusOr<std::string> bytes = store.GetRange(uri, offset, length);
  if (!bytes.ok()) return bytes.status();
  if (static_cast<int64_t>(bytes->size()) != length) {
    return absl::DataLossError(absl::StrCat(uri, ": ", offset + static_cast<int64_t>(bytes->size()),
                                            " bytes, the manifest says more"));
  }
  return bytes;
}

// The header of the safetensors object `object`, read from its start; `prefix` receives the bytes
// read (the first bytes of the object, for its hash). The rest of the object is its data section.
absl::StatusOr<SafetensorsHeader> ReadObjectHeader(ObjectStore& store, const std::string& uri,
                                                   const ManifestObject& object,
                                                   std::string& prefix) {
  if (object.size < 8) {
    return absl::DataLossError(absl::StrCat(uri, ": ", object.size, " bytes, not safetensors"));
  }
  absl::StatusOr<std::string> first = ReadExactly(store, uri, 0, 8);
  if (!first.ok()) return first.status();
  prefix = *std::move(first);
  absl::StatusOr<uint64_t> header_size = SafetensorsHeaderSize(prefix);
  if (!header_size.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(uri, ": ", header_size.status().message()));
  }
  if (*header_size > static_cast<uint64_t>(object.size - 8)) {
    return absl::DataLossError(absl::StrCat(uri, ": its header is longer than the object"));
  }
  absl::StatusOr<std::string> rest = ReadExactly(store, uri, 8, static_cast<int64_t>(*header_size));
  if (!rest.ok()) return rest.status();
  prefix.append(*rest);
  absl::StatusOr<SafetensorsHeader> header =
      DecodeSafetensorsHeader(prefix, static_cast<uint64_t>(object.size));
  if (!header.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(uri, ": ", header.status().message()));
  }
  return header;
}

// Streams the data section of `object` (after its header) in chunks to `sink`, hashing it into
// `hash`, then checks the whole object's SHA-256 against the manifest.
absl::Status StreamObjectData(ObjectStore& store, const std::string& uri,
                              const ManifestObject& object, uint64_t data_start, Sha256& hash,
                              const std::function<absl::Status(int64_t, absl::string_view)>& sink) {
  for (int64_t offset = static_cast<int64_t>(data_start); offset < object.size;) {
    const int64_t length = std::min(kReadChunk, object.size - offset);
    absl::StatusOr<std::string> chunk = ReadExactly(store, uri, offset, length);
    if (!chunk.ok()) return chunk.status();
    hash.Update(*chunk);
    if (absl::Status status = sink(offset - static_cast<int64_t>(data_start), *chunk);
        !status.ok()) {
      return status;
    }
    offset += length;
  }
  const std::string actual = hash.HexDigest();
  if (actual != object.sha256) {
    return absl::DataLossError(
        absl::StrCat(uri, ": sha256 ", actual, ", the manifest says ", object.sha256));
  }
  return absl::OkStatus();
}

// Reads the safetensors object `object` in chunks, checking its size and SHA-256, and returns a
// safetensors buffer of only the tensors `keep` accepts (and the object's metadata): memory for
// what is kept and one chunk, whatever the object's size.
absl::StatusOr<std::string> ReadObjectKeeping(ObjectStore& store, const std::string& uri,
                                              const ManifestObject& object,
                                              const std::function<bool(const std::string&)>& keep) {
  std::string prefix;
  absl::StatusOr<SafetensorsHeader> header = ReadObjectHeader(store, uri, object, prefix);
  if (!header.ok()) return header.status();
  Sha256 hash;
  hash.Update(prefix);
  std::vector<SafetensorsSlot> kept;    // where each kept tensor is in the object's data
  std::vector<SafetensorsSlot> packed;  // and where it goes in the returned buffer's
  uint64_t packed_size = 0;
  for (const SafetensorsSlot& slot : header->tensors) {
    if (!keep(slot.name)) continue;
    kept.push_back(slot);
    SafetensorsSlot to = slot;
    to.begin = packed_size;
    to.end = packed_size + (slot.end - slot.begin);
    packed_size = to.end;
    packed.push_back(std::move(to));
  }
  absl::StatusOr<std::string> out = EncodeSafetensorsHeader(packed, header->metadata);
  if (!out.ok()) return absl::InvalidArgumentError(absl::StrCat(uri, ": ", out.status().message()));
  const size_t base = out->size();
  out->resize(base + packed_size);
  size_t next = 0;  // the first kept slot not yet wholly copied
  absl::Status streamed = StreamObjectData(
      store, uri, object, header->data_start, hash,
      [&](int64_t at, absl::string_view chunk) -> absl::Status {
        const uint64_t chunk_begin = static_cast<uint64_t>(at);
        const uint64_t chunk_end = chunk_begin + chunk.size();
        for (size_t i = next; i < kept.size() && kept[i].begin < chunk_end; ++i) {
          const uint64_t from = std::max(kept[i].begin, chunk_begin);
          const uint64_t to = std::min(kept[i].end, chunk_end);
          if (from < to) {
            std::memcpy(out->data() + base + packed[i].begin + (from - kept[i].begin),
                        chunk.data() + (from - chunk_begin), to - from);
          }
          if (kept[i].end <= chunk_end && i == next) ++next;
        }
        return absl::OkStatus();
      });
  if (!streamed.ok()) return streamed;
  return out;
}

}  // namespace

absl::StatusOr<LoadedCheckpoint> ReadCheckpoint(ObjectStore& store, const std::string& step_uri,
                                                const CheckpointFilter* keep) {
  absl::StatusOr<std::vector<ManifestObject>> listed = ReadManifest(store, step_uri);
  if (!listed.ok()) return listed.status();
  std::map<std::string, std::string> objects;
  for (const ManifestObject& entry : *listed) {
    const std::string uri = JoinUri(step_uri, entry.name);
    const bool model = IsObjectOf(entry.name, kModelBase);
    if (keep != nullptr && (model || IsObjectOf(entry.name, kOptimizerBase))) {
      absl::StatusOr<std::string> kept =
          ReadObjectKeeping(store, uri, entry, model ? keep->model : keep->optimizer);
      if (!kept.ok()) return kept.status();
      objects[entry.name] = *std::move(kept);
      continue;
    }
    absl::StatusOr<std::string> bytes = store.Get(uri);
    if (!bytes.ok()) return bytes.status();
    if (static_cast<int64_t>(bytes->size()) != entry.size) {
      return absl::DataLossError(
          absl::StrCat(uri, ": size ", bytes->size(), ", the manifest says ", entry.size));
    }
    const std::string actual = Sha256Hex(*bytes);
    if (actual != entry.sha256) {
      return absl::DataLossError(
          absl::StrCat(uri, ": sha256 ", actual, ", the manifest says ", entry.sha256));
    }
    objects[entry.name] = *std::move(bytes);
  }
  if (objects.count(kStateObject) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(step_uri, "/MANIFEST.json: does not list ", kStateObject));
  }
  LoadedCheckpoint loaded;
  loaded.uri = step_uri;
  absl::StatusOr<TrainerState> state = DecodeTrainerState(objects[kStateObject]);
  if (!state.ok()) return state.status();
  loaded.state = *std::move(state);
  // The whole model's objects, or a pipeline's stages' (ObjectNames), merged: each tensor is in
  // one of them.
  int models = 0, optimizers = 0;
  for (auto& [name, bytes] : objects) {
    const bool model = IsObjectOf(name, kModelBase);
    if (!model && !IsObjectOf(name, kOptimizerBase)) continue;
    std::map<std::string, std::string> metadata;
    absl::StatusOr<std::map<std::string, torch::Tensor>> tensors =
        DecodeObject(name.c_str(), std::move(bytes), model ? nullptr : &metadata);
    if (!tensors.ok()) return tensors.status();
    std::map<std::string, torch::Tensor>& into = model ? loaded.model : loaded.optimizer;
    for (auto& [tensor_name, tensor] : *tensors) {
      if (!into.emplace(tensor_name, std::move(tensor)).second) {
        return absl::InvalidArgumentError(
            absl::StrCat(step_uri, "/", name, ": tensor '", tensor_name, "' is in two objects"));
      }
    }
    if (model) {
      ++models;
    } else {
      ++optimizers;
      if (!loaded.optimizer_name.empty() && loaded.optimizer_name != metadata["optimizer"]) {
        return absl::InvalidArgumentError(
            absl::StrCat(step_uri, "/", name, ": state of optimizer '", metadata["optimizer"],
                         "', another object's is of '", loaded.optimizer_name, "'"));
      }
      loaded.optimizer_name = metadata["optimizer"];
    }
  }
  if (models == 0 || optimizers == 0) {
    return absl::InvalidArgumentError(absl::StrCat(step_uri, "/MANIFEST.json: does not list ",
                                                   models == 0 ? kModelObject : kOptimizerObject));
  }
  return loaded;
}

absl::Status WriteMergedModel(ObjectStore& store, const std::string& step_uri,
                              const std::map<std::string, std::string>& metadata,
                              const std::string& local_path) {
  absl::StatusOr<std::vector<ManifestObject>> listed = ReadManifest(store, step_uri);
  if (!listed.ok()) return listed.status();
  struct Source {
    ManifestObject object;
    std::string uri;
    SafetensorsHeader header;
    std::string prefix;  // the object's bytes before its data, hashed before the data
  };
  std::vector<Source> sources;
  std::vector<SafetensorsSlot> merged;
  std::set<std::string> names;
  for (const ManifestObject& entry : *listed) {
    if (!IsObjectOf(entry.name, kModelBase)) continue;
    Source source{entry, JoinUri(step_uri, entry.name), {}, {}};
    absl::StatusOr<SafetensorsHeader> header =
        ReadObjectHeader(store, source.uri, entry, source.prefix);
    if (!header.ok()) return header.status();
    // Streamed as one run of bytes: the tensors must fill the data section end to end.
    uint64_t end = 0;
    for (const SafetensorsSlot& slot : header->tensors) {
      if (slot.begin != end) {
        return absl::InvalidArgumentError(
            absl::StrCat(source.uri, ": the tensors leave a gap before '", slot.name, "'"));
      }
      end = slot.end;
      if (!names.insert(slot.name).second) {
        return absl::InvalidArgumentError(
            absl::StrCat(source.uri, ": tensor '", slot.name, "' is in two objects"));
      }
      merged.push_back(slot);
    }
    if (header->data_start + end != static_cast<uint64_t>(entry.size)) {
      return absl::InvalidArgumentError(absl::StrCat(source.uri, ": bytes after its last tensor"));
    }
    source.header = *std::move(header);
    sources.push_back(std::move(source));
  }
  if (sources.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(step_uri, "/MANIFEST.json: does not list ", kModelObject));
  }
  absl::StatusOr<std::string> header = EncodeSafetensorsHeader(merged, metadata);
  if (!header.ok()) return header.status();
  std::FILE* file = std::fopen(local_path.c_str(), "wb");
  if (file == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("cannot write ", local_path, ": ", std::strerror(errno)));
  }
  auto write = [&](absl::string_view bytes) -> absl::Status {
    if (std::fwrite(bytes.data(), 1, bytes.size(), file) != bytes.size()) {
      return absl::UnavailableError(
          absl::StrCat("cannot write ", local_path, ": ", std::strerror(errno)));
    }
    return absl::OkStatus();
  };
  absl::Status status = write(*header);
  for (const Source& source : sources) {
    if (!status.ok()) break;
    // Every byte of the object is checked: its header as read above, then its data.
    Sha256 hash;
    hash.Update(source.prefix);
    status = StreamObjectData(store, source.uri, source.object, source.header.data_start, hash,
                              [&](int64_t, absl::string_view chunk) { return write(chunk); });
  }
  if (std::fclose(file) != 0 && status.ok()) {
    status = absl::UnavailableError(
        absl::StrCat("cannot write ", local_path, ": ", std::strerror(errno)));
  }
  if (!status.ok()) std::remove(local_path.c_str());
  return status;
}

absl::Status ReadTensorsInto(const std::string& local_path, const NamedTensors& targets) {
  const int fd = ::open(local_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const std::string message =
        absl::StrCat("cannot read ", local_path, ": ", std::strerror(errno));
    return errno == ENOENT ? absl::NotFoundError(message) : absl::UnavailableError(message);
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat file {};
  if (::fstat(fd, &file) != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot read ", local_path, ": ", std::strerror(errno)));
  }
  auto read_at = [&](uint64_t offset, char* into, uint64_t length) -> absl::Status {
    while (length > 0) {
      const ssize_t n = ::pread(fd, into, length, static_cast<off_t>(offset));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        return absl::UnavailableError(
            absl::StrCat("cannot read ", local_path, ": ", std::strerror(errno)));
      }
      if (n == 0) return absl::DataLossError(absl::StrCat(local_path, ": ends too soon"));
      into += n;
      offset += static_cast<uint64_t>(n);
      length -= static_cast<uint64_t>(n);
    }
    return absl::OkStatus();
  };
  std::string prefix(8, '\0');
  if (absl::Status read = read_at(0, prefix.data(), 8); !read.ok()) return read;
  absl::StatusOr<uint64_t> header_size = SafetensorsHeaderSize(prefix);
  if (!header_size.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(local_path, ": ", header_size.status().message()));
  }
  if (*header_size > static_cast<uint64_t>(file.st_size) - 8) {
    return absl::DataLossError(absl::StrCat(local_path, ": its header is longer than the file"));
  }
  prefix.resize(8 + *header_size);
  if (absl::Status read = read_at(8, prefix.data() + 8, *header_size); !read.ok()) return read;
  absl::StatusOr<SafetensorsHeader> header =
      DecodeSafetensorsHeader(prefix, static_cast<uint64_t>(file.st_size));
  if (!header.ok()) {
    return absl::Status(header.status().code(),
                        absl::StrCat(local_path, ": ", header.status().message()));
  }
  std::map<std::string, const SafetensorsSlot*> slots;
  for (const SafetensorsSlot& slot : header->tensors) slots[slot.name] = &slot;
  torch::NoGradGuard no_grad;
  for (const auto& [name, target] : targets) {
    auto found = slots.find(name);
    if (found == slots.end()) {
      return absl::NotFoundError(absl::StrCat(local_path, ": no tensor '", name, "'"));
    }
    const SafetensorsSlot& slot = *found->second;
    if (torch::IntArrayRef(slot.shape) != target.sizes()) {
      return absl::InvalidArgumentError(
          absl::StrCat(local_path, ": tensor '", name, "' is [", absl::StrJoin(slot.shape, ", "),
                       "], the model's [", absl::StrJoin(target.sizes(), ", "), "]"));
    }
    const std::optional<torch::ScalarType> dtype = ScalarTypeOf(slot.dtype);
    if (!dtype.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat(local_path, ": tensor '", name, "' of unknown dtype ", slot.dtype));
    }
    const bool in_place =
        target.device().is_cpu() && target.is_contiguous() && target.scalar_type() == *dtype;
    torch::Tensor into = in_place ? target : torch::empty(target.sizes(), torch::dtype(*dtype));
    // The header's check made end - begin the bytes of this shape and dtype.
    absl::Status read = read_at(header->data_start + slot.begin,
                                static_cast<char*>(into.data_ptr()), slot.end - slot.begin);
    if (!read.ok()) return read;
    if (!in_place) target.copy_(into);
  }
  return absl::OkStatus();
}

void ReportSkippedCheckpoint(CoordinatorClient* coordinator, const std::string& uri,
                             const absl::Status& why) {
  LogWarning("checkpoint ", uri, " is unusable, trying the next one: ", why.ToString());
  if (coordinator == nullptr) return;
  absl::Status reported = coordinator->ReportEvent(
      absl::StrCat("checkpoint ", uri, " skipped (", absl::StatusCodeToString(why.code()),
                   "): ", why.message()));
  if (!reported.ok()) LogWarning("cannot report the skipped checkpoint: ", reported.ToString());
}

Checkpointer::Checkpointer(ObjectStore* store, CoordinatorClient* coordinator, const Clock& clock,
                           Options options)
    : store_(store), coordinator_(coordinator), clock_(clock), options_(std::move(options)) {
  // Only our own step folders: resume lists may name another job's checkpoints too.
  const std::string own = JoinUri(options_.base_uri, kCheckpointStepPrefix);
  for (const std::string& uri : options_.committed) {
    if (absl::StartsWith(uri, own)) committed_.insert(uri);
  }
}

Checkpointer::~Checkpointer() { Wait().IgnoreError(); }

bool Checkpointer::SaveAsync(int64_t step, absl::FunctionRef<CheckpointData()> snapshot,
                             bool final_save, absl::Time give_up_at) {
  // A later pipeline stage saves whenever the first does (which decides whether to skip): its
  // objects must be there when the first stage lists them.
  if (options_.parts > 1 && options_.part > 0) final_save = true;
  if (upload_.joinable() && !final_save) {
    absl::MutexLock lock(&mu_);
    // Waiting out a coordinator outage would stall training for nothing.
    auto settled = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return upload_done_ || commit_retrying_;
    };
    // An upload running far longer than saves usually take is a store in trouble (unreachable,
    // say): waiting for it would stall training for nothing too. Waits at most until it has
    // taken twice the longest recent save and a second more, and never beyond max_wait.
    absl::Duration wait = options_.max_wait;
    if (!recent_durations_.empty()) {
      const absl::Duration usual =
          *std::max_element(recent_durations_.begin(), recent_durations_.end());
      const absl::Duration running = clock_.Now() - upload_started_;
      wait = std::clamp(2 * usual + absl::Seconds(1) - running, absl::ZeroDuration(), wait);
    }
    mu_.AwaitWithTimeout(absl::Condition(&settled), wait);
    if (!upload_done_) {
      skipped_++;
      if (commit_retrying_) {
        // Once per outage: at a short checkpoint period there would be a line every few steps.
        if (skip_logged_step_ != upload_step_) {
          skip_logged_step_ = upload_step_;
          LogWarning("checkpoint of step ", step, " skipped: the commit of step ", upload_step_,
                     " is being retried (the coordinator is unreachable); due checkpoints are "
                     "skipped until it goes through");
        }
      } else {
        LogWarning("checkpoint of step ", step, " skipped: the checkpoint of step ", upload_step_,
                   " is still uploading after ",
                   absl::FormatDuration(
                       absl::Trunc(clock_.Now() - upload_started_, absl::Milliseconds(1))),
                   recent_durations_.empty() ? "" : " (longer than saves usually take)");
      }
      return false;
    }
  }
  absl::Status previous = Wait();
  if (!previous.ok()) {
    LogWarning("checkpoint of step ", upload_step_, " was not saved: ", previous.ToString());
  }
  CheckpointData data = snapshot();
  upload_step_ = data.state.step;
  upload_started_ = clock_.Now();
  {
    absl::MutexLock lock(&mu_);
    upload_done_ = false;
  }
  upload_ = std::thread([this, give_up_at, data = std::move(data)]() mutable {
    // Serialising, hashing and sending compete with training for the CPU: the training thread
    // goes first. Threads the upload starts (parallel parts) inherit the lower priority.
    setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 10);
    if (!options_.upload_cpus.empty()) PinThisThread(options_.upload_cpus);
    torch::NoGradGuard no_grad;
    try {
      upload_status_ = Save(data, give_up_at);
    } catch (const std::exception& e) {
      upload_status_ = absl::InternalError(
          absl::StrCat("checkpoint of step ", data.state.step, ": ", DescribeTorchError(e)));
    }
    // The snapshot's memory goes before the training thread is told the upload is over.
    data = CheckpointData();
    absl::MutexLock lock(&mu_);
    upload_done_ = true;
    commit_retrying_ = false;
  });
  return true;
}

absl::Status Checkpointer::Wait() { return WaitUntil(absl::InfiniteFuture()); }

absl::Status Checkpointer::WaitUntil(absl::Time deadline) {
  if (!upload_.joinable()) return absl::OkStatus();
  if (deadline != absl::InfiniteFuture()) {
    absl::MutexLock lock(&mu_);
    if (!mu_.AwaitWithTimeout(absl::Condition(&upload_done_), deadline - clock_.Now())) {
      return absl::DeadlineExceededError(
          absl::StrCat("the checkpoint of step ", upload_step_, " is still being saved"));
    }
  }
  upload_.join();
  absl::Status status = std::move(upload_status_);
  upload_status_ = absl::OkStatus();
  return status;
}

namespace {

// UNAVAILABLE (the store failed), but PERMISSION_DENIED stays so: a place the job may not write
// (outside its allowed folders, or refused by the store) is its spec's doing, and retrying on
// another attempt will not change it.
absl::Status UploadFailed(const absl::Status& status) {
  return absl::Status(absl::IsPermissionDenied(status) ? absl::StatusCode::kPermissionDenied
                                                       : absl::StatusCode::kUnavailable,
                      absl::StrCat("checkpoint upload: ", status.message()));
}

}  // namespace

absl::StatusOr<std::string> Checkpointer::PutPiecesWithRetries(
    const std::string& uri, const std::vector<absl::string_view>& pieces) {
  std::string sha256;
  absl::Status status = Retry(clock_, StorageRetry(), UnlessRefused, [&]() -> absl::Status {
    absl::StatusOr<std::string> put = store_->PutPieces(uri, pieces);
    if (!put.ok()) return put.status();
    sha256 = *std::move(put);
    return absl::OkStatus();
  });
  if (!status.ok()) return UploadFailed(status);
  return sha256;
}

absl::Status Checkpointer::PutWithRetries(const std::string& uri, const std::string& bytes) {
  absl::Status status =
      Retry(clock_, StorageRetry(), UnlessRefused, [&] { return store_->Put(uri, bytes); });
  if (!status.ok()) return UploadFailed(status);
  return status;
}

namespace {

// The objects pipeline stage `part` of attempt `generation` listed in the step folder `step_uri`,
// once it has: polled, backing off to a second apart, until `wait` has passed or `give_up_at`.
absl::StatusOr<json> AwaitPart(ObjectStore& store, const Clock& clock, const std::string& step_uri,
                               int part, int64_t generation, absl::Duration wait,
                               absl::Time give_up_at) {
  const std::string uri = JoinUri(step_uri, PartListName(part, generation));
  const absl::Time deadline = std::min(give_up_at, clock.Now() + wait);
  absl::Duration pause = absl::Milliseconds(20);
  while (true) {
    absl::StatusOr<std::string> bytes = store.Get(uri);
    if (bytes.ok()) {
      json list = json::parse(*bytes, nullptr, /*allow_exceptions=*/false);
      int64_t listed_generation = -1;
      if (list.is_discarded() || !ReadField(list, "generation", listed_generation) ||
          listed_generation != generation || !list.contains("objects") ||
          !list["objects"].is_array()) {
        return absl::DataLossError(absl::StrCat(uri, ": not a list of this attempt's objects"));
      }
      return list["objects"];
    } else if (!absl::IsNotFound(bytes.status())) {
      LogWarning("checkpoint: reading ", uri, ": ", bytes.status().ToString());
    }
    if (clock.Now() + pause > deadline) {
      return absl::DeadlineExceededError(absl::StrCat("checkpoint: pipeline stage ", part,
                                                      " did not list its objects in ", uri,
                                                      " within ", absl::FormatDuration(wait)));
    }
    clock.SleepFor(pause);
    pause = std::min(pause * 2, absl::Seconds(1));
  }
}

}  // namespace

absl::Status Checkpointer::Save(const CheckpointData& data, absl::Time give_up_at) {
  const int64_t step = data.state.step;
  const std::string step_uri = CheckpointStepUri(options_.base_uri, step);
  // Leftovers of an earlier attempt go before we write, so that keys are never overwritten.
  if (options_.collect_garbage && coordinator_ != nullptr && !collected_once_) {
    collected_once_ = true;
    CollectGarbage(step);
  }
  // Each object is written from the snapshot's tensors as they are, and its hash for the
  // manifest comes from the pass over the bytes that the store makes to write them.
  absl::StatusOr<SafetensorsPieces> model = LayOutTensors(data.model, {{"format", "trainyard/1"}});
  if (!model.ok()) return model.status();
  absl::StatusOr<SafetensorsPieces> optimizer =
      LayOutTensors(data.optimizer, {{"optimizer", data.optimizer_name}});
  if (!optimizer.ok()) return optimizer.status();
  const int part = options_.parts > 1 ? options_.part : -1;
  const std::string state = part <= 0 ? EncodeTrainerState(data.state) : std::string();
  const std::string model_name = ObjectName(kModelBase, part, data.state.generation);
  const std::string optimizer_name = ObjectName(kOptimizerBase, part, data.state.generation);
  std::vector<std::pair<std::string, std::vector<absl::string_view>>> writes = {
      {model_name, model->Pieces()}, {optimizer_name, optimizer->Pieces()}};
  if (part <= 0) writes.push_back({kStateObject, {state}});

  json objects = json::array();
  int64_t total_bytes = 0;
  for (const auto& [name, pieces] : writes) {
    absl::StatusOr<std::string> sha256 = PutPiecesWithRetries(JoinUri(step_uri, name), pieces);
    if (!sha256.ok()) return sha256.status();
    int64_t size = 0;
    for (absl::string_view piece : pieces) size += static_cast<int64_t>(piece.size());
    objects.push_back({{"name", name}, {"size", size}, {"sha256", *sha256}});
    total_bytes += size;
  }
  if (part > 0) {
    // A later stage: its list, for the first stage's manifest. It commits nothing itself.
    json list = {{"generation", data.state.generation}, {"step", step}, {"objects", objects}};
    absl::Status put =
        PutWithRetries(JoinUri(step_uri, PartListName(part, data.state.generation)), list.dump(2));
    if (!put.ok()) return put;
    last_saved_step_ = step;
    LogInfo("checkpoint stage ", part, " written: ", step_uri, " (", total_bytes, " bytes)");
    RecordDuration(data.snapshot_time + (clock_.Now() - upload_started_));
    return absl::OkStatus();
  }
  for (int other = 1; part == 0 && other < options_.parts; ++other) {
    absl::StatusOr<json> listed = AwaitPart(*store_, clock_, step_uri, other, data.state.generation,
                                            options_.parts_wait, give_up_at);
    if (!listed.ok()) return listed.status();
    for (const json& entry : *listed) {
      objects.push_back(entry);
      total_bytes += entry.value("size", int64_t{0});
    }
  }
  json manifest = {{"format", kCheckpointFormat},
                   {"job_id", data.state.job_id},
                   {"step", step},
                   {"generation", data.state.generation},
                   {"created_unix_ms", absl::ToUnixMillis(clock_.Now())},
                   {"objects", objects}};
  const std::string manifest_bytes = manifest.dump(2);
  absl::Status put = PutWithRetries(JoinUri(step_uri, kManifestObject), manifest_bytes);
  if (!put.ok()) return put;
  total_bytes += static_cast<int64_t>(manifest_bytes.size());
  last_saved_step_ = step;
  LogInfo("checkpoint written: ", step_uri, " (", total_bytes, " bytes)");

  if (coordinator_ == nullptr) {
    RecordDuration(data.snapshot_time + (clock_.Now() - upload_started_));
    return absl::OkStatus();
  }
  std::vector<std::string> retired;
  const absl::Time commit_give_up = std::min(give_up_at, clock_.Now() + options_.commit_retry_for);
  bool failed_once = false;
  absl::Status commit =
      Retry(clock_, CoordinatorRetry(commit_give_up, options_.backoff, options_.max_backoff),
            IsRetryableCoordinatorError, [&]() -> absl::Status {
              absl::StatusOr<std::vector<std::string>> r =
                  coordinator_->CommitCheckpoint(step, total_bytes, upload_started_);
              if (!r.ok()) {
                if (!failed_once && IsRetryableCoordinatorError(r.status())) {
                  failed_once = true;
                  LogWarning("checkpoint commit of step ", step, " failed, retrying for up to ",
                             absl::FormatDuration(commit_give_up - clock_.Now()), ": ",
                             r.status().ToString());
                  absl::MutexLock lock(&mu_);
                  commit_retrying_ = true;
                }
                return r.status();
              }
              retired = *std::move(r);
              return absl::OkStatus();
            });
  if (!commit.ok()) {
    return absl::Status(commit.code(),
                        absl::StrCat("checkpoint commit of step ", step, ": ", commit.message()));
  }
  if (failed_once) LogInfo("checkpoint commit of step ", step, " went through");
  RecordDuration(data.snapshot_time + (clock_.Now() - upload_started_));
  {
    absl::MutexLock lock(&mu_);
    last_committed_step_ = step;
  }
  committed_.insert(step_uri);
  for (const std::string& uri : retired) {
    committed_.erase(uri);
    DeleteRetired(uri);
  }
  if (options_.collect_garbage) CollectGarbage(step + 1);
  return absl::OkStatus();
}

void Checkpointer::RecordDuration(absl::Duration duration) {
  absl::MutexLock lock(&mu_);
  recent_durations_.push_back(duration);
  while (recent_durations_.size() > kRecentSaves) recent_durations_.pop_front();
}

void Checkpointer::CollectGarbage(int64_t keep_from) {
  std::string base = options_.base_uri;
  if (base.empty() || base.back() != '/') base += '/';
  absl::StatusOr<std::vector<ObjectInfo>> objects =
      store_->List(JoinUri(base, kCheckpointStepPrefix));
  if (!objects.ok()) {
    LogWarning("garbage collection: cannot list ", base, ": ", objects.status().ToString());
    return;
  }
  std::set<std::string> garbage;
  for (const ObjectInfo& info : *objects) {
    if (!absl::StartsWith(info.uri, base)) continue;
    const std::string relative = info.uri.substr(base.size());
    const size_t slash = relative.find('/');
    if (slash == std::string::npos) continue;  // a stray object, not inside a step folder
    const std::string folder = JoinUri(options_.base_uri, relative.substr(0, slash));
    if (committed_.count(folder) > 0) continue;
    // A pipeline's later stages may be writing the folders of this save and the next.
    int64_t step = -1;
    if (options_.parts > 1 &&
        absl::SimpleAtoi(
            relative.substr(strlen(kCheckpointStepPrefix), slash - strlen(kCheckpointStepPrefix)),
            &step) &&
        step >= keep_from) {
      continue;
    }
    garbage.insert(folder);
  }
  for (const std::string& folder : garbage) {
    LogInfo("garbage collection: deleting ", folder, " (no committed checkpoint refers to it)");
    DeleteRetired(folder);
  }
}

void Checkpointer::DeleteRetired(const std::string& step_uri) {
  std::string prefix = step_uri;
  if (prefix.empty() || prefix.back() != '/') prefix += '/';
  absl::StatusOr<std::vector<ObjectInfo>> objects = store_->List(prefix);
  if (!objects.ok()) {
    LogWarning("cannot list retired checkpoint ", step_uri, ": ", objects.status().ToString());
    return;
  }
  // The manifest goes first so that a half-deleted folder never looks like a checkpoint.
  std::vector<std::string> uris;
  for (const ObjectInfo& info : *objects) {
    if (absl::EndsWith(info.uri, kManifestObject)) {
      uris.insert(uris.begin(), info.uri);
    } else {
      uris.push_back(info.uri);
    }
  }
  for (const std::string& uri : uris) {
    absl::Status status = store_->Delete(uri);
    if (!status.ok()) LogWarning("cannot delete ", uri, ": ", status.ToString());
  }
}

}  // namespace trainyard::trainer
