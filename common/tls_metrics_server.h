#ifndef TRAINYARD_COMMON_TLS_METRICS_SERVER_H_
#define TRAINYARD_COMMON_TLS_METRICS_SERVER_H_

// GET /metrics over HTTPS (OpenSSL), for Prometheus scrapes that must not travel in clear. Our
// own because the HTTP server under Debian 12's prometheus-cpp (civetweb 1.15) crashes in its
// TLS handshake with OpenSSL 3. It does only what a scrape needs: one request per connection,
// one connection at a time, each bounded in size and time (16 KiB, 5 s), so a stalled client
// delays scrapes by at most that.

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "prometheus/collectable.h"

struct ssl_ctx_st;

namespace trainyard {

class TlsMetricsServer {
 public:
  // Listens on `host` ("[::1]" style for IPv6) and `port` (0: the kernel picks) with the PEM
  // certificate (chain) and key. With `basic_auth` ("USER:PASSWORD") a request must carry it
  // (401 otherwise). INVALID_ARGUMENT for files that do not load, UNAVAILABLE when it cannot
  // bind.
  static absl::StatusOr<std::unique_ptr<TlsMetricsServer>> Start(
      const std::string& host, int port, std::weak_ptr<prometheus::Collectable> collectable,
      const std::string& cert_file, const std::string& key_file, const std::string& basic_auth);
  ~TlsMetricsServer();  // stops accepting and waits for the request in progress
  TlsMetricsServer(const TlsMetricsServer&) = delete;
  TlsMetricsServer& operator=(const TlsMetricsServer&) = delete;

  int port() const { return port_; }

 private:
  TlsMetricsServer() = default;
  void Serve();
  void Handle(int fd);

  ssl_ctx_st* ctx_ = nullptr;
  int fd_ = -1;
  int port_ = 0;
  std::string expected_authorization_;  // "Basic ..." or empty
  std::weak_ptr<prometheus::Collectable> collectable_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_TLS_METRICS_SERVER_H_
