#ifndef TRAINYARD_COMMON_STORAGE_S3_CLIENT_INTERNAL_H_
#define TRAINYARD_COMMON_STORAGE_S3_CLIENT_INTERNAL_H_

// Inside S3Client: what its transport (s3_client_transport.cc: signing, curl, retries) and its
// operations (s3_client.cc: objects, multipart uploads, listings) share. Not for other users.

#include <curl/curl.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/storage/s3_client.h"

namespace trainyard {

struct S3Client::Body {
  static Body FromPieces(absl::Span<const absl::string_view> pieces) {
    Body body;
    body.pieces.assign(pieces.begin(), pieces.end());
    body.starts.reserve(pieces.size());
    for (absl::string_view piece : pieces) {
      body.starts.push_back(body.size);
      body.size += static_cast<int64_t>(piece.size());
    }
    return body;
  }
  static Body FromFile(int fd, int64_t size) {
    Body body;
    body.fd = fd;
    body.size = size;
    return body;
  }

  // Calls fn(absl::string_view) on the in-memory bytes [offset, offset + length), in order, in as
  // few slices as the pieces allow.
  template <typename Fn>
  void ForEach(int64_t offset, int64_t length, Fn&& fn) const {
    if (pieces.empty()) return;
    size_t i = static_cast<size_t>(std::upper_bound(starts.begin(), starts.end(), offset) -
                                   starts.begin());
    i = i == 0 ? 0 : i - 1;
    for (; length > 0 && i < pieces.size(); ++i) {
      const int64_t within = offset - starts[i];
      const int64_t n = std::min<int64_t>(length, static_cast<int64_t>(pieces[i].size()) - within);
      if (n <= 0) continue;
      fn(pieces[i].substr(static_cast<size_t>(within), static_cast<size_t>(n)));
      offset += n;
      length -= n;
    }
  }

  std::vector<absl::string_view> pieces;  // not owned
  std::vector<int64_t> starts;            // where each piece begins in the body
  int fd = -1;
  int64_t size = 0;
};

struct S3Client::Request {
  std::string op;  // S3 API name, for messages: "PutObject", "UploadPart", ...
  std::string method;
  std::string bucket;
  std::string key;
  std::vector<std::pair<std::string, std::string>> query;
  std::map<std::string, std::string> headers;  // extra headers to sign and send ("range")
  // The body: body_length bytes of `body` from body_offset; none when null.
  const Body* body = nullptr;
  int64_t body_offset = 0;
  int64_t body_length = 0;
  std::string payload_sha256;  // computed on the first attempt unless set before
  // Where a 2xx body goes: sink_fd at sink_offset, or Response::body.
  int sink_fd = -1;
  int64_t sink_offset = 0;
  // The most bytes of a 2xx body the caller asked for (an object, a range, a part): more ends the
  // transfer with DATA_LOSS. -1: an answer of S3's own (a listing, an upload id), held in memory
  // up to s3_internal::kMaxAnswerBytes (RESOURCE_EXHAUSTED past it), as error answers always are.
  int64_t max_body = -1;
  // A ranged GET into memory: where the range ends. A service that ignores Range answers 200
  // with the whole object; the transfer ends, successfully, once it has this many bytes.
  int64_t range_end = -1;
  bool no_body = false;  // HEAD
  // S3 may answer CompleteMultipartUpload with 200 and an <Error> body.
  bool error_in_body = false;
};

struct S3Client::Prepared {
  CURL* handle = nullptr;
  curl_slist* headers = nullptr;
  std::string host;  // for messages: "transport error talking to ..."
  char error[CURL_ERROR_SIZE] = {0};
};

struct S3Client::Response {
  long status = 0;
  std::string body;                            // the 2xx body (when no sink) or an error body
  std::map<std::string, std::string> headers;  // lower-case names
  int64_t received = 0;
};

namespace s3_internal {

// The most bytes of an answer that is not an object held in memory: listings (a page of 1000
// keys is a few hundred KiB), multipart answers and errors, so that a broken or hostile endpoint
// cannot make the client grow without end.
inline constexpr int64_t kMaxAnswerBytes = int64_t{16} << 20;

// "bucket 'B'" or "bucket 'B', key 'K'", for messages.
inline std::string Where(const std::string& bucket, const std::string& key) {
  return key.empty() ? absl::StrCat("bucket '", bucket, "'")
                     : absl::StrCat("bucket '", bucket, "', key '", key, "'");
}

// The raw contents of every <tag>...</tag> in `xml`, in order (tags read never nest in
// themselves). S3 answers are flat enough for tag extraction.
std::vector<absl::string_view> XmlElements(absl::string_view xml, absl::string_view tag);
// The first <tag>'s text, unescaped; empty when there is none.
std::string XmlText(absl::string_view xml, absl::string_view tag);
std::string XmlEscape(absl::string_view s);
// An ETag without its surrounding quotes.
std::string StripQuotes(absl::string_view etag);

}  // namespace s3_internal
}  // namespace trainyard

#endif  // TRAINYARD_COMMON_STORAGE_S3_CLIENT_INTERNAL_H_
