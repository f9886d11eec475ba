#ifndef TRAINYARD_COMMON_STORAGE_S3_OBJECT_STORE_H_
#define TRAINYARD_COMMON_STORAGE_S3_OBJECT_STORE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/storage/object_store.h"
#include "common/storage/s3_client.h"

namespace trainyard {

// An ObjectStore over S3: s3://bucket/key URIs, the key taken verbatim (no percent-decoding).
// A PUT is atomic in S3, so Put and PutFile need no temporary name; large objects go as
// multipart uploads (see S3Client). Errors are S3Client's (they name bucket, key and the S3
// error code); INVALID_ARGUMENT for a URI that is not s3://bucket/key. Thread-safe.
class S3ObjectStore final : public ObjectStore {
 public:
  explicit S3ObjectStore(std::unique_ptr<S3Client> client);

  absl::Status Put(absl::string_view uri, absl::string_view data) override;
  // The hash comes from the pass that signs the requests (S3Client::PutObjectPieces).
  absl::StatusOr<std::string> PutPieces(absl::string_view uri,
                                        absl::Span<const absl::string_view> pieces) override;
  absl::StatusOr<std::string> Get(absl::string_view uri) override;
  absl::StatusOr<std::string> GetRange(absl::string_view uri, int64_t offset,
                                       int64_t length) override;
  absl::StatusOr<ObjectInfo> Head(absl::string_view uri) override;
  // s3://bucket/prefix: every key starting with prefix, all pages, sorted.
  absl::StatusOr<std::vector<ObjectInfo>> List(absl::string_view prefix) override;
  absl::Status Delete(absl::string_view uri) override;
  absl::Status PutFile(absl::string_view uri, const std::string& local_path) override;
  absl::StatusOr<ObjectInfo> GetToFile(absl::string_view uri,
                                       const std::string& local_path) override;

  S3Client& client() { return *client_; }

 private:
  const std::unique_ptr<S3Client> client_;
};

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_STORAGE_S3_OBJECT_STORE_H_
