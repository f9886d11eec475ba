// StartDaemonMetrics: the coordinator's and the agent's metrics start-up. Metrics are off without
// an address, and when the daemon's default address is taken; an address asked for explicitly
// that cannot be bound, an unreadable file or a port file that cannot be written stop the daemon.

#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/metrics_http.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"

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

}  // namespace
}  // namespace trainyard
