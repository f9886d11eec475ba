#include "common/tls_metrics_server.h"

#include <netdb.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "prometheus/text_serializer.h"

namespace trainyard {
namespace {

constexpr size_t kMaxRequestBytes = 16 << 10;
constexpr int kIoTimeoutSeconds = 5;

std::string OpenSslError() {
  const unsigned long code = ERR_get_error();  // NOLINT(runtime/int): OpenSSL's type
  char buffer[256] = {};
  if (code != 0) ERR_error_string_n(code, buffer, sizeof(buffer));
  return buffer;
}

void WriteAll(SSL* ssl, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    const int n = SSL_write(ssl, data.data() + done, static_cast<int>(data.size() - done));
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

std::string Response(int code, const char* reason, const std::string& body,
                     const std::string& extra_headers = "") {
  return absl::StrCat("HTTP/1.1 ", code, " ", reason,
                      "\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
                      "Content-Length: ",
                      body.size(), "\r\n", extra_headers, "Connection: close\r\n\r\n", body);
}

}  // namespace

absl::StatusOr<std::unique_ptr<TlsMetricsServer>> TlsMetricsServer::Start(
    const std::string& host, int port, std::weak_ptr<prometheus::Collectable> collectable,
    const std::string& cert_file, const std::string& key_file, const std::string& basic_auth) {
  const std::string listen = absl::StrCat(host, ":", port);
  // A scraper that hangs up mid-answer must not kill the process: OpenSSL writes to the socket
  // with write(2), which raises SIGPIPE.
  signal(SIGPIPE, SIG_IGN);
  std::unique_ptr<TlsMetricsServer> server(new TlsMetricsServer());
  server->collectable_ = std::move(collectable);
  if (!basic_auth.empty()) {
    std::string encoded;
    absl::Base64Escape(basic_auth, &encoded);
    server->expected_authorization_ = "Basic " + encoded;
  }
  server->ctx_ = SSL_CTX_new(TLS_server_method());
  if (server->ctx_ == nullptr) return absl::InternalError("SSL_CTX_new: " + OpenSslError());
  SSL_CTX_set_min_proto_version(server->ctx_, TLS1_2_VERSION);
  if (SSL_CTX_use_certificate_chain_file(server->ctx_, cert_file.c_str()) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics TLS certificate ", cert_file, ": ", OpenSslError()));
  }
  if (SSL_CTX_use_PrivateKey_file(server->ctx_, key_file.c_str(), SSL_FILETYPE_PEM) != 1 ||
      SSL_CTX_check_private_key(server->ctx_) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics TLS key ", key_file, ": ", OpenSslError()));
  }

  const std::string bare = host.size() >= 2 && host.front() == '[' && host.back() == ']'
                               ? host.substr(1, host.size() - 2)
                               : host;
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (getaddrinfo(bare.empty() ? nullptr : bare.c_str(), absl::StrCat(port).c_str(), &hints,
                  &found) != 0 ||
      found == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", listen));
  }
  server->fd_ = socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  setsockopt(server->fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  const bool bound = server->fd_ >= 0 &&
                     bind(server->fd_, found->ai_addr, found->ai_addrlen) == 0 &&
                     ::listen(server->fd_, 16) == 0;
  freeaddrinfo(found);
  if (!bound) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", listen, ": ", std::strerror(errno)));
  }
  sockaddr_storage addr = {};
  socklen_t length = sizeof(addr);
  getsockname(server->fd_, reinterpret_cast<sockaddr*>(&addr), &length);
  server->port_ =
      ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                       : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  server->thread_ = std::thread([s = server.get()] { s->Serve(); });
  return server;
}

TlsMetricsServer::~TlsMetricsServer() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  if (fd_ >= 0) close(fd_);
  if (ctx_ != nullptr) SSL_CTX_free(ctx_);
}

void TlsMetricsServer::Serve() {
  while (!stop_) {
    pollfd p = {fd_, POLLIN, 0};
    // Woken at least every 200 ms to see stop_.
    if (poll(&p, 1, 200) <= 0) continue;
    const int fd = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    Handle(fd);
    close(fd);
  }
}

void TlsMetricsServer::Handle(int fd) {
  timeval timeout = {kIoTimeoutSeconds, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  SSL* ssl = SSL_new(ctx_);
  if (ssl == nullptr) return;
  SSL_set_fd(ssl, fd);
  if (SSL_accept(ssl) != 1) {
    SSL_free(ssl);
    return;
  }
  std::string request;
  char buffer[4096];
  while (request.find("\r\n\r\n") == std::string::npos && request.size() < kMaxRequestBytes) {
    const int n = SSL_read(ssl, buffer, sizeof(buffer));
    if (n <= 0) break;
    request.append(buffer, static_cast<size_t>(n));
  }
  std::vector<absl::string_view> lines =
      absl::StrSplit(absl::string_view(request).substr(0, request.find("\r\n\r\n")), "\r\n");
  std::vector<absl::string_view> words = absl::StrSplit(lines.empty() ? "" : lines[0], ' ');
  std::string authorization;
  for (size_t i = 1; i < lines.size(); ++i) {
    const size_t colon = lines[i].find(':');
    if (colon == absl::string_view::npos) continue;
    if (absl::EqualsIgnoreCase(absl::StripAsciiWhitespace(lines[i].substr(0, colon)),
                               "authorization")) {
      authorization = std::string(absl::StripAsciiWhitespace(lines[i].substr(colon + 1)));
    }
  }
  std::string response;
  const absl::string_view path = words.size() >= 2 ? words[1].substr(0, words[1].find('?')) : "";
  if (request.find("\r\n\r\n") == std::string::npos || words.size() != 3) {
    response = Response(400, "Bad Request", "bad request\n");
  } else if (words[0] != "GET" || path != "/metrics") {
    response = Response(404, "Not Found", "only GET /metrics is served here\n");
  } else if (!expected_authorization_.empty() &&
             (authorization.size() != expected_authorization_.size() ||
              CRYPTO_memcmp(authorization.data(), expected_authorization_.data(),
                            authorization.size()) != 0)) {
    response = Response(401, "Unauthorized", "credentials required\n",
                        "WWW-Authenticate: Basic realm=\"trainyard\"\r\n");
  } else if (std::shared_ptr<prometheus::Collectable> c = collectable_.lock(); c == nullptr) {
    response = Response(503, "Service Unavailable", "shutting down\n");
  } else {
    response = Response(200, "OK", prometheus::TextSerializer().Serialize(c->Collect()));
  }
  WriteAll(ssl, response);
  SSL_shutdown(ssl);
  SSL_free(ssl);
}

}  // namespace trainyard
