#ifndef TRAINYARD_COMMON_STORAGE_S3_CLIENT_H_
#define TRAINYARD_COMMON_STORAGE_S3_CLIENT_H_

// A small S3 client on libcurl and OpenSSL: SigV4-signed PUT (single or multipart, parts in
// parallel), GET (whole, ranged, or to a file with parallel ranges), HEAD, ListObjectsV2 with
// paging, and DELETE, against AWS or any S3-compatible endpoint (MinIO, Ceph, R2, s3rver).
//
// Every request retries on connection errors, HTTP 5xx, 429 and SlowDown with exponential backoff
// and full jitter (sleep = uniform(0, min(max_backoff, initial_backoff * 2^n))), bounded by
// max_attempts and by max_elapsed per call. S3 requests are idempotent for our use (keys are
// written whole and never overwritten with different content), so PUTs retry as well.
//
// Errors name the operation, bucket, key and the S3 error code (or the transport error):
//   NOT_FOUND           NoSuchKey, NoSuchBucket, NoSuchUpload, HTTP 404
//   PERMISSION_DENIED   AccessDenied, InvalidAccessKeyId, SignatureDoesNotMatch, HTTP 401/403
//   OUT_OF_RANGE        a range that starts past the end of the object
//   INVALID_ARGUMENT    other 4xx, bad arguments
//   UNAVAILABLE         5xx, 429, SlowDown, connection errors: after the retry bound
//   DATA_LOSS           a response shorter than its Content-Length / the object's size
// Thread-safe: one client serves any number of threads; idle connections are kept in a pool of
// curl handles and reused.

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/clock.h"
#include "common/storage/s3_auth.h"

namespace trainyard {

struct S3RetryPolicy {
  int max_attempts = 6;  // per request, first try included
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(5);
  absl::Duration max_elapsed = absl::Seconds(60);  // no retry starts after this since the first try
};

enum class S3PayloadSigning {
  // Over http, sign; over https, send UNSIGNED-PAYLOAD, as the AWS SDKs do: TLS already protects
  // the body, and hashing it costs a pass over every byte sent.
  kAuto,
  kAlways,  // sign the SHA-256 of every body
  kNever,   // UNSIGNED-PAYLOAD for every body (AWS accepts it; over http the body is unprotected)
};

enum class S3Addressing {
  kAuto,           // virtual-hosted on AWS's own endpoint, path-style on a custom endpoint
  kPath,           // http://endpoint/bucket/key
  kVirtualHosted,  // http://bucket.endpoint/key
};

struct S3ClientOptions {
  // scheme://host[:port] of the service; empty means https://s3.{region}.amazonaws.com.
  std::string endpoint;
  std::string region = "us-east-1";
  S3Addressing addressing = S3Addressing::kAuto;
  AwsCredentials credentials;
  S3RetryPolicy retry;
  // Objects of at least this size go up as multipart uploads and come down as parallel ranged
  // GETs of part_size bytes, `parallelism` at a time.
  int64_t multipart_threshold = int64_t{64} << 20;
  int64_t part_size = int64_t{16} << 20;
  int parallelism = 4;
  S3PayloadSigning payload_signing = S3PayloadSigning::kAuto;
  absl::Duration connect_timeout = absl::Seconds(10);
  // A transfer slower than 1 KiB/s for this long is aborted (and retried).
  absl::Duration stall_timeout = absl::Seconds(30);
  // Time for the retry bound, the waits between tries and request dates; null means RealClock.
  // Not owned.
  const Clock* clock = nullptr;
  uint64_t jitter_seed = 0;  // 0: random
};

// Options from the environment: endpoint AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL, region
// AWS_REGION or AWS_DEFAULT_REGION, addressing TRAINYARD_S3_ADDRESSING (path | virtual | auto),
// payload signing TRAINYARD_S3_SIGN_PAYLOAD (auto | always | never), credentials as
// LoadAwsCredentials. Errors as LoadAwsCredentials; INVALID_ARGUMENT for a bad endpoint,
// addressing or signing value.
absl::StatusOr<S3ClientOptions> S3ClientOptionsFromEnv(const EnvLookup& env);

struct S3ObjectInfo {
  std::string key;
  int64_t size = 0;
  std::string etag;  // as the service gives it, quotes removed
};

// A request passed through on someone else's behalf (the agent's S3 gateway, which has checked
// it): signed with this client's credentials and sent once, not retried (the sender retries).
struct S3ForwardRequest {
  std::string method;  // GET, HEAD, PUT, POST, DELETE
  std::string bucket;
  std::string key;  // "" for a bucket's listing
  std::vector<std::pair<std::string, std::string>> query;
  std::map<std::string, std::string> headers;  // to sign and send: range, content-type, ...
  int64_t body_size = 0;                       // PUT and POST
  std::string payload_sha256;  // as the sender signed it: S3 checks the body against it
  // Fills up to `size` bytes of the body; returns how many, 0 at its end, -1 to abort.
  std::function<int64_t(char* buffer, size_t size)> read_body;
  // The answer's status and headers (lower-case names), once, before any of its body; then the
  // body in pieces. Either returns false to abort the transfer.
  std::function<bool(long status, const std::map<std::string, std::string>& headers)> on_head;
  std::function<bool(absl::string_view piece)> on_body;
};

// Answers are bounded: one longer than what was asked for (a range, a part, the size HEAD gave)
// is DATA_LOSS, and one that is not an object (a listing, a multipart answer, an error) is
// RESOURCE_EXHAUSTED past 16 MiB; the transfer stops there, and neither is retried.
class S3Client {
 public:
  explicit S3Client(S3ClientOptions options);
  ~S3Client();
  S3Client(const S3Client&) = delete;
  S3Client& operator=(const S3Client&) = delete;

