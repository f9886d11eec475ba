#include "worker/trainer/program/host.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/close_range.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <system_error>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/child_signals.h"
#include "common/exit_codes.h"
#include "common/json_fields.h"
#include "common/log.h"
#include "common/storage/uri.h"
#include "worker/trainer/program/agent_store.h"

extern char** environ;

namespace trainyard::trainer::program {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr char kPeerKey[] = "program/peer/";
constexpr char kMasterKey[] = "program/master";
// "host" when rank 0's host serves the ranks' store at the master's address, else "program".
constexpr char kStoreKey[] = "program/store";
constexpr char kEndedKey[] = "program/ended/";

// A TCP port free on this machine now, for the program's rendezvous when rank 0's program
// serves torch's TCPStore: the kernel picks it, and the program binds it moments later.
absl::StatusOr<int> FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
  sockaddr_in address = {};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t length = sizeof(address);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    const std::string error = std::strerror(errno);
    ::close(fd);
    return absl::UnavailableError(absl::StrCat("no free port: ", error));
  }
  ::close(fd);
  return ntohs(address.sin_port);
}

std::vector<std::pair<std::string, std::string>> OwnEnvironment() {
  std::vector<std::pair<std::string, std::string>> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const absl::string_view entry(*e);
    const size_t eq = entry.find('=');
    if (eq == absl::string_view::npos) continue;
    env.emplace_back(std::string(entry.substr(0, eq)), std::string(entry.substr(eq + 1)));
  }
  return env;
}

std::string PathOf(const std::vector<std::pair<std::string, std::string>>& env) {
  for (const auto& [name, value] : env) {
    if (name == "PATH") return value;
  }
  return "";
}

// Whether the program's last words say that its Python has no torch: the standard message of
// an import that failed, which the test of a program without torch pins.
bool LacksTorch(absl::string_view last_line) {
  return absl::StrContains(last_line, "ModuleNotFoundError: No module named 'torch'");
}

}  // namespace

int ExitCodeForHost(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return kExitOk;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kPermissionDenied:
      return kExitUserError;
    default:
      return kExitInfrastructure;
  }
}

Host::Host(const v1::Task& task, const ProgramOptions& options)
    : task_(task), options_(options), clock_(*options.clock) {
  const std::string dir = fs::absolute(options.task_dir).lexically_normal().string();
  paths_.workdir = dir + "/program";
  paths_.checkpoint_dir = dir + "/checkpoint";
  paths_.socket = dir + "/trainyard.sock";
  paths_.step_file = absl::StrCat(dir, "/", kLastStepFile);
  restore_base_ = dir + "/restore";
  paths_.python_module_dir = options.python_module_dir;
  store_.without_libuv = options.store_without_libuv;
}

ProgramResult Host::Run() {
  if (absl::Status s = Prepare(); !s.ok()) {
    return {ExitCodeForHost(s), std::string(s.message())};
  }
  if (absl::Status s = MeetPeers(); !s.ok()) {
    return {ExitCodeForHost(s), std::string(s.message())};
  }
  if (paths_.socket.size() >= kMaxSocketPath) {
    // A Unix socket's path holds at most 107 bytes, and a task folder under a deep work folder
    // with a long job name is longer: a private folder of /tmp instead (0700, the task user's).
    char dir[] = "/tmp/trainyard-sock-XXXXXX";
    if (::mkdtemp(dir) == nullptr) {
      return {kExitInfrastructure, absl::StrCat("mkdtemp: ", std::strerror(errno))};
    }
    socket_dir_ = dir;
    paths_.socket = socket_dir_ + "/trainyard.sock";
  }
  absl::Cleanup remove_socket_dir = [this] {
    if (socket_dir_.empty()) return;
    std::error_code ec;
    fs::remove_all(socket_dir_, ec);
  };
  absl::StatusOr<std::unique_ptr<Channel>> channel =
      Channel::Listen(paths_.socket, [this](const json& request) { return Handle(request); });
  if (!channel.ok()) return {kExitInfrastructure, std::string(channel.status().message())};
  if (options_.coordinator != nullptr) {
    reporter_ =
        std::make_unique<ProgressReporter>(options_.coordinator, clock_, options_.report_interval);
  }
  absl::StatusOr<pid_t> pid = Start();
  if (!pid.ok()) return {ExitCodeForHost(pid.status()), std::string(pid.status().message())};
  std::thread silent;
  if (reporter_ != nullptr && task_.rank() == 0) silent = std::thread([this] { ReportIfSilent(); });
  absl::Cleanup end_silent = [this, &silent] {
    {
      absl::MutexLock lock(&mu_);
      ended_ = true;
    }
    reported_or_ended_.SignalAll();
    if (silent.joinable()) silent.join();
  };
  int status = 0;
  while (::waitpid(*pid, &status, 0) < 0) {
    if (errno != EINTR) {
      return {kExitInternal, absl::StrCat("waitpid: ", std::strerror(errno))};
    }
  }
  std::move(end_silent).Invoke();
  channel->reset();  // no request after the program's end
  SayProgramEnded();
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) KeepStoreForPeers();
  ProgramResult result = Conclude(status);
  if (result.exit_code == kExitInternal && AttemptEndedMeanwhile()) {
    return {kExitInfrastructure,
            absl::StrCat(result.message, " (after its attempt ended: a peer was lost)")};
  }
  return result;
}

