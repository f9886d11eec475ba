// Reading a committed checkpoint: its manifest, its objects checked against it as they stream,
// the model merged into one local file for an export, and tensors read from such a file.

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
#include "common/formats/safetensors.h"
#include "common/log.h"
#include "common/sha256.h"
#include "common/storage/checkpoint_layout.h"
#include "common/storage/uri.h"
#include "worker/trainer/checkpoint/checkpoint.h"
#include "worker/trainer/checkpoint/checkpoint_files.h"
#include "worker/trainer/model/optimizer.h"
#include "worker/trainer/model/tensors.h"

namespace trainyard::trainer {

using checkpoint_files::IsObjectOf;
using checkpoint_files::IsStateObject;
using checkpoint_files::kModelBase;
using checkpoint_files::kModelObject;
using checkpoint_files::kOptimizerBase;
using checkpoint_files::kOptimizerObject;
using checkpoint_files::kStateObject;
using checkpoint_files::ReadField;
using nlohmann::json;

namespace {

absl::StatusOr<std::map<std::string, torch::Tensor>> DecodeObject(
    const std::string& name, std::string bytes, std::map<std::string, std::string>* metadata) {
  absl::StatusOr<std::map<std::string, torch::Tensor>> tensors =
      DecodeTensors(std::move(bytes), metadata);
  if (!tensors.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": ", tensors.status().message()));
  }
  return tensors;
}

// One object a manifest lists.
struct ManifestObject {
  std::string name;
  int64_t size = -1;
  std::string sha256;
};

// A step folder's manifest (NewestManifestUri) and the objects it lists.
struct Manifest {
  std::string uri;
  std::vector<ManifestObject> objects;
};

absl::StatusOr<Manifest> ReadManifest(ObjectStore& store, const std::string& step_uri) {
  Manifest out;
  absl::StatusOr<std::string> uri = NewestManifestUri(store, step_uri);
  if (!uri.ok()) return uri.status();
  out.uri = *std::move(uri);
  absl::StatusOr<std::string> manifest_bytes = store.Get(out.uri);
  if (!manifest_bytes.ok()) return manifest_bytes.status();
  json manifest = json::parse(*manifest_bytes, nullptr, /*allow_exceptions=*/false);
  std::string format;
  if (manifest.is_discarded() || !manifest.is_object() || !ReadField(manifest, "format", format) ||
      format != kCheckpointFormat || !manifest.contains("objects") ||
      !manifest["objects"].is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat(out.uri, ": not a ", kCheckpointFormat, " manifest"));
  }
  for (const json& entry : manifest["objects"]) {
    ManifestObject object;
    if (!ReadField(entry, "name", object.name) || !ReadField(entry, "size", object.size) ||
        !ReadField(entry, "sha256", object.sha256) || object.size < 0 ||
        !IsSafeRelativePath(object.name)) {
      return absl::InvalidArgumentError(absl::StrCat(out.uri, ": malformed object entry"));
    }
    out.objects.push_back(std::move(object));
  }
  return out;
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
  absl::StatusOr<Manifest> listed = ReadManifest(store, step_uri);
  if (!listed.ok()) return listed.status();
  std::map<std::string, std::string> objects;
  std::string state_name;
  for (const ManifestObject& entry : listed->objects) {
    if (IsStateObject(entry.name)) state_name = entry.name;
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
  if (state_name.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(listed->uri, ": does not list ", kStateObject));
  }
  LoadedCheckpoint loaded;
  loaded.uri = step_uri;
  absl::StatusOr<TrainerState> state = DecodeTrainerState(objects[state_name]);
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
    return absl::InvalidArgumentError(absl::StrCat(listed->uri, ": does not list ",
                                                   models == 0 ? kModelObject : kOptimizerObject));
  }
  return loaded;
}

absl::Status WriteMergedModel(ObjectStore& store, const std::string& step_uri,
                              const std::map<std::string, std::string>& metadata,
                              const std::string& local_path) {
  absl::StatusOr<Manifest> listed = ReadManifest(store, step_uri);
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
  for (const ManifestObject& entry : listed->objects) {
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
    return absl::InvalidArgumentError(absl::StrCat(listed->uri, ": does not list ", kModelObject));
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

}  // namespace trainyard::trainer
