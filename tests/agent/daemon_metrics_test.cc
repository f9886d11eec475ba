// StartDaemonMetrics: the coordinator's and the agent's metrics start-up. Metrics are off without
// an address, and when the daemon's default address is taken; an address asked for explicitly
// that cannot be bound, an unreadable file or a port file that cannot be written stop the daemon.
// And the HTTPS server behind --metrics_tls_cert: a slow client neither holds up other scrapes
// nor keeps its connection past the deadline.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/rpc/metrics_http.h"
#include "common/rpc/tls_metrics_server.h"
#include "gtest/gtest.h"
#include "prometheus/counter.h"
#include "prometheus/registry.h"
#include "tests/common/fake_clock.h"

namespace trainyard {
namespace {

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(DaemonMetricsTest, StartsWhereAskedAndWritesItsPort) {
  auto registry = std::make_shared<prometheus::Registry>();
  DaemonMetricsFlags flags;
  EXPECT_EQ(*StartDaemonMetrics(flags, registry), nullptr);  // no address: off

  const std::string dir = testing::TempDir();
  flags.listen = "127.0.0.1:0";
  flags.port_file = dir + "/daemon-metrics.port";
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server = StartDaemonMetrics(flags, registry);
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_NE(*server, nullptr);
  EXPECT_EQ(Slurp(flags.port_file), absl::StrCat((*server)->port(), "\n"));

  // The same address again: taken. As the daemon's default, metrics are off; asked for
  // explicitly, the daemon stops, naming the flag.
  flags.listen = absl::StrCat("127.0.0.1:", (*server)->port());
  flags.port_file.clear();
  flags.default_listen = flags.listen;
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> off = StartDaemonMetrics(flags, registry);
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ(*off, nullptr);
  flags.default_listen = "127.0.0.1:7071";
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> taken = StartDaemonMetrics(flags, registry);
  ASSERT_FALSE(taken.ok());
  EXPECT_TRUE(absl::StartsWith(taken.status().message(), "--metrics_listen: ")) << taken.status();
}

TEST(DaemonMetricsTest, BadFilesStopTheDaemon) {
  auto registry = std::make_shared<prometheus::Registry>();
  DaemonMetricsFlags flags;
  flags.listen = "127.0.0.1:0";
  flags.basic_auth_file = "/nonexistent/metrics-auth";
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> bad = StartDaemonMetrics(flags, registry);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  flags.basic_auth_file.clear();
  flags.port_file = "/nonexistent/folder/metrics.port";
  bad = StartDaemonMetrics(flags, registry);
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::StartsWith(bad.status().message(), "--metrics_port_file: ")) << bad.status();
}

// A self-signed certificate and its key, made once for the whole test binary.
struct TestCert {
  std::string cert;
  std::string key;
};

const TestCert& Cert() {
  static const TestCert* const kCert = [] {
    auto* made = new TestCert{absl::StrCat(::testing::TempDir(), "/metrics-", getpid(), ".pem"),
                              absl::StrCat(::testing::TempDir(), "/metrics-", getpid(), ".key")};
    const std::string command = absl::StrCat(
        "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 "
        "-subj /CN=localhost -keyout ",
        made->key, " -out ", made->cert, " 2>/dev/null");
    EXPECT_EQ(std::system(command.c_str()), 0) << command;
    return made;
  }();
  return *kCert;
}

// A TCP connection to 127.0.0.1:`port` whose reads and writes give up after `timeout`: the
// client's own bound, well below the server's deadline, so that a blocked server fails the test
// instead of hanging it.
int Connect(int port, absl::Duration timeout = absl::Seconds(2)) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const timeval tv = absl::ToTimeval(timeout);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  return fd;
}

// A TLS 1.2 client (no certificate checks: the server's TLS is not what is tested here).
class TlsClient {
 public:
  explicit TlsClient(int port) : fd_(Connect(port)) {
    ctx_ = SSL_CTX_new(TLS_client_method());
    // TLS 1.3 servers send session tickets after the handshake; with 1.2 a server that is
    // waiting sends nothing, which OpenAndQuiet can see.
    SSL_CTX_set_max_proto_version(ctx_, TLS1_2_VERSION);
    ssl_ = SSL_new(ctx_);
    SSL_set_fd(ssl_, fd_);
  }
  ~TlsClient() {
    SSL_free(ssl_);
    SSL_CTX_free(ctx_);
    close(fd_);
  }
  int fd() const { return fd_; }
  // True once the server has taken part in a whole handshake: a thread of it serves us.
  bool Handshake() { return SSL_connect(ssl_) == 1; }
  bool Write(const std::string& data) {
    return SSL_write(ssl_, data.data(), static_cast<int>(data.size())) ==
           static_cast<int>(data.size());
  }
  // What the server sends until it closes; empty if it sends nothing in time.
  std::string ReadToEnd() {
    std::string out;
    char buffer[4096];
    int n;
    while ((n = SSL_read(ssl_, buffer, sizeof(buffer))) > 0) out.append(buffer, n);
    return out;
  }

