// The S3 client: retries and faults against a tiny scripted HTTP server, real round trips
// against s3rver on loopback, cross-checked with the aws CLI, and the signatures of the requests
// it sends checked with botocore by a proxy in front of s3rver, in both addressing styles.

// Request tables and scripted answers list only the fields that matter to each case.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

#include "common/storage/s3_client.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/formats/safetensors.h"
#include "common/formats/shard_index.h"
#include "common/sha256.h"
#include "common/storage/object_store.h"
#include "common/storage/s3_object_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/fake_clock.h"
#include "tests/common/s3rver.h"
#include "tests/common/sigv4_proxy.h"

namespace trainyard {
namespace {

using ::testing::HasSubstr;
using testing::SigV4Proxy;
namespace fs = std::filesystem;

struct FakeRequest {
  std::string method;
  std::string target;                          // path?query
  std::map<std::string, std::string> headers;  // lower-case
  std::string body;
};
struct FakeResponse {
  int status = 200;
  std::string body;
  std::map<std::string, std::string> headers;
  // Then this many more bytes ('x'), and no Content-Length: the body ends when the connection
  // does (or the client hangs up).
  int64_t filler = 0;
};

// A one-request-per-connection HTTP/1.1 server on 127.0.0.1 answering with `handler`.
class FakeHttpServer {
 public:
  explicit FakeHttpServer(std::function<FakeResponse(const FakeRequest&)> handler)
      : handler_(std::move(handler)) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int one = 1;
    setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(listen(fd_, 16), 0);
    socklen_t len = sizeof(addr);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { Serve(); });
  }
  ~FakeHttpServer() {
    stop_ = true;
    shutdown(fd_, SHUT_RDWR);
    close(fd_);
    thread_.join();
  }
  std::string endpoint() const { return absl::StrCat("http://127.0.0.1:", port_); }
  std::vector<FakeRequest> requests() {
    absl::MutexLock lock(&mu_);
    return requests_;
  }
  // Bytes of answers the client took (into its socket, at least).
  int64_t bytes_sent() const { return sent_.load(); }

 private:
  void Serve() {
    while (!stop_) {
      int client = accept(fd_, nullptr, nullptr);
      if (client < 0) return;
      std::string data;
      char buffer[65536];
      size_t header_end = std::string::npos;
      while (header_end == std::string::npos) {
        ssize_t n = read(client, buffer, sizeof(buffer));
        if (n <= 0) break;
        data.append(buffer, n);
        header_end = data.find("\r\n\r\n");
      }
      if (header_end == std::string::npos) {
        close(client);
        continue;
      }
      FakeRequest request;
      std::vector<std::string> lines = absl::StrSplit(data.substr(0, header_end), "\r\n");
      std::vector<std::string> first = absl::StrSplit(lines[0], ' ');
      request.method = first[0];
      request.target = first.size() > 1 ? first[1] : "";
      for (size_t i = 1; i < lines.size(); ++i) {
        const size_t colon = lines[i].find(':');
        if (colon == std::string::npos) continue;
        std::string name = lines[i].substr(0, colon);
        for (char& c : name) c = static_cast<char>(tolower(c));
        request.headers[name] = std::string(absl::StripAsciiWhitespace(lines[i].substr(colon + 1)));
      }
      size_t length = 0;
      if (request.headers.count("content-length")) {
        (void)absl::SimpleAtoi(request.headers["content-length"], &length);
      }
      request.body = data.substr(header_end + 4);
      while (request.body.size() < length) {
        ssize_t n = read(client, buffer, sizeof(buffer));
        if (n <= 0) break;
        request.body.append(buffer, n);
      }
      FakeResponse response = handler_(request);
      {
        absl::MutexLock lock(&mu_);
        requests_.push_back(request);
      }
      std::string out = absl::StrCat("HTTP/1.1 ", response.status, " X\r\n");
      if (response.filler == 0) {
        absl::StrAppend(&out, "Content-Length: ", response.body.size(), "\r\n");
      }
      absl::StrAppend(&out, "Connection: close\r\n");
      for (const auto& [k, v] : response.headers) absl::StrAppend(&out, k, ": ", v, "\r\n");
      absl::StrAppend(&out, "\r\n");
      if (request.method != "HEAD") out += response.body;
      bool open = Send(client, out);
      const std::string filler(1 << 20, 'x');
      for (int64_t left = response.filler; open && left > 0; left -= filler.size()) {
        open = Send(client, absl::string_view(filler).substr(
                                0, static_cast<size_t>(std::min<int64_t>(left, filler.size()))));
      }
      close(client);
    }
  }

  // False once the client is gone.
  bool Send(int client, absl::string_view data) {
    size_t done = 0;
    while (done < data.size()) {
      ssize_t n = send(client, data.data() + done, data.size() - done, MSG_NOSIGNAL);
      if (n <= 0) return false;
      done += static_cast<size_t>(n);
      sent_ += n;
    }
    return true;
  }

  std::function<FakeResponse(const FakeRequest&)> handler_;
  std::atomic<int64_t> sent_{0};
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  absl::Mutex mu_;
  std::vector<FakeRequest> requests_ ABSL_GUARDED_BY(mu_);
};

