#include "common/storage/object_store.h"

#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/sha256.h"
#include "common/storage/file_object_store.h"
#include "common/storage/s3_client.h"
#include "common/storage/s3_object_store.h"
#include "common/storage/uri.h"

namespace trainyard {

absl::StatusOr<std::string> ObjectStore::PutPieces(absl::string_view uri,
                                                   absl::Span<const absl::string_view> pieces) {
  std::string data;
  for (absl::string_view piece : pieces) data.append(piece.data(), piece.size());
  absl::Status status = Put(uri, data);
  if (!status.ok()) return status;
  return Sha256Hex(data);
}

absl::Status ObjectStore::PutFile(absl::string_view uri, const std::string& local_path) {
  std::ifstream in(local_path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot open ", local_path, " to upload to ", uri));
  }
  std::ostringstream data;
  data << in.rdbuf();
  if (in.bad()) return absl::UnavailableError(absl::StrCat("error reading ", local_path));
  return Put(uri, data.str());
}

absl::StatusOr<ObjectInfo> ObjectStore::GetToFile(absl::string_view uri,
                                                  const std::string& local_path) {
  absl::StatusOr<ObjectInfo> info = Head(uri);
  if (!info.ok()) return info.status();
  absl::StatusOr<std::string> data = Get(uri);
  if (!data.ok()) return data.status();
  std::ofstream out(local_path, std::ios::binary | std::ios::trunc);
  out.write(data->data(), static_cast<std::streamsize>(data->size()));
  out.close();
  if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", local_path));
  info->size_bytes = static_cast<int64_t>(data->size());
  return info;
}

namespace {

class EnvironmentStores final : public ObjectStoreResolver {
 public:
  EnvironmentStores(const EnvLookup& env,
                    const std::optional<std::vector<std::string>>& local_roots)
      : files_(local_roots.has_value() ? std::make_shared<FileObjectStore>(*local_roots)
                                       : std::make_shared<FileObjectStore>()),
        s3_options_(S3ClientOptionsFromEnv(env)) {}

  absl::StatusOr<std::shared_ptr<ObjectStore>> Open(absl::string_view uri) const override {
    absl::StatusOr<Uri> parsed = ParseUri(uri);
    if (!parsed.ok()) return parsed.status();
    if (parsed->scheme == "file") return files_;
    if (parsed->scheme != "s3") {
      return absl::InvalidArgumentError(
          absl::StrCat("'", uri, "': no object store for scheme '", parsed->scheme, "'"));
    }
    if (!s3_options_.ok()) {
      return absl::Status(s3_options_.status().code(),
                          absl::StrCat(uri, ": ", s3_options_.status().message()));
    }
    absl::MutexLock lock(&mu_);
    if (s3_ == nullptr)
      s3_ = std::make_shared<S3ObjectStore>(std::make_unique<S3Client>(*s3_options_));
    return s3_;
  }

 private:
  const std::shared_ptr<ObjectStore> files_;
  const absl::StatusOr<S3ClientOptions> s3_options_;
  mutable absl::Mutex mu_;
  mutable std::shared_ptr<ObjectStore> s3_ ABSL_GUARDED_BY(mu_);  // made at the first s3:// URI
};

}  // namespace

std::unique_ptr<ObjectStoreResolver> NewObjectStoreResolver(
    const EnvLookup& env, const std::optional<std::vector<std::string>>& local_roots) {
  return std::make_unique<EnvironmentStores>(env, local_roots);
}

absl::StatusOr<std::shared_ptr<ObjectStore>> OpenObjectStore(absl::string_view uri) {
  return NewObjectStoreResolver([](const char* name) { return std::getenv(name); })->Open(uri);
}

}  // namespace trainyard
