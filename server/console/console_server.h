#ifndef TRAINYARD_SERVER_CONSOLE_CONSOLE_SERVER_H_
#define TRAINYARD_SERVER_CONSOLE_CONSOLE_SERVER_H_

// The console's HTTP(S) server (cpp-httplib, with OpenSSL): the pages and scripts compiled into
// the coordinator (console_assets.h), the JSON API (json_gateway.h) under /api/v1/, and /healthz.
// (Not civetweb, which the agent's S3 gateway uses: Debian 12's civetweb 1.15 crashes in its TLS
// handshake with OpenSSL 3.)
//
// What keeps a browser safe: every response forbids inline script and framing
// (Content-Security-Policy) and sniffing; the pages write every string from a job as text, never
// as HTML; credentials travel only in the Authorization header (no cookie), so another site
// cannot make a logged-in browser call the API, and no call is allowed across origins.

#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/console/json_gateway.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace trainyard {

struct ConsoleOptions {
  std::string listen;  // HOST:PORT (port 0: the kernel picks one)
  // Both set: HTTPS only, with this certificate (chain) and key, TLS 1.2 or later.
  std::string tls_cert_file;
  std::string tls_key_file;
  int64_t max_body_bytes = int64_t{4} << 20;  // a larger request body is refused with 413
  int threads = 64;  // requests served at once (each following stream holds one)
};

class ConsoleServer {
 public:
  // Listens; UNAVAILABLE when it cannot (the address taken, the certificate unreadable).
  static absl::StatusOr<std::unique_ptr<ConsoleServer>> Start(ConsoleOptions options);
  ~ConsoleServer();  // stops serving; requests in flight end first
  ConsoleServer(const ConsoleServer&) = delete;
  ConsoleServer& operator=(const ConsoleServer&) = delete;

  int port() const { return port_; }
  // "https://HOST:PORT/" (http:// without TLS).
  const std::string& url() const { return url_; }

  // Leading: API calls go to `gateway`. Null: standing by, API calls are answered 503 naming
  // the leader (SetLeader) and /healthz 503. Returns once no call is being started with the
  // gateway it replaces.
  void SetGateway(std::shared_ptr<const JsonGateway> gateway);
  void SetLeader(const std::string& leader);  // the leader's gRPC address; empty: unknown

 private:
  explicit ConsoleServer(ConsoleOptions options);
  void Route();
  void ServeApi(const httplib::Request& request, httplib::Response& response);
  void ServeAsset(const httplib::Request& request, httplib::Response& response);

  const ConsoleOptions options_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
  std::string url_;
  mutable absl::Mutex mu_;
  std::shared_ptr<const JsonGateway> gateway_ ABSL_GUARDED_BY(mu_);
  std::string leader_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trainyard

#endif  // TRAINYARD_SERVER_CONSOLE_CONSOLE_SERVER_H_
