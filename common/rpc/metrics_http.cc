#include "common/rpc/metrics_http.h"

#include <openssl/crypto.h>

#include <cstdio>
#include <exception>
#include <fstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/rpc/tls_metrics_server.h"

namespace trainyard {

absl::StatusOr<MetricsHttpOptions> LoadMetricsHttpOptions(const std::string& basic_auth_file,
                                                          const std::string& tls_cert_file,
                                                          const std::string& tls_key_file) {
  MetricsHttpOptions options;
  if (!basic_auth_file.empty()) {
    std::ifstream in(basic_auth_file);
    std::string line;
    if (!in || !std::getline(in, line) ||
        (options.basic_auth = std::string(absl::StripAsciiWhitespace(line))).empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot read USER:PASSWORD from ", basic_auth_file));
    }
  }
  options.tls_cert_file = tls_cert_file;
  options.tls_key_file = tls_key_file;
  return options;
}

MetricsHttpServer::MetricsHttpServer(std::unique_ptr<prometheus::Exposer> exposer,
                                     std::unique_ptr<TlsMetricsServer> tls, int port)
    : exposer_(std::move(exposer)), tls_(std::move(tls)), port_(port) {}

MetricsHttpServer::~MetricsHttpServer() = default;

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& listen, const std::shared_ptr<prometheus::Collectable>& collectable,
    const MetricsHttpOptions& options) {
  const std::string& basic_auth = options.basic_auth;
  const size_t split = basic_auth.find(':');
  if (!basic_auth.empty() && (split == std::string::npos || split == 0)) {
    return absl::InvalidArgumentError("metrics basic auth: expected USER:PASSWORD");
  }
  const size_t colon = listen.rfind(':');
  int requested = -1;
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(absl::string_view(listen).substr(colon + 1), &requested) || requested < 0 ||
      requested > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics address '", listen, "': expected HOST:PORT"));
  }
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return absl::InvalidArgumentError("metrics TLS needs both the certificate and the key");
  }
  if (!options.tls_cert_file.empty()) {
    absl::StatusOr<std::unique_ptr<TlsMetricsServer>> tls =
        TlsMetricsServer::Start(listen.substr(0, colon), requested, collectable,
                                options.tls_cert_file, options.tls_key_file, basic_auth);
    if (!tls.ok()) return tls.status();
    const int port = (*tls)->port();
    return std::unique_ptr<MetricsHttpServer>(
        new MetricsHttpServer(nullptr, *std::move(tls), port));
  }
  std::unique_ptr<prometheus::Exposer> exposer;
  try {
    // civetweb throws when it cannot bind.
    exposer = std::make_unique<prometheus::Exposer>(listen, /*num_threads=*/2);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", listen, ": ", e.what()));
  }
  exposer->RegisterCollectable(collectable);
  if (!basic_auth.empty()) {
    exposer->RegisterAuth(
        [user = basic_auth.substr(0, split), password = basic_auth.substr(split + 1)](
            const std::string& u, const std::string& p) {
          // Compared in constant time for equal lengths, as a password check should be.
          return u == user && p.size() == password.size() &&
                 CRYPTO_memcmp(p.data(), password.data(), p.size()) == 0;
        },
        "trainyard");
  }
  const std::vector<int> ports = exposer->GetListeningPorts();
  if (ports.empty()) {
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", listen));
  }
  return std::unique_ptr<MetricsHttpServer>(
      new MetricsHttpServer(std::move(exposer), nullptr, ports[0]));
}

absl::Status WritePortFile(const std::string& path, int port) {
  const std::string temp = absl::StrCat(path, ".tmp");
  {
    std::ofstream out(temp, std::ios::trunc);
    out << port << "\n";
    out.flush();
    if (!out) return absl::UnavailableError(absl::StrCat("write ", temp));
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    return absl::UnavailableError(absl::StrCat("rename ", temp, " -> ", path));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> StartDaemonMetrics(
    const DaemonMetricsFlags& flags, const std::shared_ptr<prometheus::Collectable>& collectable) {
  absl::StatusOr<MetricsHttpOptions> options =
      LoadMetricsHttpOptions(flags.basic_auth_file, flags.tls_cert_file, flags.tls_key_file);
  if (!options.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("metrics: ", options.status().message()));
  }
  if (flags.listen.empty()) return std::unique_ptr<MetricsHttpServer>();
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> started =
      MetricsHttpServer::Start(flags.listen, collectable, *options);
  if (!started.ok()) {
    // Only an address asked for explicitly is worth refusing to start over.
    if (flags.listen != flags.default_listen || absl::IsInvalidArgument(started.status())) {
      return absl::Status(started.status().code(),
                          absl::StrCat("--metrics_listen: ", started.status().message()));
    }
    LogWarning("metrics are off: ", started.status().message());
    return std::unique_ptr<MetricsHttpServer>();
  }
  LogInfo("metrics on ", flags.listen.substr(0, flags.listen.rfind(':')), ":", (*started)->port(),
          "/metrics");
  if (!flags.port_file.empty()) {
    if (absl::Status s = WritePortFile(flags.port_file, (*started)->port()); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("--metrics_port_file: ", s.message()));
    }
  }
  return started;
}

}  // namespace trainyard
