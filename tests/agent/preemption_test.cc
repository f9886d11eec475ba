#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/fake_clock.h"
#include "tests/common/scratch_files.h"
#include "worker/agent/drain_watcher.h"
#include "worker/agent/notice_poller.h"
#include "worker/agent/preemption_notice.h"
#include "worker/agent/preemption_watcher.h"

namespace trainyard {
namespace {

using ::testing::HasSubstr;

constexpr absl::Duration kGrace = absl::Seconds(25);
const absl::Time kNow = absl::FromUnixSeconds(1'700'000'000);

std::string Rfc3339(absl::Time t) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", t, absl::UTCTimeZone());
}

// ---- the answer parser ----

TEST(ParsePreemptionAnswerTest, GceFalseIsNoNoticeAndTrueIsANoticeForTheGracePeriod) {
  absl::StatusOr<std::optional<PreemptionNotice>> answer =
      ParsePreemptionAnswer(200, "FALSE", kNow, kGrace);
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_FALSE(answer->has_value());

  answer = ParsePreemptionAnswer(200, "TRUE\n", kNow, kGrace);
  ASSERT_TRUE(answer.ok()) << answer.status();
  ASSERT_TRUE(answer->has_value());
  EXPECT_EQ((*answer)->source, "gce");
  EXPECT_EQ((*answer)->deadline, kNow + kGrace);
  EXPECT_FALSE((*answer)->message.empty());
}

TEST(ParsePreemptionAnswerTest, Aws404IsNoNotice) {
  absl::StatusOr<std::optional<PreemptionNotice>> answer =
      ParsePreemptionAnswer(404, "<html>Not Found</html>", kNow, kGrace);
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_FALSE(answer->has_value());
}

TEST(ParsePreemptionAnswerTest, AwsActionDeadlineIsItsTimeOrTheGracePeriodWhicheverIsFirst) {
  const std::string soon = Rfc3339(kNow + absl::Seconds(10));
  absl::StatusOr<std::optional<PreemptionNotice>> answer = ParsePreemptionAnswer(
      200, absl::StrCat(R"({"action": "terminate", "time": ")", soon, R"("})"), kNow, kGrace);
  ASSERT_TRUE(answer.ok()) << answer.status();
  ASSERT_TRUE(answer->has_value());
  EXPECT_EQ((*answer)->source, "aws");
  EXPECT_EQ((*answer)->deadline, kNow + absl::Seconds(10));
  EXPECT_THAT((*answer)->message, HasSubstr("terminate at " + soon));

  // AWS gives two minutes; the grace period is what the agent has.
  answer = ParsePreemptionAnswer(
      200, absl::StrCat(R"({"action":"stop","time":")", Rfc3339(kNow + absl::Minutes(2)), R"("})"),
      kNow, kGrace);
  ASSERT_TRUE(answer.ok()) << answer.status();
  ASSERT_TRUE(answer->has_value());
  EXPECT_EQ((*answer)->deadline, kNow + kGrace);

  // A notice whose time cannot be read is still a notice.
  answer = ParsePreemptionAnswer(200, R"({"action": "hibernate", "time": "soon"})", kNow, kGrace);
  ASSERT_TRUE(answer.ok()) << answer.status();
  ASSERT_TRUE(answer->has_value());
  EXPECT_EQ((*answer)->deadline, kNow + kGrace);
}

TEST(ParsePreemptionAnswerTest, MalformedAnswersAreErrors) {
  for (const char* body :
       {"", "maybe", "{\"action\": ", R"({"time": "2023-11-14T22:13:30Z"})",
        R"({"action": "reboot", "time": "2023-11-14T22:13:30Z"})", "[1, 2]", R"({"action": 3})"}) {
    absl::StatusOr<std::optional<PreemptionNotice>> answer =
        ParsePreemptionAnswer(200, body, kNow, kGrace);
    EXPECT_EQ(answer.status().code(), absl::StatusCode::kInvalidArgument) << body;
  }
  EXPECT_EQ(ParsePreemptionAnswer(500, "oops", kNow, kGrace).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(ParsePreemptionAnswer(401, "", kNow, kGrace).status().code(),
            absl::StatusCode::kUnavailable);
}

// ---- the watcher, against a real HTTP server on loopback ----

struct HttpRequest {
  std::string method;
  std::string path;
  std::vector<std::string> headers;  // "name: value", names lowercased

  bool Has(absl::string_view header) const {
    for (const std::string& h : headers) {
      if (h == absl::AsciiStrToLower(header)) return true;
    }
    return false;
  }
};

struct HttpReply {
  int status = 200;
  std::string body;
};

// A one-connection-at-a-time HTTP/1.1 server on 127.0.0.1 with a port from the kernel. Each
// request gets the handler's reply and the connection is closed. A handler that returns nullopt
// never answers (the connection is held until the server stops).
class TinyHttpServer {
 public:
  using Handler = std::function<std::optional<HttpReply>(const HttpRequest&, int index)>;

  explicit TinyHttpServer(Handler handler) : handler_(std::move(handler)) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr = {};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(listen(fd_, 16), 0);
    socklen_t len = sizeof(addr);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { Serve(); });
  }
  ~TinyHttpServer() {
    stop_ = true;
    thread_.join();
    close(fd_);
  }

