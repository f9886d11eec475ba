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
#include "common/storage/s3_client_internal.h"

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
  Prepared prepared;
  if (absl::Status s = Prepare(r.method, r.bucket, r.key, r.query, r.headers, r.payload_sha256,
                               r.body_size, &prepared);
      !s.ok()) {
    return s;
  }
  CURL* h = prepared.handle;
  ForwardState state;
  state.handle = h;
  state.request = &r;
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, ForwardBody);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &state);
  curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, ForwardHeader);
  curl_easy_setopt(h, CURLOPT_HEADERDATA, &state);
  if (r.method == "PUT" || r.method == "POST") {
    curl_easy_setopt(h, CURLOPT_READFUNCTION, ForwardRead);
    curl_easy_setopt(h, CURLOPT_READDATA, &state);
  }
  const CURLcode code = curl_easy_perform(h);
  if (code == CURLE_OK) SendHead(state);  // an answer without a body
  Finish(prepared);
  if (state.aborted) return absl::CancelledError("the forwarded request was abandoned");
  if (code != CURLE_OK) {
    return absl::UnavailableError(
        absl::StrCat("transport error talking to ", scheme_, "://", prepared.host, ": ",
                     prepared.error[0] != '\0' ? prepared.error : curl_easy_strerror(code)));
  }
  return absl::OkStatus();
}

}  // namespace trainyard
