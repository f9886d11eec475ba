#include "worker/agent/s3_gateway_rules.h"

#include <openssl/crypto.h>

#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "common/spec/job_paths.h"
#include "common/storage/s3_auth.h"
#include "common/storage/uri.h"

namespace trainyard {

namespace {

// Whether `key` is `place` or lies below it.
bool Covers(const ObjectPlace& place, absl::string_view bucket, absl::string_view key) {
  if (place.bucket != bucket) return false;
  if (place.key.empty()) return true;
  return key == place.key || (absl::StartsWith(key, place.key) && key.size() > place.key.size() &&
                              key[place.key.size()] == '/');
}

// An s3:// place of a spec: a pattern's fixed folder, or the place itself, without trailing '/'.
ObjectPlace PlaceOf(const Uri& uri) {
  std::string key = FixedPart(uri.path);
  while (!key.empty() && key.back() == '/') key.pop_back();
  return {uri.authority, key};
}

absl::Status Denied(absl::string_view op, absl::string_view bucket, absl::string_view key,
                    absl::string_view why) {
  return absl::PermissionDeniedError(
      absl::StrCat(op, " of bucket '", bucket, "', key '", key, "': ", why));
}

// The query parameters an operation takes; any other is refused.
bool OnlyParameters(const GatewayRequest& r, const std::set<std::string>& allowed,
                    std::string* extra) {
  for (const auto& [name, value] : r.query) {
    if (allowed.count(name) == 0) {
      *extra = name;
      return false;
    }
  }
  return true;
}

bool HasParameter(const GatewayRequest& r, absl::string_view name) {
  for (const auto& [n, v] : r.query) {
    if (n == name) return true;
  }
  return false;
}

std::string Parameter(const GatewayRequest& r, absl::string_view name) {
  for (const auto& [n, v] : r.query) {
    if (n == name) return v;
  }
  return "";
}

// The object operation a path-style request on an object names, "" when none.
std::string ObjectOperation(const GatewayRequest& r, bool* write) {
  const bool upload = HasParameter(r, "uploadId");
  *write = true;
  if (r.method == "GET" || r.method == "HEAD") {
    *write = false;
    return r.method == "GET" ? "GetObject" : "HeadObject";
  }
  if (r.method == "PUT") return upload ? "UploadPart" : "PutObject";
  if (r.method == "POST" && HasParameter(r, "uploads")) return "CreateMultipartUpload";
  if (r.method == "POST" && upload) return "CompleteMultipartUpload";
  if (r.method == "DELETE") return upload ? "AbortMultipartUpload" : "DeleteObject";
  return "";
}

}  // namespace

bool ObjectScope::MayRead(absl::string_view bucket, absl::string_view key) const {
  for (const ObjectPlace& place : read) {
    if (Covers(place, bucket, key)) return true;
  }
  return MayWrite(bucket, key);
}

bool ObjectScope::MayWrite(absl::string_view bucket, absl::string_view key) const {
  for (const ObjectPlace& place : write) {
    if (Covers(place, bucket, key)) return true;
  }
  return false;
}

bool ObjectScope::MayList(absl::string_view bucket, absl::string_view prefix) const {
  auto within = [&](const std::vector<ObjectPlace>& places) {
    for (const ObjectPlace& place : places) {
      if (place.bucket != bucket) continue;
      if (place.key.empty() || absl::StartsWith(prefix, absl::StrCat(place.key, "/"))) return true;
    }
    return false;
  };
  return within(read) || within(write);
}

absl::StatusOr<ObjectScope> TaskObjectScope(const v1::Task& task) {
  absl::StatusOr<std::vector<JobLocation>> locations = JobLocations(task.spec());
  if (!locations.ok()) return locations.status();
  ObjectScope scope;
  for (const JobLocation& location : *locations) {
    // The spec's checkpoint.uri is the base; the job writes in its own folder below it.
    if (location.written || location.uri.scheme != "s3") continue;
    scope.read.push_back(PlaceOf(location.uri));
  }
  for (const std::string& step : task.resume_checkpoints()) {
    absl::StatusOr<Uri> uri = ParseUri(step);
    if (!uri.ok())
      return absl::InvalidArgumentError(
          absl::StrCat("resume checkpoint: ", uri.status().message()));
    if (uri->scheme == "s3") scope.read.push_back(PlaceOf(*uri));
  }
  if (!task.checkpoint_uri().empty()) {
    absl::StatusOr<Uri> uri = ParseUri(task.checkpoint_uri());
    if (!uri.ok())
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint folder: ", uri.status().message()));
    // A job's folder is never a bucket's root: that would let it write over every other job.
    if (uri->scheme == "s3" && !PlaceOf(*uri).key.empty()) scope.write.push_back(PlaceOf(*uri));
  }
  return scope;
}

absl::StatusOr<SigV4Authorization> ParseSigV4Authorization(absl::string_view header) {
  constexpr absl::string_view kScheme = "AWS4-HMAC-SHA256 ";
  if (!absl::ConsumePrefix(&header, kScheme)) {
    return absl::PermissionDeniedError(
        "the request is not signed with AWS Signature Version 4 in its Authorization header");
  }
  SigV4Authorization auth;
  std::string credential, signed_headers;
  for (absl::string_view part : absl::StrSplit(header, ',')) {
    part = absl::StripAsciiWhitespace(part);
    if (absl::ConsumePrefix(&part, "Credential=")) credential = std::string(part);
    if (absl::ConsumePrefix(&part, "SignedHeaders=")) signed_headers = std::string(part);
    if (absl::ConsumePrefix(&part, "Signature=")) auth.signature = absl::AsciiStrToLower(part);
  }
  const std::vector<std::string> scope = absl::StrSplit(credential, '/');
  if (scope.size() != 5 || scope[0].empty() || scope[1].size() != 8 || scope[4] != "aws4_request" ||
      signed_headers.empty() || auth.signature.size() != 64) {
    return absl::PermissionDeniedError("malformed Authorization header");
  }
  auth.key_id = scope[0];
  auth.date = scope[1];
  auth.region = scope[2];
  auth.service = scope[3];
  auth.signed_headers = absl::StrSplit(signed_headers, ';');
  return auth;
}

absl::Status VerifyGatewaySignature(const GatewayRequest& request, const SigV4Authorization& auth,
                                    const std::string& secret, absl::Time now) {
  auto header = [&](const std::string& name) -> const std::string* {
    auto it = request.headers.find(name);
    return it == request.headers.end() ? nullptr : &it->second;
  };
  const std::string* amz_date = header("x-amz-date");
  const std::string* payload = header("x-amz-content-sha256");
  if (amz_date == nullptr || payload == nullptr) {
    return absl::PermissionDeniedError("the request has no x-amz-date or x-amz-content-sha256");
  }
  absl::Time signed_at;
  std::string error;
  // absl's %Y takes every digit it finds: the fields are cut apart first.
  const std::string& d = *amz_date;
  const std::string spaced =
      d.size() == 16 ? absl::StrCat(d.substr(0, 4), "-", d.substr(4, 2), "-", d.substr(6, 2), " ",
                                    d.substr(9, 2), ":", d.substr(11, 2), ":", d.substr(13, 2))
                     : "";
  if (d.size() != 16 || d[8] != 'T' || d[15] != 'Z' ||
      !absl::ParseTime("%Y-%m-%d %H:%M:%S", spaced, absl::UTCTimeZone(), &signed_at, &error) ||
      absl::FormatTime("%Y%m%d", signed_at, absl::UTCTimeZone()) != auth.date) {
    return absl::PermissionDeniedError(absl::StrCat("bad x-amz-date '", *amz_date, "'"));
  }
  if (absl::AbsDuration(signed_at - now) > kGatewayClockSkew) {
    return absl::PermissionDeniedError(
        "RequestTimeTooSkewed: the request's time is too far from the gateway's");
  }
  SigV4Request canonical;
  canonical.method = request.method;
  canonical.canonical_uri = AwsUriEncode(request.path, /*keep_slash=*/true);
  canonical.query = request.query;
  canonical.payload_sha256 = *payload;
  for (const std::string& name : auth.signed_headers) {
    if (name == "x-amz-date" || name == "x-amz-content-sha256") continue;
    const std::string* value = header(name);
    if (value == nullptr) {
      return absl::UnauthenticatedError(
          absl::StrCat("SignatureDoesNotMatch: signed header '", name, "' is missing"));
    }
    canonical.headers[name] = *value;
  }
  AwsCredentials credentials;
  credentials.access_key_id = auth.key_id;
  credentials.secret_access_key = secret;
  const SigV4Result expected = SignV4(canonical, credentials, auth.region, auth.service, signed_at);
  const absl::string_view authorization = expected.headers.at("authorization");
  const std::string signature(authorization.substr(authorization.rfind('=') + 1));
  const std::string listed(absl::StrJoin(auth.signed_headers, ";"));
  const bool same_headers =
      absl::StrContains(authorization, absl::StrCat("SignedHeaders=", listed, ","));
  if (!same_headers || signature.size() != auth.signature.size() ||
      CRYPTO_memcmp(signature.data(), auth.signature.data(), signature.size()) != 0) {
    return absl::UnauthenticatedError(
        "SignatureDoesNotMatch: the request's signature does not match the task's key");
  }
  return absl::OkStatus();
}

namespace {

// A key (or a listing's prefix, whose last segment may be partial or empty) written as the one
// URI parser writes keys: no segment of dots alone, no empty segment, no control character or
// backslash. A server or proxy that normalises "a/../b" would otherwise take a key the scope
// check saw under one folder to another.
bool PlainKey(absl::string_view key, bool prefix) {
  const std::vector<absl::string_view> segments = absl::StrSplit(key, '/');
  for (size_t i = 0; i < segments.size(); ++i) {
    const absl::string_view segment = segments[i];
    const bool last = i + 1 == segments.size();
    if (segment.empty()) {
      if (last && (prefix || key.empty())) continue;
      return false;
    }
    if (segment.find_first_not_of('.') == absl::string_view::npos) return false;
    for (char c : segment) {
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f || c == '\\') return false;
    }
  }
  return true;
}

}  // namespace

