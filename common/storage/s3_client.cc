#include "common/storage/s3_client.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "common/clock.h"
#include "common/parallel.h"
#include "common/sha256.h"
#include "common/storage/s3_client_internal.h"

namespace trainyard {

using s3_internal::StripQuotes;
using s3_internal::Where;
using s3_internal::XmlElements;
using s3_internal::XmlEscape;
using s3_internal::XmlText;

absl::Status S3Client::PutSingle(const std::string& bucket, const std::string& key,
                                 const Body& body, std::string* object_sha256) {
  Request r;
  r.op = "PutObject";
  r.method = "PUT";
  r.bucket = bucket;
  r.key = key;
  r.body = &body;
  r.body_length = body.size;
  if (object_sha256 != nullptr) {
    // The object's hash is the payload hash a signed request needs: one pass serves both.
    Sha256 hash;
    body.ForEach(0, body.size, [&](absl::string_view s) { hash.Update(s); });
    *object_sha256 = hash.HexDigest();
    if (sign_payload_ || body.size == 0) r.payload_sha256 = *object_sha256;
  }
  absl::StatusOr<Response> response = Execute(r);
  return response.status();
}

absl::StatusOr<std::string> S3Client::CreateUpload(const std::string& bucket,
                                                   const std::string& key) {
  Request create;
  create.op = "CreateMultipartUpload";
  create.method = "POST";
  create.bucket = bucket;
  create.key = key;
  create.query = {{"uploads", ""}};
  absl::StatusOr<Response> created = Execute(create);
  if (!created.ok()) return created.status();
  const std::string upload_id = XmlText(created->body, "UploadId");
  if (upload_id.empty()) {
    return absl::UnavailableError(absl::StrCat("S3 CreateMultipartUpload of ", Where(bucket, key),
                                               ": no UploadId in the answer"));
  }
  return upload_id;
}

absl::StatusOr<std::vector<std::string>> S3Client::UploadParts(const std::string& bucket,
                                                               const std::string& key,
                                                               const std::string& upload_id,
                                                               const Body& body,
                                                               std::string* object_sha256) {
  const int64_t size = body.size;
  // S3 allows at most 10,000 parts.
  const int64_t part_size = std::max<int64_t>(options_.part_size, (size + 9999) / 10000);
  const int64_t parts = (size + part_size - 1) / part_size;
  auto part_length = [&](int64_t i) { return std::min(part_size, size - i * part_size); };

  // When the caller wants the whole object's hash, this thread makes one pass over the bytes for
  // it and, when requests are signed, for each part's too (in memory; a file's parts are hashed
  // as they are read), a chunk at a time so that the second hash reads from the cache; part i
  // goes out as soon as its hash is known. Otherwise each upload thread hashes its own part as
  // it signs it, in parallel.
  const bool hash_object = object_sha256 != nullptr;
  const bool hash_parts = hash_object && sign_payload_ && body.fd < 0;
  std::vector<std::string> part_sha256(static_cast<size_t>(parts));
  absl::Mutex mu;
  int64_t hashed = hash_parts ? 0 : parts;  // parts whose hash is known; guarded by mu
  bool failed = false;                      // guarded by mu
  absl::Status first_error;                 // guarded by mu

  std::vector<std::string> etags(static_cast<size_t>(parts));
  auto upload_part = [&](int64_t i) -> absl::Status {
    Request part;
    part.op = "UploadPart";
    part.method = "PUT";
    part.bucket = bucket;
    part.key = key;
    part.query = {{"partNumber", absl::StrCat(i + 1)}, {"uploadId", upload_id}};
    part.body = &body;
    part.body_offset = i * part_size;
    part.body_length = part_length(i);
    if (hash_parts) {
      absl::MutexLock lock(&mu);
      auto ready = [&]() { return hashed > i || failed; };
      mu.Await(absl::Condition(&ready));
      if (hashed <= i) return absl::CancelledError("another part failed");
      part.payload_sha256 = part_sha256[static_cast<size_t>(i)];
    }
    absl::Status status;
    absl::StatusOr<Response> response = Execute(part);
    if (!response.ok()) {
      status = response.status();
    } else if (auto etag = response->headers.find("etag"); etag == response->headers.end()) {
      status = absl::UnavailableError(absl::StrCat("S3 UploadPart ", i + 1, " of ",
                                                   Where(bucket, key), ": no ETag in the answer"));
    } else {
      etags[static_cast<size_t>(i)] = etag->second;
    }
    if (!status.ok()) {
      absl::MutexLock lock(&mu);
      if (first_error.ok()) first_error = status;
      failed = true;
    }
    return status;
  };
  absl::Status status;
  if (!hash_object) {
    status = ParallelFor(parts, options_.parallelism, upload_part);
  } else {
    std::thread uploads([&] { status = ParallelFor(parts, options_.parallelism, upload_part); });
    constexpr int64_t kChunk = 256 << 10;
    Sha256 part_hash, object_hash;
    for (int64_t i = 0; i < parts; ++i) {
      {
        absl::MutexLock lock(&mu);
        if (failed) break;
      }
      body.ForEach(i * part_size, part_length(i), [&](absl::string_view slice) {
        for (size_t at = 0; at < slice.size(); at += kChunk) {
          const absl::string_view chunk = slice.substr(at, kChunk);
          if (hash_parts) part_hash.Update(chunk);
          object_hash.Update(chunk);
        }
      });
      std::string sha = hash_parts ? part_hash.HexDigest() : std::string();
      absl::MutexLock lock(&mu);
      part_sha256[static_cast<size_t>(i)] = std::move(sha);
      hashed = i + 1;
    }
    *object_sha256 = object_hash.HexDigest();
    uploads.join();
  }
  absl::MutexLock lock(&mu);
  if (!first_error.ok()) return first_error;  // not the cancellation of a waiting part
  if (!status.ok()) return status;
  return etags;
}

absl::Status S3Client::CompleteUpload(const std::string& bucket, const std::string& key,
                                      const std::string& upload_id,
                                      const std::vector<std::string>& etags, int64_t size) {
  std::string xml = "<CompleteMultipartUpload>";
  for (size_t i = 0; i < etags.size(); ++i) {
    absl::StrAppend(&xml, "<Part><PartNumber>", i + 1, "</PartNumber><ETag>", XmlEscape(etags[i]),
                    "</ETag></Part>");
  }
  absl::StrAppend(&xml, "</CompleteMultipartUpload>");
  const Body xml_body = Body::FromPieces({xml});
  Request complete;
  complete.op = "CompleteMultipartUpload";
  complete.method = "POST";
  complete.bucket = bucket;
  complete.key = key;
  complete.query = {{"uploadId", upload_id}};
  complete.body = &xml_body;
  complete.body_length = xml_body.size;
  complete.headers["content-type"] = "application/xml";
  complete.error_in_body = true;
  absl::StatusOr<Response> done = Execute(complete);
  if (done.ok()) return absl::OkStatus();
  // A retried Complete can find the upload already completed by the first try.
  if (done.status().code() == absl::StatusCode::kNotFound) {
    absl::StatusOr<S3ObjectInfo> head = HeadObject(bucket, key);
    if (head.ok() && head->size == size) return absl::OkStatus();
  }
  return done.status();
}

absl::Status S3Client::PutMultipart(const std::string& bucket, const std::string& key,
                                    const Body& body, std::string* object_sha256) {
  absl::StatusOr<std::string> upload_id = CreateUpload(bucket, key);
  if (!upload_id.ok()) return upload_id.status();
  absl::StatusOr<std::vector<std::string>> etags =
      UploadParts(bucket, key, *upload_id, body, object_sha256);
  absl::Status status = etags.status();
  if (status.ok()) {
    status = CompleteUpload(bucket, key, *upload_id, *etags, body.size);
    if (status.ok()) return status;
  }
  Request abort;
  abort.op = "AbortMultipartUpload";
  abort.method = "DELETE";
  abort.bucket = bucket;
  abort.key = key;
  abort.query = {{"uploadId", *upload_id}};
  absl::StatusOr<Response> aborted = Execute(abort);
  if (!aborted.ok() && aborted.status().code() != absl::StatusCode::kNotFound) {
    return absl::Status(
        status.code(),
        absl::StrCat(status.message(), "; the abort failed too: ", aborted.status().message()));
  }
  return status;
}

absl::Status S3Client::PutObject(const std::string& bucket, const std::string& key,
                                 absl::string_view data) {
  const Body body = Body::FromPieces({data});
  if (body.size >= options_.multipart_threshold) return PutMultipart(bucket, key, body, nullptr);
  return PutSingle(bucket, key, body, nullptr);
}

absl::StatusOr<std::string> S3Client::PutObjectPieces(const std::string& bucket,
                                                      const std::string& key,
                                                      absl::Span<const absl::string_view> pieces) {
  const Body body = Body::FromPieces(pieces);
  std::string sha256;
  absl::Status status = body.size >= options_.multipart_threshold
                            ? PutMultipart(bucket, key, body, &sha256)
                            : PutSingle(bucket, key, body, &sha256);
  if (!status.ok()) return status;
  return sha256;
}

absl::Status S3Client::PutObjectFromFile(const std::string& bucket, const std::string& key,
                                         const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const std::string message = absl::StrCat("cannot open ", path, " to upload to ",
                                             Where(bucket, key), ": ", std::strerror(errno));
    return errno == ENOENT ? absl::NotFoundError(message) : absl::UnavailableError(message);
  }
  struct stat st;
  absl::Status status;
  if (fstat(fd, &st) != 0) {
    status = absl::UnavailableError(absl::StrCat("stat of ", path, ": ", std::strerror(errno)));
  } else {
    const Body body = Body::FromFile(fd, st.st_size);
    status = st.st_size >= options_.multipart_threshold ? PutMultipart(bucket, key, body, nullptr)
                                                        : PutSingle(bucket, key, body, nullptr);
  }
  close(fd);
  return status;
}