FakeResponse S3Error(int status, const std::string& code) {
  return {status, absl::StrCat("<?xml version=\"1.0\"?><Error><Code>", code,
                               "</Code><Message>fake ", code, "</Message></Error>")};
}

// Simulated time whose waits are recorded: a retry's wait moves it on at once.
class RecordingClock final : public Clock {
 public:
  absl::Time Now() const override { return time_.Now(); }
  void SleepFor(absl::Duration d) const override {
    sleeps.push_back(d);
    time_.Advance(d);
  }
  mutable std::vector<absl::Duration> sleeps;  // the client retries on one thread

 private:
  FakeClock time_{absl::FromUnixSeconds(1767323045)};
};

struct NoSleep {
  RecordingClock clock;
  std::vector<absl::Duration>& sleeps = clock.sleeps;
  void Apply(S3ClientOptions& options) {
    options.clock = &clock;
    options.jitter_seed = 7;
    options.credentials = {"AK", "SK", "", "test"};
  }
};

TEST(S3ClientFaultTest, RetriesServiceUnavailableThenSucceeds) {
  std::atomic<int> calls{0};
  FakeHttpServer server([&](const FakeRequest&) {
    if (calls++ < 3)
      return calls == 2 ? S3Error(503, "SlowDown") : S3Error(503, "ServiceUnavailable");
    return FakeResponse{200, "payload"};
  });
  NoSleep no_sleep;
  S3ClientOptions options;
  options.endpoint = server.endpoint();
  no_sleep.Apply(options);
  S3Client client(options);
  absl::StatusOr<std::string> got = client.GetObject("bkt", "some/key");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "payload");
  EXPECT_EQ(client.requests_sent(), 4);
  EXPECT_EQ(client.retries(), 3);
  ASSERT_EQ(no_sleep.sleeps.size(), 3u);
  // Full jitter: each wait is within [0, initial * 2^n].
  for (size_t i = 0; i < no_sleep.sleeps.size(); ++i) {
    EXPECT_GE(no_sleep.sleeps[i], absl::ZeroDuration());
    EXPECT_LE(no_sleep.sleeps[i], options.retry.initial_backoff * (1 << i));
  }
  EXPECT_EQ(server.requests()[0].target, "/bkt/some/key");
}

TEST(S3ClientFaultTest, GivesUpAfterTheAttemptBoundNamingBucketKeyAndCode) {
  FakeHttpServer server([](const FakeRequest&) { return S3Error(503, "SlowDown"); });
  NoSleep no_sleep;
  S3ClientOptions options;
  options.endpoint = server.endpoint();
  options.retry.max_attempts = 4;
  no_sleep.Apply(options);
  S3Client client(options);
  absl::Status status = client.PutObject("bkt", "a b/c.bin", "data");
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(status.message(), HasSubstr("bucket 'bkt'"));
  EXPECT_THAT(status.message(), HasSubstr("key 'a b/c.bin'"));
  EXPECT_THAT(status.message(), HasSubstr("SlowDown"));
  EXPECT_THAT(status.message(), HasSubstr("4 attempts"));
  EXPECT_EQ(client.requests_sent(), 4);
  // The key went out encoded.
  EXPECT_EQ(server.requests()[0].target, "/bkt/a%20b/c.bin");
}

TEST(S3ClientFaultTest, TimeBoundStopsRetriesEarly) {
  FakeHttpServer server([](const FakeRequest&) { return S3Error(500, "InternalError"); });
  NoSleep no_sleep;
  S3ClientOptions options;
  options.endpoint = server.endpoint();
  options.retry.max_attempts = 100;
  options.retry.initial_backoff = absl::Seconds(1);
  options.retry.max_backoff = absl::Seconds(1);
  options.retry.max_elapsed = absl::Seconds(3);
  no_sleep.Apply(options);
  S3Client client(options);
  EXPECT_EQ(client.HeadObject("bkt", "k").status().code(), absl::StatusCode::kUnavailable);
  absl::Duration slept;
  for (absl::Duration d : no_sleep.sleeps) slept += d;
  EXPECT_LE(slept, absl::Seconds(3));
  EXPECT_LT(client.requests_sent(), 100);
}

TEST(S3ClientFaultTest, ClientErrorsAreNotRetried) {
  FakeHttpServer server([](const FakeRequest& r) {
    return r.method == "HEAD" ? FakeResponse{404, ""} : S3Error(404, "NoSuchKey");
  });
  NoSleep no_sleep;
  S3ClientOptions options;
  options.endpoint = server.endpoint();
  no_sleep.Apply(options);
  S3Client client(options);
  absl::Status status = client.GetObject("bkt", "missing").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr("NoSuchKey"));
  EXPECT_EQ(client.HeadObject("bkt", "missing").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client.requests_sent(), 2);
  EXPECT_TRUE(no_sleep.sleeps.empty());
}

