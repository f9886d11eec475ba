#include "server/auth/auth.h"

#include <string>

#include "common/rpc/credentials.h"
#include "common/sha256.h"
#include "gmock/gmock.h"
#include "google/protobuf/descriptor.h"
#include "gtest/gtest.h"
#include "server/api/request_limits.h"
#include "tests/common/fake_clock.h"
#include "tests/server/fake_job_store.h"
#include "trainyard/v1/admin_service.pb.h"
#include "trainyard/v1/agent_service.pb.h"
#include "trainyard/v1/job_service.pb.h"

namespace trainyard {
namespace {

using ::testing::HasSubstr;

class AuthenticatorTest : public ::testing::Test {
 protected:
  std::unique_ptr<Authenticator> Open() {
    auto auth = Authenticator::Create(store_, key_, clock_);
    EXPECT_TRUE(auth.ok()) << auth.status();
    return auth.ok() ? *std::move(auth) : nullptr;
  }
  absl::StatusOr<Principal> As(const Authenticator& auth, const std::string& bearer) {
    CallerCredentials c;
    c.bearer = bearer;
    return auth.Authenticate(c);
  }

  FakeJobStore store_;
  FakeClock clock_;
  const std::string key_ = RandomBytes(32);
};

TEST_F(AuthenticatorTest, TokensAreStoredHashedAndOutliveARestart) {
  auto auth = Open();
  auto made = auth->CreateToken("alice", Role::kUser, absl::InfiniteDuration(), "root");
  ASSERT_TRUE(made.ok()) << made.status();
  const std::string token = made->first;
  EXPECT_EQ(made->second.created_by, "root");
  // Only the hash is written.
  auto stored = store_.LoadTokens();
  ASSERT_TRUE(stored.ok());
  ASSERT_EQ(stored->size(), 1u);
  EXPECT_EQ((*stored)[0].hash, Sha256Hex(token));
  EXPECT_EQ((*stored)[0].name, "alice");
  EXPECT_EQ(token.find((*stored)[0].hash), std::string::npos);

  auto reopened = Open();
  auto who = As(*reopened, token);
  ASSERT_TRUE(who.ok()) << who.status();
  EXPECT_EQ(who->role, Role::kUser);
  EXPECT_EQ(who->name, "alice");
  // One character off is someone else's problem.
  std::string forged = token;
  forged.back() = forged.back() == 'A' ? 'B' : 'A';
  EXPECT_EQ(As(*reopened, forged).status().code(), absl::StatusCode::kUnauthenticated);
}

TEST_F(AuthenticatorTest, ExpiredAndRevokedTokensStopWorking) {
  auto auth = Open();
  const std::string day = auth->CreateToken("day", Role::kUser, absl::Hours(24), "root")->first;
  const std::string kept =
      auth->CreateToken("kept", Role::kAgent, absl::InfiniteDuration(), "root")->first;
  clock_.Advance(absl::Hours(24) - absl::Seconds(1));
  EXPECT_TRUE(As(*auth, day).ok());
  clock_.Advance(absl::Seconds(1));
  EXPECT_THAT(std::string(As(*auth, day).status().message()), HasSubstr("has expired"));

  auto revoked = auth->RevokeToken(*TokenId(kept), "root");
  ASSERT_TRUE(revoked.ok()) << revoked.status();
  EXPECT_EQ(revoked->revoked_by, "root");
  EXPECT_THAT(std::string(As(*auth, kept).status().message()), HasSubstr("was revoked"));
  EXPECT_EQ(auth->RevokeToken(*TokenId(kept), "root").status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(auth->RevokeToken("ffffffffffff", "root").status().code(), absl::StatusCode::kNotFound);
  // Still revoked after a restart.
  EXPECT_EQ(As(*Open(), kept).status().code(), absl::StatusCode::kUnauthenticated);
}

TEST_F(AuthenticatorTest, AnAdminTokenIsMadeOnlyWhenNoneIsValid) {
  auto auth = Open();
  auto first = auth->EnsureAdminToken();
  ASSERT_TRUE(first.ok() && first->has_value());
  EXPECT_EQ(As(*auth, **first)->role, Role::kAdmin);
  EXPECT_FALSE(auth->EnsureAdminToken()->has_value());
  auth->RevokeToken(*TokenId(**first), "root").IgnoreError();
  auto second = auth->EnsureAdminToken();
  ASSERT_TRUE(second.ok() && second->has_value());
  EXPECT_NE(**second, **first);
}

TEST_F(AuthenticatorTest, BadTokenRequestsAreRefused) {
  auto auth = Open();
  EXPECT_EQ(auth->CreateToken("", Role::kUser, absl::InfiniteDuration(), "r").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(auth->CreateToken("a b", Role::kUser, absl::InfiniteDuration(), "r").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(auth->CreateToken("x", Role::kTask, absl::InfiniteDuration(), "r").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(auth->CreateToken("x", Role::kUser, absl::ZeroDuration(), "r").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(store_.LoadTokens()->empty());
  // Nothing, or something that is not one of ours.
  EXPECT_EQ(auth->Authenticate(CallerCredentials()).status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(As(*auth, "hunter2").status().code(), absl::StatusCode::kUnauthenticated);
}

TEST_F(AuthenticatorTest, TaskCredentialsCarryTheirScopeAndCannotBeAltered) {
  auto auth = Open();
  TaskScope scope;
  scope.job_id = "mlp-3";
  scope.generation = 2;
  scope.shard = true;
  scope.index = 1;
  const std::string credential = SignTaskCredential(key_, scope);
  auto who = As(*auth, credential);
  ASSERT_TRUE(who.ok()) << who.status();
  EXPECT_EQ(who->role, Role::kTask);
  EXPECT_EQ(who->task.job_id, "mlp-3");
  EXPECT_EQ(who->task.generation, 2);
  EXPECT_TRUE(who->task.shard);
  EXPECT_EQ(who->name, "mlp-3/shard 1");
  // Another scope under the same signature, or another key, is refused.
  TaskScope other = scope;
  other.generation = 3;
  const std::string signed_other = SignTaskCredential(key_, other);
  const std::string spliced =
      signed_other.substr(0, signed_other.rfind('.')) + credential.substr(credential.rfind('.'));
  EXPECT_EQ(As(*auth, spliced).status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(As(*auth, SignTaskCredential(RandomBytes(32), scope)).status().code(),
            absl::StatusCode::kUnauthenticated);
  // What a task may do.
  EXPECT_TRUE(AllowTask(*who, "mlp-3", 2).ok());
  EXPECT_EQ(AllowTask(*who, "mlp-3", 1).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(AllowTask(*who, "mlp-4", 2).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Allow(*who, Audience::kPeople, "SubmitJob").code(),
            absl::StatusCode::kPermissionDenied);
}

TEST(RequestLimitsTest, EveryFieldIsBoundedAtAnyDepth) {
  v1::RegisterWorkerRequest ok;
  ok.set_name(std::string(128, 'n'));
  ok.add_tasks()->set_message(std::string(64 << 10, 'm'));
  EXPECT_TRUE(CheckRequestLimits(ok).ok());

  v1::RegisterWorkerRequest deep = ok;
  deep.mutable_tasks(0)->set_message(std::string((64 << 10) + 1, 'm'));
  EXPECT_EQ(CheckRequestLimits(deep).message(),
            "tasks[0].message: 65537 bytes is over the limit of 65536");
  v1::RegisterWorkerRequest name = ok;
  name.set_name(std::string(129, 'n'));
  EXPECT_EQ(CheckRequestLimits(name).code(), absl::StatusCode::kInvalidArgument);
  // A field the table does not name gets the default bound.
  v1::SubmitJobRequest spec;
  spec.mutable_spec()->mutable_data()->set_train(std::string(kDefaultMaxStringBytes + 1, 'p'));
  EXPECT_THAT(std::string(CheckRequestLimits(spec).message()),
              HasSubstr("spec.data.train: 4097 bytes"));
  // Every field the table names exists: a renamed field would lose its bound silently. (The
  // services' messages are linked in here.)
  v1::CreateTokenRequest::descriptor();
  int count = 0;
  const FieldBound* bounds = RequestBounds(&count);
  for (int i = 0; i < count; ++i) {
    const std::string full = bounds[i].field;
    const std::string message = full.substr(0, full.rfind('.'));
    const auto* descriptor =
        google::protobuf::DescriptorPool::generated_pool()->FindMessageTypeByName(message);
    ASSERT_NE(descriptor, nullptr) << full;
    EXPECT_NE(descriptor->FindFieldByName(full.substr(full.rfind('.') + 1)), nullptr) << full;
  }
}

}  // namespace
}  // namespace trainyard
