#include "common/s3_client.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
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
#include "common/parallel.h"
#include "common/sha256.h"

namespace trainyard {

// What a PUT sends: in-memory pieces one after the other, or `size` bytes of the file `fd`.
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
      const int64_t n =
          std::min<int64_t>(length, static_cast<int64_t>(pieces[i].size()) - within);
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
  bool no_body = false;  // HEAD
  // S3 may answer CompleteMultipartUpload with 200 and an <Error> body.
  bool error_in_body = false;
};

struct S3Client::Response {
  long status = 0;
  std::string body;                            // the 2xx body (when no sink) or an error body
  std::map<std::string, std::string> headers;  // lower-case names
  int64_t received = 0;
};

namespace {

constexpr char kUnsignedPayload[] = "UNSIGNED-PAYLOAD";

void GlobalInit() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

// ---- a few lines of XML: S3 answers are flat enough for tag extraction ----

std::string XmlUnescape(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '&') {
      out.push_back(s[i]);
      continue;
    }
    const size_t semi = s.find(';', i);
    if (semi == absl::string_view::npos) {
      out.push_back(s[i]);
      continue;
    }
    absl::string_view entity = s.substr(i + 1, semi - i - 1);
    uint32_t cp = 0;
    bool numeric = false;
    if (entity == "amp") {
      out.push_back('&');
    } else if (entity == "lt") {
      out.push_back('<');
    } else if (entity == "gt") {
      out.push_back('>');
    } else if (entity == "quot") {
      out.push_back('"');
    } else if (entity == "apos") {
      out.push_back('\'');
    } else if (absl::StartsWith(entity, "#x") || absl::StartsWith(entity, "#X")) {
      numeric = absl::SimpleHexAtoi(entity.substr(2), &cp);
    } else if (absl::StartsWith(entity, "#")) {
      numeric = absl::SimpleAtoi(entity.substr(1), &cp);
    } else {
      out.append(s.data() + i, semi - i + 1);
    }
    if (numeric) {  // UTF-8 encode
      if (cp < 0x80) {
        out.push_back(static_cast<char>(cp));
      } else if (cp < 0x800) {
        out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
      } else if (cp < 0x10000) {
        out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
      } else {
        out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
      }
    }
    i = semi;
  }
  return out;
}

// The raw contents of every <tag>...</tag> in `xml`, in order (tags we read never nest in
// themselves).
std::vector<absl::string_view> XmlElements(absl::string_view xml, absl::string_view tag) {
  std::vector<absl::string_view> out;
  const std::string open = absl::StrCat("<", tag, ">");
  const std::string close = absl::StrCat("</", tag, ">");
  size_t pos = 0;
  while (true) {
    const size_t start = xml.find(open, pos);
    if (start == absl::string_view::npos) break;
    const size_t end = xml.find(close, start + open.size());
    if (end == absl::string_view::npos) break;
    out.push_back(xml.substr(start + open.size(), end - start - open.size()));
    pos = end + close.size();
  }
  return out;
}

std::string XmlText(absl::string_view xml, absl::string_view tag) {
  std::vector<absl::string_view> e = XmlElements(xml, tag);
  return e.empty() ? std::string() : XmlUnescape(e.front());
}

std::string XmlEscape(absl::string_view s) {
  return absl::StrReplaceAll(s, {{"&", "&amp;"}, {"<", "&lt;"}, {">", "&gt;"}, {"\"", "&quot;"}});
}

std::string StripQuotes(absl::string_view etag) {
  absl::string_view e = absl::StripAsciiWhitespace(etag);
  if (e.size() >= 2 && e.front() == '"' && e.back() == '"') e = e.substr(1, e.size() - 2);
  return std::string(e);
}

// ---- curl callbacks ----

struct ReadState {
  const S3Client::Request* request;
  int64_t pos = 0;
  int read_errno = 0;
};

