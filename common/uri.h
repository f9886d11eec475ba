#ifndef TRAINYARD_COMMON_URI_H_
#define TRAINYARD_COMMON_URI_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace trainyard {

// scheme://authority/path. For file:///tmp/x: scheme "file", authority "", path "/tmp/x".
// For s3://bucket/a/b: scheme "s3", authority "bucket", path "a/b".
struct Uri {
  std::string scheme;
  std::string authority;
  std::string path;
  std::string ToString() const;
};

// INVALID_ARGUMENT naming the URI when it has no scheme, an unsupported one, or an empty path.
// A plain absolute path ("/data/x") parses as file://.
absl::StatusOr<Uri> ParseUri(absl::string_view uri);

// Joins with exactly one '/' between the parts: JoinUri("file:///a/", "b") == "file:///a/b".
std::string JoinUri(absl::string_view base, absl::string_view child);

// For file:// URIs and plain paths: the local path. INVALID_ARGUMENT otherwise.
absl::StatusOr<std::string> LocalPath(absl::string_view uri);

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_URI_H_
