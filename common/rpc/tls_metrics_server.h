#ifndef TRAINYARD_COMMON_RPC_TLS_METRICS_SERVER_H_
#define TRAINYARD_COMMON_RPC_TLS_METRICS_SERVER_H_

// GET /metrics over HTTPS (OpenSSL), for Prometheus scrapes that must not travel in clear. Our
// own because the HTTP server under Debian 12's prometheus-cpp (civetweb 1.15) crashes in its
// TLS handshake with OpenSSL 3. It does only what a scrape needs: one request per connection,
// up to kMaxConnections connections served at once (more wait in the kernel's listen backlog of
// the same size), each bounded in size and time: the request may be 16 KiB, the handshake and
// the request together must arrive within 5 s of the connection being accepted, and the answer
// must be taken within 5 s more. A client that sends slowly or nothing holds one slot for at most
// that, and never delays the scrapes on the other slots.

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "prometheus/collectable.h"

struct ssl_ctx_st;
struct ssl_st;

namespace trainyard {

// The answer to one scrape, `request` being the bytes up to and including the blank line (or
// fewer, when the client stopped): 400 for a request that is not one, 404 for anything but GET
// /metrics, 401 when `expected_authorization` ("Basic ...") is set and the request's Authorization
// header is not it (compared in constant time), 503 once the collectable is gone, else 200 with
// its metrics in the text exposition format.
std::string AnswerMetricsRequest(absl::string_view request,
                                 absl::string_view expected_authorization,
                                 const std::weak_ptr<prometheus::Collectable>& collectable);

class TlsMetricsServer {
 public:
  static constexpr int kMaxConnections = 16;
  static constexpr absl::Duration kRequestDeadline = absl::Seconds(5);  // handshake + request
  static constexpr absl::Duration kAnswerDeadline = absl::Seconds(5);
  static constexpr size_t kMaxRequestBytes = 16 << 10;

  // Listens on `host` ("[::1]" style for IPv6) and `port` (0: the kernel picks) with the PEM
  // certificate (chain) and key. With `basic_auth` ("USER:PASSWORD") a request must carry it
  // (401 otherwise). INVALID_ARGUMENT for files that do not load, UNAVAILABLE when it cannot
  // bind. The deadlines are measured on `clock` (not owned; it must outlive the server).
  static absl::StatusOr<std::unique_ptr<TlsMetricsServer>> Start(
      const std::string& host, int port, std::weak_ptr<prometheus::Collectable> collectable,
      const std::string& cert_file, const std::string& key_file, const std::string& basic_auth,
      const Clock& clock = RealClock::Get());
  // Stops accepting and drops the connections in progress; returns within about 200 ms.
  ~TlsMetricsServer();
  TlsMetricsServer(const TlsMetricsServer&) = delete;
  TlsMetricsServer& operator=(const TlsMetricsServer&) = delete;

  int port() const { return port_; }

 private:
  explicit TlsMetricsServer(const Clock& clock) : clock_(clock) {}
  // One of the kMaxConnections serving threads: accepts a connection, serves it, and again.
  void Serve();
  void Handle(int fd);
  // Runs `op` (an SSL call on the non-blocking `fd`: > 0 is success) until it succeeds, waiting
  // for the socket as OpenSSL asks. Returns its result, or -1 when it fails, `deadline` passes
  // or the server stops.
  template <typename Op>
  int Io(ssl_st* ssl, int fd, absl::Time deadline, Op op) const;

  const Clock& clock_;
  ssl_ctx_st* ctx_ = nullptr;
  int fd_ = -1;
  int port_ = 0;
  std::string expected_authorization_;  // "Basic ..." or empty
  std::weak_ptr<prometheus::Collectable> collectable_;
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
};

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_RPC_TLS_METRICS_SERVER_H_
