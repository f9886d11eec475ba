#include "common/storage/s3_object_store.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/storage/uri.h"

namespace trainyard {
namespace {

struct BucketKey {
  std::string bucket;
  std::string key;
};

absl::StatusOr<BucketKey> Split(absl::string_view uri, bool allow_empty_key) {
  absl::StatusOr<Uri> parsed = ParseUri(uri);
  if (!parsed.ok()) return parsed.status();
  if (parsed->scheme != "s3") {
    return absl::InvalidArgumentError(absl::StrCat("'", uri, "' is not an s3:// URI"));
  }
  if (parsed->path.empty() && !allow_empty_key) {
    return absl::InvalidArgumentError(absl::StrCat("'", uri, "' names a bucket, not an object"));
  }
  return BucketKey{parsed->authority, parsed->path};
}

std::string ObjectUri(const std::string& bucket, const std::string& key) {
  return absl::StrCat("s3://", bucket, "/", key);
}

}  // namespace

S3ObjectStore::S3ObjectStore(std::unique_ptr<S3Client> client) : client_(std::move(client)) {}

absl::Status S3ObjectStore::Put(absl::string_view uri, absl::string_view data) {
  absl::StatusOr<BucketKey> bk = Split(uri, false);
  if (!bk.ok()) return bk.status();
  return client_->PutObject(bk->bucket, bk->key, data);
}

absl::StatusOr<std::string> S3ObjectStore::PutPieces(absl::string_view uri,
                                                     absl::Span<const absl::string_view> pieces) {
  absl::StatusOr<BucketKey> bk = Split(uri, false);
  if (!bk.ok()) return bk.status();
  return client_->PutObjectPieces(bk->bucket, bk->key, pieces);
}

absl::Status S3ObjectStore::PutFile(absl::string_view uri, const std::string& local_path) {
  absl::StatusOr<BucketKey> bk = Split(uri, false);
  if (!bk.ok()) return bk.status();
  return client_->PutObjectFromFile(bk->bucket, bk->key, local_path);
}

absl::StatusOr<std::string> S3ObjectStore::Get(absl::string_view uri) {
  absl::StatusOr<BucketKey> bk = Split(uri, false);
  if (!bk.ok()) return bk.status();
  return client_->GetObject(bk->bucket, bk->key);
}

absl::StatusOr<std::string> S3ObjectStore::GetRange(absl::string_view uri, int64_t offset,
                                                    int64_t length) {
  absl::StatusOr<BucketKey> bk = Split(uri, false);
  if (!bk.ok()) return bk.status();
  return client_->GetObjectRange(bk->bucket, bk->key, offset, length);
}

absl::StatusOr<ObjectInfo> S3ObjectStore::Head(absl::string_view uri) {
  absl::StatusOr<BucketKey> bk = Split(uri, false);
  if (!bk.ok()) return bk.status();
  absl::StatusOr<S3ObjectInfo> info = client_->HeadObject(bk->bucket, bk->key);
  if (!info.ok()) return info.status();
  return ObjectInfo{ObjectUri(bk->bucket, bk->key), info->size, info->etag};
}

absl::StatusOr<ObjectInfo> S3ObjectStore::GetToFile(absl::string_view uri,
                                                    const std::string& local_path) {
  absl::StatusOr<BucketKey> bk = Split(uri, false);
  if (!bk.ok()) return bk.status();
  absl::StatusOr<S3ObjectInfo> info = client_->GetObjectToFile(bk->bucket, bk->key, local_path);
  if (!info.ok()) return info.status();
  return ObjectInfo{ObjectUri(bk->bucket, bk->key), info->size, info->etag};
}

absl::StatusOr<std::vector<ObjectInfo>> S3ObjectStore::List(absl::string_view prefix) {
  absl::StatusOr<BucketKey> bk = Split(prefix, true);
  if (!bk.ok()) return bk.status();
  absl::StatusOr<std::vector<S3ObjectInfo>> objects = client_->ListObjects(bk->bucket, bk->key);
  if (!objects.ok()) return objects.status();
  std::vector<ObjectInfo> out;
  out.reserve(objects->size());
  for (S3ObjectInfo& o : *objects) {
    out.push_back(ObjectInfo{ObjectUri(bk->bucket, o.key), o.size, std::move(o.etag)});
  }
  return out;
}

absl::Status S3ObjectStore::Delete(absl::string_view uri) {
  absl::StatusOr<BucketKey> bk = Split(uri, false);
  if (!bk.ok()) return bk.status();
  return client_->DeleteObject(bk->bucket, bk->key);
}

}  // namespace trainyard