void Host::ReportIfSilent() {
  const absl::Time until = clock_.Now() + options_.silent_program_after;
  trainyard::v1::JobProgress progress;
  {
    absl::MutexLock lock(&mu_);
    while (!reported_ && !ended_ && !clock_.WaitWithDeadline(reported_or_ended_, mu_, until)) {
    }
    if (reported_ || ended_) return;
    progress_.set_step(restore_step_);
    progress_.set_world_size(task_.world_size());
    progress_.set_attempt_start_step(restore_step_);
    progress_.set_rendezvous_seconds(rendezvous_seconds_);
    progress_.set_checkpoint_load_seconds(restore_seconds_);
    progress_.set_steps_unknown(true);
    progress = progress_;
  }
  LogInfo("the program has reported no step in ",
          absl::FormatDuration(options_.silent_program_after),
          " (it does not use the trainyard module, or not yet): its steps are unknown");
  reporter_->Update(progress);
}

bool Host::AttemptEndedMeanwhile() {
  if (task_.world_size() <= 1 || options_.rendezvous == nullptr) return false;
  if (options_.stop_signal != nullptr && options_.stop_signal->load() != 0) return false;
  LogInfo("the program failed: waiting up to ", absl::FormatDuration(options_.peer_loss_grace),
          " to learn whether a peer was lost");
  // No one sets this key: the wait ends when the coordinator ends the attempt (the store then
  // refuses every call of it) or when the grace is over.
  const absl::Status status =
      options_.rendezvous->Get("program/never-set", options_.peer_loss_grace).status();
  return status.code() == absl::StatusCode::kFailedPrecondition;
}

