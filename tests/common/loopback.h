#ifndef TRAINYARD_TESTS_COMMON_LOOPBACK_H_
#define TRAINYARD_TESTS_COMMON_LOOPBACK_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace trainyard::testing {

// A TCP port free on 127.0.0.1 now, for a process that must be told its port before it starts
// (it may be taken in between: callers retry on a clash). 0 if none could be had.
inline int FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 0;
  if (fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  if (fd >= 0) close(fd);
  return port;
}

}  // namespace trainyard::testing

#endif  // TRAINYARD_TESTS_COMMON_LOOPBACK_H_