  // Writes the object: one PUT below multipart_threshold, else a multipart upload whose parts go
  // in parallel and which is aborted (its parts deleted) if any part fails. Blocks.
  absl::Status PutObject(const std::string& bucket, const std::string& key, absl::string_view data);
  // As PutObject, for the object made of `pieces` one after the other, sent from where they are
  // (they must stay valid until the call returns). Returns the lower-case hex SHA-256 of the
  // object, from the same pass over the bytes as the payload hashes of the signature: below
  // multipart_threshold the object's hash is the payload hash; a signed multipart upload hashes
  // each part as well, in that pass. Blocks.
  absl::StatusOr<std::string> PutObjectPieces(const std::string& bucket, const std::string& key,
                                              absl::Span<const absl::string_view> pieces);
  // As PutObject, streaming from a local file (never more than parallelism parts in memory).
  // NOT_FOUND / UNAVAILABLE for a file that cannot be opened or read.
  absl::Status PutObjectFromFile(const std::string& bucket, const std::string& key,
                                 const std::string& path);
  absl::StatusOr<std::string> GetObject(const std::string& bucket, const std::string& key);
  // Bytes [offset, offset + length) clipped to the object; offset == size gives "". OUT_OF_RANGE
  // for an offset past the end, INVALID_ARGUMENT for a negative offset or length.
  absl::StatusOr<std::string> GetObjectRange(const std::string& bucket, const std::string& key,
                                             int64_t offset, int64_t length);
  // Writes the object to `path` (created or truncated), in parallel ranges when it is large.
  // Returns what HEAD said about it. The file is incomplete on error; the caller removes it.
  absl::StatusOr<S3ObjectInfo> GetObjectToFile(const std::string& bucket, const std::string& key,
                                               const std::string& path);
  absl::StatusOr<S3ObjectInfo> HeadObject(const std::string& bucket, const std::string& key);
  // Every object whose key starts with `prefix`, following continuation tokens; in key order.
  absl::StatusOr<std::vector<S3ObjectInfo>> ListObjects(const std::string& bucket,
                                                        const std::string& prefix);
  // Deleting a missing key is OK (S3 answers 204 either way).
  absl::Status DeleteObject(const std::string& bucket, const std::string& key);

  // Sends `request` once. UNAVAILABLE naming the endpoint for a transport error (the answer may
  // then have begun), CANCELLED when a callback aborted; S3's own errors are answers (on_head).
  absl::Status Forward(const S3ForwardRequest& request);

  // Requests sent and retries made since construction (for tests and benchmarks).
  int64_t requests_sent() const { return requests_sent_.load(); }
  int64_t retries() const { return retries_.load(); }

  struct Body;
  struct Request;
  struct Response;

 private:
  // One attempt; transport errors come back as UNAVAILABLE with retryable set.
  absl::StatusOr<Response> PerformOnce(Request& request, bool* retryable);
  // With the retry policy; maps HTTP errors to statuses naming `op`, bucket and key.
  absl::StatusOr<Response> Execute(Request& request);
  // Uploads `body`; when `object_sha256` is not null (in-memory bodies only), sets it to the hash
  // of the whole object.
  absl::Status PutMultipart(const std::string& bucket, const std::string& key, const Body& body,
                            std::string* object_sha256);
  absl::Status PutSingle(const std::string& bucket, const std::string& key, const Body& body,
                         std::string* object_sha256);
  // PutMultipart's steps: the upload begun (its id), its parts sent (their ETags, in order; the
  // object's hash where asked for), and completed.
  absl::StatusOr<std::string> CreateUpload(const std::string& bucket, const std::string& key);
  absl::StatusOr<std::vector<std::string>> UploadParts(const std::string& bucket,
                                                       const std::string& key,
                                                       const std::string& upload_id,
                                                       const Body& body,
                                                       std::string* object_sha256);
  absl::Status CompleteUpload(const std::string& bucket, const std::string& key,
                              const std::string& upload_id, const std::vector<std::string>& etags,
                              int64_t size);
  absl::Duration Backoff(int retry);
  // A request signed with this client's credentials and set up on a pooled curl handle (its URL,
  // signed headers without 100-continue, timeouts, method and body size); the caller adds its
  // callbacks, performs it and hands it back with Finish. RESOURCE_EXHAUSTED without a handle.
  // Prepared (s3_client_internal.h) must stay where it is until Finish: curl writes its errors
  // into it.
  struct Prepared;
  absl::Status Prepare(const std::string& method, const std::string& bucket, const std::string& key,
                       const std::vector<std::pair<std::string, std::string>>& query,
                       const std::map<std::string, std::string>& headers,
                       const std::string& payload_sha256, int64_t body_size, Prepared* out);
  void Finish(Prepared& prepared);
  // Where a request for `key` of `bucket` goes: the Host header and the encoded path.
  std::pair<std::string, std::string> HostAndPath(const std::string& bucket,
                                                  const std::string& key) const;
  void* AcquireHandle();
  void ReleaseHandle(void* handle);

  const S3ClientOptions options_;
  const Clock& clock_;
  std::string scheme_;  // "http" or "https"
  std::string host_;    // host[:port] of the endpoint
  bool virtual_hosted_ = false;
  bool sign_payload_ = true;

  absl::Mutex pool_mu_;
  std::vector<void*> idle_handles_ ABSL_GUARDED_BY(pool_mu_);  // CURL*
  absl::Mutex rng_mu_;
  std::mt19937_64 rng_ ABSL_GUARDED_BY(rng_mu_);
  std::atomic<int64_t> requests_sent_{0};
  std::atomic<int64_t> retries_{0};
};

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_STORAGE_S3_CLIENT_H_
