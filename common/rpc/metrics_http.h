#ifndef TRAINYARD_COMMON_RPC_METRICS_HTTP_H_
#define TRAINYARD_COMMON_RPC_METRICS_HTTP_H_

// Serving Prometheus metrics over HTTP, shared by the coordinator and the worker agent.

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "prometheus/collectable.h"
#include "prometheus/exposer.h"

namespace trainyard {

struct MetricsHttpOptions {
  std::string basic_auth;  // "USER:PASSWORD": scrapes must present it (HTTP basic auth)
  // PEM certificate (chain) and key: serve HTTPS (TlsMetricsServer) instead of HTTP.
  std::string tls_cert_file;
  std::string tls_key_file;
};

// The options the coordinator's and the agent's flags name: the basic-auth file's first line,
// trimmed, and the TLS files as given. INVALID_ARGUMENT naming the file when it cannot be read.
absl::StatusOr<MetricsHttpOptions> LoadMetricsHttpOptions(const std::string& basic_auth_file,
                                                          const std::string& tls_cert_file,
                                                          const std::string& tls_key_file);

class TlsMetricsServer;

// An HTTP server answering GET /metrics with the text exposition of one collectable.
class MetricsHttpServer {
 public:
  // Listens on `listen` (HOST:PORT; port 0 lets the kernel pick), as `options` say.
  // INVALID_ARGUMENT for an address without a port, credentials without a colon or TLS files
  // that do not load, UNAVAILABLE when it cannot bind. The collectable is held weakly: it must
  // outlive the server or be dropped from scrapes once gone.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      const std::string& listen, const std::shared_ptr<prometheus::Collectable>& collectable,
      const MetricsHttpOptions& options = {});
  ~MetricsHttpServer();

  // The bound port.
  int port() const { return port_; }

 private:
  MetricsHttpServer(std::unique_ptr<prometheus::Exposer> exposer,
                    std::unique_ptr<TlsMetricsServer> tls, int port);

  std::unique_ptr<prometheus::Exposer> exposer_;  // HTTP
  std::unique_ptr<TlsMetricsServer> tls_;         // or HTTPS
  int port_;
};

// What a daemon's metrics flags say (--metrics_listen, --metrics_basic_auth_file,
// --metrics_tls_cert, --metrics_tls_key, --metrics_port_file), and the daemon's own default
// address.
struct DaemonMetricsFlags {
  std::string listen;  // empty: metrics off
  std::string default_listen;
  std::string basic_auth_file;
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string port_file;  // empty: none
};

// The coordinator's and the agent's metrics start-up: serves `collectable` as the flags say,
// logs where, and writes the port file. nullptr when metrics are off: no address, or the default
// address is taken (several daemons on one machine: tests, `trainyard up`), which is logged as a
// warning. An error, which should stop the daemon, for files that cannot be read, an address
// given explicitly that cannot be bound, a malformed address, or a port file that cannot be
// written; its message names the flag.
absl::StatusOr<std::unique_ptr<MetricsHttpServer>> StartDaemonMetrics(
    const DaemonMetricsFlags& flags, const std::shared_ptr<prometheus::Collectable>& collectable);

// Writes `port` and a newline to `path` atomically (temp file, then rename), so a reader never
// sees a partial number. UNAVAILABLE when it cannot.
absl::Status WritePortFile(const std::string& path, int port);

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_RPC_METRICS_HTTP_H_
