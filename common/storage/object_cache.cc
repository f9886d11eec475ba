#include "common/storage/object_cache.h"

#include <fnmatch.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/sha256.h"

namespace trainyard {
namespace {

namespace fs = std::filesystem;

const char* Env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

// The newest cached version of the object whose names start with `stem`, if any.
std::string AnyCachedVersion(const std::string& dir, const std::string& stem) {
  std::error_code ec;
  std::string best;
  fs::file_time_type best_time;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!absl::StartsWith(name, stem) || absl::StrContains(name, ".part")) continue;
    std::error_code time_ec;
    const fs::file_time_type t = it->last_write_time(time_ec);
    if (time_ec) continue;
    if (best.empty() || t > best_time) {
      best = it->path().string();
      best_time = t;
    }
  }
  return best;
}

}  // namespace

ObjectCache::ObjectCache(std::string dir) : dir_(std::move(dir)) {}

std::string ObjectCache::DefaultDir() {
  if (const char* dir = Env("TRAINYARD_CACHE_DIR")) return dir;
  if (const char* xdg = Env("XDG_CACHE_HOME")) return absl::StrCat(xdg, "/trainyard");
  if (const char* home = Env("HOME")) return absl::StrCat(home, "/.cache/trainyard");
  return "/tmp/trainyard-cache";
}

absl::StatusOr<std::string> ObjectCache::Fetch(ObjectStore& store, const std::string& uri) {
  const std::string stem = absl::StrCat(Sha256Hex(uri).substr(0, 32), "-");
  absl::StatusOr<ObjectInfo> head = store.Head(uri);
  if (!head.ok()) {
    if (head.status().code() == absl::StatusCode::kUnavailable) {
      const std::string cached = AnyCachedVersion(dir_, stem);
      if (!cached.empty()) {
        LogWarning("cannot reach ", uri, " (", head.status().message(), "); using the cached copy ",
                   cached);
        return cached;
      }
    }
    return head.status();
  }
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("cannot create the cache folder ", dir_, ": ", ec.message()));
  }
  // Without an ETag the size is the only version we know: better than nothing, and the stores we
  // serve always give one.
  const std::string version =
      head->etag.empty() ? absl::StrCat("size:", head->size_bytes) : head->etag;
  const std::string path = absl::StrCat(dir_, "/", stem, Sha256Hex(version).substr(0, 16));
  const uintmax_t cached_size = fs::file_size(path, ec);
  if (!ec && static_cast<int64_t>(cached_size) == head->size_bytes) return path;

  const std::string temp = absl::StrCat(path, ".part-", getpid(), "-", downloads_.load());
  absl::StatusOr<ObjectInfo> got = store.GetToFile(uri, temp);
  if (got.ok() && got->size_bytes != head->size_bytes) {
    got = absl::DataLossError(absl::StrCat(uri, ": downloaded ", got->size_bytes,
                                           " bytes, HEAD said ", head->size_bytes));
  }
  if (got.ok() && !got->etag.empty() && !head->etag.empty() && got->etag != head->etag) {
    // It changed while we looked; what we have is whole and newer, but keyed wrongly. Retrying
    // is the caller's business.
    got = absl::UnavailableError(absl::StrCat(uri, " changed while it was downloaded"));
  }
  if (!got.ok()) {
    fs::remove(temp, ec);
    return got.status();
  }
  fs::rename(temp, path, ec);
  if (ec) {
    fs::remove(temp, ec);
    return absl::UnavailableError(
        absl::StrCat("cannot move ", uri, " into the cache: ", ec.message()));
  }
  downloads_++;
  // Older versions of this object are dead weight now.
  for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (absl::StartsWith(name, stem) && it->path().string() != path &&
        !absl::StrContains(name, ".part")) {
      std::error_code remove_ec;
      fs::remove(it->path(), remove_ec);
    }
  }
  LogInfo("cached ", uri, " (", head->size_bytes, " bytes) as ", path);
  return path;
}

absl::StatusOr<std::vector<std::string>> ExpandObjectGlob(ObjectStore& store,
                                                          const std::string& pattern) {
  const size_t wildcard = pattern.find_first_of("*?[");
  if (wildcard == std::string::npos) {
    absl::StatusOr<ObjectInfo> head = store.Head(pattern);
    if (!head.ok()) return head.status();
    return std::vector<std::string>{pattern};
  }
  // List from the folder holding the first wildcard: the match is by full URI.
  const std::string prefix = pattern.substr(0, wildcard);
  absl::StatusOr<std::vector<ObjectInfo>> objects = store.List(prefix);
  if (!objects.ok()) return objects.status();
  std::vector<std::string> out;
  for (const ObjectInfo& o : *objects) {
    if (fnmatch(pattern.c_str(), o.uri.c_str(), FNM_PATHNAME) == 0) out.push_back(o.uri);
  }
  if (out.empty()) {
    return absl::NotFoundError(absl::StrCat("no objects match '", pattern, "'"));
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace trainyard