size_t ReadBody(char* buffer, size_t size, size_t nitems, void* userdata) {
  auto* state = static_cast<ReadState*>(userdata);
  const S3Client::Request& r = *state->request;
  const size_t n = static_cast<size_t>(
      std::min<int64_t>(static_cast<int64_t>(size * nitems), r.body_length - state->pos));
  if (n == 0) return 0;
  if (r.body->fd < 0) {
    size_t done = 0;
    r.body->ForEach(r.body_offset + state->pos, static_cast<int64_t>(n),
                    [&](absl::string_view slice) {
                      std::memcpy(buffer + done, slice.data(), slice.size());
                      done += slice.size();
                    });
    state->pos += static_cast<int64_t>(n);
    return n;
  }
  ssize_t got;
  do {
    got = pread(r.body->fd, buffer, n, r.body_offset + state->pos);
  } while (got < 0 && errno == EINTR);
  if (got <= 0) {
    state->read_errno = got < 0 ? errno : EIO;
    return CURL_READFUNC_ABORT;
  }
  state->pos += got;
  return static_cast<size_t>(got);
}

int SeekBody(void* userdata, curl_off_t offset, int origin) {
  auto* state = static_cast<ReadState*>(userdata);
  if (origin != SEEK_SET) return CURL_SEEKFUNC_CANTSEEK;
  state->pos = offset;
  return CURL_SEEKFUNC_OK;
}

struct WriteState {
  CURL* handle;
  const S3Client::Request* request;
  S3Client::Response* response;
  int write_errno = 0;
};

size_t WriteBody(char* data, size_t size, size_t nmemb, void* userdata) {
  auto* state = static_cast<WriteState*>(userdata);
  const size_t n = size * nmemb;
  long status = 0;
  curl_easy_getinfo(state->handle, CURLINFO_RESPONSE_CODE, &status);
  const S3Client::Request& r = *state->request;
  if (status >= 300 || r.sink_fd < 0) {
    state->response->body.append(data, n);
  } else {
    size_t done = 0;
    while (done < n) {
      ssize_t w = pwrite(r.sink_fd, data + done, n - done,
                         r.sink_offset + state->response->received + static_cast<int64_t>(done));
      if (w < 0) {
        if (errno == EINTR) continue;
        state->write_errno = errno;
        return 0;  // makes curl fail with CURLE_WRITE_ERROR
      }
      done += static_cast<size_t>(w);
    }
  }
  state->response->received += static_cast<int64_t>(n);
  return n;
}

size_t ReadHeader(char* data, size_t size, size_t nitems, void* userdata) {
  auto* response = static_cast<S3Client::Response*>(userdata);
  const size_t n = size * nitems;
  absl::string_view line(data, n);
  if (absl::StartsWith(line, "HTTP/")) {
    response->headers.clear();  // a new response (after 100 Continue)
    return n;
  }
  const size_t colon = line.find(':');
  if (colon != absl::string_view::npos) {
    response->headers[absl::AsciiStrToLower(absl::StripAsciiWhitespace(line.substr(0, colon)))] =
        std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
  }
  return n;
}

bool RetryableCurlCode(CURLcode code) {
  switch (code) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
      return true;
    default:
      return false;
  }
}

absl::StatusCode CodeForS3Error(long http, const std::string& code) {
  if (code == "NoSuchKey" || code == "NoSuchBucket" || code == "NoSuchUpload" ||
      code == "NotFound" || http == 404) {
    return absl::StatusCode::kNotFound;
  }
  if (code == "AccessDenied" || code == "InvalidAccessKeyId" || code == "SignatureDoesNotMatch" ||
      code == "ExpiredToken" || code == "InvalidToken" || http == 401 || http == 403) {
    return absl::StatusCode::kPermissionDenied;
  }
  if (code == "InvalidRange" || http == 416) return absl::StatusCode::kOutOfRange;
  if (code == "SlowDown" || http == 429 || http >= 500) return absl::StatusCode::kUnavailable;
  return absl::StatusCode::kInvalidArgument;
}

std::string DefaultCodeFor(long http) {
  switch (http) {
    case 301:
      return "PermanentRedirect";
    case 400:
      return "BadRequest";
    case 403:
      return "Forbidden";
    case 404:
      return "NotFound";
    case 416:
      return "InvalidRange";
    case 429:
      return "TooManyRequests";
    case 503:
      return "ServiceUnavailable";
    default:
      return absl::StrCat("HTTP", http);
  }
}