absl::Status Host::Prepare() {
  std::error_code ec;
  for (const std::string& dir : {paths_.workdir, paths_.checkpoint_dir}) {
    fs::remove_all(dir, ec);
    fs::create_directories(dir, ec);
    if (ec) return absl::UnavailableError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  }
  // The last-step file, which the module writes (empty: no step yet).
  const int step_fd =
      ::open(paths_.step_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (step_fd >= 0) ::close(step_fd);
  const v1::ProgramSpec& program = task_.spec().program();
  if (!program.workdir().empty()) {
    absl::StatusOr<std::shared_ptr<ObjectStore>> store = options_.stores->Open(program.workdir());
    if (!store.ok()) return store.status();
    if (absl::Status s = FetchWorkdir(**store, program.workdir(), paths_.workdir); !s.ok()) {
      return s;
    }
  }
  if (!task_.checkpoint_uri().empty()) {
    absl::StatusOr<std::shared_ptr<ObjectStore>> store =
        options_.stores->Open(task_.checkpoint_uri());
    if (!store.ok()) return store.status();
    checkpoint_store_ = *std::move(store);
  }
  return Restore();
}

absl::Status Host::Restore() {
  if (task_.resume_checkpoints_size() == 0) return absl::OkStatus();
  const absl::Time start = clock_.Now();
  const std::string& dir = restore_base_;
  for (const std::string& uri : task_.resume_checkpoints()) {
    absl::StatusOr<std::shared_ptr<ObjectStore>> from = options_.stores->Open(uri);
    absl::StatusOr<int64_t> step =
        from.ok() ? RestoreCheckpoint(**from, uri, dir) : absl::StatusOr<int64_t>(from.status());
    if (!step.ok()) {
      const std::string message =
          absl::StrCat("skipped checkpoint ", uri, ": ", step.status().message());
      LogWarning(message);
      if (options_.coordinator != nullptr) options_.coordinator->ReportEvent(message).IgnoreError();
      continue;
    }
    paths_.restore_dir = dir;
    restore_step_ = *step;
    restore_seconds_ = absl::ToDoubleSeconds(clock_.Now() - start);
    LogInfo("restored ", uri, " (step ", restore_step_, ") into ", dir);
    return absl::OkStatus();
  }
  LogWarning("no usable checkpoint among ", task_.resume_checkpoints_size(),
             "; the program starts from scratch");
  return absl::OkStatus();
}

absl::Status Host::MeetPeers() {
  const absl::Time start = clock_.Now();
  const char* gpus = std::getenv("CUDA_VISIBLE_DEVICES");
  Peer me{task_.worker_address().empty() ? "127.0.0.1" : task_.worker_address(),
          gpus == nullptr ? "" : gpus};
  std::vector<Peer> peers(task_.world_size() > 0 ? task_.world_size() : 1);
  peers[task_.rank()] = me;
  if (task_.rank() == 0) {
    if (absl::Status s = PlaceStore(me.address); !s.ok()) return s;
  }
  if (peers.size() > 1) {
    if (options_.rendezvous == nullptr) {
      return absl::FailedPreconditionError(
          "a program with several ranks needs the coordinator (--coordinator) to meet its peers");
    }
    RendezvousClient& rendezvous = *options_.rendezvous;
    const json mine = {{"address", me.address}, {"gpus", me.gpus}};
    if (absl::Status s = rendezvous.Set(absl::StrCat(kPeerKey, task_.rank()), mine.dump());
        !s.ok()) {
      return s;
    }
    if (task_.rank() == 0) {
      // The store's place first: a rank that reads the master reads it too.
      if (absl::Status s = rendezvous.Set(kStoreKey, store_.on_host ? "host" : "program");
          !s.ok()) {
        return s;
      }
      if (absl::Status s = rendezvous.Set(kMasterKey, store_.master); !s.ok()) return s;
    } else {
      absl::StatusOr<std::string> master = rendezvous.Get(kMasterKey, options_.peer_timeout);
      if (!master.ok()) return master.status();
      store_.master = *master;
      absl::StatusOr<std::string> store = rendezvous.Get(kStoreKey, options_.peer_timeout);
      if (!store.ok()) return store.status();
      store_.on_host = *store == "host";
    }
    for (int r = 0; r < static_cast<int>(peers.size()); ++r) {
      if (r == task_.rank()) continue;
      absl::StatusOr<std::string> text =
          rendezvous.Get(absl::StrCat(kPeerKey, r), options_.peer_timeout);
      if (!text.ok()) return text.status();
      const json peer = json::parse(*text, nullptr, /*allow_exceptions=*/false);
      if (!peer.is_object()) return absl::InternalError(absl::StrCat("rank ", r, ": bad entry"));
      peers[r] = Peer{JsonString(peer, "address"), JsonString(peer, "gpus")};
    }
  }
  layout_ = LayoutOf(peers, task_.rank());
  rendezvous_seconds_ = absl::ToDoubleSeconds(clock_.Now() - start);
  return absl::OkStatus();
}

absl::StatusOr<pid_t> Host::Start() {
  const std::vector<std::pair<std::string, std::string>> env =
      ProgramEnvironment(task_, layout_, store_, paths_, restore_step_, OwnEnvironment());
  const v1::ProgramSpec& program = task_.spec().program();
  absl::StatusOr<std::string> file = FindCommand(program.command(0), PathOf(env), paths_.workdir);
  if (!file.ok()) return file.status();
  // Everything the child needs, made before fork: after it, only async-signal-safe calls.
  std::vector<std::string> env_lines;
  for (const auto& [name, value] : env) env_lines.push_back(absl::StrCat(name, "=", value));
  std::vector<char*> envp;
  for (std::string& line : env_lines) envp.push_back(line.data());
  envp.push_back(nullptr);
  std::vector<std::string> args(program.command().begin(), program.command().end());
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  int report[2];
  if (::pipe2(report, O_CLOEXEC) != 0) {
    return absl::UnavailableError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(report[0]);
    ::close(report[1]);
    return absl::UnavailableError(absl::StrCat("fork: ", std::strerror(errno)));
  }
  if (pid == 0) {
    // The program dies with its host (which the agent may SIGKILL at a stop's deadline).
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    ResetSignalsForExec();
    // Nothing of the host's but the standard streams reaches the program (the store's sockets,
    // which LibTorch does not make close-on-exec, among them).
    if (::syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC) != 0) {
      for (int fd = 3; fd < 65536; ++fd) ::fcntl(fd, F_SETFD, FD_CLOEXEC);
    }
    int error = 0;
    if (::chdir(paths_.workdir.c_str()) != 0) {
      error = errno;
    } else {
      ::execve(file->c_str(), argv.data(), envp.data());
      error = errno;
    }
    ssize_t ignored = ::write(report[1], &error, sizeof(error));
    (void)ignored;
    ::_exit(127);
  }
  ::close(report[1]);
  int error = 0;
  ssize_t n;
  do {
    n = ::read(report[0], &error, sizeof(error));
  } while (n < 0 && errno == EINTR);
  ::close(report[0]);
  if (n == sizeof(error)) {
    int ignored;
    ::waitpid(pid, &ignored, 0);
    return absl::InvalidArgumentError(
        absl::StrCat("program.command: cannot start ", *file, ": ", std::strerror(error)));
  }
  LogInfo("started the program (pid ", pid, "): ", absl::StrJoin(args, " "), " as rank ",
          task_.rank(), "/", task_.world_size(), ", master ", store_.master, ", local rank ",
          layout_.local_rank, "/", layout_.local_world_size);
  return pid;
}

