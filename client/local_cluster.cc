#include "client/local_cluster.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "client/credentials.h"
#include "client/format.h"
#include "common/clock.h"
#include "common/rpc/channel.h"
#include "common/rpc/credentials.h"
#include "grpcpp/grpcpp.h"
#include "trainyard/v1/admin_service.grpc.pb.h"
#include "trainyard/v1/job_service.grpc.pb.h"
#include "worker/agent/subprocess.h"

namespace trainyard::cli {
namespace {

struct Child {
  std::string name;
  pid_t pid = -1;
  std::string log;
  bool done = false;
};

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

std::string Tail(const std::string& path, size_t lines) {
  const std::string text = ReadAll(path);
  size_t pos = text.size();
  for (size_t i = 0; i <= lines && pos > 0; ++i) {
    const size_t nl = text.rfind('\n', pos - 1);
    if (nl == std::string::npos) {
      pos = 0;
      break;
    }
    pos = nl;
  }
  return text.substr(pos == 0 ? 0 : pos + 1);
}

// Checks each child once; the first one found dead (reaped), or nullptr.
Child* ReapDead(std::vector<Child>& children) {
  for (Child& child : children) {
    if (child.done) continue;
    absl::StatusOr<std::optional<ExitInfo>> exit = TryWaitSubprocess(child.pid);
    if (!exit.ok() || exit->has_value()) {
      child.done = true;
      std::cerr << "trainyard up: " << child.name << " "
                << (exit.ok() ? DescribeExit(**exit) : std::string(exit.status().message()))
                << "; its log " << child.log << " ends with:\n"
                << Tail(child.log, 10);
      return &child;
    }
  }
  return nullptr;
}

// SIGTERM to each, then waits up to `grace` for all of them before SIGKILL.
void StopChildren(std::vector<Child*> children, absl::Duration grace, int signal = SIGTERM) {
  for (Child* child : children) {
    if (!child->done) SignalSubprocess(child->pid, signal, /*group=*/true).IgnoreError();
  }
  const absl::Time deadline = RealClock::Get().Now() + grace;
  for (Child* child : children) {
    while (!child->done) {
      absl::StatusOr<std::optional<ExitInfo>> exit = TryWaitSubprocess(child->pid);
      if (!exit.ok() || exit->has_value()) {
        child->done = true;
        break;
      }
      if (RealClock::Get().Now() >= deadline) {
        std::cerr << "trainyard up: " << child->name << " did not stop in time; killing it\n";
        SignalSubprocess(child->pid, SIGKILL, /*group=*/true).IgnoreError();
        WaitSubprocess(child->pid).IgnoreError();
        child->done = true;
        break;
      }
      RealClock::Get().SleepFor(absl::Milliseconds(20));
    }
  }
}

}  // namespace

absl::StatusOr<int> ParsePortFile(const std::string& text) {
  absl::string_view view = absl::StripAsciiWhitespace(text);
  const size_t colon = view.rfind(':');
  if (colon != absl::string_view::npos) view = view.substr(colon + 1);
  int port = 0;
  if (!absl::SimpleAtoi(view, &port) || port <= 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("no port in '", text, "'"));
  }
  return port;
}

// The token worker `name` registers with: the one an earlier run left in `path`, else a new one
// made with the admin token and kept there.
absl::StatusOr<std::string> AgentToken(v1::AdminService::Stub& admin, const std::string& name,
                                       const std::string& path) {
  if (absl::StatusOr<std::string> kept = ReadCredentialFile(path); kept.ok()) return kept;
  v1::CreateTokenRequest request;
  request.set_name(name);
  request.set_role(v1::TOKEN_AGENT);
  v1::CreateTokenResponse response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(RealClock::Get().Now() + absl::Seconds(10)));
  if (grpc::Status s = admin.CreateToken(&context, request, &response); !s.ok()) {
    return absl::UnavailableError(
        absl::StrCat("cannot make the token of ", name, ": ", s.error_message()));
  }
  if (absl::Status s = WriteSecretFile(path, response.secret() + "\n"); !s.ok()) return s;
  return response.secret();
}

// Whether a process on this machine accepts connections on 127.0.0.1:`port`.
bool PortServed(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool served = connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
  close(fd);
  return served;
}