absl::StatusOr<std::string> S3Client::GetObject(const std::string& bucket, const std::string& key) {
  Request r;
  r.op = "GetObject";
  r.method = "GET";
  r.bucket = bucket;
  r.key = key;
  // The whole object, whatever its size: bounded by its Content-Length, which curl holds the
  // answer to.
  r.max_body = std::numeric_limits<int64_t>::max();
  absl::StatusOr<Response> response = Execute(r);
  if (!response.ok()) return response.status();
  return std::move(response->body);
}

absl::StatusOr<std::string> S3Client::GetObjectRange(const std::string& bucket,
                                                     const std::string& key, int64_t offset,
                                                     int64_t length) {
  if (offset < 0 || length < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad range offset=", offset, " length=", length, " for ", Where(bucket, key)));
  }
  if (length == 0) {
    absl::StatusOr<S3ObjectInfo> head = HeadObject(bucket, key);
    if (!head.ok()) return head.status();
    if (offset > head->size) {
      return absl::OutOfRangeError(absl::StrCat("offset ", offset, " is past the end of ",
                                                Where(bucket, key), " (", head->size, " bytes)"));
    }
    return std::string();
  }
  Request r;
  r.op = "GetObject";
  r.method = "GET";
  r.bucket = bucket;
  r.key = key;
  r.headers["range"] = absl::StrCat("bytes=", offset, "-", offset + length - 1);
  r.max_body = length;
  r.range_end = offset + length;
  absl::StatusOr<Response> response = Execute(r);
  if (response.ok()) {
    // A service that ignores Range answers 200 with the whole object.
    if (response->status == 200 && response->headers.count("content-range") == 0) {
      std::string& all = response->body;
      if (offset > static_cast<int64_t>(all.size())) {
        return absl::OutOfRangeError(
            absl::StrCat("offset ", offset, " is past the end of ", Where(bucket, key)));
      }
      return all.substr(static_cast<size_t>(offset), static_cast<size_t>(length));
    }
    return std::move(response->body);
  }
  if (response.status().code() != absl::StatusCode::kOutOfRange) return response.status();
  // 416: the offset is at or past the end. At the end is an empty read, as for files.
  absl::StatusOr<S3ObjectInfo> head = HeadObject(bucket, key);
  if (head.ok() && head->size == offset) return std::string();
  return response.status();
}

