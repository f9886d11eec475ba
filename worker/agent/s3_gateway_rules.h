#ifndef TRAINYARD_WORKER_AGENT_S3_GATEWAY_RULES_H_
#define TRAINYARD_WORKER_AGENT_S3_GATEWAY_RULES_H_

// What a task may do in object storage through its agent's S3 gateway, and how a request to the
// gateway is checked: its SigV4 signature against the task's own key, then its operation against
// the task's scope. Pure functions over strings (no I/O); the server is s3_gateway.h.
//
// A task's scope is what its job names: it reads the objects under each s3:// place of its spec
// (data.train and data.tokens, their patterns up to the first wildcard's folder; the models; the
// teacher) and the committed checkpoints it resumes from, and it reads and writes under its
// job's own checkpoint folder. Nothing else: no other job's objects, no bucket operation, no
// listing wider than a folder it may read.

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "trainyard/v1/agent_service.pb.h"

namespace trainyard {

// A folder of a bucket (its key prefix without the trailing '/'; "" is the whole bucket) or one
// object: `key` covers itself and every key below `key` + "/".
struct ObjectPlace {
  std::string bucket;
  std::string key;
};

struct ObjectScope {
  std::vector<ObjectPlace> read;   // may GET, HEAD and list
  std::vector<ObjectPlace> write;  // may also PUT (multipart uploads included) and DELETE

  bool MayRead(absl::string_view bucket, absl::string_view key) const;
  bool MayWrite(absl::string_view bucket, absl::string_view key) const;
  // A listing of keys starting with `prefix`: only within a folder the scope reads, so that no
  // listing names a sibling's keys ("base/job-1" would also list "base/job-10/...").
  bool MayList(absl::string_view bucket, absl::string_view prefix) const;
};

// The scope of `task`: the s3:// places of its spec (as JobLocations reads them), its resume
// checkpoints, and its checkpoint folder (Task.checkpoint_uri) to write. INVALID_ARGUMENT naming
// the field for a place that does not parse (the coordinator already refused such specs).
absl::StatusOr<ObjectScope> TaskObjectScope(const trainyard::v1::Task& task);

// One request to the gateway as its HTTP server read it.
struct GatewayRequest {
  std::string method;                                      // "GET", "PUT", ...
  std::string path;                                        // decoded: "/bucket/a b/c"
  std::vector<std::pair<std::string, std::string>> query;  // decoded
  std::map<std::string, std::string> headers;              // lower-case names
};

// The parts of an "AWS4-HMAC-SHA256 Credential=..., SignedHeaders=..., Signature=..." header.
struct SigV4Authorization {
  std::string key_id;
  std::string date;    // YYYYMMDD
  std::string region;  // of the credential's scope
  std::string service;
  std::vector<std::string> signed_headers;  // lower-case, as listed
  std::string signature;                    // lower-case hex
};

// PERMISSION_DENIED naming what is wrong (S3 answers AccessDenied) for anything but a well-formed
// header of that form; query-string signatures are not accepted.
absl::StatusOr<SigV4Authorization> ParseSigV4Authorization(absl::string_view header);

// How far a request's x-amz-date may be from the gateway's clock, as S3 allows.
inline constexpr absl::Duration kGatewayClockSkew = absl::Minutes(15);

// Checks `request`'s signature with `secret` (the key `auth` names): the canonical request
// rebuilt from the path (encoded again as SigV4 encodes it), the query and the headers it says
// it signed, at its own x-amz-date, which must lie within kGatewayClockSkew of `now`.
// UNAUTHENTICATED (SignatureDoesNotMatch) when the signature differs, PERMISSION_DENIED for a
// request too old or too new, or without x-amz-date or x-amz-content-sha256.
absl::Status VerifyGatewaySignature(const GatewayRequest& request, const SigV4Authorization& auth,
                                    const std::string& secret, absl::Time now);

// What a request does, once allowed.
struct GatewayOperation {
  std::string name;  // "GetObject", "ListObjectsV2", "UploadPart", ...
  std::string bucket;
  std::string key;     // the object's; a listing's prefix
  bool write = false;  // writes or deletes
  bool list = false;
};

// The request's operation within `scope`: objects read (GET, HEAD) and written (PUT, DELETE,
// multipart uploads: POST ?uploads, PUT ?partNumber&uploadId, POST and DELETE ?uploadId) in a
// path-style URL (/bucket/key), and listings (GET /bucket?list-type=2&prefix=...). A key or
// prefix with a segment of dots alone, an empty segment or a control character (which a server
// that normalises paths could take elsewhere), a query parameter the operation does not take, a
// copy (x-amz-copy-source), a streaming (aws-chunked) body, and every bucket or account
// operation are refused. PERMISSION_DENIED naming the
// operation, the bucket and the key (S3's AccessDenied).
absl::StatusOr<GatewayOperation> AuthorizeGatewayRequest(const GatewayRequest& request,
                                                         const ObjectScope& scope);

}  // namespace trainyard

#endif  // TRAINYARD_WORKER_AGENT_S3_GATEWAY_RULES_H_
