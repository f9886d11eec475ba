#ifndef TRAINYARD_TESTS_COMMON_TEST_STORES_H_
#define TRAINYARD_TESTS_COMMON_TEST_STORES_H_

// Object stores for tests, shared by every test that needs one: a store in memory, a resolver
// that serves every URI from it, and the stores of the process environment.

#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/storage/object_store.h"

namespace trainyard {

// A remote store in memory (any URI: "mem://...", "s3://..."), recording the byte ranges read.
// Thread-safe.
class MemoryStore final : public ObjectStore {
 public:
  absl::Status Put(absl::string_view uri, absl::string_view data) override {
    absl::MutexLock lock(&mu_);
    objects_[std::string(uri)] = std::string(data);
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> Get(absl::string_view uri) override {
    return GetRange(uri, 0, INT64_MAX / 2);
  }
  absl::StatusOr<std::string> GetRange(absl::string_view uri, int64_t offset,
                                       int64_t length) override {
    absl::MutexLock lock(&mu_);
    auto it = objects_.find(std::string(uri));
    if (it == objects_.end()) return absl::NotFoundError(absl::StrCat(uri, " not found"));
    if (failing_ == uri) return absl::PermissionDeniedError(absl::StrCat(uri, ": access denied"));
    reads_.push_back({std::string(uri), offset, length});
    if (offset >= static_cast<int64_t>(it->second.size())) return std::string();
    return it->second.substr(static_cast<size_t>(offset), static_cast<size_t>(length));
  }
  absl::StatusOr<ObjectInfo> Head(absl::string_view uri) override {
    absl::MutexLock lock(&mu_);
    auto it = objects_.find(std::string(uri));
    if (it == objects_.end()) return absl::NotFoundError(absl::StrCat(uri, " not found"));
    return ObjectInfo{std::string(uri), static_cast<int64_t>(it->second.size()),
                      absl::StrCat("etag-", it->second.size())};
  }
  absl::StatusOr<std::vector<ObjectInfo>> List(absl::string_view prefix) override {
    absl::MutexLock lock(&mu_);
    std::vector<ObjectInfo> out;
    for (const auto& [uri, data] : objects_) {
      if (absl::StartsWith(uri, prefix)) {
        out.push_back({uri, static_cast<int64_t>(data.size()), ""});
      }
    }
    return out;
  }
  absl::Status Delete(absl::string_view uri) override {
    absl::MutexLock lock(&mu_);
    objects_.erase(std::string(uri));
    return absl::OkStatus();
  }

  struct Read {
    std::string uri;
    int64_t offset;
    int64_t length;
  };
  std::vector<Read> reads() {
    absl::MutexLock lock(&mu_);
    return reads_;
  }
  void Fail(const std::string& uri) {
    absl::MutexLock lock(&mu_);
    failing_ = uri;
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, std::string> objects_ ABSL_GUARDED_BY(mu_);
  std::vector<Read> reads_ ABSL_GUARDED_BY(mu_);
  std::string failing_ ABSL_GUARDED_BY(mu_);
};

// Serves every URI, whatever its scheme, from one MemoryStore.
class MemoryStores final : public ObjectStoreResolver {
 public:
  absl::StatusOr<std::shared_ptr<ObjectStore>> Open(absl::string_view) const override {
    return store_;
  }
  MemoryStore& store() const { return *store_; }

 private:
  const std::shared_ptr<MemoryStore> store_ = std::make_shared<MemoryStore>();
};

// The stores of the process environment (files; S3 as its variables say), made once.
inline const ObjectStoreResolver& EnvironmentStores() {
  static const ObjectStoreResolver* const kStores =
      NewObjectStoreResolver([](const char* name) { return std::getenv(name); }).release();
  return *kStores;
}

}  // namespace trainyard

#endif  // TRAINYARD_TESTS_COMMON_TEST_STORES_H_