TEST(S3ClientFaultTest, EndpointDownIsAClearErrorAfterTheBound) {
  // A port nobody listens on: bind, read the port, close.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  NoSleep no_sleep;
  S3ClientOptions options;
  options.endpoint = absl::StrCat("http://127.0.0.1:", ntohs(addr.sin_port));
  options.retry.max_attempts = 3;
  no_sleep.Apply(options);
  S3Client client(options);
  absl::Status status = client.GetObject("bkt", "k").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(status.message(), HasSubstr("bucket 'bkt', key 'k'"));
  EXPECT_THAT(status.message(), HasSubstr("3 attempts"));
  EXPECT_EQ(client.requests_sent(), 3);
  EXPECT_EQ(no_sleep.sleeps.size(), 2u);
}

TEST(S3ClientFaultTest, FailedMultipartUploadIsAborted) {
  std::atomic<int> parts{0};
  FakeHttpServer server([&](const FakeRequest& r) {
    if (r.method == "POST" && absl::StrContains(r.target, "uploads")) {
      return FakeResponse{200,
                          "<InitiateMultipartUploadResult><UploadId>up-1</UploadId>"
                          "</InitiateMultipartUploadResult>"};
    }
    if (r.method == "PUT") {
      if (absl::StrContains(r.target, "partNumber=2")) return S3Error(400, "EntityTooSmall");
      parts++;
      return FakeResponse{200, "", {{"ETag", "\"etag\""}}};
    }
    if (r.method == "DELETE") return FakeResponse{204, ""};
    return S3Error(400, "Unexpected");
  });
  NoSleep no_sleep;
  S3ClientOptions options;
  options.endpoint = server.endpoint();
  options.multipart_threshold = 1000;
  options.part_size = 400;
  options.parallelism = 1;
  no_sleep.Apply(options);
  S3Client client(options);
  absl::Status status = client.PutObject("bkt", "big", std::string(1000, 'x'));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("EntityTooSmall"));
  const std::vector<FakeRequest> requests = server.requests();
  ASSERT_FALSE(requests.empty());
  EXPECT_EQ(requests.back().method, "DELETE");
  EXPECT_EQ(requests.back().target, "/bkt/big?uploadId=up-1");
}

TEST(S3ClientFaultTest, AnEndlessListingIsRefusedAtTheBoundNotBuffered) {
  // A listing, then 256 MiB more, as a broken or hostile endpoint might send without end.
  constexpr int64_t kFiller = int64_t{256} << 20;
  FakeHttpServer server([](const FakeRequest&) {
    FakeResponse answer{200, "<ListBucketResult><IsTruncated>false</IsTruncated>"};
    answer.filler = kFiller;
    return answer;
  });
  NoSleep no_sleep;
  S3ClientOptions options;
  options.endpoint = server.endpoint();
  no_sleep.Apply(options);
  S3Client client(options);
  absl::StatusOr<std::vector<S3ObjectInfo>> listed = client.ListObjects("bkt", "p/");
  EXPECT_EQ(listed.status().code(), absl::StatusCode::kResourceExhausted) << listed.status();
  EXPECT_THAT(listed.status().message(), HasSubstr("ListObjectsV2"));
  EXPECT_THAT(listed.status().message(), HasSubstr("16 MiB"));
  EXPECT_EQ(client.requests_sent(), 1);  // not retried
  // The client hung up near the bound instead of reading on (what the sockets buffer aside).
  EXPECT_LT(server.bytes_sent(), kFiller / 4);
}

TEST(S3ClientFaultTest, AnOversizedErrorAnswerIsRefusedAtTheBound) {
  FakeHttpServer server([](const FakeRequest&) {
    FakeResponse answer = S3Error(500, "InternalError");
    answer.filler = int64_t{64} << 20;
    return answer;
  });
  NoSleep no_sleep;
  S3ClientOptions options;
  options.endpoint = server.endpoint();
  no_sleep.Apply(options);
  S3Client client(options);
  absl::Status status = client.PutObject("bkt", "k", "data");
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_EQ(client.requests_sent(), 1);
}

TEST(S3ClientFaultTest, ObjectAnswersLongerThanAskedAreDataLoss) {
  // HEAD says 10 bytes; every GET answers with 64 MiB: a ranged one as 206, a whole one as 200.
  FakeHttpServer server([](const FakeRequest& r) {
    if (r.method == "HEAD") return FakeResponse{200, "0123456789"};
    FakeResponse answer{r.headers.count("range") ? 206 : 200, "0123456789"};
    if (r.headers.count("range")) answer.headers["Content-Range"] = "bytes 0-9/10";
    answer.filler = int64_t{64} << 20;
    return answer;
  });
  NoSleep no_sleep;
  S3ClientOptions options;
  options.endpoint = server.endpoint();
  no_sleep.Apply(options);
  S3Client client(options);
  absl::StatusOr<std::string> range = client.GetObjectRange("bkt", "k", 0, 10);
  EXPECT_EQ(range.status().code(), absl::StatusCode::kDataLoss) << range.status();
  EXPECT_THAT(range.status().message(), HasSubstr("more than the 10 bytes asked for"));

  const std::string path = ::testing::TempDir() + "/s3-oversized-download";
  absl::StatusOr<S3ObjectInfo> file = client.GetObjectToFile("bkt", "k", path);
  EXPECT_EQ(file.status().code(), absl::StatusCode::kDataLoss) << file.status();
  EXPECT_LE(fs::file_size(path), 10u);  // nothing past what HEAD promised went to disk
  fs::remove(path);
}