namespace {

// A local cluster as RunLocalCluster brings it up: its folder, sizes, processes and credentials.
struct LocalCluster {
  explicit LocalCluster(const LocalClusterOptions& o) : options(o) {}
  // Metrics next to the gRPC port: the coordinator on port+1, worker i on port+1+i (all picked
  // by the kernel when the port is).
  int MetricsBase() const { return options.port == 0 ? 0 : options.port + 1; }
  int MetricsPort(int offset) const { return MetricsBase() == 0 ? 0 : MetricsBase() + offset; }
  // The web console on port+1000, or where the kernel picks when the port is picked so or
  // port+1000 is already served (the console is for a browser: its port need not be known).
  int ConsolePort() const {
    if (options.port == 0 || options.port + 1000 > 65535) return 0;
    return PortServed(options.port + 1000) ? 0 : options.port + 1000;
  }
  std::vector<Child*> All() {
    std::vector<Child*> all;
    for (Child& c : children) all.push_back(&c);
    return all;
  }

  const LocalClusterOptions& options;
  std::string state_dir;
  int workers = 1;
  int slots = 1;
  int gpus = 0;
  std::vector<Child> children;  // the coordinator first; reserved, so that pointers stay
  std::string address;
  std::string console_url;   // "http://127.0.0.1:PORT/"
  std::string console_code;  // a one-time login code for the admin
  std::string admin_token;
  std::string cli_dir;  // where the CLI on this machine finds the admin token for `address`
};

// The state folder: the one asked for, or a new temporary one. False (said) when it cannot be.
bool PrepareStateDir(LocalCluster& c) {
  namespace fs = std::filesystem;
  c.state_dir = c.options.state_dir;
  if (c.state_dir.empty()) {
    std::string tmpl = (fs::temp_directory_path() / "trainyard-XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) {
      std::cerr << "error: cannot create a temporary folder\n";
      return false;
    }
    c.state_dir = tmpl;
  }
  std::error_code ec;
  fs::create_directories(fs::path(c.state_dir) / "logs", ec);
  c.state_dir = fs::absolute(c.state_dir).lexically_normal().string();
  if (ec) {
    std::cerr << "error: cannot create " << c.state_dir << ": " << ec.message() << "\n";
    return false;
  }
  return true;
}

// Starts the coordinator and waits for its port. False (said, the coordinator stopped) when it
// does not come up.
bool StartCoordinator(LocalCluster& c) {
  std::error_code ec;
  const std::string port_file = c.state_dir + "/coordinator.port";
  std::filesystem::remove(port_file, ec);
  SubprocessOptions coordinator;
  coordinator.argv = {c.options.bin_dir + "/trainyard-coordinator",
                      absl::StrCat("--listen=127.0.0.1:", c.options.port),
                      "--state_dir=" + c.state_dir, "--port_file=" + port_file,
                      // One machine, one user: jobs may read whatever that user can.
                      "--allowed_local_paths=*",
                      absl::StrCat("--metrics_listen=127.0.0.1:", c.MetricsPort(0)),
                      absl::StrCat("--console_listen=127.0.0.1:", c.ConsolePort()),
                      "--console_port_file=" + c.state_dir + "/console.port"};
  coordinator.output_file = c.state_dir + "/logs/coordinator.log";
  absl::StatusOr<pid_t> pid = StartSubprocess(coordinator);
  if (!pid.ok()) {
    std::cerr << "error: " << pid.status().message() << "\n";
    return false;
  }
  c.children.push_back({"coordinator", *pid, coordinator.output_file});
  const absl::Time deadline = RealClock::Get().Now() + c.options.start_timeout;
  while (true) {
    absl::StatusOr<int> parsed = ParsePortFile(ReadAll(port_file));
    if (parsed.ok()) {
      c.address = absl::StrCat("127.0.0.1:", *parsed);
      // The console listens before the API does: its port file is there by now.
      if (absl::StatusOr<int> console = ParsePortFile(ReadAll(c.state_dir + "/console.port"));
          console.ok()) {
        c.console_url = absl::StrCat("http://127.0.0.1:", *console, "/");
      }
      return true;
    }
    if (ReapDead(c.children) != nullptr) return false;
    if (RealClock::Get().Now() >= deadline) {
      std::cerr << "error: the coordinator did not write " << port_file << " within "
                << absl::FormatDuration(c.options.start_timeout) << "\n";
      StopChildren({&c.children[0]}, absl::Seconds(5));
      return false;
    }
    RealClock::Get().SleepFor(absl::Milliseconds(50));
  }
}

// Authentication is on: the coordinator made an admin token in its state folder; each worker
// gets an agent token of its own, and the CLI on this machine finds the admin token for this
// address (removed again when the cluster stops). Null (said, the coordinator stopped) when the
// token cannot be had.
std::unique_ptr<v1::AdminService::Stub> ConnectAdmin(LocalCluster& c) {
  absl::StatusOr<std::string> admin_token = ReadCredentialFile(c.state_dir + "/admin.token");
  if (!admin_token.ok()) {
    std::cerr << "error: " << admin_token.status().message()
              << " (the coordinator writes it when no admin token is valid; make one with "
                 "`trainyard token create` and put it there)\n";
    StopChildren({&c.children[0]}, absl::Seconds(10));
    return nullptr;
  }
  c.admin_token = *admin_token;
  ClientCredentials admin_credentials;
  admin_credentials.token = c.admin_token;
  absl::StatusOr<std::shared_ptr<grpc::Channel>> admin_channel =
      NewClientChannel(c.address, admin_credentials);
  if (!admin_channel.ok()) {
    std::cerr << "error: " << admin_channel.status().message() << "\n";
    StopChildren({&c.children[0]}, absl::Seconds(10));
    return nullptr;
  }
  c.cli_dir = LocalCredentialsDir(c.address);
  std::error_code ec;
  std::filesystem::create_directories(c.cli_dir, ec);
  if (absl::Status s = WriteSecretFile(c.cli_dir + "/token", c.admin_token + "\n"); !s.ok()) {
    std::cerr << "warning: the CLI will need --token-file " << c.state_dir
              << "/admin.token: " << s.message() << "\n";
  }
  // Where `trainyard console` finds the console of this address, and a login link into it.
  if (!c.console_url.empty()) {
    WriteSecretFile(c.cli_dir + "/console_url", c.console_url + "\n").IgnoreError();
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(RealClock::Get().Now() + absl::Seconds(10)));
    v1::ConsoleLogin login;
    if (v1::JobService::NewStub(*admin_channel)
            ->CreateConsoleLogin(&context, v1::CreateConsoleLoginRequest(), &login)
            .ok()) {
      c.console_code = login.code();
    }
  }
  return v1::AdminService::NewStub(*admin_channel);
}

