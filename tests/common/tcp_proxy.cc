#include "tests/common/tcp_proxy.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <tuple>

#include "absl/strings/str_cat.h"

namespace trainyard::testing {
namespace {

int ConnectTo(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

// Writes all of `data` (blocking); false when the peer is gone.
bool WriteAll(int fd, const char* data, ssize_t n) {
  while (n > 0) {
    const ssize_t w = write(fd, data, static_cast<size_t>(n));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    data += w;
    n -= w;
  }
  return true;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TcpProxy>> TcpProxy::Start(int target_port) {
  std::unique_ptr<TcpProxy> proxy(new TcpProxy());
  proxy->target_port_ = target_port;
  proxy->listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(proxy->listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(proxy->listen_fd_, 64) != 0 ||
      getsockname(proxy->listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0 ||
      pipe2(proxy->wake_, O_CLOEXEC) != 0) {
    return absl::UnavailableError(absl::StrCat("proxy: ", strerror(errno)));
  }
  proxy->port_ = ntohs(addr.sin_port);
  proxy->thread_ = std::thread([p = proxy.get()] { p->Loop(); });
  return proxy;
}

TcpProxy::~TcpProxy() {
  stop_ = true;
  Wake();
  if (thread_.joinable()) thread_.join();
  for (int fd : {listen_fd_, wake_[0], wake_[1]}) {
    if (fd >= 0) close(fd);
  }
}

void TcpProxy::Wake() {
  const char byte = 1;
  [[maybe_unused]] ssize_t n = write(wake_[1], &byte, 1);
}

void TcpProxy::Cut() {
  cut_ = true;
  Wake();
}

void TcpProxy::Heal() {
  cut_ = false;
  Wake();
}

void TcpProxy::Loop() {
  // Each relayed connection: the client's socket and the target's (-1 until connected, which
  // waits while the link is cut).
  struct Link {
    int client;
    int target;
  };
  std::vector<Link> links;
  auto close_link = [](Link& l) {
    close(l.client);
    if (l.target >= 0) close(l.target);
    l.client = l.target = -1;
  };
  while (!stop_) {
    const bool cut = cut_;
    if (!cut) {
      for (Link& l : links) {
        if (l.target < 0 && (l.target = ConnectTo(target_port_)) < 0) close_link(l);
      }
    }
    std::vector<pollfd> fds = {{wake_[0], POLLIN, 0}, {listen_fd_, POLLIN, 0}};
    if (!cut) {
      for (const Link& l : links) {
        if (l.client < 0) continue;
        fds.push_back({l.client, POLLIN, 0});
        fds.push_back({l.target, POLLIN, 0});
      }
    }
    if (poll(fds.data(), fds.size(), -1) < 0 && errno != EINTR) break;
    if (fds[0].revents & POLLIN) {
      char buffer[64];
      [[maybe_unused]] ssize_t n = read(wake_[0], buffer, sizeof(buffer));
    }
    // The links polled this round (a connection accepted below joins the next).
    const size_t polled = cut ? 0 : links.size();
    if (fds[1].revents & POLLIN) {
      const int client = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (client >= 0) {
        const int one = 1;
        setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        links.push_back({client, -1});
      }
    }
    size_t at = 2;
    for (size_t i = 0; i < polled; ++i) {
      Link& l = links[i];
      if (l.client < 0) continue;
      const pollfd& from_client = fds[at++];
      const pollfd& from_target = fds[at++];
      for (const auto& [ready, src, dst] : {std::tuple{from_client.revents, l.client, l.target},
                                            std::tuple{from_target.revents, l.target, l.client}}) {
        if (l.client < 0 || (ready & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
        char buffer[65536];
        const ssize_t n = read(src, buffer, sizeof(buffer));
        if (n <= 0 || !WriteAll(dst, buffer, n)) close_link(l);
      }
    }
    links.erase(
        std::remove_if(links.begin(), links.end(), [](const Link& l) { return l.client < 0; }),
        links.end());
  }
  for (Link& l : links) {
    if (l.client >= 0) close_link(l);
  }
}

}  // namespace trainyard::testing
