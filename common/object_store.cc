#include "common/object_store.h"

#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/file_object_store.h"
#include "common/s3_client.h"
#include "common/s3_object_store.h"
#include "common/sha256.h"
#include "common/uri.h"

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

absl::StatusOr<std::unique_ptr<ObjectStore>> OpenObjectStore(absl::string_view uri) {
  absl::StatusOr<Uri> parsed = ParseUri(uri);
  if (!parsed.ok()) return parsed.status();
  if (parsed->scheme == "file") return std::unique_ptr<ObjectStore>(new FileObjectStore());
  if (parsed->scheme == "s3") {
    absl::StatusOr<S3ClientOptions> options =
        S3ClientOptionsFromEnv([](const char* name) { return std::getenv(name); });
    if (!options.ok()) {
      return absl::Status(options.status().code(),
                          absl::StrCat(uri, ": ", options.status().message()));
    }
    return std::unique_ptr<ObjectStore>(
        new S3ObjectStore(std::make_unique<S3Client>(*std::move(options))));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("'", uri, "': no object store for scheme '", parsed->scheme, "'"));
}

}  // namespace trainyard
