#include "worker/trainer/program/files.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/formats/workdir_archive.h"
#include "common/json_fields.h"
#include "common/sha256.h"
#include "common/storage/checkpoint_layout.h"
#include "common/storage/uri.h"

namespace trainyard::trainer::program {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr char kFormat[] = "trainyard-checkpoint/1";

// A read-only mapping of a whole file, unmapped on destruction.
class MappedFile {
 public:
  static absl::StatusOr<MappedFile> Open(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
      return absl::UnavailableError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
    }
    struct stat st;
    if (::fstat(fd, &st) != 0) {
      ::close(fd);
      return absl::UnavailableError(absl::StrCat("cannot stat ", path, ": ", std::strerror(errno)));
    }
    MappedFile file;
    file.size_ = static_cast<size_t>(st.st_size);
    if (file.size_ > 0) {
      void* data = ::mmap(nullptr, file.size_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (data == MAP_FAILED) {
        ::close(fd);
        return absl::UnavailableError(
            absl::StrCat("cannot map ", path, ": ", std::strerror(errno)));
      }
      file.data_ = data;
    }
    ::close(fd);
    return file;
  }
  MappedFile(MappedFile&& other) noexcept : data_(other.data_), size_(other.size_) {
    other.data_ = nullptr;
  }
  ~MappedFile() {
    if (data_ != nullptr) ::munmap(data_, size_);
  }
  absl::string_view bytes() const {
    return data_ == nullptr ? absl::string_view()
                            : absl::string_view(static_cast<char*>(data_), size_);
  }

