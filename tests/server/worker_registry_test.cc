#include "server/jobs/worker_registry.h"

#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/fake_clock.h"

namespace trainyard {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

LeasePolicy Timeout(absl::Duration timeout) {
  LeasePolicy policy;
  policy.timeout = timeout;
  return policy;
}

v1::Worker Info(const std::string& id) {
  v1::Worker w;
  w.set_id(id);
  w.set_slots(2);
  return w;
}

// Registers w0..w{n-1}, each holding a lease stream; the registration of each.
std::vector<LeaseTicket> RegisterStreaming(WorkerRegistry& registry, int n) {
  std::vector<LeaseTicket> registration;
  for (int i = 0; i < n; ++i) {
    const std::string id = absl::StrCat("w", i);
    registry.Register(Info(id));
    registration.push_back(*registry.OpenLease(id));
  }
  return registration;
}

TEST(WorkerRegistryTest, LeaseExpiresExactlyAtTheTimeout) {
  FakeClock clock;
  WorkerRegistry registry(clock, Timeout(absl::Seconds(10)));
  registry.Register(Info("w1"));
  EXPECT_EQ(registry.Find("w1")->info.state(), v1::READY);

  clock.Advance(absl::Seconds(10) - absl::Milliseconds(1));
  EXPECT_THAT(registry.ExpireLeases().lost, IsEmpty());
  EXPECT_EQ(registry.Find("w1")->info.state(), v1::READY);

  clock.Advance(absl::Milliseconds(1));
  EXPECT_THAT(registry.ExpireLeases().lost, ElementsAre("w1"));
  EXPECT_EQ(registry.Find("w1")->info.state(), v1::LOST);
  // Reported once.
  EXPECT_THAT(registry.ExpireLeases().lost, IsEmpty());
}

TEST(WorkerRegistryTest, RenewExtendsTheLease) {
  FakeClock clock;
  WorkerRegistry registry(clock, Timeout(absl::Seconds(10)));
  registry.Register(Info("w1"));
  clock.Advance(absl::Seconds(8));
  ASSERT_TRUE(registry.Renew("w1").ok());
  clock.Advance(absl::Seconds(8));
  EXPECT_THAT(registry.ExpireLeases().lost, IsEmpty());
  clock.Advance(absl::Seconds(2));
  EXPECT_THAT(registry.ExpireLeases().lost, ElementsAre("w1"));
}

TEST(WorkerRegistryTest, LostWorkerMustRegisterAgain) {
  FakeClock clock;
  WorkerRegistry registry(clock, Timeout(absl::Seconds(1)));
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
  WorkerRegistry registry(clock, Timeout(absl::Seconds(10)));
  registry.Register(Info("w1"));
  const uint64_t v = registry.Find("w1")->desired_version;
  registry.BumpVersion("w1");
  EXPECT_GT(registry.Find("w1")->desired_version, v);
}

TEST(WorkerRegistryTest, AnOpenLeaseStreamHoldsTheLeasePastTheTimeout) {
  FakeClock clock;
  WorkerRegistry registry(clock, Timeout(absl::Seconds(10)));
  registry.Register(Info("w1"));
  absl::StatusOr<LeaseTicket> registration = registry.OpenLease("w1");
  ASSERT_TRUE(registration.ok());
  clock.Advance(absl::Hours(1));
  EXPECT_THAT(registry.ExpireLeases().lost, IsEmpty());
  // Syncs do not move a streamed lease: it ends with its stream.
  ASSERT_TRUE(registry.Renew("w1").ok());
  registry.CloseLease("w1", *registration);
  clock.Advance(absl::Milliseconds(499));
  EXPECT_THAT(registry.ExpireLeases().lost, IsEmpty());
  ASSERT_TRUE(registry.Renew("w1").ok());
  clock.Advance(absl::Milliseconds(1));
  EXPECT_THAT(registry.ExpireLeases().lost, ElementsAre("w1"));
  EXPECT_EQ(registry.OpenLease("w1").status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(registry.OpenLease("nope").status().code(), absl::StatusCode::kNotFound);
}

TEST(WorkerRegistryTest, AStreamReopenedWithinTheGraceKeepsTheLease) {
  FakeClock clock;
  WorkerRegistry registry(clock, Timeout(absl::Seconds(10)));
  registry.Register(Info("w1"));
  const LeaseTicket first = *registry.OpenLease("w1");
  // The new stream may open before the old one is seen closed.
  const LeaseTicket second = *registry.OpenLease("w1");
  registry.CloseLease("w1", first);
  clock.Advance(absl::Seconds(5));
  EXPECT_THAT(registry.ExpireLeases().lost, IsEmpty());
  registry.CloseLease("w1", second);
  clock.Advance(absl::Milliseconds(200));
  ASSERT_TRUE(registry.OpenLease("w1").ok());
  clock.Advance(absl::Seconds(5));
  EXPECT_THAT(registry.ExpireLeases().lost, IsEmpty());
}

TEST(WorkerRegistryTest, AStreamOfAnEarlierRegistrationEndsNothing) {
  FakeClock clock;
  WorkerRegistry registry(clock, Timeout(absl::Seconds(10)));
  registry.Register(Info("w1"));
  const LeaseTicket old = *registry.OpenLease("w1");
  registry.Register(Info("w1"));
  const LeaseTicket current = *registry.OpenLease("w1");
  EXPECT_NE(old.stream, current.stream);
  registry.CloseLease("w1", old);
  clock.Advance(absl::Seconds(30));
  EXPECT_THAT(registry.ExpireLeases().lost, IsEmpty());
}

TEST(WorkerRegistryTest, MostWorkersOutOfLeaseAtOnceAreHeldNotLost) {
  FakeClock clock;
  LeasePolicy policy = Timeout(absl::Seconds(10));
  policy.mass_loss_hold = absl::Minutes(5);
  WorkerRegistry registry(clock, policy);
  std::vector<LeaseTicket> registration = RegisterStreaming(registry, 3);
  // One of three: a machine lost.
  registry.CloseLease("w0", registration[0]);
  clock.Advance(absl::Seconds(1));
  EXPECT_THAT(registry.ExpireLeases().lost, ElementsAre("w0"));
  registry.Register(Info("w0"));
  registration[0] = *registry.OpenLease("w0");
  // All three at once: this coordinator is the one cut off. Held, not lost, and nothing new
  // is placed there (unreachable).
  for (int i = 0; i < 3; ++i) registry.CloseLease(absl::StrCat("w", i), registration[i]);
  clock.Advance(absl::Seconds(1));
  WorkerRegistry::Expiry expiry = registry.ExpireLeases();
  EXPECT_THAT(expiry.lost, IsEmpty());
  EXPECT_THAT(expiry.held, ElementsAre("w0", "w1", "w2"));
  EXPECT_TRUE(registry.Find("w1")->unreachable());
  EXPECT_EQ(registry.Find("w1")->info.state(), v1::READY);
  clock.Advance(absl::Seconds(30));
  expiry = registry.ExpireLeases();
  EXPECT_THAT(expiry.lost, IsEmpty());
  EXPECT_THAT(expiry.held, IsEmpty());  // said once
  // Two come back: the third has a lease timeout to come back too (a partition heals a moment
  // apart), and is LOST after that.
  ASSERT_TRUE(registry.OpenLease("w0").ok());
  ASSERT_TRUE(registry.OpenLease("w1").ok());
  expiry = registry.ExpireLeases();
  EXPECT_THAT(expiry.returned, ElementsAre("w0", "w1"));
  EXPECT_THAT(expiry.lost, IsEmpty());
  EXPECT_FALSE(registry.Find("w0")->unreachable());
  EXPECT_TRUE(registry.Find("w2")->unreachable());
  clock.Advance(absl::Seconds(10) - absl::Milliseconds(1));
  EXPECT_THAT(registry.ExpireLeases().lost, IsEmpty());
  clock.Advance(absl::Milliseconds(1));
  EXPECT_THAT(registry.ExpireLeases().lost, ElementsAre("w2"));
}

TEST(WorkerRegistryTest, OneHeldThatComesBackLateIsNotLost) {
  FakeClock clock;
  WorkerRegistry registry(clock, Timeout(absl::Seconds(10)));
  const std::vector<LeaseTicket> registration = RegisterStreaming(registry, 3);
  for (int i = 0; i < 3; ++i) registry.CloseLease(absl::StrCat("w", i), registration[i]);
  clock.Advance(absl::Seconds(1));
  EXPECT_THAT(registry.ExpireLeases().held, ElementsAre("w0", "w1", "w2"));
  ASSERT_TRUE(registry.OpenLease("w0").ok());
  ASSERT_TRUE(registry.OpenLease("w1").ok());
  EXPECT_THAT(registry.ExpireLeases().lost, IsEmpty());
  clock.Advance(absl::Milliseconds(100));
  ASSERT_TRUE(registry.OpenLease("w2").ok());
  WorkerRegistry::Expiry expiry = registry.ExpireLeases();
  EXPECT_THAT(expiry.returned, ElementsAre("w2"));
  EXPECT_THAT(expiry.lost, IsEmpty());
  EXPECT_EQ(registry.Find("w2")->info.state(), v1::READY);
}

TEST(WorkerRegistryTest, ALeaseThatRanOutWaitsWhileOtherStreamsAreClosing) {
  FakeClock clock;
  WorkerRegistry registry(clock, Timeout(absl::Seconds(10)));
  const std::vector<LeaseTicket> registration = RegisterStreaming(registry, 5);
  registry.CloseLease("w0", registration[0]);
  clock.Advance(absl::Milliseconds(300));
  registry.CloseLease("w1", registration[1]);
  clock.Advance(absl::Milliseconds(200));
  // w0's lease ran out, but w1's stream is closing too: wait and see.
  WorkerRegistry::Expiry expiry = registry.ExpireLeases();
  EXPECT_THAT(expiry.lost, IsEmpty());
  EXPECT_THAT(expiry.held, IsEmpty());
  clock.Advance(absl::Milliseconds(300));
  // Two of five: machines lost, not this coordinator cut off.
  EXPECT_THAT(registry.ExpireLeases().lost, ElementsAre("w0", "w1"));
}

TEST(WorkerRegistryTest, StreamsBreakingOneAfterAnotherAreAMassLoss) {
  FakeClock clock;
  WorkerRegistry registry(clock, Timeout(absl::Seconds(10)));
  const std::vector<LeaseTicket> registration = RegisterStreaming(registry, 3);
  for (int i = 0; i < 3; ++i) {
    registry.CloseLease(absl::StrCat("w", i), registration[i]);
    clock.Advance(absl::Milliseconds(200));
    WorkerRegistry::Expiry expiry = registry.ExpireLeases();
    EXPECT_THAT(expiry.lost, IsEmpty()) << i;
  }
  clock.Advance(absl::Seconds(1));
  WorkerRegistry::Expiry expiry = registry.ExpireLeases();
  EXPECT_THAT(expiry.lost, IsEmpty());
  EXPECT_TRUE(registry.Find("w0")->unreachable());
  EXPECT_TRUE(registry.Find("w2")->unreachable());
}

TEST(WorkerRegistryTest, AMassLossHeldTooLongIsALoss) {
  FakeClock clock;
  LeasePolicy policy = Timeout(absl::Seconds(10));
  policy.mass_loss_hold = absl::Minutes(5);
  WorkerRegistry registry(clock, policy);
  registry.Register(Info("w0"));
  registry.Register(Info("w1"));
  clock.Advance(absl::Seconds(10));
  EXPECT_THAT(registry.ExpireLeases().held, ElementsAre("w0", "w1"));
  clock.Advance(absl::Minutes(5) - absl::Milliseconds(1));
  EXPECT_THAT(registry.ExpireLeases().lost, IsEmpty());
  clock.Advance(absl::Milliseconds(1));
  EXPECT_THAT(registry.ExpireLeases().lost, ElementsAre("w0", "w1"));
}

// A worker restored by a coordinator that took over has its lease and the time its agent may
// need to give up the old, frozen leader (its pings: 3 s) to come.
TEST(WorkerRegistryTest, ARestoredWorkerHasTheTimeToLeaveAFrozenLeader) {
  FakeClock clock;
  WorkerRegistry registry(clock, Timeout(absl::Seconds(2)));
  registry.Restore(Info("w0"));
  clock.Advance(absl::Seconds(5) - absl::Milliseconds(1));
  EXPECT_THAT(registry.ExpireLeases().lost, IsEmpty());
  clock.Advance(absl::Milliseconds(1));
  EXPECT_THAT(registry.ExpireLeases().lost, ElementsAre("w0"));
}

// Workers whose agents said they were leaving (DRAINING after a notice) and then left are gone as
// announced: LOST when their leases run out, never held as if the coordinator were cut off.
TEST(WorkerRegistryTest, WorkersThatLeftAfterANoticeAreLostNotHeld) {
  FakeClock clock;
  WorkerRegistry registry(clock, Timeout(absl::Seconds(10)));
  // Two of three leave after a notice; the third stays.
  for (const char* id : {"w0", "w1", "w2"}) registry.Register(Info(id));
  ASSERT_TRUE(registry.SetState("w0", v1::DRAINING).ok());
  ASSERT_TRUE(registry.SetState("w1", v1::DRAINING).ok());
  clock.Advance(absl::Seconds(5));
  ASSERT_TRUE(registry.Renew("w2").ok());
  clock.Advance(absl::Seconds(5));
  WorkerRegistry::Expiry expiry = registry.ExpireLeases();
  EXPECT_THAT(expiry.lost, ElementsAre("w0", "w1"));
  EXPECT_THAT(expiry.held, IsEmpty());
  EXPECT_EQ(expiry.down, 0);
  EXPECT_EQ(expiry.live, 1);

  // Every worker of a cluster preempted at once (one Slurm allocation): lost, not held.
  WorkerRegistry all(clock, Timeout(absl::Seconds(10)));
  for (const char* id : {"a", "b"}) {
    all.Register(Info(id));
    ASSERT_TRUE(all.SetState(id, v1::DRAINING).ok());
  }
  clock.Advance(absl::Seconds(10));
  expiry = all.ExpireLeases();
  EXPECT_THAT(expiry.lost, ElementsAre("a", "b"));
  EXPECT_THAT(expiry.held, IsEmpty());
  EXPECT_FALSE(all.Find("a")->unreachable());

  // A mass loss among the others still holds them while the one leaving goes.
  WorkerRegistry mixed(clock, Timeout(absl::Seconds(10)));
  for (const char* id : {"m0", "m1", "m2", "m3"}) mixed.Register(Info(id));
  ASSERT_TRUE(mixed.SetState("m0", v1::DRAINING).ok());
  clock.Advance(absl::Seconds(10));
  expiry = mixed.ExpireLeases();
  EXPECT_THAT(expiry.lost, ElementsAre("m0"));
  EXPECT_THAT(expiry.held, ElementsAre("m1", "m2", "m3"));
}

// Agents w0..w{n-1} that beat, each stream's end counted in `ended` (the server cancels the call;
// here the test closes it as the call's end would).
struct Beating {
  std::vector<LeaseTicket> tickets;
  std::map<std::string, int> ended;
};
void RegisterBeating(WorkerRegistry& registry, int n, Beating& out) {
  for (int i = 0; i < n; ++i) {
    const std::string id = absl::StrCat("w", i);
    registry.Register(Info(id));
    out.tickets.push_back(*registry.OpenLease(id, /*beats=*/true, [&out, id] { ++out.ended[id]; }));
  }
}

TEST(WorkerRegistryTest, ABusyAgentWithoutABeatForTheTimeoutHasItsStreamEnded) {
  FakeClock clock;
  WorkerRegistry registry(clock, Timeout(absl::Seconds(10)));  // beat_timeout 1.5 s
  Beating agents;
  RegisterBeating(registry, 3, agents);
  auto busy = [](const std::string& id) { return id == "w0"; };
  // Beats every 500 ms keep it; the idle ones need none.
  for (int i = 0; i < 6; ++i) {
    clock.Advance(absl::Milliseconds(500));
    registry.Beat("w0", agents.tickets[0]);
    WorkerRegistry::Silence silence = registry.CheckBeats(busy);
    EXPECT_THAT(silence.silent, IsEmpty());
    EXPECT_THAT(silence.probe, IsEmpty());
  }
  // One late beat is not a loss: three intervals are.
  clock.Advance(absl::Milliseconds(1499));
  EXPECT_THAT(registry.CheckBeats(busy).silent, IsEmpty());
  clock.Advance(absl::Milliseconds(1));
  WorkerRegistry::Silence silence = registry.CheckBeats(busy);
  EXPECT_THAT(silence.silent, ElementsAre("w0"));
  EXPECT_EQ(agents.ended["w0"], 1);
  // The others were not heard from lately (idle agents say nothing): asked for a word.
  EXPECT_THAT(silence.probe, ElementsAre("w1", "w2"));
  EXPECT_THAT(registry.CheckBeats(busy).silent, IsEmpty());  // ended once
  EXPECT_EQ(agents.ended["w0"], 1);
  registry.CloseLease("w0", agents.tickets[0]);
  // Their answers (a Sync each) come: one machine lost, not this coordinator cut off.
  registry.Heard("w1");
  clock.Advance(absl::Milliseconds(100));
  EXPECT_THAT(registry.ExpireLeases().lost, IsEmpty());  // w2 has not answered yet
  registry.Heard("w2");
  clock.Advance(absl::Milliseconds(400));
  EXPECT_THAT(registry.ExpireLeases().lost, ElementsAre("w0"));
  EXPECT_TRUE(registry.Find("w0")->silenced);
  EXPECT_EQ(agents.ended["w1"] + agents.ended["w2"], 0);
}

TEST(WorkerRegistryTest, AnIdleAgentNeedsNoBeatsUntilItsTasksChange) {
  FakeClock clock;
  WorkerRegistry registry(clock, Timeout(absl::Seconds(10)));
  Beating agents;
  RegisterBeating(registry, 2, agents);
  bool busy = false;
  auto is_busy = [&busy](const std::string& id) { return busy && id == "w0"; };
  clock.Advance(absl::Minutes(10));
  EXPECT_THAT(registry.CheckBeats(is_busy).silent, IsEmpty());
  EXPECT_THAT(registry.ExpireLeases().lost, IsEmpty());
  // Given a task: beats are due from then, not from its last word ten minutes ago.
  busy = true;
  registry.BumpVersion("w0");
  clock.Advance(absl::Milliseconds(1499));
  EXPECT_THAT(registry.CheckBeats(is_busy).silent, IsEmpty());
  clock.Advance(absl::Milliseconds(1));
  EXPECT_THAT(registry.CheckBeats(is_busy).silent, ElementsAre("w0"));
}

TEST(WorkerRegistryTest, WhenNoProbedAgentAnswersItIsAMassLoss) {
  FakeClock clock;
  WorkerRegistry registry(clock, Timeout(absl::Seconds(10)));
  Beating agents;
  RegisterBeating(registry, 4, agents);
  auto busy = [](const std::string& id) { return id == "w0"; };
  clock.Advance(absl::Seconds(2));
  WorkerRegistry::Silence silence = registry.CheckBeats(busy);
  ASSERT_THAT(silence.silent, ElementsAre("w0"));
  ASSERT_THAT(silence.probe, ElementsAre("w1", "w2", "w3"));
  registry.CloseLease("w0", agents.tickets[0]);
  // Past w0's grace, but the probes are out: no decision yet.
  clock.Advance(absl::Seconds(1));
  WorkerRegistry::Expiry expiry = registry.ExpireLeases();
  EXPECT_THAT(expiry.lost, IsEmpty());
  EXPECT_THAT(expiry.held, IsEmpty());
  // No answer: this coordinator is the one cut off. Their streams end, and all are held.
  clock.Advance(absl::Milliseconds(500));
  silence = registry.CheckBeats(busy);
  EXPECT_THAT(silence.silent, ElementsAre("w1", "w2", "w3"));
  EXPECT_THAT(silence.probe, IsEmpty());
  for (int i = 1; i < 4; ++i) registry.CloseLease(absl::StrCat("w", i), agents.tickets[i]);
  clock.Advance(absl::Milliseconds(500));
  expiry = registry.ExpireLeases();
  EXPECT_THAT(expiry.lost, IsEmpty());
  EXPECT_THAT(expiry.held, ElementsAre("w0", "w1", "w2", "w3"));
}

TEST(WorkerRegistryTest, BeatsOfAnEndedStreamCountForNothing) {
  FakeClock clock;
  WorkerRegistry registry(clock, Timeout(absl::Seconds(10)));
  Beating agents;
  RegisterBeating(registry, 1, agents);
  auto busy = [](const std::string&) { return true; };
  clock.Advance(absl::Seconds(2));
  ASSERT_THAT(registry.CheckBeats(busy).silent, ElementsAre("w0"));
  // The call's end has not reached the handler yet; a beat read meanwhile does not revive it.
  registry.Beat("w0", agents.tickets[0]);
  registry.CloseLease("w0", agents.tickets[0]);
  clock.Advance(absl::Milliseconds(500));
  EXPECT_THAT(registry.ExpireLeases().lost, ElementsAre("w0"));
}

// What `trainyard workers` shows: READY only while the lease is as it should be.
TEST(WorkerRegistryTest, TheShownStateSaysWhatTheCoordinatorKnows) {
  FakeClock clock;
  LeasePolicy policy = Timeout(absl::Seconds(10));
  policy.mass_loss_hold = absl::Minutes(5);
  WorkerRegistry registry(clock, policy);
  const absl::Duration quiet = absl::Seconds(70);
  auto shown = [&](const std::string& id, std::string* reason = nullptr) {
    return registry.ShownState(*registry.Find(id), quiet, reason);
  };
  Beating agents;
  RegisterBeating(registry, 4, agents);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(shown(absl::StrCat("w", i)), v1::READY);

  // An idle agent long-polls: quiet for up to its poll and a timeout more, then SUSPECT.
  clock.Advance(quiet);
  EXPECT_EQ(shown("w3"), v1::READY);
  clock.Advance(absl::Seconds(1));
  std::string reason;
  EXPECT_EQ(shown("w3", &reason), v1::SUSPECT);
  EXPECT_THAT(reason, ::testing::HasSubstr("no word for 1m11s"));
  for (int i = 0; i < 4; ++i) registry.Heard(absl::StrCat("w", i));
  EXPECT_EQ(shown("w3"), v1::READY);

  // A busy agent that stops beating: its stream ended, SUSPECT until it is decided (LOST); the
  // others, asked for a word, SUSPECT until they answer.
  registry.BumpVersion("w0");
  clock.Advance(absl::Milliseconds(1500));
  WorkerRegistry::Silence silence =
      registry.CheckBeats([](const std::string& id) { return id == "w0"; });
  ASSERT_THAT(silence.silent, ElementsAre("w0"));
  EXPECT_EQ(shown("w0", &reason), v1::SUSPECT);
  EXPECT_EQ(shown("w1", &reason), v1::SUSPECT);
  EXPECT_THAT(reason, ::testing::HasSubstr("asked for a word"));
  registry.Heard("w1");
  registry.Heard("w2");
  registry.Heard("w3");
  EXPECT_EQ(shown("w1"), v1::READY);
  clock.Advance(absl::Milliseconds(500));
  EXPECT_THAT(registry.ExpireLeases().lost, ElementsAre("w0"));
  EXPECT_EQ(shown("w0"), v1::LOST);

  // Most at once: held, shown UNREACHABLE with when it becomes LOST (a worker DRAINING left as
  // its agent said it would: LOST, not held).
  ASSERT_TRUE(registry.SetState("w2", v1::DRAINING).ok());
  for (int i = 1; i < 4; ++i) {
    registry.CloseLease(absl::StrCat("w", i), agents.tickets[i]);
  }
  EXPECT_EQ(shown("w1", &reason), v1::SUSPECT);
  EXPECT_THAT(reason, ::testing::HasSubstr("stream closed"));
  clock.Advance(absl::Seconds(1));
  WorkerRegistry::Expiry expiry = registry.ExpireLeases();
  EXPECT_THAT(expiry.held, ElementsAre("w1", "w3"));
  EXPECT_THAT(expiry.lost, ElementsAre("w2"));
  clock.Advance(absl::Seconds(60));
  EXPECT_EQ(shown("w3", &reason), v1::UNREACHABLE);
  EXPECT_THAT(reason, ::testing::HasSubstr("LOST if it is not back within 4m"));
  EXPECT_EQ(registry.Find("w3")->info.state(), v1::READY);  // stored as it was

  // Restored from the store and not registered with this coordinator yet.
  WorkerRegistry restarted(clock, policy);
  restarted.Restore(Info("w5"));
  EXPECT_EQ(restarted.ShownState(*restarted.Find("w5"), quiet, &reason), v1::SUSPECT);
  EXPECT_THAT(reason, ::testing::HasSubstr("since this coordinator started"));
}

}  // namespace
}  // namespace trainyard