ProgramResult Host::Conclude(int wait_status) {
  const bool stopped = options_.stop_signal != nullptr && options_.stop_signal->load() != 0;
  absl::Status failure;
  std::optional<int64_t> stopping_at;
  int64_t last_step = 0;
  trainyard::v1::JobProgress progress;
  bool reported = false;
  {
    absl::MutexLock lock(&mu_);
    reported = reported_;
    failure = failure_;
    stopping_at = stopping_at_;
    last_step = progress_.step();
    progress = progress_;
  }
  if (reporter_ != nullptr && reported) {
    // The last word on progress, so that the job shows where the program ended.
    reporter_->Finish(progress, clock_.Now() + options_.coordinator_retry_for).IgnoreError();
  }
  const std::string last_line = LastOutputLine();
  const std::string said = last_line.empty() ? "" : absl::StrCat(": ", last_line);
  if (WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0) {
    if (!failure.ok()) return {ExitCodeForHost(failure), std::string(failure.message())};
    // Stopped where the ranks agreed (the module said so); a program that ran to its end before
    // the stop came has finished, whatever was asked meanwhile.
    if (stopped && stopping_at.has_value()) {
      return {kExitStoppedBySignal, absl::StrCat("stopped by SIGTERM at step ", *stopping_at)};
    }
    return {kExitOk, ""};
  }
  if (WIFSIGNALED(wait_status)) {
    const int sig = WTERMSIG(wait_status);
    if (sig == SIGTERM && stopped) {
      return {kExitStoppedBySignal,
              absl::StrCat("stopped by SIGTERM: the program ended without saving (last step ",
                           last_step, ")")};
    }
    return {kExitInternal, absl::StrCat("the program was killed by signal ", sig, " (",
                                        SignalName(sig), ")", said)};
  }
  const int code = WEXITSTATUS(wait_status);
  if (!failure.ok()) {
    return {ExitCodeForHost(failure), absl::StrCat(failure.message(), said)};
  }
  if (LacksTorch(last_line)) {
    return {kExitUserError,
            absl::StrCat("the program's Python has no torch on this worker (install "
                         "python3-torch, or name a Python that has it in program.command)",
                         said)};
  }
  if (code == kExitUserError) {
    return {kExitUserError, absl::StrCat("the program exited with code 2 (its own error: no "
                                         "retry)",
                                         said)};
  }
  return {kExitInternal, absl::StrCat("the program exited with code ", code, said)};
}

