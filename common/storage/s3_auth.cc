#include "common/storage/s3_auth.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/sha256.h"

namespace trainyard {
namespace {

// Header values are trimmed and inner runs of spaces collapse to one, as SigV4 asks.
std::string CanonicalHeaderValue(absl::string_view value) {
  std::vector<absl::string_view> words =
      absl::StrSplit(value, absl::ByAnyChar(" \t\r\n"), absl::SkipEmpty());
  return absl::StrJoin(words, " ");
}

const char* NonEmpty(const EnvLookup& env, const char* name) {
  const char* value = env(name);
  return value != nullptr && *value != '\0' ? value : nullptr;
}

}  // namespace

std::string AwsUriEncode(absl::string_view s, bool keep_slash) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size() * 3);
  for (unsigned char c : s) {
    if (absl::ascii_isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' ||
        (keep_slash && c == '/')) {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 0xf]);
    }
  }
  return out;
}

std::string CanonicalQueryString(const std::vector<std::pair<std::string, std::string>>& query) {
  std::vector<std::pair<std::string, std::string>> encoded;
  encoded.reserve(query.size());
  for (const auto& [key, value] : query) {
    encoded.emplace_back(AwsUriEncode(key, false), AwsUriEncode(value, false));
  }
  std::sort(encoded.begin(), encoded.end());
  std::string out;
  for (const auto& [key, value] : encoded) {
    if (!out.empty()) out.push_back('&');
    absl::StrAppend(&out, key, "=", value);
  }
  return out;
}

SigV4Result SignV4(const SigV4Request& request, const AwsCredentials& credentials,
                   absl::string_view region, absl::string_view service, absl::Time now) {
  const std::string amz_date = absl::FormatTime("%Y%m%dT%H%M%SZ", now, absl::UTCTimeZone());
  const std::string date = amz_date.substr(0, 8);

  SigV4Result result;
  for (const auto& [name, value] : request.headers) {
    result.headers[absl::AsciiStrToLower(name)] = value;
  }
  result.headers["x-amz-date"] = amz_date;
  result.headers["x-amz-content-sha256"] = request.payload_sha256;
  if (!credentials.session_token.empty()) {
    result.headers["x-amz-security-token"] = credentials.session_token;
  }

  std::string canonical_headers, signed_headers;
  for (const auto& [name, value] : result.headers) {  // std::map: sorted by lower-case name
    absl::StrAppend(&canonical_headers, name, ":", CanonicalHeaderValue(value), "\n");
    if (!signed_headers.empty()) signed_headers.push_back(';');
    signed_headers += name;
  }
  result.canonical_request = absl::StrCat(
      request.method, "\n", request.canonical_uri.empty() ? "/" : request.canonical_uri, "\n",
      CanonicalQueryString(request.query), "\n", canonical_headers, "\n", signed_headers, "\n",
      request.payload_sha256);

  const std::string scope = absl::StrCat(date, "/", region, "/", service, "/aws4_request");
  result.string_to_sign = absl::StrCat("AWS4-HMAC-SHA256\n", amz_date, "\n", scope, "\n",
                                       Sha256Hex(result.canonical_request));
  std::string key = HmacSha256(absl::StrCat("AWS4", credentials.secret_access_key), date);
  key = HmacSha256(key, region);
  key = HmacSha256(key, service);
  key = HmacSha256(key, "aws4_request");
  const std::string signature = absl::BytesToHexString(HmacSha256(key, result.string_to_sign));
  result.headers["authorization"] =
      absl::StrCat("AWS4-HMAC-SHA256 Credential=", credentials.access_key_id, "/", scope,
                   ", SignedHeaders=", signed_headers, ", Signature=", signature);
  return result;
}

absl::StatusOr<AwsCredentials> LoadAwsCredentials(const EnvLookup& env) {
  const char* id = NonEmpty(env, "AWS_ACCESS_KEY_ID");
  const char* secret = NonEmpty(env, "AWS_SECRET_ACCESS_KEY");
  if (id != nullptr && secret != nullptr) {
    AwsCredentials c;
    c.access_key_id = id;
    c.secret_access_key = secret;
    if (const char* token = NonEmpty(env, "AWS_SESSION_TOKEN")) c.session_token = token;
    c.source = "environment";
    return c;
  }

  std::string path;
  if (const char* file = NonEmpty(env, "AWS_SHARED_CREDENTIALS_FILE")) {
    path = file;
  } else if (const char* home = NonEmpty(env, "HOME")) {
    path = absl::StrCat(home, "/.aws/credentials");
  }
  const char* profile_env = NonEmpty(env, "AWS_PROFILE");
  const std::string profile = profile_env != nullptr ? profile_env : "default";
  std::ifstream in(path);
  if (path.empty() || !in) {
    return absl::NotFoundError(absl::StrCat(
        "no AWS credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or write profile '",
        profile, "' to ", path.empty() ? "~/.aws/credentials" : path));
  }
  std::map<std::string, std::string> fields;
  bool found = false, in_profile = false;
  std::string line;
  while (std::getline(in, line)) {
    absl::string_view l = absl::StripAsciiWhitespace(line);
    if (l.empty() || l[0] == '#' || l[0] == ';') continue;
    if (l.front() == '[' && l.back() == ']') {
      absl::string_view name = absl::StripAsciiWhitespace(l.substr(1, l.size() - 2));
      // The credentials file names profiles plainly; accept the config file's "profile x" too.
      absl::ConsumePrefix(&name, "profile ");
      in_profile = absl::StripAsciiWhitespace(name) == profile;
      found = found || in_profile;
      continue;
    }
    if (!in_profile) continue;
    const size_t eq = l.find('=');
    if (eq == absl::string_view::npos) continue;
    fields[absl::AsciiStrToLower(absl::StripAsciiWhitespace(l.substr(0, eq)))] =
        std::string(absl::StripAsciiWhitespace(l.substr(eq + 1)));
  }
  if (!found) {
    return absl::InvalidArgumentError(absl::StrCat("AWS profile '", profile, "' is not in ", path));
  }
  AwsCredentials c;
  c.access_key_id = fields["aws_access_key_id"];
  c.secret_access_key = fields["aws_secret_access_key"];
  c.session_token = fields["aws_session_token"];
  if (c.access_key_id.empty() || c.secret_access_key.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("AWS profile '", profile, "' in ", path,
                     " needs both aws_access_key_id and aws_secret_access_key"));
  }
  c.source = absl::StrCat("profile '", profile, "' of ", path);
  return c;
}

}  // namespace trainyard
