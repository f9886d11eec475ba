#include "server/auth/console_logins.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/fake_clock.h"

namespace trainyard {
namespace {

using ::testing::HasSubstr;

Principal Person(const std::string& name, Role role) {
  Principal p;
  p.name = name;
  p.role = role;
  return p;
}

TEST(ConsoleLoginsTest, ACodeIsGoodOnceWithinItsLifetime) {
  FakeClock clock(absl::FromUnixSeconds(1000));
  ConsoleLogins logins(clock);
  auto made = logins.Create(Person("alice", Role::kUser));
  ASSERT_TRUE(made.ok()) << made.status();
  EXPECT_EQ(made->second, clock.Now() + ConsoleLogins::kCodeLifetime);
  auto other = logins.Create(Person("alice", Role::kUser));
  ASSERT_TRUE(other.ok());
  EXPECT_NE(made->first, other->first);
  auto person = logins.Redeem(made->first);
  ASSERT_TRUE(person.ok()) << person.status();
  EXPECT_EQ(person->name, "alice");
  EXPECT_EQ(person->role, Role::kUser);
  auto again = logins.Redeem(made->first);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(std::string(again.status().message()), HasSubstr("used already"));
  // The other code, too late.
  clock.Advance(ConsoleLogins::kCodeLifetime);
  auto late = logins.Redeem(other->first);
  EXPECT_EQ(late.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(std::string(late.status().message()), HasSubstr("expired"));
  EXPECT_EQ(logins.Redeem("no-such-code").status().code(), absl::StatusCode::kUnauthenticated);
}

TEST(ConsoleLoginsTest, OnlyPeopleGetCodesAndTheUnusedOnesAreBounded) {
  FakeClock clock(absl::FromUnixSeconds(1000));
  ConsoleLogins logins(clock);
  EXPECT_EQ(logins.Create(Person("w1", Role::kAgent)).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(logins.Create(Person("root", Role::kAdmin)).ok());
  for (int i = 1; i < ConsoleLogins::kMaxPending; ++i) {
    ASSERT_TRUE(logins.Create(Person("bob", Role::kUser)).ok()) << i;
  }
  EXPECT_EQ(logins.Create(Person("bob", Role::kUser)).status().code(),
            absl::StatusCode::kResourceExhausted);
  // Expired codes make room.
  clock.Advance(ConsoleLogins::kCodeLifetime + absl::Seconds(1));
  EXPECT_TRUE(logins.Create(Person("bob", Role::kUser)).ok());
}

}  // namespace
}  // namespace trainyard
