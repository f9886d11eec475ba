#include "worker/agent/s3_gateway.h"

#include <civetweb.h>
#include <openssl/rand.h>

#include <cstdlib>
#include <cstring>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/log.h"
#include "common/storage/s3_client_internal.h"

namespace trainyard {

namespace {

// Random bytes as upper-case hex (the key id, as AWS's are upper-case) or lower-case (the secret).
std::string RandomHex(int bytes, bool upper) {
  std::string raw(static_cast<size_t>(bytes), '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(raw.data()), bytes) != 1) {
    LogError("RAND_bytes failed: the gateway's keys would be predictable");
    std::abort();
  }
  std::string hex = absl::BytesToHexString(raw);
  return upper ? absl::AsciiStrToUpper(hex) : hex;
}

// %XX decoded; '+' stays ('+' in a query is a plus sign to S3's signers, which encode spaces).
std::string PercentDecode(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && absl::ascii_isxdigit(s[i + 1]) &&
        absl::ascii_isxdigit(s[i + 2])) {
      out.push_back(static_cast<char>(std::stoi(std::string(s.substr(i + 1, 2)), nullptr, 16)));
      i += 2;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> ParseQuery(const char* query) {
  std::vector<std::pair<std::string, std::string>> out;
  if (query == nullptr || *query == '\0') return out;
  for (absl::string_view part : absl::StrSplit(query, '&', absl::SkipEmpty())) {
    const size_t eq = part.find('=');
    out.emplace_back(PercentDecode(part.substr(0, eq)),
                     eq == absl::string_view::npos ? "" : PercentDecode(part.substr(eq + 1)));
  }
  return out;
}

// Headers a request carries on to S3 (signed again there); the rest are the sender's connection's
// or its signature's.
bool ForwardedRequestHeader(const std::string& name) {
  static const std::set<std::string> kHeaders = {"cache-control",
                                                 "content-disposition",
                                                 "content-encoding",
                                                 "content-language",
                                                 "content-md5",
                                                 "content-type",
                                                 "expires",
                                                 "if-match",
                                                 "if-modified-since",
                                                 "if-none-match",
                                                 "if-unmodified-since",
                                                 "range"};
  return kHeaders.count(name) > 0 || absl::StartsWith(name, "x-amz-meta-") ||
         absl::StartsWith(name, "x-amz-checksum-");
}

// Headers of S3's answer passed back; the connection's own are civetweb's.
bool ForwardedAnswerHeader(const std::string& name) {
  return name != "connection" && name != "keep-alive" && name != "transfer-encoding" &&
         name != "date" && name != "server";
}

// Writes an answer's status and headers: through civetweb's header API (which keeps the
// connection alive), or as raw HTTP/1.1 that closes it once an interim "100 Continue" went out
// (after which that API refuses). False when the client is gone.
bool WriteHead(mg_connection* c, bool raw, int status,
               const std::vector<std::pair<std::string, std::string>>& headers) {
  if (raw) {
    std::string head =
        absl::StrCat("HTTP/1.1 ", status, " ", mg_get_response_code_text(c, status), "\r\n");
    for (const auto& [name, value] : headers) absl::StrAppend(&head, name, ": ", value, "\r\n");
    absl::StrAppend(&head, "Connection: close\r\n\r\n");
    return mg_write(c, head.data(), head.size()) == static_cast<int>(head.size());
  }
  if (mg_response_header_start(c, status) != 0) return false;
  for (const auto& [name, value] : headers) {
    mg_response_header_add(c, name.c_str(), value.c_str(), static_cast<int>(value.size()));
  }
  return mg_response_header_send(c) == 0;
}

// S3's XML error, as any S3 client reads it.
int SendError(mg_connection* c, bool raw, int status, absl::string_view code,
              absl::string_view message) {
  const std::string body =
      absl::StrCat("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>", code,
                   "</Code><Message>", s3_internal::XmlEscape(message), "</Message></Error>");
  WriteHead(c, raw, status,
            {{"Content-Type", "application/xml"}, {"Content-Length", absl::StrCat(body.size())}});
  mg_write(c, body.data(), body.size());
  return status;
}

int Handler(mg_connection* c, void* gateway) { return static_cast<S3Gateway*>(gateway)->Serve(c); }

GatewayRequest ReadRequest(mg_connection* c) {
  const mg_request_info* info = mg_get_request_info(c);
  GatewayRequest request;
  request.method = info->request_method;
  request.path = info->local_uri_raw != nullptr ? info->local_uri_raw : "";
  request.query = ParseQuery(info->query_string);
  for (int i = 0; i < info->num_headers; ++i) {
    std::string& value = request.headers[absl::AsciiStrToLower(info->http_headers[i].name)];
    if (!value.empty()) value += ",";
    value += info->http_headers[i].value;
  }
  return request;
}

}  // namespace

S3Gateway::S3Gateway(S3GatewayOptions options)
    : options_(std::move(options)),
      clock_(options_.clock != nullptr ? *options_.clock : RealClock::Get()),
      upstream_(options_.upstream) {}

absl::StatusOr<std::unique_ptr<S3Gateway>> S3Gateway::Start(S3GatewayOptions options) {
  static const bool initialised = [] {
    mg_init_library(0);
    return true;
  }();
  (void)initialised;
  std::unique_ptr<S3Gateway> gateway(new S3Gateway(std::move(options)));
  const std::string threads = absl::StrCat(std::max(gateway->options_.threads, 1));
  const char* settings[] = {"listening_ports",
                            gateway->options_.listen.c_str(),
                            "num_threads",
                            threads.c_str(),
                            "request_timeout_ms",
                            "60000",
                            "enable_keep_alive",
                            "yes",
                            nullptr};
  mg_callbacks callbacks;
  std::memset(&callbacks, 0, sizeof(callbacks));
  gateway->server_ = mg_start(&callbacks, nullptr, settings);
  if (gateway->server_ == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("the S3 gateway cannot listen on ", gateway->options_.listen));
  }
  mg_set_request_handler(gateway->server_, "/", Handler, gateway.get());
  mg_server_port ports[4];
  const int n = mg_get_server_ports(gateway->server_, 4, ports);
  if (n < 1) return absl::UnavailableError("the S3 gateway has no port");
  std::string host = gateway->options_.listen.substr(0, gateway->options_.listen.rfind(':'));
  gateway->endpoint_ = absl::StrCat("http://", host, ":", ports[0].port);
  return gateway;
}

S3Gateway::~S3Gateway() {
  if (server_ != nullptr) mg_stop(server_);
}

std::map<std::string, std::string> S3Gateway::Grant(const std::string& task_id, ObjectScope scope) {
  const std::string key_id = absl::StrCat("TY", RandomHex(9, true));
  const std::string secret = RandomHex(32, false);
  {
    absl::MutexLock lock(&mu_);
    if (auto old = by_task_.find(task_id); old != by_task_.end()) keys_.erase(old->second);
    keys_[key_id] = Key{secret, task_id, std::move(scope)};
    by_task_[task_id] = key_id;
  }
  const std::string& region = options_.upstream.region;
  return {{"AWS_ENDPOINT_URL", endpoint_},
          {"AWS_ENDPOINT_URL_S3", endpoint_},
          {"AWS_ACCESS_KEY_ID", key_id},
          {"AWS_SECRET_ACCESS_KEY", secret},
          {"AWS_REGION", region},
          {"AWS_DEFAULT_REGION", region},
          {"TRAINYARD_S3_ADDRESSING", "path"}};
}

void S3Gateway::Revoke(const std::string& task_id) {
  absl::MutexLock lock(&mu_);
  auto it = by_task_.find(task_id);
  if (it == by_task_.end()) return;
  keys_.erase(it->second);
  by_task_.erase(it);
}

int64_t S3Gateway::requests() const {
  absl::MutexLock lock(&mu_);
  return requests_;
}

int64_t S3Gateway::refused() const {
  absl::MutexLock lock(&mu_);
  return refused_;
}

int S3Gateway::Serve(mg_connection* c) {
  {
    absl::MutexLock lock(&mu_);
    ++requests_;
  }
  const GatewayRequest request = ReadRequest(c);
  auto header = [&](const std::string& name) {
    auto it = request.headers.find(name);
    return it == request.headers.end() ? std::string() : it->second;
  };
  // Who sends it, and what it may do.
  std::string task_id;
  absl::StatusOr<GatewayOperation> op = [&]() -> absl::StatusOr<GatewayOperation> {
    absl::StatusOr<SigV4Authorization> auth = ParseSigV4Authorization(header("authorization"));
    if (!auth.ok()) return auth.status();
    Key key;
    {
      absl::MutexLock lock(&mu_);
      auto it = keys_.find(auth->key_id);
      if (it == keys_.end()) {
        return absl::UnauthenticatedError(
            absl::StrCat("InvalidAccessKeyId: key '", auth->key_id, "' is not a running task's"));
      }
      key = it->second;
    }
    task_id = key.task_id;
    if (absl::Status s = VerifyGatewaySignature(request, *auth, key.secret, clock_.Now());
        !s.ok()) {
      return s;
    }
    return AuthorizeGatewayRequest(request, key.scope);
  }();
  if (!op.ok()) {
    {
      absl::MutexLock lock(&mu_);
      ++refused_;
    }
    const std::string message(op.status().message());
    LogWarning("S3 gateway: refused ", request.method, " ", request.path,
               task_id.empty() ? "" : absl::StrCat(" from task ", task_id), ": ", message);
    const size_t colon = message.find(':');
    const bool named =
        op.status().code() == absl::StatusCode::kUnauthenticated && colon != std::string::npos;
    return SendError(c, false, 403, named ? message.substr(0, colon) : "AccessDenied", message);
  }

  S3ForwardRequest forward;
  forward.method = request.method;
  forward.bucket = op->bucket;
  forward.key = op->list ? "" : op->key;
  forward.query = request.query;
  for (const auto& [name, value] : request.headers) {
    if (ForwardedRequestHeader(name)) forward.headers[name] = value;
  }
  forward.payload_sha256 = header("x-amz-content-sha256");
  const mg_request_info* info = mg_get_request_info(c);
  bool raw = false;  // an interim answer went out: the final one is written raw
  if (request.method == "PUT" || request.method == "POST") {
    if (info->content_length < 0) {
      return SendError(c, false, 411, "MissingContentLength", "a body needs its Content-Length");
    }
    forward.body_size = info->content_length;
    // Clients that ask (botocore does) wait for it before they send the body.
    if (absl::EqualsIgnoreCase(header("expect"), "100-continue")) {
      raw = true;
      mg_printf(c, "HTTP/1.1 100 Continue\r\n\r\n");
    }
  }
  forward.read_body = [c](char* buffer, size_t size) -> int64_t {
    const int got = mg_read(c, buffer, size);
    return got < 0 ? -1 : got;
  };
  bool chunked = false;
  long answered = 0;
  forward.on_head = [&](long status, const std::map<std::string, std::string>& headers) {
    answered = status;
    std::vector<std::pair<std::string, std::string>> passed;
    for (const auto& [name, value] : headers) {
      if (ForwardedAnswerHeader(name)) passed.emplace_back(name, value);
    }
    chunked = request.method != "HEAD" && headers.count("content-length") == 0 && status != 204 &&
              status != 304;
    if (chunked) passed.emplace_back("Transfer-Encoding", "chunked");
    return WriteHead(c, raw, static_cast<int>(status), passed);
  };
  forward.on_body = [&](absl::string_view piece) {
    if (chunked) return mg_send_chunk(c, piece.data(), static_cast<unsigned>(piece.size())) > 0;
    return mg_write(c, piece.data(), piece.size()) == static_cast<int>(piece.size());
  };
  const absl::Status sent = upstream_.Forward(forward);
  if (chunked && sent.ok()) mg_send_chunk(c, "", 0);
  if (!sent.ok()) {
    LogWarning("S3 gateway: ", op->name, " of bucket '", op->bucket, "', key '", op->key,
               "' for task ", task_id, ": ", sent.message());
    if (answered == 0) return SendError(c, raw, 503, "ServiceUnavailable", sent.message());
  }
  return answered == 0 ? 500 : static_cast<int>(answered);
}

}  // namespace trainyard
