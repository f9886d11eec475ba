#ifndef TRAINYARD_COMMON_RPC_DAEMON_METRICS_FLAGS_H_
#define TRAINYARD_COMMON_RPC_DAEMON_METRICS_FLAGS_H_

// The metrics flags the coordinator and the worker agent share (--metrics_basic_auth_file,
// --metrics_tls_cert, --metrics_tls_key, --metrics_port_file), defined once here; each daemon
// keeps its own --metrics_listen, whose default differs. A daemon's --help lists them when its
// usage filter accepts kDaemonMetricsFlagsFile.

#include <string>

#include "absl/strings/string_view.h"
#include "common/rpc/metrics_http.h"

namespace trainyard {

// The file these flags are defined in, as absl names it for --help filters.
inline constexpr absl::string_view kDaemonMetricsFlagsFile = "common/rpc/daemon_metrics_flags.cc";

// The daemon's metrics flags: `listen` and `default_listen` are its own --metrics_listen and that
// flag's default; the rest come from the shared flags.
DaemonMetricsFlags DaemonMetricsFlagsFromCommandLine(std::string listen,
                                                     std::string default_listen);

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_RPC_DAEMON_METRICS_FLAGS_H_