  std::string Url(absl::string_view path) const {
    return absl::StrCat("http://127.0.0.1:", port_, path);
  }
  std::vector<HttpRequest> requests() const {
    absl::MutexLock lock(&mu_);
    return requests_;
  }
  // Waits (polling, up to `timeout`) until at least `n` requests have come in.
  bool AwaitRequests(size_t n, absl::Duration timeout) const {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return requests_.size() >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
  }

 private:
  // Waits up to 50 ms for `fd` to be readable; false when stopping.
  bool Readable(int fd) {
    while (!stop_) {
      pollfd p = {fd, POLLIN, 0};
      if (poll(&p, 1, 50) > 0) return true;
    }
    return false;
  }

  void Serve() {
    while (Readable(fd_)) {
      const int conn = accept(fd_, nullptr, nullptr);
      if (conn < 0) continue;
      std::string data;
      char buffer[4096];
      while (data.find("\r\n\r\n") == std::string::npos && Readable(conn)) {
        const ssize_t n = read(conn, buffer, sizeof(buffer));
        if (n <= 0) break;
        data.append(buffer, static_cast<size_t>(n));
      }
      const size_t end = data.find("\r\n\r\n");
      if (end == std::string::npos) {
        close(conn);
        continue;
      }
      std::vector<std::string> lines = absl::StrSplit(data.substr(0, end), "\r\n");
      HttpRequest request;
      std::vector<std::string> first = absl::StrSplit(lines[0], ' ');
      request.method = first[0];
      request.path = first.size() > 1 ? first[1] : "";
      for (size_t i = 1; i < lines.size(); ++i) {
        request.headers.push_back(absl::AsciiStrToLower(lines[i]));
      }
      int index;
      {
        absl::MutexLock lock(&mu_);
        index = static_cast<int>(requests_.size());
        requests_.push_back(request);
      }
      std::optional<HttpReply> reply = handler_(request, index);
      if (!reply.has_value()) {
        while (!stop_) Readable(conn);  // hold it unanswered
        close(conn);
        continue;
      }
      const std::string response =
          absl::StrCat("HTTP/1.1 ", reply->status, " X\r\nContent-Length: ", reply->body.size(),
                       "\r\nConnection: close\r\n\r\n", reply->body);
      (void)!write(conn, response.data(), response.size());
      close(conn);
    }
  }

  const Handler handler_;
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  mutable absl::Mutex mu_;
  std::vector<HttpRequest> requests_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

// Collects the notices a watcher hands out.
class Notices {
 public:
  std::function<void(const PreemptionNotice&)> Callback() {
    return [this](const PreemptionNotice& notice) {
      absl::MutexLock lock(&mu_);
      notices_.push_back(notice);
    };
  }
  bool Await(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto any = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !notices_.empty(); };
    return mu_.AwaitWithTimeout(absl::Condition(&any), timeout);
  }
  std::vector<PreemptionNotice> all() {
    absl::MutexLock lock(&mu_);
    return notices_;
  }

