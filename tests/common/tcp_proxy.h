#ifndef TRAINYARD_TESTS_COMMON_TCP_PROXY_H_
#define TRAINYARD_TESTS_COMMON_TCP_PROXY_H_

// A TCP relay on 127.0.0.1 in front of a local port, which a test can cut: from Cut() on nothing
// passes either way and nobody is told (connections stay open, new ones are accepted and hear
// nothing), as when a cable is cut; Heal() lets bytes pass again. No root, no firewall rules.

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"

namespace trainyard::testing {

class TcpProxy {
 public:
  // Listens on a port the kernel picks and relays each connection to 127.0.0.1:`target_port`.
  static absl::StatusOr<std::unique_ptr<TcpProxy>> Start(int target_port);
  ~TcpProxy();  // closes every connection
  TcpProxy(const TcpProxy&) = delete;
  TcpProxy& operator=(const TcpProxy&) = delete;

  int port() const { return port_; }
  void Cut();
  void Heal();

 private:
  TcpProxy() = default;
  void Loop();
  void Wake();

  int listen_fd_ = -1;
  int port_ = 0;
  int target_port_ = 0;
  int wake_[2] = {-1, -1};
  std::atomic<bool> cut_{false};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace trainyard::testing

#endif  // TRAINYARD_TESTS_COMMON_TCP_PROXY_H_