 private:
  int fd_;
  SSL_CTX* ctx_;
  SSL* ssl_;
};

// GET /metrics on a new connection, within the client's 2 s bound; the whole answer.
std::string Scrape(int port) {
  TlsClient client(port);
  if (!client.Handshake()) return "handshake failed";
  if (!client.Write("GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")) return "write failed";
  return client.ReadToEnd();
}

// The connection is open and the server has sent nothing on it (nor closed it).
bool OpenAndQuiet(int fd) {
  pollfd p = {fd, POLLIN, 0};
  return poll(&p, 1, 0) == 0;
}

// The server closes the connection within `patience` of real time.
bool ClosedWithin(int fd, absl::Duration patience) {
  pollfd p = {fd, POLLIN, 0};
  if (poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(patience))) != 1) return false;
  char byte;
  return recv(fd, &byte, 1, MSG_DONTWAIT) <= 0;
}

std::shared_ptr<prometheus::Registry> RegistryWithACounter() {
  auto registry = std::make_shared<prometheus::Registry>();
  prometheus::BuildCounter().Name("trainyard_test_total").Register(*registry).Add({}).Increment();
  return registry;
}

TEST(TlsMetricsServerTest, SlowClientsDoNotHoldUpOtherScrapes) {
  auto registry = RegistryWithACounter();
  const FakeClock clock;  // never moves: no deadline passes in this test
  absl::StatusOr<std::unique_ptr<TlsMetricsServer>> server =
      TlsMetricsServer::Start("127.0.0.1", 0, registry, Cert().cert, Cert().key, "", clock);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();

  // One client stops half-way through its request: its handshake done, a server thread is
  // serving it. Another connects and sends nothing at all.
  TlsClient slow(port);
  ASSERT_TRUE(slow.Handshake());
  ASSERT_TRUE(slow.Write("GET /metrics HTTP/1.1\r\nHost: local"));
  const int silent = Connect(port);

  // A scrape still gets its answer, within the client's 2 s (the deadline is 5 s, and far off on
  // the clock), while both are connected.
  const std::string answer = Scrape(port);
  EXPECT_TRUE(absl::StartsWith(answer, "HTTP/1.1 200 OK")) << answer;
  EXPECT_TRUE(absl::StrContains(answer, "trainyard_test_total 1")) << answer;
  EXPECT_TRUE(OpenAndQuiet(slow.fd()));
  EXPECT_TRUE(OpenAndQuiet(silent));
  close(silent);
}

TEST(TlsMetricsServerTest, AClientThatDribblesIsClosedAtTheDeadline) {
  auto registry = RegistryWithACounter();
  const FakeClock clock;
  absl::StatusOr<std::unique_ptr<TlsMetricsServer>> server =
      TlsMetricsServer::Start("127.0.0.1", 0, registry, Cert().cert, Cert().key, "", clock);
  ASSERT_TRUE(server.ok()) << server.status();
  TlsClient slow((*server)->port());
  ASSERT_TRUE(slow.Handshake());
  ASSERT_TRUE(slow.Write("GET /metrics HTTP/1.1\r\n"));
  // A byte a second: each read is prompt, but the request as a whole takes too long.
  const absl::Duration step = TlsMetricsServer::kRequestDeadline / 5;
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(slow.Write("X"));
    clock.Advance(step);
    ASSERT_TRUE(OpenAndQuiet(slow.fd())) << "closed after " << i + 1 << " steps";
  }
  ASSERT_TRUE(slow.Write("X"));
  clock.Advance(2 * step);
  EXPECT_TRUE(ClosedWithin(slow.fd(), absl::Seconds(3)));
  // And its slot serves again.
  const std::string answer = Scrape((*server)->port());
  EXPECT_TRUE(absl::StartsWith(answer, "HTTP/1.1 200 OK")) << answer;
}

}  // namespace
}  // namespace trainyard