TEST(S3ClientFaultTest, AServiceIgnoringRangeIsReadOnlyUpToTheRange) {
  FakeHttpServer server([](const FakeRequest&) {
    FakeResponse answer{200, "0123456789"};
    answer.filler = int64_t{256} << 20;
    return answer;
  });
  NoSleep no_sleep;
  S3ClientOptions options;
  options.endpoint = server.endpoint();
  no_sleep.Apply(options);
  S3Client client(options);
  absl::StatusOr<std::string> range = client.GetObjectRange("bkt", "k", 2, 5);
  ASSERT_TRUE(range.ok()) << range.status();
  EXPECT_EQ(*range, "23456");
  EXPECT_LT(server.bytes_sent(), int64_t{64} << 20);
}

std::string RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string out(n, '\0');
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t v = rng();
    std::memcpy(&out[i], &v, std::min<size_t>(8, n - i));
  }
  return out;
}

// Serves multipart uploads: the parts it accepted by number, the first attempt of part
// `failing_part` answered 503.
struct MultipartRecorder {
  explicit MultipartRecorder(int failing_part) : failing_part(failing_part) {}
  FakeResponse Handle(const FakeRequest& r) {
    if (r.method == "POST" && absl::StrContains(r.target, "uploads")) {
      return {200,
              "<InitiateMultipartUploadResult><UploadId>up-1</UploadId>"
              "</InitiateMultipartUploadResult>"};
    }
    if (r.method == "POST") return {200, "<CompleteMultipartUploadResult/>"};
    if (r.method != "PUT") return S3Error(400, "Unexpected");
    int part = 0;
    const size_t at = r.target.find("partNumber=");
    if (at != std::string::npos) {
      (void)absl::SimpleAtoi(r.target.substr(at + 11, r.target.find('&', at) - at - 11), &part);
    }
    absl::MutexLock lock(&mu);
    if (part == failing_part && !failed_once) {
      failed_once = true;
      return S3Error(503, "SlowDown");
    }
    bodies[part] = r.body;
    signed_hashes[part] = r.headers.count("x-amz-content-sha256")
                              ? r.headers.at("x-amz-content-sha256")
                              : std::string("(none)");
    return {200, "", {{"ETag", absl::StrCat("\"etag-", part, "\"")}}};
  }

  const int failing_part;
  absl::Mutex mu;
  bool failed_once = false;
  std::map<int, std::string> bodies;  // 0 for a single PUT
  std::map<int, std::string> signed_hashes;
};

TEST(S3ClientFaultTest, PiecesGoUpAsOneObjectWithEachBodysHashSignedAndTheObjectsHashReturned) {
  // Pieces of odd sizes, some empty, so that parts begin and end inside pieces.
  const std::vector<std::string> pieces = {"",
                                           std::string(1, 'a'),
                                           std::string(399, 'b'),
                                           std::string(250, 'c'),
                                           "",
                                           std::string(700, 'd'),
                                           "xyz"};
  std::string whole;
  for (const std::string& piece : pieces) whole += piece;
  const std::vector<absl::string_view> views(pieces.begin(), pieces.end());
  for (const bool multipart : {false, true}) {
    SCOPED_TRACE(multipart ? "multipart" : "single PUT");
    MultipartRecorder recorder(/*failing_part=*/multipart ? 2 : -1);
    FakeHttpServer server([&](const FakeRequest& r) { return recorder.Handle(r); });
    NoSleep no_sleep;
    S3ClientOptions options;
    options.endpoint = server.endpoint();
    options.multipart_threshold = multipart ? 1000 : 1 << 20;
    options.part_size = 400;
    options.parallelism = 2;
    no_sleep.Apply(options);
    S3Client client(options);
    absl::StatusOr<std::string> sha256 = client.PutObjectPieces("bkt", "obj", views);
    ASSERT_TRUE(sha256.ok()) << sha256.status();
    EXPECT_EQ(*sha256, Sha256Hex(whole));
    absl::MutexLock lock(&recorder.mu);
    std::string sent;
    for (const auto& [part, body] : recorder.bodies) {
      sent += body;
      // Over http every body is signed with its own hash (a part's, not the object's).
      EXPECT_EQ(recorder.signed_hashes[part], Sha256Hex(body)) << "part " << part;
    }
    EXPECT_TRUE(sent == whole);
    EXPECT_EQ(recorder.bodies.size(), multipart ? 4u : 1u);  // 400, 400, 400, 153 bytes
    EXPECT_EQ(recorder.failed_once, multipart);              // part 2 was sent again, whole
  }
}

