// S3Client::Forward: one request sent on someone else's behalf, streamed both ways.

#include <curl/curl.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/storage/s3_client.h"

namespace trainyard {

namespace {

struct ForwardState {
  CURL* handle = nullptr;
  const S3ForwardRequest* request = nullptr;
  long status = 0;
  std::map<std::string, std::string> headers;
  bool head_sent = false;
  bool aborted = false;
};

// Hands the answer's status and headers on, once.
bool SendHead(ForwardState& state) {
  if (state.head_sent) return true;
  state.head_sent = true;
  curl_easy_getinfo(state.handle, CURLINFO_RESPONSE_CODE, &state.status);
  if (!state.request->on_head(state.status, state.headers)) state.aborted = true;
  return !state.aborted;
}

size_t ForwardHeader(char* data, size_t size, size_t nitems, void* userdata) {
  auto* state = static_cast<ForwardState*>(userdata);
  const size_t n = size * nitems;
  absl::string_view line(data, n);
  if (absl::StartsWith(line, "HTTP/")) {
    state->headers.clear();  // a new answer (after 100 Continue)
    return n;
  }
  const size_t colon = line.find(':');
  if (colon != absl::string_view::npos) {
    state->headers[absl::AsciiStrToLower(absl::StripAsciiWhitespace(line.substr(0, colon)))] =
        std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
  }
  return n;
}

size_t ForwardBody(char* data, size_t size, size_t nmemb, void* userdata) {
  auto* state = static_cast<ForwardState*>(userdata);
  const size_t n = size * nmemb;
  if (!SendHead(*state)) return 0;
  if (!state->request->on_body(absl::string_view(data, n))) {
    state->aborted = true;
    return 0;
  }
  return n;
}

size_t ForwardRead(char* buffer, size_t size, size_t nitems, void* userdata) {
  auto* state = static_cast<ForwardState*>(userdata);
  const int64_t got = state->request->read_body(buffer, size * nitems);
  if (got < 0) {
    state->aborted = true;
    return CURL_READFUNC_ABORT;
  }
  return static_cast<size_t>(got);
}

}  // namespace

absl::Status S3Client::Forward(const S3ForwardRequest& r) {
  const auto [host, path] = HostAndPath(r.bucket, r.key);
  const std::string query = CanonicalQueryString(r.query);
  const std::string url = absl::StrCat(scheme_, "://", host, path, query.empty() ? "" : "?", query);
  SigV4Request to_sign;
  to_sign.method = r.method;
  to_sign.canonical_uri = path;
  to_sign.query = r.query;
  to_sign.headers = r.headers;
  to_sign.headers["host"] = host;
  to_sign.payload_sha256 = r.payload_sha256;
  const SigV4Result signed_request =
      SignV4(to_sign, options_.credentials, options_.region, "s3", clock_.Now());

  CURL* h = static_cast<CURL*>(AcquireHandle());
  if (h == nullptr) return absl::ResourceExhaustedError("curl_easy_init failed");
  curl_easy_reset(h);
  curl_slist* headers = nullptr;
  for (const auto& [name, value] : signed_request.headers) {
    headers = curl_slist_append(headers, absl::StrCat(name, ": ", value).c_str());
  }
  headers = curl_slist_append(headers, "Expect:");
  ForwardState state;
  state.handle = h;
  state.request = &r;
  char error_buffer[CURL_ERROR_SIZE] = {0};
  curl_easy_setopt(h, CURLOPT_URL, url.c_str());
  curl_easy_setopt(h, CURLOPT_PATH_AS_IS, 1L);
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, error_buffer);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS,
                   static_cast<long>(absl::ToInt64Milliseconds(options_.connect_timeout)));
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1024L);
  curl_easy_setopt(
      h, CURLOPT_LOW_SPEED_TIME,
      static_cast<long>(std::max<int64_t>(1, absl::ToInt64Seconds(options_.stall_timeout))));
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, ForwardBody);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &state);
  curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, ForwardHeader);
  curl_easy_setopt(h, CURLOPT_HEADERDATA, &state);
  curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
  if (r.method == "HEAD") {
    curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
  } else if (r.method == "PUT" || r.method == "POST") {
    curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(r.body_size));
    curl_easy_setopt(h, CURLOPT_READFUNCTION, ForwardRead);
    curl_easy_setopt(h, CURLOPT_READDATA, &state);
    curl_easy_setopt(h, CURLOPT_UPLOAD_BUFFERSIZE, 512L * 1024L);
    if (r.method == "POST") curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, "POST");
  } else if (r.method != "GET") {
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, r.method.c_str());
  }
  if (r.method == "GET") curl_easy_setopt(h, CURLOPT_BUFFERSIZE, 512L * 1024L);
  requests_sent_++;
  const CURLcode code = curl_easy_perform(h);
  if (code == CURLE_OK) SendHead(state);  // an answer without a body
  curl_slist_free_all(headers);
  ReleaseHandle(h);
  if (state.aborted) return absl::CancelledError("the forwarded request was abandoned");
  if (code != CURLE_OK) {
    return absl::UnavailableError(
        absl::StrCat("transport error talking to ", scheme_, "://", host, ": ",
                     error_buffer[0] ? error_buffer : curl_easy_strerror(code)));
  }
  return absl::OkStatus();
}

}  // namespace trainyard
