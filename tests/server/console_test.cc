// The console's JSON API and pages over real HTTP: a coordinator's server and its console in this
// process, called with libcurl as `curl` would.

#include <curl/curl.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/rpc/credentials.h"
#include "gmock/gmock.h"
#include "google/protobuf/descriptor.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "server/api/coordinator_server.h"
#include "server/console/console_server.h"
#include "server/console/json_gateway.h"
#include "server/searches/search_manager.h"
#include "server/store/sqlite_job_store.h"
#include "tests/server/test_util.h"

namespace trainyard {
namespace {

using ::testing::HasSubstr;

struct Answer {
  long status = 0;
  std::map<std::string, std::string> headers;  // names in lower case
  std::string body;
  nlohmann::json Json() const { return nlohmann::json::parse(body, nullptr, false); }
};

size_t Collect(char* data, size_t size, size_t n, void* out) {
  static_cast<std::string*>(out)->append(data, size * n);
  return size * n;
}

size_t CollectHeader(char* data, size_t size, size_t n, void* out) {
  const std::string line(data, size * n);
  const size_t colon = line.find(':');
  if (colon != std::string::npos) {
    (*static_cast<std::map<std::string, std::string>*>(
        out))[absl::AsciiStrToLower(line.substr(0, colon))] =
        std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
  }
  return size * n;
}

// One HTTP request; `method` GET or POST (POST sends `body`); `token` goes as a bearer token,
// or whole as the Authorization header when it names its scheme ("Basic ...").
Answer Http(const std::string& url, const std::string& method, const std::string& body = "",
            const std::string& token = "") {
  Answer answer;
  CURL* curl = curl_easy_init();
  curl_slist* headers = curl_slist_append(nullptr, "Content-Type: application/json");
  if (!token.empty()) {
    const std::string value = absl::StrContains(token, ' ') ? token : "Bearer " + token;
    headers = curl_slist_append(headers, ("Authorization: " + value).c_str());
  }
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT, 60L);
  if (method == "POST") {
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body.data());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, static_cast<long>(body.size()));
  }
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, Collect);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &answer.body);
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, CollectHeader);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, &answer.headers);
  const CURLcode rc = curl_easy_perform(curl);
  EXPECT_EQ(rc, CURLE_OK) << curl_easy_strerror(rc) << " for " << url;
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &answer.status);
  curl_slist_free_all(headers);
  curl_easy_cleanup(curl);
  return answer;
}

// Every call the API offers, and those it does not (a stream of requests).
std::vector<const google::protobuf::MethodDescriptor*> Methods(bool offered) {
  std::vector<const google::protobuf::MethodDescriptor*> out;
  for (const char* name : {"JobService", "SearchService", "AdminService"}) {
    const google::protobuf::ServiceDescriptor* service =
        google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
            absl::StrCat("trainyard.v1.", name));
    for (int i = 0; service != nullptr && i < service->method_count(); ++i) {
      if (service->method(i)->client_streaming() != offered) out.push_back(service->method(i));
    }
  }
  return out;
}

class ConsoleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = SqliteJobStore::Open(dir_.path() + "/state.db");
    ASSERT_TRUE(store.ok()) << store.status();
    auto token_store = SqliteJobStore::Open(dir_.path() + "/state.db");
    ASSERT_TRUE(token_store.ok());
    token_store_ = *std::move(token_store);
    auto auth = Authenticator::Create(*token_store_, RandomBytes(32), RealClock::Get());
    ASSERT_TRUE(auth.ok()) << auth.status();
    auth_ = *std::move(auth);
    JobManagerOptions options;
    options.checkpoint_root = "file:///ckpt";
    auto manager = JobManager::Create(RealClock::Get(), *std::move(store),
                                      std::make_unique<LogStore>(dir_.path() + "/logs"), options);
    ASSERT_TRUE(manager.ok()) << manager.status();
    manager_ = *std::move(manager);
    trial_jobs_ = TrialJobsOf(*manager_);
    auto search_store = SqliteJobStore::Open(dir_.path() + "/state.db");
    ASSERT_TRUE(search_store.ok());
    auto searches = SearchManager::Create(RealClock::Get(), *trial_jobs_, *std::move(search_store));
    ASSERT_TRUE(searches.ok()) << searches.status();
    searches_ = *std::move(searches);
    CoordinatorServerOptions server_options;
    server_options.searches = searches_.get();
    auto server = CoordinatorServer::Start(*manager_, *auth_, server_options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    ConsoleOptions console_options;
    console_options.listen = "127.0.0.1:0";
    console_options.max_body_bytes = 4096;
    auto console = ConsoleServer::Start(console_options);
    ASSERT_TRUE(console.ok()) << console.status();
    console_ = *std::move(console);
    console_->SetGateway(std::make_shared<JsonGateway>(server_->InProcessChannel()));
    url_ = console_->url();
    admin_ = Token("root", Role::kAdmin);
    alice_ = Token("alice", Role::kUser);
    bob_ = Token("bob", Role::kUser);
  }

  void TearDown() override {
    console_.reset();
    server_->Shutdown(absl::Seconds(2));
    server_.reset();
    searches_.reset();
  }

  std::string Token(const std::string& name, Role role) {
    auto made = auth_->CreateToken(name, role, absl::InfiniteDuration(), "test");
    EXPECT_TRUE(made.ok()) << made.status();
    return made.ok() ? made->first : "";
  }

  Answer Call(const std::string& method, const std::string& body, const std::string& token) {
    return Http(url_ + "api/v1/" + method, "POST", body, token);
  }

  std::string Submit(const std::string& name, const std::string& token) {
    const std::string yaml =
        absl::StrCat("name: ", name,
                     "\nmodel: {builtin: mlp, args: {inputs: 4, hidden: [8], classes: 2}}\n"
                     "data: {synthetic: {samples: 64, features: 4, classes: 2}}\nbatch_size: 16\n"
                     "max_steps: 10\n");
    Answer a = Call("JobService/SubmitJob", nlohmann::json{{"specYaml", yaml}}.dump(), token);
    EXPECT_EQ(a.status, 200) << a.body;
    return a.Json().value("id", "");
  }

  TempDir dir_;
  std::unique_ptr<JobStore> token_store_;
  std::unique_ptr<Authenticator> auth_;
  std::unique_ptr<JobManager> manager_;
  std::unique_ptr<TrialJobs> trial_jobs_;
  std::unique_ptr<SearchManager> searches_;
  std::unique_ptr<CoordinatorServer> server_;
  std::unique_ptr<ConsoleServer> console_;
  std::string url_, admin_, alice_, bob_;
};

TEST_F(ConsoleTest, EveryCallWithoutACredentialIsRefused401) {
  const auto methods = Methods(true);
  ASSERT_GE(methods.size(), 20u);
  for (const auto* m : methods) {
    const std::string name = absl::StrCat(m->service()->name(), "/", m->name());
    Answer a = Call(name, "{}", "");
    EXPECT_EQ(a.status, 401) << name << ": " << a.body;
    EXPECT_EQ(a.Json().value("code", ""), "UNAUTHENTICATED") << name;
    // A token that is not one is as good as none.
    EXPECT_EQ(Call(name, "{}", "not-a-token").status, 401) << name;
  }
  // Not a bearer credential at all: said so.
  Answer basic = Http(url_ + "api/v1/JobService/ListJobs", "POST", "{}", "Basic YWxpY2U6eA==");
  EXPECT_EQ(basic.status, 401);
  EXPECT_THAT(basic.Json().value("message", ""), HasSubstr("Bearer"));
}