TEST(S3ClientFaultTest, UnsignedPayloadsStillReturnTheObjectsHash) {
  const std::string data = RandomBytes(2500, 9);
  for (const bool multipart : {false, true}) {
    SCOPED_TRACE(multipart ? "multipart" : "single PUT");
    MultipartRecorder recorder(/*failing_part=*/-1);
    FakeHttpServer server([&](const FakeRequest& r) { return recorder.Handle(r); });
    NoSleep no_sleep;
    S3ClientOptions options;
    options.endpoint = server.endpoint();
    options.payload_signing = S3PayloadSigning::kNever;
    options.multipart_threshold = multipart ? 1000 : 1 << 20;
    options.part_size = 1000;
    no_sleep.Apply(options);
    S3Client client(options);
    absl::StatusOr<std::string> sha256 = client.PutObjectPieces(
        "bkt", "obj",
        {absl::string_view(data).substr(0, 1234), absl::string_view(data).substr(1234)});
    ASSERT_TRUE(sha256.ok()) << sha256.status();
    EXPECT_EQ(*sha256, Sha256Hex(data));
    absl::MutexLock lock(&recorder.mu);
    ASSERT_EQ(recorder.bodies.size(), multipart ? 3u : 1u);
    for (const auto& [part, hash] : recorder.signed_hashes) EXPECT_EQ(hash, "UNSIGNED-PAYLOAD");
  }
}

TEST(S3ClientOptionsTest, PayloadSigningComesFromTheEnvironment) {
  auto options_with = [](const char* signing) {
    return S3ClientOptionsFromEnv([signing](const char* name) -> const char* {
      const std::string n = name;
      if (n == "AWS_ACCESS_KEY_ID") return "AK";
      if (n == "AWS_SECRET_ACCESS_KEY") return "SK";
      if (n == "TRAINYARD_S3_SIGN_PAYLOAD") return signing;
      return nullptr;
    });
  };
  absl::StatusOr<S3ClientOptions> options = options_with(nullptr);
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->payload_signing, S3PayloadSigning::kAuto);
  options = options_with("always");
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->payload_signing, S3PayloadSigning::kAlways);
  options = options_with("never");
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->payload_signing, S3PayloadSigning::kNever);
  options = options_with("sometimes");
  EXPECT_EQ(options.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(options.status().message(), HasSubstr("TRAINYARD_S3_SIGN_PAYLOAD"));
}

// ---- against s3rver ----

std::string ReadWhole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Keys that need encoding in a request's path (and in its signature).
const std::vector<std::string> kKeysToEncode = {"plain.bin", "with space/and+plus=.bin",
                                                "ünï/模型 ~!'()*.bin"};

// Puts `data` at `key` in bucket bkt, then checks that a get returns it and a head its size.
void ExpectPutGetHead(S3Client& client, const std::string& key, const std::string& data) {
  ASSERT_TRUE(client.PutObject("bkt", key, data).ok());
  absl::StatusOr<std::string> got = client.GetObject("bkt", key);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(*got == data);
  absl::StatusOr<S3ObjectInfo> head = client.HeadObject("bkt", key);
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ(head->size, static_cast<int64_t>(data.size()));
  EXPECT_FALSE(head->etag.empty());
}

class S3rverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (testing::S3rver::BinaryPath().empty()) GTEST_SKIP() << "s3rver is not installed";
    absl::StatusOr<std::unique_ptr<testing::S3rver>> s = testing::S3rver::Start({"bkt"});
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
    char dir[] = "/tmp/s3-client-test-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
  }
  void TearDown() override {
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
  }
  std::unique_ptr<testing::S3rver> server_;
  std::string dir_;
};

