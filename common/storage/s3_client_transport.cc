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
#include "common/clock.h"
#include "common/parallel.h"
#include "common/sha256.h"
#include "common/storage/s3_client.h"
#include "common/storage/s3_client_internal.h"

namespace trainyard {

using s3_internal::Where;
using s3_internal::XmlText;

namespace {

constexpr char kUnsignedPayload[] = "UNSIGNED-PAYLOAD";

void GlobalInit() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
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
  int64_t over_bound = -1;   // the bound the body went past (the transfer stopped there)
  bool whole_range = false;  // a 200 answer to a ranged GET has the range: stopped there
};

size_t WriteBody(char* data, size_t size, size_t nmemb, void* userdata) {
  auto* state = static_cast<WriteState*>(userdata);
  size_t n = size * nmemb;
  long status = 0;
  curl_easy_getinfo(state->handle, CURLINFO_RESPONSE_CODE, &status);
  const S3Client::Request& r = *state->request;
  S3Client::Response& response = *state->response;
  const bool ignored_range =
      status == 200 && r.range_end >= 0 && response.headers.count("content-range") == 0;
  const int64_t bound = ignored_range                     ? r.range_end
                        : status >= 300 || r.max_body < 0 ? s3_internal::kMaxAnswerBytes
                                                          : r.max_body;
  if (response.received + static_cast<int64_t>(n) > bound) {
    if (!ignored_range) {
      state->over_bound = bound;
      return 0;  // makes curl fail with CURLE_WRITE_ERROR
    }
    n = static_cast<size_t>(bound - response.received);
    state->whole_range = true;
  }
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
  return state->whole_range ? 0 : n;
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
    return absl::InvalidArgumentError(
        absl::StrCat("TRAINYARD_S3_SIGN_PAYLOAD '", signing, "' must be auto, always or never"));
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

std::pair<std::string, std::string> S3Client::HostAndPath(const std::string& bucket,
                                                          const std::string& key) const {
  if (virtual_hosted_ && DnsCompatibleBucket(bucket)) {
    return {absl::StrCat(bucket, ".", host_), absl::StrCat("/", AwsUriEncode(key, true))};
  }
  std::string path = absl::StrCat("/", bucket);
  if (!key.empty()) absl::StrAppend(&path, "/", AwsUriEncode(key, true));
  return {host_, path};
}

absl::Status S3Client::Prepare(const std::string& method, const std::string& bucket,
                               const std::string& key,
                               const std::vector<std::pair<std::string, std::string>>& query,
                               const std::map<std::string, std::string>& headers,
                               const std::string& payload_sha256, int64_t body_size,
                               Prepared* out) {
  const auto [host, path] = HostAndPath(bucket, key);
  const std::string query_string = CanonicalQueryString(query);
  const std::string url =
      absl::StrCat(scheme_, "://", host, path, query_string.empty() ? "" : "?", query_string);
  SigV4Request to_sign;
  to_sign.method = method;
  to_sign.canonical_uri = path;
  to_sign.query = query;
  to_sign.headers = headers;
  to_sign.headers["host"] = host;
  to_sign.payload_sha256 = payload_sha256;
  const SigV4Result signed_request =
      SignV4(to_sign, options_.credentials, options_.region, "s3", clock_.Now());

  CURL* h = static_cast<CURL*>(AcquireHandle());
  if (h == nullptr) return absl::ResourceExhaustedError("curl_easy_init failed");
  curl_easy_reset(h);
  out->handle = h;
  out->host = host;
  for (const auto& [name, value] : signed_request.headers) {
    out->headers = curl_slist_append(out->headers, absl::StrCat(name, ": ", value).c_str());
  }
  out->headers = curl_slist_append(out->headers, "Expect:");  // no 100-continue round trip
  curl_easy_setopt(h, CURLOPT_URL, url.c_str());
  curl_easy_setopt(h, CURLOPT_PATH_AS_IS, 1L);  // keys may contain "../"; sign what is sent
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, out->headers);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, out->error);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS,
                   static_cast<long>(absl::ToInt64Milliseconds(options_.connect_timeout)));
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1024L);
  curl_easy_setopt(
      h, CURLOPT_LOW_SPEED_TIME,
      static_cast<long>(std::max<int64_t>(1, absl::ToInt64Seconds(options_.stall_timeout))));
  curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
  if (method == "HEAD") {
    curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
  } else if (method == "PUT" || method == "POST") {
    curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(body_size));
    curl_easy_setopt(h, CURLOPT_UPLOAD_BUFFERSIZE, 512L * 1024L);
    if (method == "POST") curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, "POST");
  } else if (method != "GET") {
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method.c_str());
  }
  if (method == "GET") curl_easy_setopt(h, CURLOPT_BUFFERSIZE, 512L * 1024L);
  requests_sent_++;
  return absl::OkStatus();
}

void S3Client::Finish(Prepared& prepared) {
  curl_slist_free_all(prepared.headers);
  prepared.headers = nullptr;
  ReleaseHandle(prepared.handle);
  prepared.handle = nullptr;
}

absl::StatusOr<S3Client::Response> S3Client::PerformOnce(Request& r, bool* retryable) {
  *retryable = false;

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
  Prepared prepared;
  if (absl::Status s = Prepare(r.method, r.bucket, r.key, r.query, r.headers, r.payload_sha256,
                               body_size, &prepared);
      !s.ok()) {
    return s;
  }
  CURL* h = prepared.handle;
  Response response;
  ReadState read_state{&r};
  WriteState write_state{h, &r, &response};
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, WriteBody);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &write_state);
  curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, ReadHeader);
  curl_easy_setopt(h, CURLOPT_HEADERDATA, &response);
  if (r.method == "PUT" || r.method == "POST") {
    curl_easy_setopt(h, CURLOPT_READFUNCTION, ReadBody);
    curl_easy_setopt(h, CURLOPT_READDATA, &read_state);
    curl_easy_setopt(h, CURLOPT_SEEKFUNCTION, SeekBody);
    curl_easy_setopt(h, CURLOPT_SEEKDATA, &read_state);
  }
  const CURLcode code = curl_easy_perform(h);
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &response.status);
  Finish(prepared);

  if (code != CURLE_OK && !write_state.whole_range) {
    if (write_state.over_bound >= 0) {
      // Not retried: the same endpoint would send the same again.
      if (response.status >= 300 || r.max_body < 0) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "the answer (HTTP ", response.status, ") is over ", s3_internal::kMaxAnswerBytes >> 20,
            " MiB, the most an answer that is not an object may take"));
      }
      return absl::DataLossError(absl::StrCat("the answer (HTTP ", response.status,
                                              ") has more than the ", write_state.over_bound,
                                              " bytes asked for"));
    }
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
        absl::StrCat("transport error talking to ", scheme_, "://", prepared.host, ": ",
                     prepared.error[0] != '\0' ? prepared.error : curl_easy_strerror(code)));
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
    clock_.SleepFor(wait);
  }
  if (attempt == 0) return last;
  return absl::Status(
      last.code(),
      absl::StrCat(last.message(), " (gave up after ", attempt + 1, " attempts in ",
                   absl::FormatDuration(absl::Trunc(clock_.Now() - start, absl::Milliseconds(1))),
                   ")"));
}

}  // namespace trainyard
