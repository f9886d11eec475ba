#include "worker/agent/local_address.h"

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainyard {
namespace {

using ::testing::HasSubstr;

// Toward a coordinator on this machine the way out is loopback; the address found is the one
// the kernel routes from (across machines, tests/hosts/multi_host_test.py: each host's own).
TEST(LocalAddressTest, TowardLoopbackItIsLoopback) {
  absl::StatusOr<std::string> v4 = LocalAddressToward("127.0.0.1:7070");
  ASSERT_TRUE(v4.ok()) << v4.status();
  EXPECT_EQ(*v4, "127.0.0.1");
  absl::StatusOr<std::string> named = LocalAddressToward("localhost:7070");
  ASSERT_TRUE(named.ok()) << named.status();
  EXPECT_THAT(*named, ::testing::AnyOf("127.0.0.1", "::1"));
}

TEST(LocalAddressTest, BadTargetsAreRefusedSaying) {
  EXPECT_EQ(LocalAddressToward("no-port").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LocalAddressToward("[::1]7070").status().code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<std::string> unknown = LocalAddressToward("no-such-host.invalid:7070");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(unknown.status().message(), HasSubstr("cannot resolve 'no-such-host.invalid'"));
}

}  // namespace
}  // namespace trainyard