TEST_F(S3rverTest, SmallObjectsRoundTripWithRangesHeadAndDelete) {
  S3Client client(server_->ClientOptions());
  const std::string data = RandomBytes(100000, 1);
  for (const std::string& key : kKeysToEncode) {
    SCOPED_TRACE(key);
    ExpectPutGetHead(client, key, data);
  }
  absl::StatusOr<std::string> range = client.GetObjectRange("bkt", "plain.bin", 1000, 500);
  ASSERT_TRUE(range.ok()) << range.status();
  EXPECT_TRUE(*range == data.substr(1000, 500));
  range = client.GetObjectRange("bkt", "plain.bin", 99900, 500);  // clipped at the end
  ASSERT_TRUE(range.ok()) << range.status();
  EXPECT_TRUE(*range == data.substr(99900));
  range = client.GetObjectRange("bkt", "plain.bin", 100000, 10);
  ASSERT_TRUE(range.ok()) << range.status();
  EXPECT_EQ(*range, "");
  EXPECT_EQ(client.GetObjectRange("bkt", "plain.bin", 200000, 10).status().code(),
            absl::StatusCode::kOutOfRange);

  ASSERT_TRUE(client.DeleteObject("bkt", "plain.bin").ok());
  ASSERT_TRUE(client.DeleteObject("bkt", "plain.bin").ok());  // a missing key is fine
  absl::Status gone = client.GetObject("bkt", "plain.bin").status();
  EXPECT_EQ(gone.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(gone.message(), HasSubstr("NoSuchKey"));
  EXPECT_THAT(gone.message(), HasSubstr("key 'plain.bin'"));
  EXPECT_EQ(client.GetObject("nobucket", "x").status().code(), absl::StatusCode::kNotFound);

  // Unknown credentials are refused with the S3 code. (s3rver does not check SigV4 signatures
  // themselves: SigV4ProxyTest below checks those of every request with botocore.)
  S3ClientOptions bad = server_->ClientOptions();
  bad.credentials.access_key_id = "NOBODY";
  S3Client bad_client(bad);
  absl::Status denied = bad_client.GetObject("bkt", "with space/and+plus=.bin").status();
  EXPECT_EQ(denied.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(denied.message(), HasSubstr("InvalidAccessKeyId"));
}

// The data-set index over S3: shards listed by pattern, each header fetched by ranged GETs, the
// same as the files would give; the data is never fetched.
TEST_F(S3rverTest, ShardIndexReadsOnlyTheHeadersOfRemoteShards) {
  S3ObjectStore store(std::make_unique<S3Client>(server_->ClientOptions()));
  for (int i = 0; i < 2; ++i) {
    const int64_t n = 50000 + i;
    const std::string features(n * 8, '\x01');
    auto file = EncodeSafetensors({{"features", "U8", {n, 8}, features}}, {});
    ASSERT_TRUE(file.ok()) << file.status();
    ASSERT_TRUE(store.Put(absl::StrCat("s3://bkt/ds/train-", i, ".safetensors"), *file).ok());
  }
  ASSERT_TRUE(store.Put("s3://bkt/ds/readme.txt", "not a shard").ok());
  auto index = IndexShards(store, "s3://bkt/ds/train-*.safetensors");
  ASSERT_TRUE(index.ok()) << index.status();
  ASSERT_EQ(index->shards.size(), 2u);
  EXPECT_EQ(index->shards[1].uri, "s3://bkt/ds/train-1.safetensors");
  EXPECT_EQ(index->samples, 100001);
  EXPECT_EQ(index->shards[0].header.tensors[0].shape, (std::vector<int64_t>{50000, 8}));
  // 800 KB of data, a few hundred bytes read.
  EXPECT_GT(index->bytes, 800000);
  EXPECT_LT(index->header_bytes_read, 500);
}

TEST_F(S3rverTest, MultipartUploadsAndParallelDownloadsAreByteIdentical) {
  S3ClientOptions options = server_->ClientOptions();
  options.multipart_threshold = 6 << 20;
  options.part_size = 5 << 20;  // the smallest part S3 takes
  S3Client client(options);
  const std::string data = RandomBytes((13 << 20) + 12345, 2);
  ASSERT_TRUE(client.PutObject("bkt", "multi/in-memory.bin", data).ok());
  const int64_t after_first = client.requests_sent();
  EXPECT_GE(after_first, 5);  // create, three parts, complete
  absl::StatusOr<std::string> got = client.GetObject("bkt", "multi/in-memory.bin");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(*got == data);

  // From pieces that part boundaries cut through: the same object, and its hash.
  const absl::string_view view(data);
  absl::StatusOr<std::string> sha256 = client.PutObjectPieces(
      "bkt", "multi/pieces.bin",
      {view.substr(0, 3), view.substr(3, 7 << 20), view.substr(3 + (7 << 20))});
  ASSERT_TRUE(sha256.ok()) << sha256.status();
  EXPECT_EQ(*sha256, Sha256Hex(data));
  got = client.GetObject("bkt", "multi/pieces.bin");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(*got == data);

  const std::string local = dir_ + "/source.bin";
  std::ofstream(local, std::ios::binary) << data;
  ASSERT_TRUE(client.PutObjectFromFile("bkt", "multi/from file.bin", local).ok());
  const std::string back = dir_ + "/back.bin";
  absl::StatusOr<S3ObjectInfo> info = client.GetObjectToFile("bkt", "multi/from file.bin", back);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->size, static_cast<int64_t>(data.size()));
  EXPECT_TRUE(ReadWhole(back) == data);

  // The aws CLI reads what we wrote, byte for byte.
  const std::string by_aws = dir_ + "/by-aws.bin";
  testing::S3rver::CommandResult cp =
      server_->Aws({"s3", "cp", "s3://bkt/multi/from file.bin", by_aws});
  ASSERT_EQ(cp.exit_code, 0) << cp.output;
  EXPECT_TRUE(ReadWhole(by_aws) == data);
  // And we read what the aws CLI wrote (its own multipart upload above 8 MiB).
  const std::string other = RandomBytes((9 << 20) + 7, 3);
  std::ofstream(dir_ + "/other.bin", std::ios::binary) << other;
  cp = server_->Aws({"s3", "cp", dir_ + "/other.bin", "s3://bkt/from aws/ünï+.bin"});
  ASSERT_EQ(cp.exit_code, 0) << cp.output;
  got = client.GetObject("bkt", "from aws/ünï+.bin");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(*got == other);
  const std::string other_back = dir_ + "/other-back.bin";
  ASSERT_TRUE(client.GetObjectToFile("bkt", "from aws/ünï+.bin", other_back).ok());
  EXPECT_TRUE(ReadWhole(other_back) == other);
}

TEST_F(S3rverTest, ListingFollowsContinuationPastAThousandKeys) {
  S3Client client(server_->ClientOptions());
  constexpr int kKeys = 1105;
  std::atomic<int> next{0}, failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = next++; i < kKeys; i = next++) {
        if (!client.PutObject("bkt", absl::StrFormat("many/k%05d", i), "x").ok()) failures++;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  ASSERT_EQ(failures, 0);
  ASSERT_TRUE(client.PutObject("bkt", "other/k", "y").ok());
  const int64_t before = client.requests_sent();
  absl::StatusOr<std::vector<S3ObjectInfo>> listed = client.ListObjects("bkt", "many/");
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_GE(client.requests_sent() - before, 2);  // more than one page
  ASSERT_EQ(listed->size(), static_cast<size_t>(kKeys));
  EXPECT_EQ((*listed)[0].key, "many/k00000");
  EXPECT_EQ((*listed)[kKeys - 1].key, absl::StrFormat("many/k%05d", kKeys - 1));
  EXPECT_EQ((*listed)[0].size, 1);

  // Through the ObjectStore interface, with s3:// URIs.
  S3ObjectStore store(std::make_unique<S3Client>(server_->ClientOptions()));
  absl::StatusOr<std::vector<ObjectInfo>> objects = store.List("s3://bkt/many/k0000");
  ASSERT_TRUE(objects.ok()) << objects.status();
  ASSERT_EQ(objects->size(), 10u);
  EXPECT_EQ((*objects)[3].uri, "s3://bkt/many/k00003");
  ASSERT_TRUE(store.Delete("s3://bkt/many/k00003").ok());
  objects = store.List("s3://bkt/many/k0000");
  ASSERT_TRUE(objects.ok());
  EXPECT_EQ(objects->size(), 9u);
}

TEST_F(S3rverTest, OpenObjectStoreUsesTheEnvironment) {
  for (const auto& [k, v] : server_->Env()) setenv(k.c_str(), v.c_str(), 1);
  absl::StatusOr<std::shared_ptr<ObjectStore>> store = OpenObjectStore("s3://bkt/x");
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->Put("s3://bkt/env/obj", "hello").ok());
  absl::StatusOr<std::string> got = (*store)->Get("s3://bkt/env/obj");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "hello");
  for (const auto& [k, v] : server_->Env()) unsetenv(k.c_str());
}

