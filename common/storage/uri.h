#ifndef TRAINYARD_COMMON_STORAGE_URI_H_
#define TRAINYARD_COMMON_STORAGE_URI_H_

// The one parser of the locations a job names (data, models, checkpoints): what is local and
// what is object storage is decided here and nowhere else, and a parsed location has one
// spelling, which every check and every open uses.

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
  bool local() const { return scheme == "file"; }
};

// INVALID_ARGUMENT naming the URI and what is wrong when it has no scheme or an unsupported one,
// or when its path could be read as leading somewhere other than where it is written:
//   - a segment of dots alone (".", "..", "..."), percent-encoded ones ("%2e%2E") included:
//     paths are never normalised, so nothing written under a folder can name a place above it;
//   - a control character (NUL among them), a backslash, or "://" inside a path
//     ("/data/x://../y" is a local path, not a URI);
//   - an empty segment in an s3 key ("s3://b/a//c"), which S3 keeps apart from "a/c".
// A plain absolute path ("/data/x") parses as file://; a local path's repeated slashes are
// folded into one, as the kernel reads them, so the parsed path is the canonical spelling.
absl::StatusOr<Uri> ParseUri(absl::string_view uri);

// Whether `uri` is `folder` or lies below it: same scheme and authority, and `folder`'s path
// segments a prefix of `uri`'s (so /data/ab is not under /data/a). Both as ParseUri returns them.
bool IsWithin(const Uri& uri, const Uri& folder);

// Joins with exactly one '/' between the parts: JoinUri("file:///a/", "b") == "file:///a/b".
std::string JoinUri(absl::string_view base, absl::string_view child);

// Whether `path` is a relative path that stays below the folder it is put in: no leading '/', no
// empty, "." or ".." segment, no control character or backslash, at most 4096 bytes. For names
// that come from others (an archive's entries, a manifest's objects, a listing's keys).
bool IsSafeRelativePath(absl::string_view path);

// For file:// URIs and plain paths: the local path (canonical, as ParseUri). INVALID_ARGUMENT
// otherwise.
absl::StatusOr<std::string> LocalPath(absl::string_view uri);

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_STORAGE_URI_H_
