#ifndef TRAINYARD_COMMON_STORAGE_S3_AUTH_H_
#define TRAINYARD_COMMON_STORAGE_S3_AUTH_H_

// AWS credentials and Signature Version 4 for S3 requests. Pure functions over strings: no I/O
// except LoadAwsCredentials, which reads the environment and the shared credentials file.

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace trainyard {

struct AwsCredentials {
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;  // empty unless temporary credentials
  std::string source;         // where they came from, for error messages ("environment", ...)
};

// Looks up an environment variable; returns nullptr when unset. Injected so tests need not touch
// the process environment.
using EnvLookup = std::function<const char*(const char*)>;

// The standard AWS chain, first match wins:
//   1. AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY (+ AWS_SESSION_TOKEN);
//   2. profile AWS_PROFILE (default "default") of AWS_SHARED_CREDENTIALS_FILE
//      (default $HOME/.aws/credentials): aws_access_key_id, aws_secret_access_key,
//      aws_session_token.
// NOT_FOUND naming every place looked at when none has credentials; INVALID_ARGUMENT when a
// named profile is missing from an existing file or has only half a key pair.
absl::StatusOr<AwsCredentials> LoadAwsCredentials(const EnvLookup& env);

// RFC 3986 percent-encoding as SigV4 wants it: unreserved characters (A-Z a-z 0-9 - _ . ~) stay,
// every other byte becomes %XX (upper-case hex); '/' stays when `keep_slash`.
std::string AwsUriEncode(absl::string_view s, bool keep_slash);

// One HTTP request as the signer sees it.
struct SigV4Request {
  std::string method;         // "GET", "PUT", ...
  std::string canonical_uri;  // the path as sent on the wire, already encoded ("/bucket/a%20b")
  // Raw (unencoded) query parameters; the signer encodes and sorts them. A parameter without a
  // value ("?uploads") has an empty value.
  std::vector<std::pair<std::string, std::string>> query;
  // Headers to sign, any case; must include "host". The signer adds x-amz-date,
  // x-amz-content-sha256 and (with a session token) x-amz-security-token.
  std::map<std::string, std::string> headers;
  std::string payload_sha256;  // lower-case hex, or "UNSIGNED-PAYLOAD"
};

// The encoded, sorted query string used both in the canonical request and on the wire.
std::string CanonicalQueryString(const std::vector<std::pair<std::string, std::string>>& query);

struct SigV4Result {
  // Every header to send (lower-case names): the request's plus x-amz-date, x-amz-content-sha256,
  // x-amz-security-token when needed, and authorization.
  std::map<std::string, std::string> headers;
  std::string canonical_request;  // for debugging signature mismatches
  std::string string_to_sign;
};

// Signs `request` for `service` in `region` at time `now`. Thread-safe.
SigV4Result SignV4(const SigV4Request& request, const AwsCredentials& credentials,
                   absl::string_view region, absl::string_view service, absl::Time now);

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_STORAGE_S3_AUTH_H_
