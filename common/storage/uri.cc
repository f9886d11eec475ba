#include "common/storage/uri.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace trainyard {
namespace {

absl::Status Refused(absl::string_view uri, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("'", absl::CHexEscape(uri), "': ", why));
}

// A segment that is dots alone once %2e is read as a dot: "." and ".." name other folders than
// the one written, and "..." is refused with them so that no spelling of one slips through.
bool IsDotSegment(absl::string_view segment) {
  if (segment.empty()) return false;
  while (!segment.empty()) {
    if (segment[0] == '.') {
      segment.remove_prefix(1);
    } else if (segment.size() >= 3 && segment[0] == '%' && segment[1] == '2' &&
               absl::ascii_tolower(segment[2]) == 'e') {
      segment.remove_prefix(3);
    } else {
      return false;
    }
  }
  return true;
}

// The checks every path shares (see ParseUri's contract); `uri` names it in the error.
absl::Status CheckPath(absl::string_view uri, absl::string_view path, bool allow_empty_segments) {
  for (char c : path) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      return Refused(uri, "control characters are not allowed in a path");
    }
    if (c == '\\') return Refused(uri, "backslashes are not allowed in a path");
  }
  if (absl::StrContains(path, "://")) {
    return Refused(uri, "'://' inside a path (a URI must start with its scheme)");
  }
  const std::vector<absl::string_view> segments = absl::StrSplit(path, '/');
  for (size_t i = 0; i < segments.size(); ++i) {
    if (IsDotSegment(segments[i])) {
      return Refused(uri, absl::StrCat("the segment '", segments[i],
                                       "' is not allowed (write the path without . or ..)"));
    }
    // The first segment of an absolute path and the last of a folder's are empty.
    if (!allow_empty_segments && segments[i].empty() && i > 0 && i + 1 < segments.size()) {
      return Refused(uri, "an empty segment ('//') in an object key");
    }
  }
  return absl::OkStatus();
}

// Repeated slashes as one: "//a///b/" -> "/a/b/".
std::string FoldSlashes(absl::string_view path) {
  std::string out;
  out.reserve(path.size());
  for (char c : path) {
    if (c == '/' && !out.empty() && out.back() == '/') continue;
    out.push_back(c);
  }
  return out;
}

absl::StatusOr<Uri> LocalUri(absl::string_view uri, absl::string_view path) {
  if (absl::Status s = CheckPath(uri, path, /*allow_empty_segments=*/true); !s.ok()) return s;
  Uri result;
  result.scheme = "file";
  result.path = FoldSlashes(path);
  return result;
}

}  // namespace

std::string Uri::ToString() const {
  if (path.empty()) return absl::StrCat(scheme, "://", authority);
  if (path[0] == '/') return absl::StrCat(scheme, "://", authority, path);
  return absl::StrCat(scheme, "://", authority, "/", path);
}

absl::StatusOr<Uri> ParseUri(absl::string_view uri) {
  if (absl::StartsWith(uri, "/")) return LocalUri(uri, uri);
  const size_t sep = uri.find("://");
  if (sep == absl::string_view::npos || sep == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", absl::CHexEscape(uri), "' is not a URI (scheme://...) or an absolute path"));
  }
  const absl::string_view scheme = uri.substr(0, sep);
  absl::string_view rest = uri.substr(sep + 3);
  if (scheme == "file") {
    // file:///abs/path, or file://localhost/abs/path.
    if (absl::ConsumePrefix(&rest, "localhost")) {
      if (!absl::StartsWith(rest, "/")) return Refused(uri, "bad file URI");
    }
    if (!absl::StartsWith(rest, "/")) {
      return Refused(uri, "file URIs need an absolute path (file:///path)");
    }
    return LocalUri(uri, rest);
  }
  if (scheme == "s3") {
    Uri result;
    result.scheme = "s3";
    const size_t slash = rest.find('/');
    absl::string_view bucket = rest.substr(0, slash);
    if (bucket.empty()) return Refused(uri, "s3 URIs need a bucket");
    if (absl::Status s = CheckPath(uri, bucket, /*allow_empty_segments=*/false); !s.ok()) return s;
    result.authority = std::string(bucket);
    if (slash != absl::string_view::npos) {
      const absl::string_view key = rest.substr(slash + 1);
      if (absl::StartsWith(key, "/")) return Refused(uri, "an s3 key starting with '/'");
      if (absl::Status s = CheckPath(uri, key, /*allow_empty_segments=*/false); !s.ok()) return s;
      result.path = std::string(key);
    }
    return result;
  }
  return Refused(uri, absl::StrCat("unsupported scheme '", absl::CHexEscape(scheme),
                                   "', expected file or s3"));
}

bool IsWithin(const Uri& uri, const Uri& folder) {
  if (uri.scheme != folder.scheme || uri.authority != folder.authority) return false;
  absl::string_view base = absl::StripSuffix(folder.path, "/");
  if (base.empty() && uri.scheme == "s3") return true;  // the whole bucket
  if (!absl::StartsWith(uri.path, base)) return false;
  return uri.path.size() == base.size() || uri.path[base.size()] == '/';
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
  if (!parsed->local()) return Refused(uri, "not a local file URI");
  return parsed->path;
}

bool IsSafeRelativePath(absl::string_view path) {
  constexpr size_t kMaxPathBytes = 4096;
  if (path.empty() || path.size() > kMaxPathBytes || path[0] == '/') return false;
  for (char c : path) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f || c == '\\') return false;
  }
  for (absl::string_view segment : absl::StrSplit(path, '/')) {
    if (segment.empty() || segment == "." || segment == "..") return false;
  }
  return true;
}

}  // namespace trainyard