// Starts the workers, each with an agent token of its own. False (said, everything stopped)
// when one cannot start.
bool StartWorkers(LocalCluster& c, v1::AdminService::Stub& admin) {
  for (int i = 1; i <= c.workers; ++i) {
    SubprocessOptions worker;
    const std::string name = absl::StrCat("worker-", i);
    worker.argv = {c.options.bin_dir + "/trainyard-worker", "--coordinator=" + c.address,
                   "--name=" + name, "--address=127.0.0.1", absl::StrCat("--slots=", c.slots),
                   // One worker takes the machine's GPUs (finding them itself, through NVML
                   // where it can) so that none is handed out twice.
                   absl::StrCat("--gpus=", i == 1 && c.gpus > 0 ? -1 : 0),
                   "--work_dir=" + c.state_dir + "/" + name,
                   absl::StrCat("--metrics_listen=127.0.0.1:", c.MetricsPort(i))};
    worker.output_file = absl::StrCat(c.state_dir, "/logs/", name, ".log");
    const std::string token_file = absl::StrCat(c.state_dir, "/", name, ".token");
    absl::StatusOr<std::string> token = AgentToken(admin, name, token_file);
    worker.argv.push_back("--token_file=" + token_file);
    absl::StatusOr<pid_t> pid = token.ok() ? StartSubprocess(worker) : token.status();
    if (!pid.ok()) {
      std::cerr << "error: " << pid.status().message() << "\n";
      StopChildren(c.All(), absl::Seconds(15));
      return false;
    }
    c.children.push_back({name, *pid, worker.output_file});
  }
  return true;
}

