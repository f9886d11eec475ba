#include "common/rpc/daemon_metrics_flags.h"

#include <string>
#include <utility>

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, metrics_basic_auth_file, "",
          "File holding USER:PASSWORD: scrapes of /metrics must present them (HTTP basic "
          "authentication, as Prometheus's basic_auth sends). Without --metrics_tls_cert they "
          "travel in clear: keep them on loopback or a private network.");
ABSL_FLAG(std::string, metrics_tls_cert, "",
          "PEM certificate (chain) for /metrics: with --metrics_tls_key, metrics are served over "
          "HTTPS only (Prometheus: scheme: https, tls_config).");
ABSL_FLAG(std::string, metrics_tls_key, "", "PEM key of --metrics_tls_cert.");
ABSL_FLAG(std::string, metrics_port_file, "",
          "If set, once metrics are served, write their bound port number to this file "
          "(atomically).");

namespace trainyard {

DaemonMetricsFlags DaemonMetricsFlagsFromCommandLine(std::string listen,
                                                     std::string default_listen) {
  DaemonMetricsFlags flags;
  flags.listen = std::move(listen);
  flags.default_listen = std::move(default_listen);
  flags.basic_auth_file = absl::GetFlag(FLAGS_metrics_basic_auth_file);
  flags.tls_cert_file = absl::GetFlag(FLAGS_metrics_tls_cert);
  flags.tls_key_file = absl::GetFlag(FLAGS_metrics_tls_key);
  flags.port_file = absl::GetFlag(FLAGS_metrics_port_file);
  return flags;
}

}  // namespace trainyard