// Found by fuzz_console_http (tests/fuzz/corpus/fuzz_console_http/bearer-not-ascii): a bearer
// with a byte outside printable ASCII went on to gRPC as metadata, and gRPC ended the coordinator.
// Newer cpp-httplib (Debian 13's) refuses such a header itself (400) before the gateway sees it;
// Debian 12's hands it on, and the gateway refuses it (401). The gateway is also asked directly.
TEST_F(ConsoleTest, ABearerThatIsNotPrintableAsciiIsRefusedAndTheCoordinatorLivesOn) {
  const std::vector<std::string> tokens = {"tyk_\xcb\x01x", "tyk_\x7f", alice_ + "\xe4"};
  for (const std::string& token : tokens) {
    Answer a = Call("JobService/ListJobs", "{}", token);
    if (a.status == 401) {
      EXPECT_THAT(a.Json().value("message", ""), HasSubstr("printable ASCII"));
    } else {
      EXPECT_EQ(a.status, 400) << a.body;
    }
  }
  auto gateway = std::make_shared<JsonGateway>(server_->InProcessChannel());
  absl::StatusOr<JsonMethod> list = JsonGateway::Find("JobService/ListJobs");
  ASSERT_TRUE(list.ok());
  for (const std::string& token : tokens) {
    absl::StatusOr<std::unique_ptr<JsonCall>> call = gateway->Start(*list, "{}", token);
    EXPECT_EQ(call.status().code(), absl::StatusCode::kUnauthenticated);
    EXPECT_THAT(std::string(call.status().message()), HasSubstr("printable ASCII"));
  }
  EXPECT_EQ(Call("JobService/ListJobs", "{}", alice_).status, 200);
}

TEST_F(ConsoleTest, AUsersTokenIsRefusedAdminCalls403AndPassesTheRest) {
  for (const auto* m : Methods(true)) {
    const std::string name = absl::StrCat(m->service()->name(), "/", m->name());
    if (m->name() == "RedeemConsoleLogin") continue;  // its code is its credential (below)
    Answer a = Call(name, "{}", alice_);
    if (m->service()->name() == "AdminService") {
      EXPECT_EQ(a.status, 403) << name << ": " << a.body;
      EXPECT_EQ(a.Json().value("code", ""), "PERMISSION_DENIED") << name;
    } else {
      EXPECT_NE(a.status, 401) << name;
      EXPECT_NE(a.status, 403) << name << ": " << a.body;
    }
    // An admin passes every gate (a call may still find nothing to act on).
    Answer b = Call(name, "{}", admin_);
    EXPECT_NE(b.status, 401) << name;
    EXPECT_NE(b.status, 403) << name << ": " << b.body;
    EXPECT_FALSE(absl::StrContains(b.body, "no call")) << name;
  }
}

TEST_F(ConsoleTest, ALoginLinkLogsInOnceAsItsPerson) {
  Answer login = Call("JobService/CreateConsoleLogin", "{}", alice_);
  ASSERT_EQ(login.status, 200) << login.body;
  const std::string code = login.Json().value("code", "");
  ASSERT_GE(code.size(), 32u);
  const std::string body = nlohmann::json{{"code", code}}.dump();
  Answer session = Call("JobService/RedeemConsoleLogin", body, "");
  ASSERT_EQ(session.status, 200) << session.body;
  EXPECT_EQ(session.Json().value("name", ""), "alice");
  EXPECT_FALSE(session.Json().value("admin", true));
  const std::string token = session.Json().value("token", "");
  EXPECT_NE(token, alice_);  // a token of hers that expires, not the one the link was made with
  EXPECT_FALSE(session.Json().value("expiresUnixMs", "0") == "0");
  Submit("hers", alice_);
  Answer listed = Call("JobService/ListJobs", "{}", token);
  ASSERT_EQ(listed.status, 200);
  EXPECT_EQ(listed.Json()["jobs"].size(), 1u);
  EXPECT_EQ(Call("AdminService/ListTokens", "{}", token).status, 403);
  // Once only.
  Answer again = Call("JobService/RedeemConsoleLogin", body, "");
  EXPECT_EQ(again.status, 401);
  EXPECT_THAT(again.Json().value("message", ""), HasSubstr("used already"));
  EXPECT_EQ(Call("JobService/RedeemConsoleLogin", R"({"code": "made-up"})", "").status, 401);
  // Only people ask for links.
  EXPECT_EQ(Call("JobService/CreateConsoleLogin", "{}", Token("w1", Role::kAgent)).status, 403);
  EXPECT_EQ(Call("JobService/CreateConsoleLogin", "{}", "").status, 401);
}