absl::StatusOr<GatewayOperation> AuthorizeGatewayRequest(const GatewayRequest& request,
                                                         const ObjectScope& scope) {
  absl::string_view path = request.path;
  if (!absl::ConsumePrefix(&path, "/") || path.empty()) {
    return absl::PermissionDeniedError("the gateway serves no account operation");
  }
  const size_t slash = path.find('/');
  GatewayOperation op;
  op.bucket = std::string(path.substr(0, slash));
  op.key = slash == absl::string_view::npos ? "" : std::string(path.substr(slash + 1));
  std::string extra;
  if (op.key.empty()) {
    if (request.method != "GET" || Parameter(request, "list-type") != "2") {
      return Denied("a bucket operation", op.bucket, "", "the gateway serves only ListObjectsV2");
    }
    op.name = "ListObjectsV2";
    op.list = true;
    op.key = Parameter(request, "prefix");
    if (!PlainKey(op.key, /*prefix=*/true)) {
      return Denied("ListObjectsV2", op.bucket, op.key,
                    "dot segments, empty segments and control characters are refused");
    }
    if (!OnlyParameters(request,
                        {"list-type", "prefix", "continuation-token", "delimiter", "max-keys",
                         "start-after", "encoding-type", "fetch-owner"},
                        &extra)) {
      return Denied(op.name, op.bucket, op.key, absl::StrCat("parameter '", extra, "' refused"));
    }
    if (!scope.MayList(op.bucket, op.key)) {
      return Denied(op.name, op.bucket, op.key, "outside the folders this job may read");
    }
    return op;
  }
  if (!PlainKey(op.key, /*prefix=*/false)) {
    return Denied(absl::StrCat(request.method, " request"), op.bucket, op.key,
                  "dot segments, empty segments and control characters are refused");
  }
  op.name = ObjectOperation(request, &op.write);
  if (op.name.empty()) {
    return Denied(absl::StrCat(request.method, " request"), op.bucket, op.key,
                  "not an object operation");
  }
  if (!OnlyParameters(request, {"uploads", "uploadId", "partNumber"}, &extra)) {
    return Denied(op.name, op.bucket, op.key, absl::StrCat("parameter '", extra, "' refused"));
  }
  if (request.headers.count("x-amz-copy-source") > 0) {
    return Denied(op.name, op.bucket, op.key, "copies are not served through the gateway");
  }
  if (auto it = request.headers.find("x-amz-content-sha256");
      it != request.headers.end() && absl::StartsWith(it->second, "STREAMING-")) {
    return Denied(op.name, op.bucket, op.key, "streaming (aws-chunked) bodies are not served");
  }
  const bool allowed =
      op.write ? scope.MayWrite(op.bucket, op.key) : scope.MayRead(op.bucket, op.key);
  if (!allowed) {
    return Denied(
        op.name, op.bucket, op.key,
        op.write ? "outside this job's checkpoint folder" : "outside the places this job may read");
  }
  return op;
}

}  // namespace trainyard
