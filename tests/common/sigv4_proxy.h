#ifndef TRAINYARD_TESTS_COMMON_SIGV4_PROXY_H_
#define TRAINYARD_TESTS_COMMON_SIGV4_PROXY_H_

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/storage/s3_auth.h"

namespace trainyard::testing {

inline std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// tests/common/sigv4_proxy.py on 127.0.0.1 in front of an s3rver: it checks the SigV4 signature
// of every request with botocore (s3rver takes any), forwards those that pass, and logs each
// request as a line of JSON.
class SigV4Proxy {
 public:
  // Starts the proxy (`script`, tests/common/sigv4_proxy.py) for `upstream` with s3rver's
  // credentials, its log in `dir`; returns once it listens. ListObjectsV2 pages hold three keys.
  // UNAVAILABLE when it does not start.
  static absl::StatusOr<std::unique_ptr<SigV4Proxy>> Start(const std::string& script,
                                                           const std::string& upstream,
                                                           const AwsCredentials& credentials,
                                                           const std::string& dir) {
    std::unique_ptr<SigV4Proxy> proxy(new SigV4Proxy());
    proxy->log_ = dir + "/sigv4-proxy.log";
    const std::string errors = dir + "/sigv4-proxy.err";
    std::vector<std::string> args = {"/usr/bin/python3",
                                     script,
                                     "--upstream",
                                     upstream,
                                     "--access-key",
                                     credentials.access_key_id,
                                     "--secret-key",
                                     credentials.secret_access_key,
                                     "--log",
                                     proxy->log_,
                                     "--list-page-size",
                                     "3"};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    int out[2];
    if (pipe2(out, O_CLOEXEC) != 0) return absl::UnavailableError("pipe2 failed");
    const pid_t pid = fork();
    if (pid == 0) {
      dup2(out[1], 1);
      const int err = open(errors.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (err >= 0) dup2(err, 2);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(out[1]);
    if (pid < 0) {
      close(out[0]);
      return absl::UnavailableError("fork failed");
    }
    proxy->pid_ = pid;
    proxy->stdout_fd_ = out[0];
    // The proxy prints "listening on 127.0.0.1:PORT" once it accepts connections.
    std::string line;
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (line.find('\n') == std::string::npos) {
      pollfd p = {out[0], POLLIN, 0};
      const int64_t wait_ms = absl::ToInt64Milliseconds(deadline - absl::Now());
      if (wait_ms <= 0 || poll(&p, 1, static_cast<int>(wait_ms)) <= 0) {
        return absl::UnavailableError(
            absl::StrCat("sigv4_proxy.py did not start: ", line, ReadWholeFile(errors)));
      }
      char buffer[256];
      const ssize_t n = read(out[0], buffer, sizeof(buffer));
      if (n <= 0) {
        return absl::UnavailableError(
            absl::StrCat("sigv4_proxy.py exited: ", ReadWholeFile(errors)));
      }
      line.append(buffer, static_cast<size_t>(n));
    }
    absl::string_view port = line;
    if (!absl::ConsumePrefix(&port, "listening on 127.0.0.1:") ||
        !absl::SimpleAtoi(absl::StripAsciiWhitespace(port), &proxy->port_)) {
      return absl::UnavailableError(absl::StrCat("sigv4_proxy.py said: ", line));
    }
    return proxy;
  }

  ~SigV4Proxy() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      int status;
      waitpid(pid_, &status, 0);
    }
    if (stdout_fd_ >= 0) close(stdout_fd_);
  }
  SigV4Proxy(const SigV4Proxy&) = delete;
  SigV4Proxy& operator=(const SigV4Proxy&) = delete;

  int port() const { return port_; }

  // The requests seen so far: {"method", "host", "path", "query", "verified", "reason",
  // "status"}. A request is logged before its answer is sent.
  std::vector<nlohmann::json> Requests() const {
    std::vector<nlohmann::json> out;
    std::istringstream lines(ReadWholeFile(log_));
    for (std::string line; std::getline(lines, line);) {
      out.push_back(nlohmann::json::parse(line));
    }
    return out;
  }

 private:
  SigV4Proxy() = default;
  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  int port_ = 0;
  std::string log_;
};

}  // namespace trainyard::testing

#endif  // TRAINYARD_TESTS_COMMON_SIGV4_PROXY_H_