 private:
  MappedFile() = default;
  void* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace

std::string RestoredPath(const std::string& name) {
  const size_t slash = name.find('/');
  if (slash != std::string::npos && name[0] == 'g' &&
      ParseNameNumber(absl::string_view(name).substr(1, slash - 1)).has_value()) {
    return name.substr(slash + 1);
  }
  return name;
}

namespace {

absl::Status FetchVerified(ObjectStore& store, const std::string& uri, const StoredFile& file,
                           const std::string& path) {
  std::error_code ec;
  fs::create_directories(fs::path(path).parent_path(), ec);
  if (ec) return absl::UnavailableError(absl::StrCat("cannot create ", path, ": ", ec.message()));
  absl::StatusOr<ObjectInfo> got = store.GetToFile(uri, path);
  if (!got.ok()) return got.status();
  std::ifstream in(path, std::ios::binary);
  Sha256 hash;
  std::string buffer(1 << 20, '\0');
  int64_t size = 0;
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    const std::streamsize n = in.gcount();
    if (n <= 0) break;
    hash.Update(absl::string_view(buffer.data(), static_cast<size_t>(n)));
    size += n;
  }
  if (size != file.size) {
    return absl::DataLossError(
        absl::StrCat(uri, ": ", size, " bytes where the manifest says ", file.size));
  }
  if (hash.HexDigest() != file.sha256) {
    return absl::DataLossError(absl::StrCat(uri, ": its SHA-256 is not the manifest's"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ListFiles(const std::string& dir) {
  std::vector<std::string> files;
  std::error_code ec;
  fs::recursive_directory_iterator it(dir, fs::directory_options::none, ec);
  if (ec) return absl::UnavailableError(absl::StrCat("cannot read ", dir, ": ", ec.message()));
  for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) return absl::UnavailableError(absl::StrCat("cannot read ", dir, ": ", ec.message()));
    const fs::file_status status = it->symlink_status(ec);
    // Lexically: fs::relative would follow a link to where it points.
    const std::string relative = it->path().lexically_relative(dir).string();
    if (fs::is_directory(status)) continue;
    if (!fs::is_regular_file(status)) {
      return absl::InvalidArgumentError(
          absl::StrCat(relative, " in the checkpoint folder is not a regular file (a symbolic ",
                       "link or a device): a checkpoint holds files only"));
    }
    if (!IsSafeRelativePath(relative)) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", relative, "' in the checkpoint folder: not a name a checkpoint keeps"));
    }
    files.push_back(relative);
  }
  std::sort(files.begin(), files.end());
  return files;
}

absl::StatusOr<std::vector<StoredFile>> UploadFiles(ObjectStore& store, const std::string& dir,
                                                    const std::string& step_uri,
                                                    int64_t generation) {
  absl::StatusOr<std::vector<std::string>> files = ListFiles(dir);
  if (!files.ok()) return files.status();
  std::vector<StoredFile> stored;
  for (const std::string& relative : *files) {
    absl::StatusOr<MappedFile> file = MappedFile::Open(absl::StrCat(dir, "/", relative));
    if (!file.ok()) return file.status();
    StoredFile out;
    out.name = absl::StrCat("g", generation, "/", relative);
    out.size = static_cast<int64_t>(file->bytes().size());
    const absl::string_view pieces[] = {file->bytes()};
    absl::StatusOr<std::string> sha = store.PutPieces(JoinUri(step_uri, out.name), pieces);
    if (!sha.ok()) return sha.status();
    out.sha256 = *std::move(sha);
    stored.push_back(std::move(out));
  }
  return stored;
}

json EncodeFiles(const std::vector<StoredFile>& files) {
  json objects = json::array();
  for (const StoredFile& f : files) {
    objects.push_back({{"name", f.name}, {"size", f.size}, {"sha256", f.sha256}});
  }
  return objects;
}

absl::StatusOr<std::vector<StoredFile>> DecodeFiles(const json& objects) {
  if (!objects.is_array()) return absl::InvalidArgumentError("objects: not a list");
  std::vector<StoredFile> files;
  for (const json& entry : objects) {
    if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() ||
        !entry.contains("size") || !entry["size"].is_number_integer() ||
        !entry.contains("sha256") || !entry["sha256"].is_string()) {
      return absl::InvalidArgumentError("malformed object entry");
    }
    StoredFile file{entry["name"].get<std::string>(), entry["size"].get<int64_t>(),
                    entry["sha256"].get<std::string>()};
    if (!IsSafeRelativePath(file.name) || file.size < 0) {
      return absl::InvalidArgumentError(absl::StrCat("object '", file.name, "': not a safe name"));
    }
    files.push_back(std::move(file));
  }
  return files;
}

std::string EncodeManifest(const std::string& job_id, int64_t step, int64_t generation,
                           int64_t created_unix_ms, const std::vector<StoredFile>& files) {
  json manifest = {{"format", kFormat},
                   {"kind", "program"},
                   {"job_id", job_id},
                   {"step", step},
                   {"generation", generation},
                   {"created_unix_ms", created_unix_ms},
                   {"objects", EncodeFiles(files)}};
  return manifest.dump(2);
}

absl::StatusOr<Manifest> DecodeManifest(absl::string_view text) {
  const json manifest = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!manifest.is_object() || JsonString(manifest, "format") != kFormat ||
      !manifest.contains("objects") || !manifest["objects"].is_array() ||
      !manifest.contains("step") || !manifest["step"].is_number_integer()) {
    return absl::InvalidArgumentError(absl::StrCat("not a ", kFormat, " manifest"));
  }
  absl::StatusOr<std::vector<StoredFile>> files = DecodeFiles(manifest["objects"]);
  if (!files.ok()) return files.status();
  return Manifest{manifest["step"].get<int64_t>(), *std::move(files)};
}

absl::StatusOr<int64_t> RestoreCheckpoint(ObjectStore& store, const std::string& step_uri,
                                          const std::string& dir) {
  EmptyFolder(dir);
  absl::StatusOr<std::string> manifest_uri = NewestManifestUri(store, step_uri);
  if (!manifest_uri.ok()) return manifest_uri.status();
  absl::StatusOr<std::string> text = store.Get(*manifest_uri);
  if (!text.ok()) return text.status();
  absl::StatusOr<Manifest> manifest = DecodeManifest(*text);
  if (!manifest.ok()) {
    return absl::Status(manifest.status().code(),
                        absl::StrCat(*manifest_uri, ": ", manifest.status().message()));
  }
  for (const StoredFile& file : manifest->files) {
    const std::string path = absl::StrCat(dir, "/", RestoredPath(file.name));
    if (absl::Status s = FetchVerified(store, JoinUri(step_uri, file.name), file, path); !s.ok()) {
      EmptyFolder(dir);
      return s;
    }
  }
  return manifest->step;
}

absl::Status FetchWorkdir(ObjectStore& store, const std::string& uri, const std::string& dir) {
  if (absl::EndsWith(uri, ".tar")) {
    // An archive (the CLI's, or one of the user's): brought beside the folder and unpacked.
    const std::string archive = absl::StrCat(dir, ".tar");
    absl::StatusOr<ObjectInfo> got = store.GetToFile(uri, archive);
    absl::Status status = got.status();
    if (status.ok()) status = UnpackWorkdir(archive, dir);
    std::error_code ec;
    fs::remove(archive, ec);
    return status;
  }
  const std::string folder = absl::EndsWith(uri, "/") ? uri : absl::StrCat(uri, "/");
  absl::StatusOr<std::vector<ObjectInfo>> objects = store.List(folder);
  if (!objects.ok()) return objects.status();
  if (objects->empty()) {
    return absl::NotFoundError(absl::StrCat("program.workdir: ", uri, " holds no files"));
  }
  for (const ObjectInfo& object : *objects) {
    const std::string relative = object.uri.substr(folder.size());
    if (!IsSafeRelativePath(relative)) {
      return absl::InvalidArgumentError(
          absl::StrCat("program.workdir: '", relative, "' would land outside the workdir"));
    }
    const std::string path = absl::StrCat(dir, "/", relative);
    std::error_code ec;
    fs::create_directories(fs::path(path).parent_path(), ec);
    absl::StatusOr<ObjectInfo> got = store.GetToFile(object.uri, path);
    if (!got.ok()) return got.status();
    // Scripts and tools keep their modes through a folder copy only where the store keeps them:
    // a program's own files are readable and, for what it runs by path, executable.
    ::chmod(path.c_str(), 0755);
  }
  return absl::OkStatus();
}

void EmptyFolder(const std::string& dir) {
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec)) {
    fs::remove_all(entry.path(), ec);
  }
  fs::create_directories(dir, ec);
}

}  // namespace trainyard::trainer::program