std::string Host::LastOutputLine() const {
  const std::string path = (fs::path(restore_base_).parent_path() / kTaskOutputFile).string();
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  const std::streamoff tail = std::min<std::streamoff>(size, 4096);
  in.seekg(size - tail);
  std::string text(static_cast<size_t>(tail), '\0');
  in.read(text.data(), tail);
  absl::string_view rest = absl::StripTrailingAsciiWhitespace(text);
  const size_t newline = rest.rfind('\n');
  if (newline != absl::string_view::npos) rest = rest.substr(newline + 1);
  return std::string(absl::StripAsciiWhitespace(rest));
}

absl::Status Host::PlaceStore(const std::string& address) {
  if (task_.world_size() > 1 && options_.serve_agent_store) {
    const std::string why_not = WhyNotServeStore();
    if (why_not.empty()) {
      absl::StatusOr<std::unique_ptr<AgentStore>> store =
          options_.serve_agent_store(task_.world_size());
      if (store.ok()) {
        agent_store_ = *std::move(store);
        store_.on_host = true;
        store_.master = absl::StrCat(address, ":", agent_store_->port());
        LogInfo("serving the ranks' store at ", store_.master);
        return absl::OkStatus();
      }
      LogWarning(store.status().message(), "; rank 0's program serves it");
    } else {
      LogInfo("rank 0's program serves the ranks' store: ", why_not);
    }
  }
  absl::StatusOr<int> port = FreePort();
  if (!port.ok()) return port.status();
  store_.master = absl::StrCat(address, ":", *port);
  return absl::OkStatus();
}

std::string Host::WhyNotServeStore() {
  if (options_.store_without_libuv) {
    return "this worker's torch has no libuv, and PyTorch's clients of a store served elsewhere "
           "ask for it";
  }
  const std::vector<std::pair<std::string, std::string>> env =
      ProgramEnvironment(task_, layout_, StorePlace{}, paths_, restore_step_, OwnEnvironment());
  absl::StatusOr<std::string> python =
      FindCommand(task_.spec().program().command(0), PathOf(env), paths_.workdir);
  if (!python.ok()) return "its command is not found";  // Start() says so
  if (!IsPython(*python)) return absl::StrCat(*python, " is not a Python");
  absl::StatusOr<std::string> version = ProgramTorchVersion(*python, env, paths_.workdir);
  if (!version.ok()) return std::string(version.status().message());
  if (version->empty()) return absl::StrCat(*python, " has no torch");
  if (!SameTorchRelease(*version, options_.trainer_torch_version)) {
    return absl::StrCat("its torch is ", *version, ", the trainer's LibTorch ",
                        options_.trainer_torch_version);
  }
  return "";
}

void Host::SayProgramEnded() {
  if (!store_.on_host || task_.rank() == 0 || options_.rendezvous == nullptr) return;
  options_.rendezvous->Set(absl::StrCat(kEndedKey, task_.rank()), "").IgnoreError();
}

void Host::KeepStoreForPeers() {
  if (agent_store_ == nullptr || options_.rendezvous == nullptr) return;
  const absl::Time deadline = clock_.Now() + options_.peer_timeout;
  for (int r = 1; r < task_.world_size(); ++r) {
    // Fails at once when the attempt has ended (the coordinator refuses its store's calls).
    const absl::Duration left = std::max(deadline - clock_.Now(), absl::ZeroDuration());
    if (!options_.rendezvous->Get(absl::StrCat(kEndedKey, r), left).ok()) {
      LogWarning("rank ", r, "'s program has not ended; the ranks' store goes");
      return;
    }
  }
}

ProgramResult RunProgram(const v1::Task& task, const ProgramOptions& options) {
  Host host(task, options);
  return host.Run();
}

}  // namespace trainyard::trainer::program
