// SigV4 against botocore's S3 signer (the reference implementation), and the credential chain.

// Request tables and scripted answers list only the fields that matter to each case.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

#include "common/storage/s3_auth.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "common/sha256.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainyard {
namespace {

using ::testing::HasSubstr;

struct Case {
  std::string name;
  std::string method;
  std::string scheme_host;
  std::string bucket;
  std::string key;
  bool virtual_hosted = false;
  std::vector<std::pair<std::string, std::string>> params;
  std::map<std::string, std::string> headers;
  std::string body;
  std::string token;
  std::string region = "us-east-1";
};

std::string SourceDir() {
  const char* dir = getenv("TRAINYARD_SOURCE_DIR");
  return dir != nullptr ? dir : TRAINYARD_SOURCE_DIR_FALLBACK;
}

std::string RunWithInput(const std::string& command, const std::string& input) {
  char path[] = "/tmp/sigv4-input-XXXXXX";
  const int fd = mkstemp(path);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(write(fd, input.data(), input.size()), static_cast<ssize_t>(input.size()));
  close(fd);
  FILE* pipe = popen(absl::StrCat(command, " < ", path).c_str(), "r");
  std::string out;
  char buffer[4096];
  size_t n;
  while (pipe != nullptr && (n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) {
    out.append(buffer, n);
  }
  if (pipe != nullptr) pclose(pipe);
  unlink(path);
  return out;
}

TEST(SigV4Test, MatchesBotocoreForATableOfRequests) {
  const std::string payload_md5_like = "hello, world\n";
  std::vector<Case> cases = {
      {"get", "GET", "http://127.0.0.1:4568", "bucket", "models/net.pt"},
      {"get-virtual", "GET", "https://s3.eu-west-1.amazonaws.com", "my-bucket", "a/b.bin", true},
      {"put",
       "PUT",
       "http://127.0.0.1:4568",
       "bucket",
       "ckpt/step-000000000010/model.safetensors",
       false,
       {},
       {},
       "some tensor bytes"},
      {"list",
       "GET",
       "http://127.0.0.1:9000",
       "bucket",
       "",
       false,
       {{"list-type", "2"}, {"prefix", "ckpt/job 1/"}, {"continuation-token", "a+b/c=="}}},
      {"space", "GET", "http://localhost:4568", "bucket", "data/train set 01.safetensors"},
      {"unicode",
       "PUT",
       "http://127.0.0.1:4568",
       "bucket",
       "données/Ünïcode-模型.bin",
       false,
       {},
       {},
       "x"},
      {"plus", "GET", "http://127.0.0.1:4568", "bucket", "a+b/c+d=e&f.bin"},
      {"reserved", "DELETE", "http://127.0.0.1:4568", "bucket", "we!rd'(key)*;:@$,?#[]%.txt"},
      {"tilde-dots", "GET", "http://127.0.0.1:4568", "bucket", "~user/./x/../y"},
      {"range",
       "GET",
       "http://127.0.0.1:4568",
       "bucket",
       "big.bin",
       false,
       {},
       {{"Range", "bytes=100-199"}}},
      {"session-token",
       "GET",
       "https://s3.us-west-2.amazonaws.com",
       "tok-bucket",
       "k",
       true,
       {},
       {},
       "",
       "FwoGZXIvYXdzEJr//////////wEaDH+token/with=specials",
       "us-west-2"},
      {"multipart-create",
       "POST",
       "http://127.0.0.1:4568",
       "bucket",
       "big.bin",
       false,
       {{"uploads", ""}}},
      {"upload-part",
       "PUT",
       "http://127.0.0.1:4568",
       "bucket",
       "big.bin",
       false,
       {{"partNumber", "3"}, {"uploadId", "abc/def+ghi=="}},
       {},
       payload_md5_like},
      {"complete",
       "POST",
       "http://127.0.0.1:4568",
       "bucket",
       "big.bin",
       false,
       {{"uploadId", "abc"}},
       {{"Content-Type", "application/xml"}},
       "<CompleteMultipartUpload></CompleteMultipartUpload>"},
  };
  const absl::Time now = absl::FromUnixSeconds(1767323045);  // 2026-01-02T03:04:05Z
  nlohmann::json input = nlohmann::json::array();
  std::vector<SigV4Result> ours;
  for (const Case& c : cases) {
    AwsCredentials credentials{"AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", c.token,
                               "test"};
    const std::string host_port = c.scheme_host.substr(c.scheme_host.find("://") + 3);
    SigV4Request request;
    request.method = c.method;
    if (c.virtual_hosted) {
      request.canonical_uri = "/" + AwsUriEncode(c.key, true);
      request.headers["host"] = absl::StrCat(c.bucket, ".", host_port);
    } else {
      request.canonical_uri =
          "/" + c.bucket + (c.key.empty() ? "" : "/" + AwsUriEncode(c.key, true));
      // botocore leaves the default port out of Host, as curl does.
      request.headers["host"] = host_port;
    }
    request.query = c.params;
    for (const auto& [k, v] : c.headers) request.headers[k] = v;
    request.payload_sha256 = Sha256Hex(c.body);
    ours.push_back(SignV4(request, credentials, c.region, "s3", now));
    nlohmann::json params = nlohmann::json::array();
    for (const auto& [k, v] : c.params) params.push_back({k, v});
    input.push_back({{"method", c.method},
                     {"scheme_host", c.scheme_host},
                     {"bucket", c.bucket},
                     {"key", c.key},
                     {"virtual", c.virtual_hosted},
                     {"params", params},
                     {"headers", c.headers},
                     {"body", c.body},
                     {"access_key", credentials.access_key_id},
                     {"secret_key", credentials.secret_access_key},
                     {"token", c.token},
                     {"region", c.region},
                     {"time", "20260102T030405Z"}});
  }
  const std::string output = RunWithInput(
      absl::StrCat("/usr/bin/python3 ", SourceDir(), "/tests/common/s3_sigv4_reference.py"),
      input.dump());
  nlohmann::json reference = nlohmann::json::parse(output, nullptr, false);
  ASSERT_TRUE(reference.is_array()) << "botocore reference failed: " << output;
  ASSERT_EQ(reference.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(ours[i].headers.at("authorization"), reference[i]["authorization"].get<std::string>())
        << "case " << cases[i].name << "\nours:\n"
        << ours[i].canonical_request << "\nbotocore:\n"
        << reference[i]["canonical_request"].get<std::string>();
  }
  // The session token is sent and signed.
  EXPECT_EQ(ours[10].headers.at("x-amz-security-token"), cases[10].token);
  EXPECT_THAT(ours[10].headers.at("authorization"), HasSubstr("x-amz-security-token"));
}

TEST(SigV4Test, UriEncoding) {
  EXPECT_EQ(AwsUriEncode("a b+c/d~e_f.g-h", true), "a%20b%2Bc/d~e_f.g-h");
  EXPECT_EQ(AwsUriEncode("a b+c/d", false), "a%20b%2Bc%2Fd");
  EXPECT_EQ(AwsUriEncode("é", false), "%C3%A9");
  EXPECT_EQ(CanonicalQueryString({{"prefix", "a b"}, {"list-type", "2"}, {"uploads", ""}}),
            "list-type=2&prefix=a%20b&uploads=");
}

std::map<std::string, std::string>* g_env = nullptr;
const char* FakeEnv(const char* name) {
  auto it = g_env->find(name);
  return it == g_env->end() ? nullptr : it->second.c_str();
}

TEST(AwsCredentialsTest, EnvironmentWins) {
  std::map<std::string, std::string> env = {{"AWS_ACCESS_KEY_ID", "AK"},
                                            {"AWS_SECRET_ACCESS_KEY", "SK"},
                                            {"AWS_SESSION_TOKEN", "TOK"},
                                            {"HOME", "/nonexistent"}};
  g_env = &env;
  absl::StatusOr<AwsCredentials> c = LoadAwsCredentials(FakeEnv);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->access_key_id, "AK");
  EXPECT_EQ(c->secret_access_key, "SK");
  EXPECT_EQ(c->session_token, "TOK");
}

TEST(AwsCredentialsTest, ProfilesFromTheSharedFile) {
  char path[] = "/tmp/aws-credentials-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  std::ofstream(path) << "[default]\naws_access_key_id = DEF\naws_secret_access_key = DEFSECRET\n"
                         "\n# a comment\n[team]\naws_access_key_id=TEAM\n"
                         "aws_secret_access_key = TEAMSECRET\naws_session_token = TEAMTOKEN\n"
                         "[half]\naws_access_key_id = X\n";
  std::map<std::string, std::string> env = {{"AWS_SHARED_CREDENTIALS_FILE", path}};
  g_env = &env;
  absl::StatusOr<AwsCredentials> c = LoadAwsCredentials(FakeEnv);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->access_key_id, "DEF");
  EXPECT_EQ(c->session_token, "");

  env["AWS_PROFILE"] = "team";
  c = LoadAwsCredentials(FakeEnv);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->access_key_id, "TEAM");
  EXPECT_EQ(c->secret_access_key, "TEAMSECRET");
  EXPECT_EQ(c->session_token, "TEAMTOKEN");

  env["AWS_PROFILE"] = "half";
  EXPECT_EQ(LoadAwsCredentials(FakeEnv).status().code(), absl::StatusCode::kInvalidArgument);
  env["AWS_PROFILE"] = "missing";
  EXPECT_EQ(LoadAwsCredentials(FakeEnv).status().code(), absl::StatusCode::kInvalidArgument);
  env = {{"HOME", "/nonexistent"}};
  absl::Status none = LoadAwsCredentials(FakeEnv).status();
  EXPECT_EQ(none.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(none.message(), HasSubstr("AWS_ACCESS_KEY_ID"));
  unlink(path);
}

}  // namespace
}  // namespace trainyard