absl::StatusOr<std::string> Sha256OfFileRange(int fd, int64_t offset, int64_t length) {
  Sha256 hash;
  std::string buffer(1 << 20, '\0');
  int64_t done = 0;
  while (done < length) {
    const size_t want = static_cast<size_t>(std::min<int64_t>(buffer.size(), length - done));
    ssize_t got = pread(fd, buffer.data(), want, offset + done);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      return absl::UnavailableError(
          absl::StrCat("reading the body to upload: ", got < 0 ? std::strerror(errno) : "EOF"));
    }
    hash.Update(absl::string_view(buffer.data(), static_cast<size_t>(got)));
    done += got;
  }
  return hash.HexDigest();
}

std::string Where(const std::string& bucket, const std::string& key) {
  return key.empty() ? absl::StrCat("bucket '", bucket, "'")
                     : absl::StrCat("bucket '", bucket, "', key '", key, "'");
}

// Bucket names that can be a DNS label prefix (virtual-hosted addressing).
bool DnsCompatibleBucket(const std::string& bucket) {
  if (bucket.size() < 3 || bucket.size() > 63) return false;
  for (char c : bucket) {
    if (!(absl::ascii_islower(c) || absl::ascii_isdigit(c) || c == '-')) return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<S3ClientOptions> S3ClientOptionsFromEnv(const EnvLookup& env) {
  S3ClientOptions options;
  auto get = [&](const char* name) -> std::string {
    const char* v = env(name);
    return v != nullptr ? std::string(v) : std::string();
  };
  options.endpoint = get("AWS_ENDPOINT_URL_S3");
  if (options.endpoint.empty()) options.endpoint = get("AWS_ENDPOINT_URL");
  if (!options.endpoint.empty() && !absl::StartsWith(options.endpoint, "http://") &&
      !absl::StartsWith(options.endpoint, "https://")) {
    return absl::InvalidArgumentError(absl::StrCat("AWS_ENDPOINT_URL '", options.endpoint,
                                                   "' must start with http:// or https://"));
  }
  std::string region = get("AWS_REGION");
  if (region.empty()) region = get("AWS_DEFAULT_REGION");
  if (!region.empty()) options.region = region;
  const std::string addressing = get("TRAINYARD_S3_ADDRESSING");
  if (addressing == "path") {
    options.addressing = S3Addressing::kPath;
  } else if (addressing == "virtual") {
    options.addressing = S3Addressing::kVirtualHosted;
  } else if (!addressing.empty() && addressing != "auto") {
    return absl::InvalidArgumentError(
        absl::StrCat("TRAINYARD_S3_ADDRESSING '", addressing, "' must be path, virtual or auto"));
  }
  const std::string signing = get("TRAINYARD_S3_SIGN_PAYLOAD");
  if (signing == "always") {
    options.payload_signing = S3PayloadSigning::kAlways;
  } else if (signing == "never") {
    options.payload_signing = S3PayloadSigning::kNever;
  } else if (!signing.empty() && signing != "auto") {
    return absl::InvalidArgumentError(absl::StrCat("TRAINYARD_S3_SIGN_PAYLOAD '", signing,
                                                   "' must be auto, always or never"));
  }
  absl::StatusOr<AwsCredentials> credentials = LoadAwsCredentials(env);
  if (!credentials.ok()) return credentials.status();
  options.credentials = *std::move(credentials);
  return options;
}

S3Client::S3Client(S3ClientOptions options)
    : options_(std::move(options)),
      clock_(options_.clock != nullptr ? *options_.clock : RealClock::Get()),
      rng_(options_.jitter_seed != 0 ? options_.jitter_seed : std::random_device()()) {
  GlobalInit();
  std::string endpoint = options_.endpoint;
  if (endpoint.empty()) endpoint = absl::StrCat("https://s3.", options_.region, ".amazonaws.com");
  absl::string_view rest = endpoint;
  scheme_ = "https";
  if (absl::ConsumePrefix(&rest, "http://")) {
    scheme_ = "http";
  } else {
    absl::ConsumePrefix(&rest, "https://");
  }
  host_ = std::string(rest.substr(0, rest.find('/')));
  virtual_hosted_ = options_.addressing == S3Addressing::kVirtualHosted ||
                    (options_.addressing == S3Addressing::kAuto && options_.endpoint.empty());
  sign_payload_ = options_.payload_signing == S3PayloadSigning::kAlways ||
                  (options_.payload_signing == S3PayloadSigning::kAuto && scheme_ == "http");
}

S3Client::~S3Client() {
  absl::MutexLock lock(&pool_mu_);
  for (void* h : idle_handles_) curl_easy_cleanup(static_cast<CURL*>(h));
}

void* S3Client::AcquireHandle() {
  {
    absl::MutexLock lock(&pool_mu_);
    if (!idle_handles_.empty()) {
      void* h = idle_handles_.back();
      idle_handles_.pop_back();
      return h;
    }
  }
  return curl_easy_init();
}

void S3Client::ReleaseHandle(void* handle) {
  absl::MutexLock lock(&pool_mu_);
  idle_handles_.push_back(handle);
}

absl::Duration S3Client::Backoff(int retry) {
  absl::Duration cap = options_.retry.initial_backoff;
  for (int i = 0; i < retry && cap < options_.retry.max_backoff; ++i) cap *= 2;
  cap = std::min(cap, options_.retry.max_backoff);
  absl::MutexLock lock(&rng_mu_);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  return cap * uniform(rng_);
}

absl::StatusOr<S3Client::Response> S3Client::PerformOnce(Request& r, bool* retryable) {
  *retryable = false;
  const bool use_virtual = virtual_hosted_ && DnsCompatibleBucket(r.bucket);
  const std::string host = use_virtual ? absl::StrCat(r.bucket, ".", host_) : host_;
  std::string path;
  if (use_virtual) {
    path = absl::StrCat("/", AwsUriEncode(r.key, true));
  } else {
    path = absl::StrCat("/", r.bucket);
    if (!r.key.empty()) absl::StrAppend(&path, "/", AwsUriEncode(r.key, true));
  }
  const std::string query = CanonicalQueryString(r.query);
  const std::string url = absl::StrCat(scheme_, "://", host, path, query.empty() ? "" : "?", query);

  const int64_t body_size = r.body != nullptr ? r.body_length : 0;
  if (r.payload_sha256.empty()) {
    if (!sign_payload_ && body_size > 0) {
      r.payload_sha256 = kUnsignedPayload;
    } else if (body_size > 0 && r.body->fd >= 0) {
      absl::StatusOr<std::string> sha = Sha256OfFileRange(r.body->fd, r.body_offset, r.body_length);
      if (!sha.ok()) return sha.status();
      r.payload_sha256 = *sha;
    } else {
      Sha256 hash;
      if (body_size > 0) {
        r.body->ForEach(r.body_offset, r.body_length, [&](absl::string_view s) { hash.Update(s); });
      }
      r.payload_sha256 = hash.HexDigest();
    }
  }
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
  headers = curl_slist_append(headers, "Expect:");  // no 100-continue round trip
  Response response;
  ReadState read_state{&r};
  WriteState write_state{h, &r, &response};
  char error_buffer[CURL_ERROR_SIZE] = {0};
  curl_easy_setopt(h, CURLOPT_URL, url.c_str());
  curl_easy_setopt(h, CURLOPT_PATH_AS_IS, 1L);  // keys may contain "../"; sign what is sent
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, error_buffer);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS,
                   static_cast<long>(absl::ToInt64Milliseconds(options_.connect_timeout)));
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1024L);
  curl_easy_setopt(
      h, CURLOPT_LOW_SPEED_TIME,
      static_cast<long>(std::max<int64_t>(1, absl::ToInt64Seconds(options_.stall_timeout))));
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, WriteBody);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &write_state);
  curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, ReadHeader);
  curl_easy_setopt(h, CURLOPT_HEADERDATA, &response);
  curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
  if (r.method == "HEAD") {
    curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
  } else if (r.method == "PUT" || r.method == "POST") {
    curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(body_size));
    curl_easy_setopt(h, CURLOPT_READFUNCTION, ReadBody);
    curl_easy_setopt(h, CURLOPT_READDATA, &read_state);
    curl_easy_setopt(h, CURLOPT_SEEKFUNCTION, SeekBody);
    curl_easy_setopt(h, CURLOPT_SEEKDATA, &read_state);
    curl_easy_setopt(h, CURLOPT_UPLOAD_BUFFERSIZE, 512L * 1024L);
    if (r.method == "POST") curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, "POST");
  } else if (r.method != "GET") {
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, r.method.c_str());
  }
  if (r.method == "GET") curl_easy_setopt(h, CURLOPT_BUFFERSIZE, 512L * 1024L);
  requests_sent_++;
  const CURLcode code = curl_easy_perform(h);
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &response.status);
  curl_slist_free_all(headers);
  ReleaseHandle(h);

  if (code != CURLE_OK) {
    if (write_state.write_errno != 0) {
      return absl::UnavailableError(
          absl::StrCat("writing the download: ", std::strerror(write_state.write_errno)));
    }
    if (read_state.read_errno != 0) {
      return absl::UnavailableError(
          absl::StrCat("reading the body to upload: ", std::strerror(read_state.read_errno)));
    }
    *retryable = RetryableCurlCode(code);
    return absl::UnavailableError(
        absl::StrCat("transport error talking to ", scheme_, "://", host, ": ",
                     error_buffer[0] != '\0' ? error_buffer : curl_easy_strerror(code)));
  }
  return response;
}

