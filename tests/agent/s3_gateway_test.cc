#include "worker/agent/s3_gateway.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/storage/s3_auth.h"
#include "common/storage/s3_client.h"
#include "tests/agent/fake_process_launcher.h"
#include "tests/common/fake_clock.h"
#include "tests/common/run_shell.h"
#include "tests/common/s3rver.h"
#include "tests/common/sigv4_proxy.h"
#include "worker/agent/reconciler.h"
#include "worker/agent/s3_gateway_rules.h"

namespace trainyard {
namespace {

using ::testing::HasSubstr;
using testing::S3rver;
using testing::SigV4Proxy;

std::string SourceDir() {
  const char* dir = getenv("TRAINYARD_SOURCE_DIR");
  return dir != nullptr ? dir : TRAINYARD_SOURCE_DIR_FALLBACK;
}

// A task of job alice/job-1 that reads data and a model from object storage and resumes from a
// checkpoint of bob's that was shared with it.
v1::Task AliceTask() {
  v1::Task task;
  task.set_task_id("job-1.g1.r0");
  task.set_job_id("job-1");
  task.mutable_spec()->mutable_data()->set_train("s3://data/sets/mnist/part-*.safetensors");
  task.mutable_spec()->mutable_model()->set_torchscript("s3://models/alice/net.pt");
  task.mutable_spec()->mutable_checkpoint()->set_uri("s3://ckpt");
  task.set_checkpoint_uri("s3://ckpt/alice/job-1");
  task.add_resume_checkpoints("s3://ckpt/bob/job-0/step-10");
  return task;
}

TEST(ObjectScopeTest, ATaskReachesWhatItsJobNamesAndNothingBeside) {
  absl::StatusOr<ObjectScope> scope = TaskObjectScope(AliceTask());
  ASSERT_TRUE(scope.ok()) << scope.status();
  // Its data (the pattern's folder), its model, what it resumes from: read only.
  EXPECT_TRUE(scope->MayRead("data", "sets/mnist/part-0.safetensors"));
  EXPECT_TRUE(scope->MayRead("models", "alice/net.pt"));
  EXPECT_TRUE(scope->MayRead("ckpt", "bob/job-0/step-10/manifest.json"));
  EXPECT_FALSE(scope->MayWrite("data", "sets/mnist/part-0.safetensors"));
  EXPECT_FALSE(scope->MayWrite("ckpt", "bob/job-0/step-10/manifest.json"));
  // Its own checkpoint folder: read and write.
  EXPECT_TRUE(scope->MayWrite("ckpt", "alice/job-1/step-5/model.safetensors"));
  EXPECT_TRUE(scope->MayRead("ckpt", "alice/job-1/step-5/model.safetensors"));
  // Neighbours whose names only begin the same, and everything else.
  EXPECT_FALSE(scope->MayRead("ckpt", "alice/job-10/step-5/model.safetensors"));
  EXPECT_FALSE(scope->MayRead("ckpt", "bob/job-0/step-11/manifest.json"));
  EXPECT_FALSE(scope->MayRead("models", "alice/net.pt.bak"));
  EXPECT_FALSE(scope->MayRead("data", "sets/other/part-0.safetensors"));
  EXPECT_FALSE(scope->MayRead("other", "sets/mnist/part-0.safetensors"));
  // Listings only within a folder it reads: "alice/job-1" would list alice/job-10/ too.
  EXPECT_TRUE(scope->MayList("ckpt", "alice/job-1/step-"));
  EXPECT_TRUE(scope->MayList("data", "sets/mnist/"));
  EXPECT_FALSE(scope->MayList("ckpt", "alice/job-1"));
  EXPECT_FALSE(scope->MayList("ckpt", "alice/"));
  EXPECT_FALSE(scope->MayList("ckpt", ""));
}

TEST(ObjectScopeTest, AJobFolderAtABucketsRootIsNotWritable) {
  v1::Task task;
  task.set_checkpoint_uri("s3://ckpt");
  absl::StatusOr<ObjectScope> scope = TaskObjectScope(task);
  ASSERT_TRUE(scope.ok());
  EXPECT_FALSE(scope->MayWrite("ckpt", "anything"));
}

GatewayRequest Request(const std::string& method, const std::string& path,
                       std::vector<std::pair<std::string, std::string>> query = {}) {
  return GatewayRequest{method, path, std::move(query), {}};
}

TEST(AuthorizeGatewayRequestTest, OperationsAreNamedAndHeldToTheScope) {
  const ObjectScope scope = *TaskObjectScope(AliceTask());
  auto op = [&](const GatewayRequest& r) { return AuthorizeGatewayRequest(r, scope); };
  absl::StatusOr<GatewayOperation> put = op(Request("PUT", "/ckpt/alice/job-1/step-1/a"));
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(put->name, "PutObject");
  EXPECT_TRUE(put->write);
  EXPECT_EQ(
      op(Request("PUT", "/ckpt/alice/job-1/a", {{"partNumber", "1"}, {"uploadId", "u"}}))->name,
      "UploadPart");
  EXPECT_EQ(op(Request("POST", "/ckpt/alice/job-1/a", {{"uploads", ""}}))->name,
            "CreateMultipartUpload");
  EXPECT_EQ(op(Request("DELETE", "/ckpt/alice/job-1/a", {{"uploadId", "u"}}))->name,
            "AbortMultipartUpload");
  EXPECT_EQ(op(Request("HEAD", "/models/alice/net.pt"))->name, "HeadObject");
  absl::StatusOr<GatewayOperation> list =
      op(Request("GET", "/ckpt", {{"list-type", "2"}, {"prefix", "alice/job-1/step-"}}));
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_TRUE(list->list);
  EXPECT_EQ(list->key, "alice/job-1/step-");

  // Refused, each with S3's AccessDenied and what was refused.
  for (const GatewayRequest& r : {
           Request("PUT", "/models/alice/net.pt"),                      // read-only place
           Request("DELETE", "/ckpt/bob/job-0/step-10/manifest.json"),  // another's checkpoint
           Request("GET", "/ckpt/alice/job-10/step-1/a"),               // a neighbour
           Request("GET", "/ckpt", {{"list-type", "2"}, {"prefix", "alice/"}}),  // too wide
           Request("GET", "/ckpt"),                                              // ListObjects v1
           Request("PUT", "/ckpt"),                               // a bucket operation
           Request("GET", "/"),                                   // ListBuckets
           Request("GET", "/ckpt/alice/job-1/a", {{"acl", ""}}),  // a sub-resource
           Request("PATCH", "/ckpt/alice/job-1/a"),
           // Spellings that a server normalising paths would take out of the job's folder.
           Request("PUT", "/ckpt/alice/job-1/../../bob/job-0/step-10/manifest.json"),
           Request("GET", "/ckpt/alice/job-1/./../job-10/x"),
           Request("GET", "/ckpt/alice/job-1//x"),
           Request("GET", "/ckpt/alice/job-1/.../x"),
           Request("GET", "/ckpt", {{"list-type", "2"}, {"prefix", "alice/job-1/../"}}),
       }) {
    absl::StatusOr<GatewayOperation> refused = op(r);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied)
        << r.method << " " << r.path;
  }
  GatewayRequest copy = Request("PUT", "/ckpt/alice/job-1/copy");
  copy.headers["x-amz-copy-source"] = "/ckpt/bob/job-0/step-10/manifest.json";
  EXPECT_THAT(op(copy).status().message(), HasSubstr("copies"));
  GatewayRequest chunked = Request("PUT", "/ckpt/alice/job-1/a");
  chunked.headers["x-amz-content-sha256"] = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD";
  EXPECT_THAT(op(chunked).status().message(), HasSubstr("streaming"));
}

// A request signed as an S3 client signs it, read back as the gateway's server reads it.
GatewayRequest Signed(const std::string& method, const std::string& key, absl::Time at,
                      const AwsCredentials& credentials) {
  SigV4Request to_sign;
  to_sign.method = method;
  to_sign.canonical_uri = "/ckpt/" + AwsUriEncode(key, true);
  to_sign.query = {{"partNumber", "2"}, {"uploadId", "a+b/c"}};
  to_sign.headers = {{"host", "127.0.0.1:9000"}, {"range", "bytes=0-9"}};
  to_sign.payload_sha256 = "UNSIGNED-PAYLOAD";
  const SigV4Result result = SignV4(to_sign, credentials, "us-east-1", "s3", at);
  GatewayRequest request{method, "/ckpt/" + key, to_sign.query, result.headers};
  return request;
}

TEST(VerifyGatewaySignatureTest, OnlyTheTasksKeyAtTheTimeItSignedVerifies) {
  const absl::Time now = absl::FromUnixSeconds(1790000000);
  const AwsCredentials task{"TYKEY", "task-secret", "", "test"};
  GatewayRequest request = Signed("PUT", "alice/job-1/a b+c", now, task);
  absl::StatusOr<SigV4Authorization> auth =
      ParseSigV4Authorization(request.headers.at("authorization"));
  ASSERT_TRUE(auth.ok()) << auth.status();
  EXPECT_EQ(auth->key_id, "TYKEY");
  EXPECT_TRUE(VerifyGatewaySignature(request, *auth, "task-secret", now).ok());
  EXPECT_TRUE(VerifyGatewaySignature(request, *auth, "task-secret", now + absl::Minutes(14)).ok());

  EXPECT_EQ(VerifyGatewaySignature(request, *auth, "other-secret", now).code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(VerifyGatewaySignature(request, *auth, "task-secret", now + absl::Minutes(16)).code(),
            absl::StatusCode::kPermissionDenied);
  GatewayRequest moved = request;
  moved.path = "/ckpt/bob/job-0/a b+c";  // the same signature on another key
  EXPECT_EQ(VerifyGatewaySignature(moved, *auth, "task-secret", now).code(),
            absl::StatusCode::kUnauthenticated);
  GatewayRequest ranged = request;
  ranged.headers["range"] = "bytes=0-99";  // a signed header changed
  EXPECT_EQ(VerifyGatewaySignature(ranged, *auth, "task-secret", now).code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_FALSE(ParseSigV4Authorization("AWS TYKEY:abc").ok());
  EXPECT_FALSE(ParseSigV4Authorization("").ok());
}

// The agent's side: a trainer gets the gateway's key for its task, none of the agent's AWS_*.
TEST(S3GatewayReconcilerTest, TrainersGetAKeyOfTheirOwnAndNoneOfTheAgents) {
  S3GatewayOptions options;
  options.upstream.endpoint = "http://127.0.0.1:9";
  options.upstream.credentials = {"AGENTKEY", "agent-secret", "", "test"};
  absl::StatusOr<std::unique_ptr<S3Gateway>> gateway = S3Gateway::Start(options);
  ASSERT_TRUE(gateway.ok()) << gateway.status();
  std::string dir = ::testing::TempDir() + "/gateway-reconciler-XXXXXX";
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  FakeClock clock;
  testing::FakeProcessLauncher launcher;
  ReconcilerOptions reconciler_options;
  reconciler_options.work_dir = dir;
  reconciler_options.trainer_path = "/bin/true";
  reconciler_options.s3_gateway = gateway->get();
  Reconciler reconciler(reconciler_options, launcher, clock);
  ASSERT_EQ(reconciler.Apply({AliceTask()}).size(), 1u);
  ASSERT_EQ(launcher.launched().size(), 1u);
  const SubprocessOptions launched = launcher.launched()[0].options;
  std::map<std::string, std::string> env(launched.env.begin(), launched.env.end());
  EXPECT_EQ(env["AWS_ENDPOINT_URL"], (*gateway)->endpoint());
  EXPECT_EQ(env["AWS_ENDPOINT_URL_S3"], (*gateway)->endpoint());
  EXPECT_TRUE(absl::StartsWith(env["AWS_ACCESS_KEY_ID"], "TY")) << env["AWS_ACCESS_KEY_ID"];
  EXPECT_EQ(env["AWS_SECRET_ACCESS_KEY"].size(), 64u);
  EXPECT_NE(env["AWS_SECRET_ACCESS_KEY"], "agent-secret");
  for (const char* name : {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                           "AWS_PROFILE", "AWS_SHARED_CREDENTIALS_FILE"}) {
    EXPECT_FALSE(launched.inherit(name)) << name;
  }
  EXPECT_TRUE(launched.inherit("PATH"));
  std::filesystem::remove_all(dir);
}

// Through the gateway to a real endpoint: the SigV4 proxy in front of s3rver checks every
// re-signed request with botocore.
class S3GatewayTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (S3rver::BinaryPath().empty()) GTEST_SKIP() << "s3rver is not installed";
    dir_ = ::testing::TempDir() + "/gateway-XXXXXX";
    ASSERT_NE(mkdtemp(dir_.data()), nullptr);
    absl::StatusOr<std::unique_ptr<S3rver>> s3 = S3rver::Start({"data", "models", "ckpt"});
    ASSERT_TRUE(s3.ok()) << s3.status();
    s3_ = *std::move(s3);
    absl::StatusOr<std::unique_ptr<SigV4Proxy>> proxy =
        SigV4Proxy::Start(SourceDir() + "/tests/common/sigv4_proxy.py", s3_->endpoint(),
                          s3_->ClientOptions().credentials, dir_);
    ASSERT_TRUE(proxy.ok()) << proxy.status();
    proxy_ = *std::move(proxy);
    S3GatewayOptions options;
    options.upstream = s3_->ClientOptions();
    options.upstream.endpoint = absl::StrCat("http://127.0.0.1:", proxy_->port());
    options.upstream.addressing = S3Addressing::kPath;
    absl::StatusOr<std::unique_ptr<S3Gateway>> gateway = S3Gateway::Start(options);
    ASSERT_TRUE(gateway.ok()) << gateway.status();
    gateway_ = *std::move(gateway);
    // What others wrote: bob's checkpoint (shared with alice's job) and bob's other job.
    S3Client owner(s3_->ClientOptions());
    ASSERT_TRUE(owner.PutObject("ckpt", "bob/job-0/step-10/manifest.json", "bob's").ok());
    ASSERT_TRUE(owner.PutObject("ckpt", "bob/job-2/step-3/manifest.json", "secret").ok());
    ASSERT_TRUE(owner.PutObject("models", "alice/net.pt", "model").ok());
  }
  void TearDown() override {
    gateway_.reset();
    proxy_.reset();
    s3_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  // The client a trainer builds from the environment its agent gave it.
  std::unique_ptr<S3Client> TaskClient(const std::map<std::string, std::string>& env) {
    absl::StatusOr<S3ClientOptions> options = S3ClientOptionsFromEnv([&](const char* name) {
      auto it = env.find(name);
      return it == env.end() ? nullptr : it->second.c_str();
    });
    EXPECT_TRUE(options.ok()) << options.status();
    options->multipart_threshold = 5 << 20;
    options->part_size = 5 << 20;
    options->retry.max_attempts = 1;
    return std::make_unique<S3Client>(*options);
  }

  std::string dir_;
  std::unique_ptr<S3rver> s3_;
  std::unique_ptr<SigV4Proxy> proxy_;
  std::unique_ptr<S3Gateway> gateway_;
};

TEST_F(S3GatewayTest, ATaskWorksInItsScopeAndIsRefusedOutsideIt) {
  const std::map<std::string, std::string> env =
      gateway_->Grant("job-1.g1.r0", *TaskObjectScope(AliceTask()));
  std::unique_ptr<S3Client> client = TaskClient(env);

  // Its own folder: a small object, a multipart one (two parts, streamed both ways), a listing,
  // a ranged read, a delete.
  ASSERT_TRUE(client->PutObject("ckpt", "alice/job-1/step-1/small", "hello").ok());
  const std::string large(6 << 20, 'x');
  absl::Status put = client->PutObject("ckpt", "alice/job-1/step-1/large", large);
  ASSERT_TRUE(put.ok()) << put;
  absl::StatusOr<std::string> back = client->GetObject("ckpt", "alice/job-1/step-1/large");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(*back == large);
  EXPECT_EQ(*client->GetObjectRange("ckpt", "alice/job-1/step-1/small", 1, 3), "ell");
  absl::StatusOr<std::vector<S3ObjectInfo>> listed = client->ListObjects("ckpt", "alice/job-1/");
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(listed->size(), 2u);
  EXPECT_TRUE(client->DeleteObject("ckpt", "alice/job-1/step-1/small").ok());
  EXPECT_EQ(client->HeadObject("ckpt", "alice/job-1/step-1/small").status().code(),
            absl::StatusCode::kNotFound);
  // What it may read.
  EXPECT_EQ(*client->GetObject("ckpt", "bob/job-0/step-10/manifest.json"), "bob's");
  EXPECT_EQ(*client->GetObject("models", "alice/net.pt"), "model");

  // Everything else is refused at the gateway, and nothing of it reached the store.
  EXPECT_EQ(client->GetObject("ckpt", "bob/job-2/step-3/manifest.json").status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(client->ListObjects("ckpt", "bob/").status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(client->PutObject("ckpt", "bob/job-0/step-10/manifest.json", "overwritten").code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(client->DeleteObject("models", "alice/net.pt").code(),
            absl::StatusCode::kPermissionDenied);
  S3Client owner(s3_->ClientOptions());
  EXPECT_EQ(*owner.GetObject("ckpt", "bob/job-0/step-10/manifest.json"), "bob's");
  EXPECT_EQ(*owner.GetObject("models", "alice/net.pt"), "model");
  EXPECT_EQ(gateway_->refused(), 4);
  // Every request that went on was signed with the agent's key, as botocore checks it.
  for (const nlohmann::json& seen : proxy_->Requests()) {
    EXPECT_TRUE(seen["verified"].get<bool>()) << seen.dump();
  }

  // A task that ended has no key any more.
  gateway_->Revoke("job-1.g1.r0");
  absl::Status after = client->PutObject("ckpt", "alice/job-1/step-2/small", "late");
  EXPECT_EQ(after.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(after.message(), HasSubstr("InvalidAccessKeyId"));
}

TEST_F(S3GatewayTest, BotocoresClientWorksThroughItWithTheTasksKey) {
  const std::map<std::string, std::string> env =
      gateway_->Grant("job-1.g1.r0", *TaskObjectScope(AliceTask()));
  const std::string file = dir_ + "/upload.bin";
  std::ofstream(file) << std::string(9 << 20, 'y');  // a multipart upload for the aws CLI
  std::string prefix = "env -i PATH=/usr/bin:/bin HOME=" + dir_;
  for (const auto& [name, value] : env) absl::StrAppend(&prefix, " ", name, "=", value);
  const std::string aws = prefix + " aws --endpoint-url " + gateway_->endpoint() + " s3 ";
  auto [code, output] = testing::RunShell(aws + "cp " + file + " s3://ckpt/alice/job-1/upload.bin");
  EXPECT_EQ(code, 0) << output;
  std::tie(code, output) = testing::RunShell(aws + "ls s3://ckpt/alice/job-1/");
  EXPECT_EQ(code, 0) << output;
  EXPECT_THAT(output, HasSubstr("upload.bin"));
  std::tie(code, output) =
      testing::RunShell(aws + "cp s3://ckpt/bob/job-2/step-3/manifest.json " + dir_ + "/stolen");
  EXPECT_NE(code, 0) << output;
  EXPECT_THAT(output, HasSubstr("403"));
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/stolen"));
  S3Client owner(s3_->ClientOptions());
  absl::StatusOr<S3ObjectInfo> uploaded = owner.HeadObject("ckpt", "alice/job-1/upload.bin");
  ASSERT_TRUE(uploaded.ok()) << uploaded.status();
  EXPECT_EQ(uploaded->size, 9 << 20);
}

}  // namespace
}  // namespace trainyard
