#include "worker/agent/subprocess.h"

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <climits>
#include <cstring>
#include <map>

#include "absl/strings/str_cat.h"
#include "common/child_signals.h"
#include "common/exit_codes.h"

extern char** environ;

namespace trainyard {
namespace {

absl::Status ErrnoStatus(int err, absl::string_view what) {
  const std::string message = absl::StrCat(what, ": ", std::strerror(err));
  switch (err) {
    case ENOENT:
      return absl::NotFoundError(message);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    default:
      return absl::InternalError(message);
  }
}

ExitInfo FromWaitStatus(int status) {
  ExitInfo exit;
  if (WIFSIGNALED(status)) {
    exit.signal = WTERMSIG(status);
    exit.exit_code = 128 + exit.signal;
  } else if (WIFEXITED(status)) {
    exit.exit_code = WEXITSTATUS(status);
  }
  return exit;
}

// Only async-signal-safe calls from here to exec: the parent may have other threads.
[[noreturn]] void RunChild(const SubprocessOptions& options, char* const* argv, char* const* envp,
                           pid_t parent, int error_fd) {
  auto fail = [error_fd](int stage) {
    const int err[2] = {stage, errno};
    ssize_t ignored = write(error_fd, err, sizeof(err));
    (void)ignored;
    _exit(127);
  };
  if (options.new_process_group && setpgid(0, 0) < 0) fail(0);
  if (options.die_with_parent) {
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) fail(0);
    // The parent may have died before prctl took effect.
    if (getppid() != parent) _exit(127);
  }
  ResetSignalsForExec();
  if (!options.output_file.empty()) {
    const int in = open("/dev/null", O_RDONLY);
    if (in < 0) fail(1);
    const int out = open(options.output_file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW,
                         static_cast<mode_t>(options.output_mode));
    if (out < 0) fail(1);
    if (dup2(in, 0) < 0 || dup2(out, 1) < 0 || dup2(out, 2) < 0) fail(1);
    if (in > 2) close(in);
    if (out > 2) close(out);
  }
  if (!options.working_dir.empty() && chdir(options.working_dir.c_str()) != 0) fail(2);
  for (const std::string& procs : options.join_cgroups) {
    const int fd = open(procs.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0 || write(fd, "0", 1) != 1) fail(4);
    close(fd);
  }
  if (options.uid >= 0) {
    const gid_t gid = static_cast<gid_t>(options.uid);
    if (setgroups(0, nullptr) != 0 || setgid(gid) != 0 ||
        setuid(static_cast<uid_t>(options.uid)) != 0) {
      fail(5);
    }
  }
  if (std::strchr(argv[0], '/') != nullptr) {
    execve(argv[0], argv, envp);
  } else {
    execvpe(argv[0], argv, envp);
  }
  fail(3);
  _exit(127);
}

}  // namespace

absl::StatusOr<pid_t> StartSubprocess(const SubprocessOptions& options) {
  if (options.argv.empty()) return absl::InvalidArgumentError("empty argv");
  // Everything the child needs is prepared before fork.
  std::vector<char*> argv;
  for (const std::string& arg : options.argv) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  std::map<std::string, std::string> env_map;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string entry(*e);
    const size_t eq = entry.find('=');
    if (eq == std::string::npos) continue;
    if (options.inherit && !options.inherit(absl::string_view(entry).substr(0, eq))) continue;
    env_map[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  for (const auto& [name, value] : options.env) env_map[name] = value;
  std::vector<std::string> env_strings;
  env_strings.reserve(env_map.size());
  for (const auto& [name, value] : env_map) env_strings.push_back(absl::StrCat(name, "=", value));
  std::vector<char*> envp;
  for (const std::string& entry : env_strings) envp.push_back(const_cast<char*>(entry.c_str()));
  envp.push_back(nullptr);

  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) return ErrnoStatus(errno, "pipe2");
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    const int err = errno;
    close(pipe_fds[0]);
    close(pipe_fds[1]);
    return ErrnoStatus(err, "fork");
  }
  if (pid == 0) {
    close(pipe_fds[0]);
    RunChild(options, argv.data(), envp.data(), parent, pipe_fds[1]);
  }
  close(pipe_fds[1]);
  int err[2] = {0, 0};
  ssize_t got;
  do {
    got = read(pipe_fds[0], err, sizeof(err));
  } while (got < 0 && errno == EINTR);
  close(pipe_fds[0]);
  if (got == 0) return pid;  // exec closed the pipe: the program runs
  int status;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (got != static_cast<ssize_t>(sizeof(err))) {
    return absl::InternalError(absl::StrCat("cannot start ", options.argv[0]));
  }
  static constexpr const char* kStages[] = {
      "set up the process", "open its output file", "enter its working directory",
      "run the program",    "join its cgroup",      "switch to its user"};
  const int stage = err[0] >= 0 && err[0] <= 5 ? err[0] : 0;
  std::string what = absl::StrCat("cannot ", kStages[stage], " for ", options.argv[0]);
  if (err[0] == 1) absl::StrAppend(&what, " (", options.output_file, ")");
  if (err[0] == 2) absl::StrAppend(&what, " (", options.working_dir, ")");
  if (err[0] == 5) absl::StrAppend(&what, " (uid ", options.uid, ")");
  return ErrnoStatus(err[1], what);
}

absl::StatusOr<std::optional<ExitInfo>> TryWaitSubprocess(pid_t pid) {
  int status;
  pid_t got;
  do {
    got = waitpid(pid, &status, WNOHANG);
  } while (got < 0 && errno == EINTR);
  if (got < 0) {
    return absl::FailedPreconditionError(absl::StrCat("waitpid ", pid, ": ", std::strerror(errno)));
  }
  if (got == 0) return std::optional<ExitInfo>();
  return std::optional<ExitInfo>(FromWaitStatus(status));
}

absl::StatusOr<ExitInfo> WaitSubprocess(pid_t pid) {
  int status;
  pid_t got;
  do {
    got = waitpid(pid, &status, 0);
  } while (got < 0 && errno == EINTR);
  if (got < 0) {
    return absl::FailedPreconditionError(absl::StrCat("waitpid ", pid, ": ", std::strerror(errno)));
  }
  return FromWaitStatus(status);
}

absl::Status SignalSubprocess(pid_t pid, int sig, bool group) {
  if (pid <= 0) return absl::InvalidArgumentError(absl::StrCat("bad pid ", pid));
  if (kill(group ? -pid : pid, sig) == 0) return absl::OkStatus();
  if (errno == ESRCH && group && kill(pid, sig) == 0) return absl::OkStatus();
  if (errno == ESRCH) return absl::OkStatus();
  return ErrnoStatus(errno, absl::StrCat("kill ", pid));
}

std::string DescribeExit(const ExitInfo& exit) {
  return trainyard::DescribeExit(exit.exit_code, exit.signal);
}

int DetectGpuCount(const std::string& dev) {
  DIR* dir = opendir(dev.c_str());
  if (dir == nullptr) return 0;
  int count = 0;
  while (struct dirent* entry = readdir(dir)) {
    const char* name = entry->d_name;
    if (std::strncmp(name, "nvidia", 6) != 0 || name[6] == '\0') continue;
    bool digits = true;
    for (const char* c = name + 6; *c != '\0'; ++c) digits &= std::isdigit(*c) != 0;
    count += digits;
  }
  closedir(dir);
  return count;
}

std::string SelfExecutableDir() {
  char buffer[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buffer, sizeof(buffer) - 1);
  if (n <= 0) return "";
  std::string path(buffer, n);
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash);
}

}  // namespace trainyard
