#include "worker/trainer/program/channel.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace trainyard::trainer::program {

using nlohmann::json;

absl::StatusOr<std::unique_ptr<Channel>> Channel::Listen(const std::string& path, Handler handler) {
  sockaddr_un address = {};
  address.sun_family = AF_UNIX;
  if (path.size() >= sizeof(address.sun_path)) {
    return absl::UnavailableError(absl::StrCat("the socket path ", path,
                                               " is longer than a Unix socket's ",
                                               sizeof(address.sun_path) - 1, " bytes"));
  }
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
  ::unlink(path.c_str());
  const mode_t before = ::umask(0077);  // the socket is the task user's alone
  const int bound = ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  ::umask(before);
  if (bound != 0 || ::listen(fd, 16) != 0) {
    const std::string error = std::strerror(errno);
    ::close(fd);
    return absl::UnavailableError(absl::StrCat("cannot listen on ", path, ": ", error));
  }
  return std::unique_ptr<Channel>(new Channel(fd, path, std::move(handler)));
}

Channel::Channel(int fd, std::string path, Handler handler)
    : listen_fd_(fd),
      path_(std::move(path)),
      handler_(std::move(handler)),
      accept_thread_([this] { Accept(); }) {}

Channel::~Channel() {
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    // shutdown wakes the threads blocked in accept and recv; the descriptors close after.
    ::shutdown(listen_fd_, SHUT_RDWR);
    for (int fd : connections_) ::shutdown(fd, SHUT_RDWR);
  }
  accept_thread_.join();
  {
    absl::MutexLock lock(&mu_);
    threads.swap(threads_);
  }
  for (std::thread& t : threads) t.join();
  ::close(listen_fd_);
  ::unlink(path_.c_str());
}

void Channel::Accept() {
  for (;;) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      if (fd >= 0) ::close(fd);
      return;
    }
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      LogWarning("program socket: accept: ", std::strerror(errno));
      return;
    }
    if (static_cast<int>(connections_.size()) >= kMaxConnections) {
      ::close(fd);
      continue;
    }
    connections_.push_back(fd);
    threads_.emplace_back([this, fd] { Serve(fd); });
  }
}

void Channel::Serve(int fd) {
  std::string buffer;
  char chunk[4096];
  bool open = true;
  while (open) {
    const ssize_t n = ::recv(fd, chunk, sizeof(chunk), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    buffer.append(chunk, static_cast<size_t>(n));
    size_t newline;
    while (open && (newline = buffer.find('\n')) != std::string::npos) {
      const std::string line = buffer.substr(0, newline);
      buffer.erase(0, newline + 1);
      json reply;
      const json request = json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (!request.is_object()) {
        reply = {{"ok", false}, {"error", "not a JSON object"}};
      } else {
        try {
          reply = handler_(request);
        } catch (const std::exception& e) {
          reply = {{"ok", false}, {"error", e.what()}};
        }
      }
      const std::string out = reply.dump() + "\n";
      size_t sent = 0;
      while (sent < out.size()) {
        const ssize_t w = ::send(fd, out.data() + sent, out.size() - sent, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
          open = false;
          break;
        }
        sent += static_cast<size_t>(w);
      }
    }
    if (buffer.size() > kMaxRequestBytes) break;
  }
  absl::MutexLock lock(&mu_);
  connections_.erase(std::remove(connections_.begin(), connections_.end(), fd), connections_.end());
  ::close(fd);
}

}  // namespace trainyard::trainer::program
