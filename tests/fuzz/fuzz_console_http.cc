// Bytes to the console's port, as anyone who reaches it may send them: one connection per input,
// its bytes written and the connection half-closed, everything the server answers read back.
// Behind the port, the console's server (cpp-httplib), its router and the JSON API's gateway,
// calling a real coordinator (server, JobManager, an in-memory store, a clock that never waits).
// "$ADMIN" and "$ALICE" in an input become those callers' tokens, so that inputs reach the calls
// behind authentication. Every answer must carry the headers that keep a browser safe, and an
// input with no token must never get an API call's answer.
//
// The coordinator lives as long as the fuzzer (starting it per input would cost most of the
// run): jobs an input submits stay for the next ones, as on a real coordinator.

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_replace.h"
#include "common/log.h"
#include "server/api/coordinator_server.h"
#include "server/auth/auth.h"
#include "server/console/console_server.h"
#include "server/console/json_gateway.h"
#include "server/jobs/job_manager.h"
#include "tests/fuzz/coordinator_world.h"
#include "tests/fuzz/fuzz_support.h"

namespace trainyard {
namespace {

struct World {
  ImpatientClock clock;
  FakeJobStore store;
  FakeJobStore tokens;
  std::unique_ptr<Authenticator> auth;
  std::unique_ptr<JobManager> manager;
  std::unique_ptr<CoordinatorServer> server;
  std::unique_ptr<ConsoleServer> console;
  std::string admin, alice;
};

World& TheWorld() {
  static World* world = [] {
    auto* w = new World;
    const std::string dir = fuzz::MakeScratchDir("console");
    constexpr char kKey[] = "0123456789abcdef0123456789abcdef";
    w->auth = *Authenticator::Create(w->tokens, kKey, w->clock);
    w->admin = w->auth->CreateToken("root", Role::kAdmin, absl::InfiniteDuration(), "fuzz")->first;
    w->alice = w->auth->CreateToken("alice", Role::kUser, absl::InfiniteDuration(), "fuzz")->first;
    JobManagerOptions options;
    options.checkpoint_root = "file://" + dir + "/ckpt";
    options.task_credential_key = kKey;
    options.max_sync_wait = absl::Milliseconds(1);
    w->manager = *JobManager::Create(w->clock, std::make_unique<SharedStore>(w->store),
                                     std::make_unique<LogStore>(dir + "/logs"), options);
    CoordinatorServerOptions server_options;
    server_options.tick_interval = absl::Hours(1);
    w->server = *CoordinatorServer::Start(*w->manager, *w->auth, server_options);
    ConsoleOptions console;
    console.listen = "127.0.0.1:0";
    console.threads = 4;
    console.max_body_bytes = 64 << 10;
    w->console = *ConsoleServer::Start(console);
    w->console->SetGateway(std::make_shared<JsonGateway>(w->server->InProcessChannel()));
    return w;
  }();
  return *world;
}

// Sends `request` on a new connection, half-closes it and returns all that comes back (reading
// for at most 2 s of real time: a stream the input opened is cut there).
std::string Exchange(int port, const std::string& request) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) std::abort();
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  // libFuzzer's timer (SIGALRM, for -timeout) interrupts calls: a connect it interrupts goes
  // on by itself, and is waited for; reads and writes are tried again.
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    int error = errno;
    if (error == EINTR) {
      pollfd writable{fd, POLLOUT, 0};
      while (poll(&writable, 1, 10000) < 0 && errno == EINTR) {
      }
      socklen_t length = sizeof(error);
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length);
    }
    if (error != 0) {
      // The harness's own failure, not the console's answer: say which.
      fprintf(stderr, "cannot connect to the console on port %d: %s\n", port, strerror(error));
      std::abort();
    }
  }
  timeval timeout{2, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  for (size_t sent = 0; sent < request.size();) {
    const ssize_t n = send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  shutdown(fd, SHUT_WR);
  std::string answer;
  char buffer[16384];
  for (;;) {
    const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    answer.append(buffer, n);
  }
  close(fd);
  return answer;
}

}  // namespace
}  // namespace trainyard

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  trainyard::fuzz::QuietLogsUnlessShown();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  trainyard::World& world = trainyard::TheWorld();
  const std::string input(reinterpret_cast<const char*>(data), size);
  const bool with_token = absl::StrContains(input, "$ADMIN") || absl::StrContains(input, "$ALICE");
  const std::string request =
      absl::StrReplaceAll(input, {{"$ADMIN", world.admin}, {"$ALICE", world.alice}});
  const std::string answer = trainyard::Exchange(world.console->port(), request);
  if (answer.empty()) return 0;  // the server may hang up on what is not HTTP at all
  const size_t head_end = answer.find("\r\n\r\n");
  const std::string head = answer.substr(0, head_end);
  if (!absl::StartsWith(head, "HTTP/1.1 ")) __builtin_trap();
  for (const char* header :
       {"Content-Security-Policy: ", "X-Content-Type-Options: nosniff", "X-Frame-Options: DENY"}) {
    if (!absl::StrContains(head, header)) {
      fprintf(stderr, "an answer without %s:\n%s\n", header, head.c_str());
      __builtin_trap();
    }
  }
  // Without a token, no call of the API answers (a console login is redeemed without one).
  const std::string body = head_end == std::string::npos ? "" : answer.substr(head_end + 4);
  if (!with_token && absl::StartsWith(head, "HTTP/1.1 200") && absl::StartsWith(body, "{") &&
      !absl::StrContains(input, "Redeem")) {
    fprintf(stderr, "an API call answered without a token:\n%s\n", answer.c_str());
    __builtin_trap();
  }
  return 0;
}