absl::StatusOr<S3ObjectInfo> S3Client::HeadObject(const std::string& bucket,
                                                  const std::string& key) {
  Request r;
  r.op = "HeadObject";
  r.method = "HEAD";
  r.bucket = bucket;
  r.key = key;
  absl::StatusOr<Response> response = Execute(r);
  if (!response.ok()) return response.status();
  S3ObjectInfo info;
  info.key = key;
  auto length = response->headers.find("content-length");
  if (length == response->headers.end() || !absl::SimpleAtoi(length->second, &info.size)) {
    return absl::UnavailableError(
        absl::StrCat("S3 HeadObject of ", Where(bucket, key), ": no Content-Length"));
  }
  auto etag = response->headers.find("etag");
  if (etag != response->headers.end()) info.etag = StripQuotes(etag->second);
  return info;
}

absl::StatusOr<S3ObjectInfo> S3Client::GetObjectToFile(const std::string& bucket,
                                                       const std::string& key,
                                                       const std::string& path) {
  absl::StatusOr<S3ObjectInfo> head = HeadObject(bucket, key);
  if (!head.ok()) return head.status();
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("cannot create ", path, " for ", Where(bucket, key),
                                               ": ", std::strerror(errno)));
  }
  const int64_t size = head->size;
  const int64_t part_size = options_.part_size;
  const int64_t parts =
      size >= options_.multipart_threshold ? (size + part_size - 1) / part_size : 1;
  absl::Status status = ParallelFor(parts, options_.parallelism, [&](int64_t i) -> absl::Status {
    Request r;
    r.op = "GetObject";
    r.method = "GET";
    r.bucket = bucket;
    r.key = key;
    r.sink_fd = fd;
    const int64_t offset = i * part_size;
    const int64_t length = parts == 1 ? size : std::min(part_size, size - offset);
    r.sink_offset = parts == 1 ? 0 : offset;
    r.max_body = length;  // what HEAD said: no more goes into the file
    if (parts > 1) {
      r.headers["range"] = absl::StrCat("bytes=", offset, "-", offset + length - 1);
      // The object must not change between the parts.
      if (!head->etag.empty()) r.headers["if-match"] = absl::StrCat("\"", head->etag, "\"");
    }
    absl::StatusOr<Response> response = Execute(r);
    if (!response.ok()) return response.status();
    if (response->received != length) {
      return absl::DataLossError(absl::StrCat("S3 GetObject of ", Where(bucket, key), ": got ",
                                              response->received, " bytes, expected ", length));
    }
    return absl::OkStatus();
  });
  if (status.ok() && fsync(fd) != 0) {
    status = absl::UnavailableError(absl::StrCat("syncing ", path, ": ", std::strerror(errno)));
  }
  close(fd);
  if (!status.ok()) return status;
  return head;
}

