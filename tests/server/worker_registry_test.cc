#include "server/worker_registry.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/fake_clock.h"

namespace trainyard {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

v1::Worker Info(const std::string& id) {
  v1::Worker w;
  w.set_id(id);
  w.set_slots(2);
  return w;
}

TEST(WorkerRegistryTest, LeaseExpiresExactlyAtTheTimeout) {
  FakeClock clock;
  WorkerRegistry registry(clock, absl::Seconds(10));
  registry.Register(Info("w1"));
  EXPECT_EQ(registry.Find("w1")->info.state(), v1::READY);

  clock.Advance(absl::Seconds(10) - absl::Milliseconds(1));
  EXPECT_THAT(registry.ExpireLeases(), IsEmpty());
  EXPECT_EQ(registry.Find("w1")->info.state(), v1::READY);

  clock.Advance(absl::Milliseconds(1));
  EXPECT_THAT(registry.ExpireLeases(), ElementsAre("w1"));
  EXPECT_EQ(registry.Find("w1")->info.state(), v1::LOST);
  // Reported once.
  EXPECT_THAT(registry.ExpireLeases(), IsEmpty());
}

TEST(WorkerRegistryTest, RenewExtendsTheLease) {
  FakeClock clock;
  WorkerRegistry registry(clock, absl::Seconds(10));
  registry.Register(Info("w1"));
  clock.Advance(absl::Seconds(8));
  ASSERT_TRUE(registry.Renew("w1").ok());
  clock.Advance(absl::Seconds(8));
  EXPECT_THAT(registry.ExpireLeases(), IsEmpty());
  clock.Advance(absl::Seconds(2));
  EXPECT_THAT(registry.ExpireLeases(), ElementsAre("w1"));
}

TEST(WorkerRegistryTest, LostWorkerMustRegisterAgain) {
  FakeClock clock;
  WorkerRegistry registry(clock, absl::Seconds(1));
  registry.Register(Info("w1"));
  clock.Advance(absl::Seconds(2));
  registry.ExpireLeases();
  EXPECT_EQ(registry.Renew("w1").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(registry.Renew("nope").code(), absl::StatusCode::kNotFound);
  const uint64_t before = registry.Find("w1")->desired_version;
  registry.Register(Info("w1"));
  EXPECT_EQ(registry.Find("w1")->info.state(), v1::READY);
  EXPECT_NE(registry.Find("w1")->desired_version, before);
  EXPECT_TRUE(registry.Renew("w1").ok());
}

TEST(WorkerRegistryTest, VersionsChangeOnBump) {
  FakeClock clock;
  WorkerRegistry registry(clock, absl::Seconds(10));
  registry.Register(Info("w1"));
  const uint64_t v = registry.Find("w1")->desired_version;
  registry.BumpVersion("w1");
  EXPECT_GT(registry.Find("w1")->desired_version, v);
}

}  // namespace
}  // namespace trainyard