void PrintRunning(const LocalCluster& c) {
  const int workers = c.workers;
  std::cout
      << "Trainyard is running: coordinator at " << c.address << ", " << Counted(workers, "worker")
      << (workers == 1 ? " (worker-1)" : absl::StrCat(" (worker-1..worker-", workers, ")"))
      << " with " << Counted(c.slots, "slot") << (workers == 1 ? "" : " each")
      << (c.gpus > 0 ? absl::StrCat(", ", c.gpus, " GPUs on worker-1") : "") << ".\n"
      << "State and logs: " << c.state_dir << "\n"
      << (c.MetricsBase() == 0 ? std::string()
                               : absl::StrCat("Metrics: http://127.0.0.1:", c.MetricsBase(),
                                              "/metrics (coordinator), ports ", c.MetricsPort(1),
                                              "-", c.MetricsPort(workers), " (workers)\n"))
      << (c.console_url.empty()
              ? std::string()
              : absl::StrCat("Console: ", c.console_url,
                             c.console_code.empty() ? "" : absl::StrCat("#login=", c.console_code),
                             "\n  (a login link, good once within 5 minutes; `trainyard console` "
                             "prints a new one)\n"))
      << "\n"
      << "In another terminal:\n"
      << "  export TRAINYARD_COORDINATOR=" << c.address << "\n"
      << "  trainyard workers\n"
      << "  trainyard submit examples/synthetic-mlp.yaml --wait\n"
      << "  kill -TERM PID   # preempt a worker (PID from `trainyard workers`); -9 loses it\n\n"
      << "Press Ctrl-C to stop.\n"
      << std::flush;
}

// Runs until a stop signal (0) or the coordinator's end (1). A worker that dies is a machine
// lost, as on a real cluster: its jobs restart on the others, and it stays down.
int Supervise(LocalCluster& c, const sigset_t& stop_signals) {
  while (true) {
    struct timespec timeout = {0, 200 * 1000 * 1000};
    const int sig = sigtimedwait(&stop_signals, nullptr, &timeout);
    if (sig == SIGINT || sig == SIGTERM) {
      std::cout << "\nStopping...\n" << std::flush;
      return 0;
    }
    Child* dead = nullptr;
    while ((dead = ReapDead(c.children)) != nullptr && dead != &c.children[0]) {
      std::cerr << "trainyard up: " << dead->name
                << " stays down; the coordinator and the other workers go on\n";
    }
    if (dead == &c.children[0]) {
      std::cerr << "trainyard up: the coordinator is gone; shutting down the workers\n";
      return 1;
    }
  }
}

}  // namespace

int RunLocalCluster(const LocalClusterOptions& options) {
  // Another cluster there would answer some of the CLI's calls and this one the rest; the
  // coordinator would refuse the port anyway, but this says what is going on.
  if (options.port != 0 && PortServed(options.port)) {
    std::cerr << "error: 127.0.0.1:" << options.port
              << " is already served, most likely by a cluster of an earlier `trainyard up`. Use "
                 "it:\n  export TRAINYARD_COORDINATOR=127.0.0.1:"
              << options.port << "\n  trainyard workers\nor stop it, or start this one on "
              << "another port (--port)\n";
    return 1;
  }
  LocalCluster c(options);
  if (!PrepareStateDir(c)) return 1;
  c.workers = std::max(1, options.workers);
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  c.slots = options.slots > 0 ? options.slots : std::max(1, cores / c.workers);
  c.children.reserve(c.workers + 1);

  // The signals are taken with sigtimedwait in Supervise; children get a clean mask.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  if (!StartCoordinator(c)) return 1;
  std::unique_ptr<v1::AdminService::Stub> admin = ConnectAdmin(c);
  if (admin == nullptr) return 1;
  c.gpus = DetectGpuCount();
  if (!StartWorkers(c, *admin)) return 1;
  PrintRunning(c);
  const int exit_code = Supervise(c, stop_signals);
  std::vector<Child*> worker_children;
  for (size_t i = 1; i < c.children.size(); ++i) worker_children.push_back(&c.children[i]);
  // SIGINT: a plain stop; SIGTERM would tell the agents their machine is being preempted.
  StopChildren(worker_children, absl::Seconds(30), SIGINT);
  StopChildren({&c.children[0]}, absl::Seconds(10));
  // The CLI's token for this address goes with the cluster, unless another one has replaced it.
  std::error_code ec;
  if (ReadAll(c.cli_dir + "/token") == c.admin_token + "\n") {
    std::filesystem::remove_all(c.cli_dir, ec);
  }
  if (exit_code == 0) std::cout << "Stopped. State is kept in " << c.state_dir << "\n";
  return exit_code;
}

}  // namespace trainyard::cli