absl::StatusOr<std::vector<S3ObjectInfo>> S3Client::ListObjects(const std::string& bucket,
                                                                const std::string& prefix) {
  std::vector<S3ObjectInfo> out;
  std::string token;
  while (true) {
    Request r;
    r.op = "ListObjectsV2";
    r.method = "GET";
    r.bucket = bucket;
    r.query = {{"list-type", "2"}, {"prefix", prefix}};
    if (!token.empty()) r.query.emplace_back("continuation-token", token);
    absl::StatusOr<Response> response = Execute(r);
    if (!response.ok()) {
      return absl::Status(response.status().code(),
                          absl::StrCat(response.status().message(), " (prefix '", prefix, "')"));
    }
    for (absl::string_view entry : XmlElements(response->body, "Contents")) {
      S3ObjectInfo info;
      info.key = XmlText(entry, "Key");
      if (!absl::SimpleAtoi(XmlText(entry, "Size"), &info.size)) info.size = -1;
      info.etag = StripQuotes(XmlText(entry, "ETag"));
      out.push_back(std::move(info));
    }
    const bool truncated = XmlText(response->body, "IsTruncated") == "true";
    token = XmlText(response->body, "NextContinuationToken");
    if (!truncated) break;
    if (token.empty()) {
      return absl::UnavailableError(absl::StrCat("S3 ListObjectsV2 of ", Where(bucket, ""),
                                                 ": truncated answer without a continuation "
                                                 "token (prefix '",
                                                 prefix, "')"));
    }
  }
  std::sort(out.begin(), out.end(),
            [](const S3ObjectInfo& a, const S3ObjectInfo& b) { return a.key < b.key; });
  return out;
}

absl::Status S3Client::DeleteObject(const std::string& bucket, const std::string& key) {
  Request r;
  r.op = "DeleteObject";
  r.method = "DELETE";
  r.bucket = bucket;
  r.key = key;
  absl::StatusOr<Response> response = Execute(r);
  if (!response.ok() && response.status().code() == absl::StatusCode::kNotFound &&
      !absl::StrContains(response.status().message(), "NoSuchBucket")) {
    return absl::OkStatus();
  }
  return response.status();
}

}  // namespace trainyard