TEST_F(ConsoleTest, BadBodiesAre400NamingTheField) {
  Answer a = Call("JobService/ListJobs", R"({"pageSize": "many"})", admin_);
  EXPECT_EQ(a.status, 400);
  EXPECT_EQ(a.Json().value("code", ""), "INVALID_ARGUMENT");
  EXPECT_THAT(a.Json().value("message", ""), HasSubstr("page_size"));
  a = Call("JobService/ListJobs", R"({"pageSise": 5})", admin_);
  EXPECT_EQ(a.status, 400);
  EXPECT_THAT(a.Json().value("message", ""), HasSubstr("pageSise"));
  a = Call("JobService/ListJobs", "not json", admin_);
  EXPECT_EQ(a.status, 400);
  EXPECT_THAT(a.Json().value("message", ""), HasSubstr("ListJobsRequest"));
  // What the coordinator refuses in a well-formed body comes back as it says it.
  a = Call("JobService/ListJobs", R"({"pageSize": -1})", admin_);
  EXPECT_EQ(a.status, 400);
  EXPECT_THAT(a.Json().value("message", ""), HasSubstr("page_size"));
  a = Call("JobService/SubmitJob", R"({"specYaml": "name: x\nmax_steps: -3\n"})", admin_);
  EXPECT_EQ(a.status, 400) << a.body;
}

TEST_F(ConsoleTest, ABodyOverTheLimitIs413) {
  const std::string big = absl::StrCat(R"({"reason": ")", std::string(5000, 'x'), R"("})");
  Answer a = Call("JobService/CancelJob", big, admin_);
  EXPECT_EQ(a.status, 413);
  EXPECT_EQ(a.Json().value("code", ""), "RESOURCE_EXHAUSTED");
  // Just under it is read (and answered for what it says).
  const std::string fits = absl::StrCat(R"({"id": "nope-1")", std::string(4000, ' '), "}");
  EXPECT_EQ(Call("JobService/CancelJob", fits, admin_).status, 404);
}

TEST_F(ConsoleTest, UnknownPathsAre404AndTheApiTakesPostOnly) {
  for (const std::string path :
       {"api/v1/Nope/Call", "api/v1/JobService/Nope", "api/v1/AgentService/Sync",
        "api/v1/ParameterServer/Push", "api/v1/JobService", "api/v1/"}) {
    Answer a = Http(url_ + path, "POST", "{}", admin_);
    EXPECT_EQ(a.status, 404) << path;
    EXPECT_EQ(a.Json().value("code", ""), "NOT_FOUND") << path;
  }
  for (const auto* m : Methods(false)) {  // a stream of requests: gRPC only
    Answer a = Call(absl::StrCat(m->service()->name(), "/", m->name()), "{}", admin_);
    EXPECT_EQ(a.status, 404) << m->full_name();
  }
  EXPECT_EQ(Http(url_ + "nope.html", "GET").status, 404);
  EXPECT_EQ(Http(url_ + "static/nope.js", "GET").status, 404);
  Answer get = Http(url_ + "api/v1/JobService/ListJobs", "GET", "", admin_);
  EXPECT_EQ(get.status, 405);
  EXPECT_EQ(get.headers["allow"], "POST");
}

TEST_F(ConsoleTest, EveryAnswerForbidsInlineScriptFramesAndSniffing) {
  std::vector<Answer> answers = {Http(url_, "GET"),
                                 Http(url_ + "static/console.js", "GET"),
                                 Http(url_ + "static/uPlot.iife.min.js", "GET"),
                                 Http(url_ + "nope", "GET"),
                                 Call("JobService/ListJobs", "{}", ""),
                                 Call("JobService/ListJobs", "{}", admin_)};
  for (const Answer& a : answers) {
    const std::string csp =
        a.headers.count("content-security-policy") ? a.headers.at("content-security-policy") : "";
    EXPECT_THAT(csp, HasSubstr("script-src 'self'"));
    EXPECT_FALSE(absl::StrContains(csp, "unsafe-inline"));
    EXPECT_THAT(csp, HasSubstr("frame-ancestors 'none'"));
    EXPECT_EQ(a.headers.count("access-control-allow-origin"), 0u);
    EXPECT_EQ(a.headers.count("set-cookie"), 0u);
    EXPECT_EQ(
        a.headers.count("x-content-type-options") ? a.headers.at("x-content-type-options") : "",
        "nosniff");
  }
  EXPECT_EQ(answers[0].status, 200);
  EXPECT_THAT(answers[0].headers["content-type"], HasSubstr("text/html"));
  EXPECT_THAT(answers[0].body, HasSubstr("/static/console.js"));
  EXPECT_FALSE(absl::StrContains(answers[0].body, "<script>"));  // no inline script
  // A page comes again from the browser's cache when unchanged.
  EXPECT_FALSE(answers[1].headers["etag"].empty());
}