// ---- signatures checked end to end ----

std::string SourceDir() {
  const char* dir = getenv("TRAINYARD_SOURCE_DIR");
  return dir != nullptr ? dir : TRAINYARD_SOURCE_DIR_FALLBACK;
}

// The client talks to s3rver through the proxy, with the addressing of the parameter.
class SigV4ProxyTest : public S3rverTest, public ::testing::WithParamInterface<S3Addressing> {
 protected:
  void SetUp() override {
    S3rverTest::SetUp();
    if (server_ == nullptr) return;  // skipped or failed
    absl::StatusOr<std::unique_ptr<SigV4Proxy>> proxy =
        SigV4Proxy::Start(SourceDir() + "/tests/common/sigv4_proxy.py", server_->endpoint(),
                          server_->ClientOptions().credentials, dir_);
    ASSERT_TRUE(proxy.ok()) << proxy.status();
    proxy_ = *std::move(proxy);
  }
  void TearDown() override {
    proxy_.reset();
    S3rverTest::TearDown();
  }

  bool virtual_hosted() const { return GetParam() == S3Addressing::kVirtualHosted; }
  S3ClientOptions ProxiedOptions() const {
    S3ClientOptions options = server_->ClientOptions();
    // libcurl takes every *.localhost name for loopback, so bkt.s3.localhost reaches the proxy.
    options.endpoint = absl::StrCat(virtual_hosted() ? "http://s3.localhost:" : "http://127.0.0.1:",
                                    proxy_->port());
    options.addressing = GetParam();
    return options;
  }

  std::unique_ptr<SigV4Proxy> proxy_;
};

