#ifndef TRAINYARD_COMMON_METRICS_HTTP_H_
#define TRAINYARD_COMMON_METRICS_HTTP_H_

// Serving Prometheus metrics over HTTP, shared by the coordinator and the worker agent.

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "prometheus/collectable.h"
#include "prometheus/exposer.h"

namespace trainyard {

// An HTTP server answering GET /metrics with the text exposition of one collectable.
class MetricsHttpServer {
 public:
  // Listens on `listen` (HOST:PORT; port 0 lets the kernel pick). With `basic_auth`
  // ("USER:PASSWORD"), scrapes must present it (HTTP basic authentication; 401 otherwise).
  // INVALID_ARGUMENT for an address without a port or credentials without a colon, UNAVAILABLE
  // when it cannot bind. The collectable is held weakly: it must outlive the server or be
  // dropped from scrapes once gone.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      const std::string& listen, const std::shared_ptr<prometheus::Collectable>& collectable,
      const std::string& basic_auth = "");
  ~MetricsHttpServer();

  // The bound port.
  int port() const { return port_; }

 private:
  MetricsHttpServer(std::unique_ptr<prometheus::Exposer> exposer, int port);

  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_;
};

// Writes `port` and a newline to `path` atomically (temp file, then rename), so a reader never
// sees a partial number. UNAVAILABLE when it cannot.
absl::Status WritePortFile(const std::string& path, int port);

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_METRICS_HTTP_H_