TEST_F(ConsoleTest, AUserSeesOnlyTheirOwnJobs) {
  const std::string mine = Submit("alices", alice_);
  const std::string theirs = Submit("bobs", bob_);
  ASSERT_FALSE(mine.empty());
  auto listed = [&](const std::string& token, const std::string& body) {
    std::vector<std::string> ids;
    const nlohmann::json list = Call("JobService/ListJobs", body, token).Json();
    for (const auto& job : list["jobs"]) ids.push_back(job.value("id", ""));
    return ids;
  };
  EXPECT_EQ(listed(alice_, "{}"), std::vector<std::string>{mine});
  // A user's owner filter cannot widen what they see.
  EXPECT_EQ(listed(alice_, R"({"owner": "bob"})"), std::vector<std::string>{mine});
  EXPECT_EQ(listed(admin_, R"({"owner": "bob"})"), std::vector<std::string>{theirs});
  EXPECT_EQ(listed(admin_, R"({"nameContains": "ALICE"})"), std::vector<std::string>{mine});
  EXPECT_EQ(listed(admin_, R"({"queue": "default"})").size(), 2u);
  EXPECT_TRUE(listed(admin_, R"({"queue": "gpu"})").empty());
  for (const char* method : {"GetJob", "CancelJob", "GetJobMetrics", "WatchJob", "GetJobLogs"}) {
    Answer a =
        Call(absl::StrCat("JobService/", method), absl::StrCat(R"({"id": ")", mine, "\"}"), bob_);
    EXPECT_EQ(a.status, 403) << method << ": " << a.body;
  }
  Answer got = Call("JobService/GetJob", absl::StrCat(R"({"id": ")", mine, "\"}"), alice_);
  EXPECT_EQ(got.status, 200);
  EXPECT_EQ(got.Json().value("owner", ""), "alice");
  // 64-bit numbers come as strings (protobuf's JSON mapping), every field present.
  EXPECT_TRUE(got.Json()["createdUnixMs"].is_string());
  EXPECT_TRUE(got.Json().contains("committedStep"));
}

TEST_F(ConsoleTest, AStreamIsOneJsonLineAMessage) {
  const std::string id = Submit("watched", alice_);
  ASSERT_TRUE(manager_->CancelJob(id, "stop", "alice").ok());
  Answer a = Call("JobService/WatchJob", absl::StrCat(R"({"id": ")", id, "\"}"), alice_);
  EXPECT_EQ(a.status, 200);
  EXPECT_THAT(a.headers["content-type"], HasSubstr("application/x-ndjson"));
  const std::vector<std::string> lines = absl::StrSplit(a.body, '\n', absl::SkipEmpty());
  ASSERT_GE(lines.size(), 1u);
  EXPECT_EQ(nlohmann::json::parse(lines.back())["job"].value("state", ""), "CANCELLED");
}

TEST_F(ConsoleTest, MetricHistoryOfAJobIsServed) {
  const std::string id = Submit("curve", alice_);
  Answer a = Call("JobService/GetJobMetrics", absl::StrCat(R"({"id": ")", id, "\"}"), alice_);
  EXPECT_EQ(a.status, 200) << a.body;
  EXPECT_TRUE(a.Json()["points"].empty());
  EXPECT_EQ(Call("JobService/GetJobMetrics", R"({"id": "nope-1"})", admin_).status, 404);
}

