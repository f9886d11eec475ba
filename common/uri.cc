#include "common/uri.h"

#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace trainyard {

std::string Uri::ToString() const {
  if (path.empty()) return absl::StrCat(scheme, "://", authority);
  if (path[0] == '/') return absl::StrCat(scheme, "://", authority, path);
  return absl::StrCat(scheme, "://", authority, "/", path);
}

absl::StatusOr<Uri> ParseUri(absl::string_view uri) {
  Uri result;
  if (absl::StartsWith(uri, "/")) {
    result.scheme = "file";
    result.path = std::string(uri);
    return result;
  }
  const size_t sep = uri.find("://");
  if (sep == absl::string_view::npos || sep == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", uri, "' is not a URI (scheme://...) or an absolute path"));
  }
  result.scheme = std::string(uri.substr(0, sep));
  absl::string_view rest = uri.substr(sep + 3);
  if (result.scheme == "file") {
    // file:///abs/path, or file://localhost/abs/path.
    if (absl::ConsumePrefix(&rest, "localhost")) {
      if (!absl::StartsWith(rest, "/")) {
        return absl::InvalidArgumentError(absl::StrCat("'", uri, "': bad file URI"));
      }
    }
    if (!absl::StartsWith(rest, "/")) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", uri, "': file URIs need an absolute path (file:///path)"));
    }
    result.path = std::string(rest);
    return result;
  }
  if (result.scheme == "s3") {
    const size_t slash = rest.find('/');
    absl::string_view bucket = rest.substr(0, slash);
    if (bucket.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("'", uri, "': s3 URIs need a bucket"));
    }
    result.authority = std::string(bucket);
    if (slash != absl::string_view::npos) result.path = std::string(rest.substr(slash + 1));
    return result;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("'", uri, "': unsupported scheme '", result.scheme, "', expected file or s3"));
}

std::string JoinUri(absl::string_view base, absl::string_view child) {
  if (base.empty()) return std::string(child);
  if (child.empty()) return std::string(base);
  // Keep the slash that makes up "://" and the root of "file:///".
  while (absl::EndsWith(base, "/") && !absl::EndsWith(base, "://") &&
         !absl::EndsWith(base, ":///")) {
    base.remove_suffix(1);
  }
  while (absl::StartsWith(child, "/")) child.remove_prefix(1);
  if (absl::EndsWith(base, "/")) return absl::StrCat(base, child);
  return absl::StrCat(base, "/", child);
}

absl::StatusOr<std::string> LocalPath(absl::string_view uri) {
  absl::StatusOr<Uri> parsed = ParseUri(uri);
  if (!parsed.ok()) return parsed.status();
  if (parsed->scheme != "file") {
    return absl::InvalidArgumentError(absl::StrCat("'", uri, "' is not a local file URI"));
  }
  return parsed->path;
}

}  // namespace trainyard
