#include "common/rpc/tls_metrics_server.h"

#include <fcntl.h>
#include <netdb.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
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

// How often a waiting thread looks at the clock and at stop_.
constexpr absl::Duration kPollSlice = absl::Milliseconds(200);

std::string OpenSslError() {
  const unsigned long code = ERR_get_error();  // NOLINT(runtime/int): OpenSSL's type
  char buffer[256] = {};
  if (code != 0) ERR_error_string_n(code, buffer, sizeof(buffer));
  return buffer;
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
    const std::string& cert_file, const std::string& key_file, const std::string& basic_auth,
    const Clock& clock) {
  const std::string listen = absl::StrCat(host, ":", port);
  // A scraper that hangs up mid-answer must not kill the process: OpenSSL writes to the socket
  // with write(2), which raises SIGPIPE.
  signal(SIGPIPE, SIG_IGN);
  std::unique_ptr<TlsMetricsServer> server(new TlsMetricsServer(clock));
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
  // Non-blocking: every serving thread polls it, and those that lose the race to accept go on.
  server->fd_ = socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  const int one = 1;
  setsockopt(server->fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  const bool bound = server->fd_ >= 0 &&
                     bind(server->fd_, found->ai_addr, found->ai_addrlen) == 0 &&
                     ::listen(server->fd_, kMaxConnections) == 0;
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
  for (int i = 0; i < kMaxConnections; ++i) {
    server->threads_.emplace_back([s = server.get()] { s->Serve(); });
  }
  return server;
}

TlsMetricsServer::~TlsMetricsServer() {
  stop_ = true;
  for (std::thread& thread : threads_) thread.join();
  if (fd_ >= 0) close(fd_);
  if (ctx_ != nullptr) SSL_CTX_free(ctx_);
}

void TlsMetricsServer::Serve() {
  while (!stop_) {
    pollfd p = {fd_, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(kPollSlice))) <= 0) continue;
    const int fd = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) continue;  // another thread took it, or the client left
    Handle(fd);
    close(fd);
  }
}

template <typename Op>
int TlsMetricsServer::Io(SSL* ssl, int fd, absl::Time deadline, Op op) const {
  while (true) {
    ERR_clear_error();
    const int n = op();
    if (n > 0) return n;
    const int error = SSL_get_error(ssl, n);
    pollfd p = {fd, 0, 0};
    if (error == SSL_ERROR_WANT_READ) {
      p.events = POLLIN;
    } else if (error == SSL_ERROR_WANT_WRITE) {
      p.events = POLLOUT;
    } else {
      return -1;
    }
    // A deadline for the whole exchange, not for each read: a client that sends a byte now and
    // then cannot keep the connection.
    int ready = 0;
    while (ready == 0) {
      const absl::Duration left = deadline - clock_.Now();
      if (stop_ || left <= absl::ZeroDuration()) return -1;
      ready = poll(&p, 1,
                   static_cast<int>(absl::ToInt64Milliseconds(
                       std::clamp(left, absl::Milliseconds(1), kPollSlice))));
      if (ready < 0 && errno == EINTR) ready = 0;
    }
    if (ready < 0) return -1;
  }
}

void TlsMetricsServer::Handle(int fd) {
  SSL* ssl = SSL_new(ctx_);
  if (ssl == nullptr) return;
  SSL_set_fd(ssl, fd);
  const absl::Time request_deadline = clock_.Now() + kRequestDeadline;
  if (Io(ssl, fd, request_deadline, [&] { return SSL_accept(ssl); }) < 0) {
    SSL_free(ssl);
    return;
  }
  std::string request;
  char buffer[4096];
  while (request.find("\r\n\r\n") == std::string::npos && request.size() < kMaxRequestBytes) {
    const int want = static_cast<int>(std::min(sizeof(buffer), kMaxRequestBytes - request.size()));
    const int n = Io(ssl, fd, request_deadline, [&] { return SSL_read(ssl, buffer, want); });
    if (n <= 0) {
      // Too slow, or gone: no answer, and the slot is free again.
      SSL_free(ssl);
      return;
    }
    request.append(buffer, static_cast<size_t>(n));
  }
  const std::string response = AnswerMetricsRequest(request, expected_authorization_, collectable_);
  const absl::Time answer_deadline = clock_.Now() + kAnswerDeadline;
  size_t done = 0;
  while (done < response.size()) {
    const int n = Io(ssl, fd, answer_deadline, [&] {
      return SSL_write(ssl, response.data() + done, static_cast<int>(response.size() - done));
    });
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  if (done == response.size()) SSL_shutdown(ssl);  // best effort: the socket is non-blocking
  SSL_free(ssl);
}

std::string AnswerMetricsRequest(absl::string_view request,
                                 absl::string_view expected_authorization,
                                 const std::weak_ptr<prometheus::Collectable>& collectable) {
  std::vector<absl::string_view> lines =
      absl::StrSplit(request.substr(0, request.find("\r\n\r\n")), "\r\n");
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
  if (request.find("\r\n\r\n") == absl::string_view::npos || words.size() != 3) {
    response = Response(400, "Bad Request", "bad request\n");
  } else if (words[0] != "GET" || path != "/metrics") {
    response = Response(404, "Not Found", "only GET /metrics is served here\n");
  } else if (!expected_authorization.empty() &&
             (authorization.size() != expected_authorization.size() ||
              CRYPTO_memcmp(authorization.data(), expected_authorization.data(),
                            authorization.size()) != 0)) {
    response = Response(401, "Unauthorized", "credentials required\n",
                        "WWW-Authenticate: Basic realm=\"trainyard\"\r\n");
  } else if (std::shared_ptr<prometheus::Collectable> c = collectable.lock(); c == nullptr) {
    response = Response(503, "Service Unavailable", "shutting down\n");
  } else {
    response = Response(200, "OK", prometheus::TextSerializer().Serialize(c->Collect()));
  }
  return response;
}

}  // namespace trainyard