TEST_F(ConsoleTest, AStandbyAnswers503NamingTheLeader) {
  console_->SetGateway(nullptr);
  console_->SetLeader("10.0.0.7:7070");
  Answer a = Call("JobService/ListJobs", "{}", admin_);
  EXPECT_EQ(a.status, 503);
  EXPECT_EQ(a.Json().value("code", ""), "UNAVAILABLE");
  EXPECT_THAT(a.Json().value("message", ""), HasSubstr("10.0.0.7:7070"));
  EXPECT_EQ(Http(url_ + "healthz", "GET").status, 503);
  // The pages still load: they show what the API says.
  EXPECT_EQ(Http(url_, "GET").status, 200);
  console_->SetGateway(std::make_shared<JsonGateway>(server_->InProcessChannel()));
  EXPECT_EQ(Http(url_ + "healthz", "GET").status, 200);
}

// The coordinator waits for the console's calls, streams included, before its server goes.
TEST_F(ConsoleTest, TheGatewayKnowsWhenItsCallsAreOver) {
  const std::string id = Submit("watched", alice_);
  auto gateway = std::make_shared<JsonGateway>(server_->InProcessChannel());
  absl::StatusOr<JsonMethod> watch = JsonGateway::Find("JobService/WatchJob");
  ASSERT_TRUE(watch.ok());
  absl::StatusOr<std::unique_ptr<JsonCall>> call =
      gateway->Start(*watch, absl::StrCat(R"({"id": ")", id, "\"}"), alice_);
  ASSERT_TRUE(call.ok()) << call.status();
  std::string first;
  ASSERT_EQ((*call)->Read(&first, absl::Seconds(30)), JsonCall::Next::kMessage);
  EXPECT_FALSE(gateway->WaitForCalls(absl::ZeroDuration()));  // the job is pending: it goes on
  call->reset();  // the client left: cancelled and ended
  EXPECT_TRUE(gateway->WaitForCalls(absl::ZeroDuration()));
}

TEST(ConsoleTlsTest, ServesHttpsWithTheCertificateAndRefusesAMismatchedKey) {
  TempDir dir;
  const std::string make =
      absl::StrCat("cd ", dir.path(),
                   " && openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=localhost "
                   "-addext subjectAltName=DNS:localhost,IP:127.0.0.1 -keyout key.pem -out "
                   "cert.pem 2>/dev/null && openssl req -x509 -newkey rsa:2048 -nodes -days 2 "
                   "-subj /CN=other -keyout other.pem -out other-cert.pem 2>/dev/null");
  ASSERT_EQ(std::system(make.c_str()), 0);
  ConsoleOptions options;
  options.listen = "127.0.0.1:0";
  options.tls_cert_file = dir.path() + "/cert.pem";
  options.tls_key_file = dir.path() + "/key.pem";
  auto console = ConsoleServer::Start(options);
  ASSERT_TRUE(console.ok()) << console.status();
  ASSERT_TRUE(absl::StartsWith((*console)->url(), "https://"));
  CURL* curl = curl_easy_init();
  std::string body;
  curl_easy_setopt(curl, CURLOPT_URL, (*console)->url().c_str());
  curl_easy_setopt(curl, CURLOPT_CAINFO, options.tls_cert_file.c_str());
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, Collect);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &body);
  EXPECT_EQ(curl_easy_perform(curl), CURLE_OK);
  long status = 0;
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
  EXPECT_EQ(status, 200);
  curl_easy_cleanup(curl);
  // Plain HTTP to the TLS port gets no page.
  CURL* plain = curl_easy_init();
  const std::string http_url = "http://" + (*console)->url().substr(8);
  std::string plain_body;
  curl_easy_setopt(plain, CURLOPT_URL, http_url.c_str());
  curl_easy_setopt(plain, CURLOPT_WRITEFUNCTION, Collect);
  curl_easy_setopt(plain, CURLOPT_WRITEDATA, &plain_body);
  curl_easy_setopt(plain, CURLOPT_TIMEOUT, 10L);
  curl_easy_perform(plain);
  EXPECT_FALSE(absl::StrContains(plain_body, "console.js"));
  curl_easy_cleanup(plain);
  // A key that is not the certificate's: the console does not start.
  options.tls_key_file = dir.path() + "/other.pem";
  EXPECT_FALSE(ConsoleServer::Start(options).ok());
}

}  // namespace
}  // namespace trainyard