 private:
  absl::Mutex mu_;
  std::vector<PreemptionNotice> notices_ ABSL_GUARDED_BY(mu_);
};

PreemptionWatcherOptions Options(const std::string& url) {
  PreemptionWatcherOptions options;
  options.url = url;
  options.poll_interval = absl::Milliseconds(10);
  options.request_timeout = absl::Seconds(5);
  options.grace_period = kGrace;
  return options;
}

TEST(PreemptionWatcherTest, GceAnswerFiresOnceWithTheGracePeriodAsDeadline) {
  constexpr char kPath[] = "/computeMetadata/v1/instance/preempted";
  TinyHttpServer server([](const HttpRequest&, int index) {
    // An error on the way is ignored; then not preempted twice; then preempted for good.
    if (index == 0) return HttpReply{503, "busy"};
    return index < 3 ? HttpReply{200, "FALSE"} : HttpReply{200, "TRUE"};
  });
  FakeClock clock;
  Notices notices;
  {
    PreemptionWatcher watcher(Options(server.Url(kPath)), clock);
    ::testing::internal::CaptureStderr();
    watcher.Start(notices.Callback());
    ASSERT_TRUE(notices.Await(absl::Seconds(30)));
  }  // joins the thread: nothing more can come
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_EQ(notices.all().size(), 1u);
  EXPECT_EQ(notices.all()[0].source, "gce");
  EXPECT_EQ(notices.all()[0].deadline, clock.Now() + kGrace);
  // It stops polling at the notice.
  const std::vector<HttpRequest> requests = server.requests();
  ASSERT_EQ(requests.size(), 4u);
  for (const HttpRequest& request : requests) {
    EXPECT_EQ(request.method, "GET");
    EXPECT_EQ(request.path, kPath);
    EXPECT_TRUE(request.Has("Metadata-Flavor: Google"));
  }
  EXPECT_THAT(log, HasSubstr("HTTP 503"));
}

TEST(PreemptionWatcherTest, AwsAnswerFiresOnceWithTheNoticeTimeAsDeadline) {
  constexpr char kPath[] = "/latest/meta-data/spot/instance-action";
  FakeClock clock;
  const absl::Time at = clock.Now() + absl::Seconds(12);
  TinyHttpServer server([at](const HttpRequest&, int index) {
    if (index < 2) return HttpReply{404, "Not Found"};
    return HttpReply{200,
                     absl::StrCat(R"({"action": "terminate", "time": ")", Rfc3339(at), R"("})")};
  });
  Notices notices;
  {
    PreemptionWatcher watcher(Options(server.Url(kPath)), clock);
    watcher.Start(notices.Callback());
    ASSERT_TRUE(notices.Await(absl::Seconds(30)));
  }
  ASSERT_EQ(notices.all().size(), 1u);
  EXPECT_EQ(notices.all()[0].source, "aws");
  EXPECT_EQ(notices.all()[0].deadline, at);
  EXPECT_THAT(notices.all()[0].message, HasSubstr("terminate"));
  EXPECT_EQ(server.requests().size(), 3u);
}

TEST(PreemptionWatcherTest, FailuresAreLoggedOnceAndPollingGoesOn) {
  TinyHttpServer server([](const HttpRequest&, int index) {
    return index < 6 ? HttpReply{500, "broken"} : HttpReply{200, "TRUE"};
  });
  FakeClock clock;
  Notices notices;
  ::testing::internal::CaptureStderr();
  {
    PreemptionWatcher watcher(Options(server.Url("/preempted")), clock);
    watcher.Start(notices.Callback());
    ASSERT_TRUE(notices.Await(absl::Seconds(30)));
  }
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(notices.all().size(), 1u);
  std::vector<absl::string_view> warnings = absl::StrSplit(log, "cannot read preemption notices");
  EXPECT_EQ(warnings.size(), 2u) << log;  // one warning for six failures
}

TEST(PreemptionWatcherTest, UsesAnImdsV2TokenWhenTheEndpointRequiresOne) {
  constexpr char kPath[] = "/latest/meta-data/spot/instance-action";
  TinyHttpServer server([](const HttpRequest& request, int) -> std::optional<HttpReply> {
    if (request.method == "PUT") {
      if (request.path != "/latest/api/token" ||
          !request.Has("X-aws-ec2-metadata-token-ttl-seconds: 21600")) {
        return HttpReply{400, "bad token request"};
      }
      return HttpReply{200, "secret-token"};
    }
    if (!request.Has("X-aws-ec2-metadata-token: secret-token")) return HttpReply{401, ""};
    return HttpReply{404, ""};
  });
  FakeClock clock;
  PreemptionWatcher watcher(Options(server.Url(kPath)), clock);
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<std::optional<PreemptionNotice>> polled = watcher.PollOnce();
    ASSERT_TRUE(polled.ok()) << polled.status();
    EXPECT_FALSE(polled->has_value());
  }
  // GET refused, PUT for the token, GET with it; then the token is kept.
  const std::vector<HttpRequest> requests = server.requests();
  ASSERT_EQ(requests.size(), 4u);
  EXPECT_EQ(requests[0].method, "GET");
  EXPECT_EQ(requests[1].method, "PUT");
  EXPECT_EQ(requests[2].method, "GET");
  EXPECT_EQ(requests[3].method, "GET");
  EXPECT_TRUE(requests[3].Has("X-aws-ec2-metadata-token: secret-token"));
}