absl::StatusOr<S3Client::Response> S3Client::Execute(Request& r) {
  const absl::Time start = clock_.Now();
  absl::Status last;
  int attempt = 0;
  for (;; ++attempt) {
    bool retryable = false;
    absl::StatusOr<Response> response = PerformOnce(r, &retryable);
    if (response.ok()) {
      std::string error_code, message;
      const bool http_error = response->status >= 300;
      if (http_error || (r.error_in_body && absl::StrContains(response->body, "<Error>"))) {
        error_code = XmlText(response->body, "Code");
        message = XmlText(response->body, "Message");
        if (error_code.empty()) error_code = DefaultCodeFor(response->status);
        const absl::StatusCode status_code =
            http_error ? CodeForS3Error(response->status, error_code)
                       : (error_code == "SlowDown" || error_code == "InternalError"
                              ? absl::StatusCode::kUnavailable
                              : absl::StatusCode::kInvalidArgument);
        retryable = status_code == absl::StatusCode::kUnavailable;
        last = absl::Status(status_code, absl::StrCat("S3 ", r.op, " of ", Where(r.bucket, r.key),
                                                      ": ", error_code, " (HTTP ", response->status,
                                                      ")", message.empty() ? "" : ": ", message));
      } else {
        return response;
      }
    } else {
      last = absl::Status(response.status().code(),
                          absl::StrCat("S3 ", r.op, " of ", Where(r.bucket, r.key), ": ",
                                       response.status().message()));
    }
    if (!retryable || attempt + 1 >= options_.retry.max_attempts) break;
    const absl::Duration wait = Backoff(attempt);
    if (clock_.Now() + wait - start > options_.retry.max_elapsed) break;
    retries_++;
    if (options_.sleeper) {
      options_.sleeper(wait);
    } else {
      absl::SleepFor(wait);
    }
  }
  if (attempt == 0) return last;
  return absl::Status(
      last.code(),
      absl::StrCat(last.message(), " (gave up after ", attempt + 1, " attempts in ",
                   absl::FormatDuration(absl::Trunc(clock_.Now() - start, absl::Milliseconds(1))),
                   ")"));
}

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

absl::Status S3Client::PutMultipart(const std::string& bucket, const std::string& key,
                                    const Body& body, std::string* object_sha256) {
  const int64_t size = body.size;
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
  {
    absl::MutexLock lock(&mu);
    if (!first_error.ok()) status = first_error;  // not the cancellation of a waiting part
  }
  if (status.ok()) {
    std::string xml = "<CompleteMultipartUpload>";
    for (int64_t i = 0; i < parts; ++i) {
      absl::StrAppend(&xml, "<Part><PartNumber>", i + 1, "</PartNumber><ETag>",
                      XmlEscape(etags[static_cast<size_t>(i)]), "</ETag></Part>");
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
    status = done.status();
    // A retried Complete can find the upload already completed by the first try.
    if (status.code() == absl::StatusCode::kNotFound) {
      absl::StatusOr<S3ObjectInfo> head = HeadObject(bucket, key);
      if (head.ok() && head->size == size) return absl::OkStatus();
    }
  }
  Request abort;
  abort.op = "AbortMultipartUpload";
  abort.method = "DELETE";
  abort.bucket = bucket;
  abort.key = key;
  abort.query = {{"uploadId", upload_id}};
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