TEST_P(SigV4ProxyTest, EveryRequestIsSignedAsBotocoreSignsIt) {
  S3ClientOptions options = ProxiedOptions();
  options.multipart_threshold = 6 << 20;
  options.part_size = 5 << 20;  // the smallest part S3 takes
  S3Client client(options);

  const std::string small = RandomBytes(100000, 4);
  for (const std::string& key : kKeysToEncode) {
    SCOPED_TRACE(key);
    ExpectPutGetHead(client, key, small);
    absl::StatusOr<std::string> range = client.GetObjectRange("bkt", key, 1000, 500);
    ASSERT_TRUE(range.ok()) << range.status();
    EXPECT_TRUE(*range == small.substr(1000, 500));
  }

  // An empty body is signed with the hash of nothing.
  ASSERT_TRUE(client.PutObject("bkt", "empty", "").ok());
  absl::StatusOr<std::string> empty = client.GetObject("bkt", "empty");
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(*empty, "");

  // Three parts up from memory and from a file (each part hashed as it is read), and down in
  // parallel ranges pinned with If-Match.
  const std::string big = RandomBytes((11 << 20) + 3, 5);
  ASSERT_TRUE(client.PutObject("bkt", "multi/big ü+.bin", big).ok());
  std::ofstream(dir_ + "/big.bin", std::ios::binary) << big;
  ASSERT_TRUE(client.PutObjectFromFile("bkt", "multi/from file.bin", dir_ + "/big.bin").ok());
  for (const std::string key : {"multi/big ü+.bin", "multi/from file.bin"}) {
    SCOPED_TRACE(key);
    absl::StatusOr<S3ObjectInfo> info = client.GetObjectToFile("bkt", key, dir_ + "/back.bin");
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_TRUE(ReadWhole(dir_ + "/back.bin") == big);
  }

  // Pages of three keys: the continuation tokens go out in the next requests' queries (s3rver's
  // are base64, so '/', '+' and '=' in them must be encoded, and signed so).
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(client.PutObject("bkt", absl::StrCat("list/k", i), "x").ok());
  }
  ASSERT_TRUE(client.PutObject("bkt", "listing", "y").ok());
  const int64_t before_list = client.requests_sent();
  absl::StatusOr<std::vector<S3ObjectInfo>> listed = client.ListObjects("bkt", "list/");
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(client.requests_sent() - before_list, 3);
  ASSERT_EQ(listed->size(), 8u);
  EXPECT_EQ(listed->front().key, "list/k0");
  EXPECT_EQ(listed->back().key, "list/k7");

  ASSERT_TRUE(client.DeleteObject("bkt", "plain.bin").ok());
  EXPECT_EQ(client.HeadObject("bkt", "plain.bin").status().code(), absl::StatusCode::kNotFound);

  // The proxy refuses to complete an upload with parts under 5 MiB, as S3 does, and the client
  // aborts it. (s3rver answers the abort 405: it has no AbortMultipartUpload.)
  S3ClientOptions small_parts = options;
  small_parts.multipart_threshold = 2 << 20;
  small_parts.part_size = 1 << 20;
  S3Client small_parts_client(small_parts);
  absl::Status refused =
      small_parts_client.PutObject("bkt", "aborted ü.bin", RandomBytes(5 << 19, 6));
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr("EntityTooSmall"));
  EXPECT_EQ(client.HeadObject("bkt", "aborted ü.bin").status().code(), absl::StatusCode::kNotFound);

  if (virtual_hosted()) {
    // The aws CLI (path-style, straight to s3rver) reads what went up virtual-hosted.
    testing::S3rver::CommandResult cp =
        server_->Aws({"s3", "cp", "--recursive", "s3://bkt/", dir_ + "/by-aws"});
    ASSERT_EQ(cp.exit_code, 0) << cp.output;
    EXPECT_TRUE(ReadWhole(dir_ + "/by-aws/" + kKeysToEncode[1]) == small);
    EXPECT_TRUE(ReadWhole(dir_ + "/by-aws/" + kKeysToEncode[2]) == small);
    EXPECT_TRUE(ReadWhole(dir_ + "/by-aws/multi/big ü+.bin") == big);
    EXPECT_TRUE(ReadWhole(dir_ + "/by-aws/multi/from file.bin") == big);
  }

  // Every request the clients sent went through the proxy, signed as botocore signs it, in the
  // addressing asked for.
  const std::vector<nlohmann::json> requests = proxy_->Requests();
  EXPECT_EQ(static_cast<int64_t>(requests.size()),
            client.requests_sent() + small_parts_client.requests_sent());
  int continued = 0, aborted = 0;
  for (const nlohmann::json& r : requests) {
    SCOPED_TRACE(r.dump());
    EXPECT_TRUE(r["verified"].get<bool>());
    const std::string host = r["host"], path = r["path"], query = r["query"];
    if (virtual_hosted()) {
      EXPECT_EQ(host, absl::StrCat("bkt.s3.localhost:", proxy_->port()));
      EXPECT_FALSE(absl::StartsWith(path, "/bkt/"));
    } else {
      EXPECT_EQ(host, absl::StrCat("127.0.0.1:", proxy_->port()));
      EXPECT_TRUE(path == "/bkt" || absl::StartsWith(path, "/bkt/"));
    }
    if (absl::StrContains(query, "continuation-token=")) continued++;
    if (r["method"] == "DELETE" && absl::StrContains(query, "uploadId=")) aborted++;
  }
  EXPECT_EQ(continued, 2);
  EXPECT_EQ(aborted, 1);
}

TEST_P(SigV4ProxyTest, AWrongSecretIsRefusedThoughS3rverAloneTakesIt) {
  S3ClientOptions options = ProxiedOptions();
  options.credentials.secret_access_key = "not-the-secret";
  S3Client through_proxy(options);
  absl::Status denied = through_proxy.PutObject("bkt", "k", "data");
  EXPECT_EQ(denied.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(denied.message(), HasSubstr("SignatureDoesNotMatch"));
  const std::vector<nlohmann::json> requests = proxy_->Requests();
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_FALSE(requests[0]["verified"].get<bool>());
  EXPECT_EQ(requests[0]["status"], 403);

  S3ClientOptions direct = server_->ClientOptions();
  direct.credentials.secret_access_key = "not-the-secret";
  S3Client straight(direct);
  ASSERT_TRUE(straight.PutObject("bkt", "k", "data").ok());
  absl::StatusOr<std::string> got = straight.GetObject("bkt", "k");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "data");
}

INSTANTIATE_TEST_SUITE_P(Addressing, SigV4ProxyTest,
                         ::testing::Values(S3Addressing::kPath, S3Addressing::kVirtualHosted),
                         [](const ::testing::TestParamInfo<S3Addressing>& info) {
                           return std::string(info.param == S3Addressing::kPath ? "PathStyle"
                                                                                : "VirtualHosted");
                         });

}  // namespace
}  // namespace trainyard