TEST(PreemptionWatcherTest, TokenRefusedFallsBackToThePlainAnswer) {
  TinyHttpServer server([](const HttpRequest& request, int) {
    return request.method == "PUT" ? HttpReply{403, "no tokens here"} : HttpReply{401, ""};
  });
  FakeClock clock;
  PreemptionWatcher watcher(Options(server.Url("/latest/meta-data/spot/instance-action")), clock);
  absl::StatusOr<std::optional<PreemptionNotice>> polled = watcher.PollOnce();
  EXPECT_EQ(polled.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(polled.status().message(), HasSubstr("HTTP 401"));
}

TEST(PreemptionWatcherTest, UnreachableEndpointIsUnavailable) {
  // A port nobody listens on: bound, then closed.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  FakeClock clock;
  PreemptionWatcher watcher(
      Options(absl::StrCat("http://127.0.0.1:", ntohs(addr.sin_port), "/preempted")), clock);
  EXPECT_EQ(watcher.PollOnce().status().code(), absl::StatusCode::kUnavailable);
}

TEST(PreemptionWatcherTest, DestructionAbortsARequestThatHangs) {
  TinyHttpServer server([](const HttpRequest&, int) { return std::optional<HttpReply>(); });
  FakeClock clock;
  Notices notices;
  PreemptionWatcherOptions options = Options(server.Url("/preempted"));
  options.request_timeout = absl::Seconds(60);
  absl::Time start;
  {
    PreemptionWatcher watcher(options, clock);
    watcher.Start(notices.Callback());
    ASSERT_TRUE(server.AwaitRequests(1, absl::Seconds(30)));
    start = absl::Now();
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_TRUE(notices.all().empty());
}

// ---- the polling both share ----

// A scripted source: polls 1 to 3 fail, 4 and 5 find nothing, 6 fails, 7 is a notice; the test
// sees what the poller said of each.
TEST(NoticePollerTest, SaysEachRunOfFailuresOnceAndHandsOnTheFirstNoticeOnce) {
  absl::Mutex mu;
  int polls = 0;
  std::vector<std::string> said;
  Notices notices;
  {
    NoticePoller poller;
    poller.Start(absl::Milliseconds(1),
                 {[&]() -> absl::StatusOr<std::optional<PreemptionNotice>> {
                    absl::MutexLock lock(&mu);
                    ++polls;
                    if (polls <= 3 || polls == 6) return absl::UnavailableError("down");
                    if (polls < 7) return std::nullopt;
                    PreemptionNotice notice;
                    notice.source = "scripted";
                    return notice;
                  },
                  notices.Callback(),
                  [&](const absl::Status& s) {
                    absl::MutexLock lock(&mu);
                    said.push_back(absl::StrCat("failed at ", polls, ": ", s.message()));
                  },
                  [&] {
                    absl::MutexLock lock(&mu);
                    said.push_back(absl::StrCat("recovered at ", polls));
                  }});
    ASSERT_TRUE(notices.Await(absl::Seconds(30)));
  }  // joined: no poll after the notice
  absl::MutexLock lock(&mu);
  EXPECT_EQ(polls, 7);
  EXPECT_EQ(said, (std::vector<std::string>{"failed at 1: down", "recovered at 4",
                                            "failed at 6: down", "recovered at 7"}));
  ASSERT_EQ(notices.all().size(), 1u);
  EXPECT_EQ(notices.all()[0].source, "scripted");
}

// Stopped between polls far apart, it ends at once; a poll in flight ends first and what it
// found is not acted on.
TEST(NoticePollerTest, StopEndsThePollingAndAPollCutShortIsNotActedOn) {
  absl::Notification in_poll;
  Notices notices;
  NoticePoller poller;
  poller.Start(absl::Hours(1), {[&]() -> absl::StatusOr<std::optional<PreemptionNotice>> {
                                  in_poll.Notify();
                                  // A poll that can be cut short watches stopping(), as a request's
                                  // abort does.
                                  poller.stopping().WaitForNotification();
                                  return PreemptionNotice{};
                                },
                                notices.Callback(), [](const absl::Status&) {}, [] {}});
  ASSERT_TRUE(in_poll.WaitForNotificationWithTimeout(absl::Seconds(30)));
  const absl::Time start = absl::Now();
  poller.Stop();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_TRUE(notices.all().empty());
  poller.Stop();  // again: nothing to do
}

// ---- a drain, from a command (Slurm's sinfo) ----

TEST(DrainWatcherTest, SaysDrainedReadsSlurmsStates) {
  for (const char* drained : {"drained", "draining\n", "MIXED+DRAIN", "drained*", "idle drain"}) {
    EXPECT_TRUE(SaysDrained(drained)) << drained;
  }
  for (const char* not_drained : {"idle", "mixed", "allocated\n", "", "undrained", "drainage"}) {
    EXPECT_FALSE(SaysDrained(not_drained)) << not_drained;
  }
}

TEST(DrainWatcherTest, TheFirstDrainedAnswerIsANoticeAndFailuresOnlyLogged) {
  testing::ScratchFolder dir;
  const std::string state = dir.path() + "/state";
  // What sinfo would print, from a file the test changes: first a failure, then idle, then
  // drained.
  DrainWatcherOptions options;
  options.command = {"sh", "-c", "cat " + state};
  options.poll_interval = absl::Milliseconds(10);
  options.grace_period = kGrace;
  FakeClock clock;
  DrainWatcher probe(options, clock);
  EXPECT_EQ(probe.PollOnce().status().code(), absl::StatusCode::kUnavailable);
  testing::WriteText(state, "mixed\n");
  absl::StatusOr<std::optional<PreemptionNotice>> polled = probe.PollOnce();
  ASSERT_TRUE(polled.ok()) << polled.status();
  EXPECT_FALSE(polled->has_value());
  testing::WriteText(state, "draining\n");
  Notices notices;
  {
    DrainWatcher watcher(options, clock);
    watcher.Start(notices.Callback());
    ASSERT_TRUE(notices.Await(absl::Seconds(30)));
  }
  ASSERT_EQ(notices.all().size(), 1u);
  EXPECT_EQ(notices.all()[0].source, "drain");
  EXPECT_EQ(notices.all()[0].deadline, clock.Now() + kGrace);
  EXPECT_THAT(notices.all()[0].message, HasSubstr("being drained (sh: draining)"));
}

}  // namespace
}  // namespace trainyard
