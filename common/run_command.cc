#include "common/run_command.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "common/clock.h"

extern char** environ;

namespace trainyard {
namespace {

// Reads what is ready on `fd` into `into` (up to the cap); false at its end.
bool Drain(int fd, std::string& into) {
  char buffer[16384];
  const ssize_t n = read(fd, buffer, sizeof buffer);
  if (n < 0) return errno == EINTR || errno == EAGAIN;
  if (n == 0) return false;
  const size_t room = kMaxCommandOutput - std::min(kMaxCommandOutput, into.size());
  into.append(buffer, std::min(static_cast<size_t>(n), room));
  return true;
}

}  // namespace

absl::StatusOr<CommandResult> RunCommand(const std::vector<std::string>& argv,
                                         const std::vector<std::string>& extra_env,
                                         absl::Duration timeout) {
  if (argv.empty()) return absl::InvalidArgumentError("no command to run");
  int out_pipe[2];
  int err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0) return absl::InternalError(strerror(errno));
  if (pipe2(err_pipe, O_CLOEXEC) != 0) {
    close(out_pipe[0]);
    close(out_pipe[1]);
    return absl::InternalError(strerror(errno));
  }
  absl::Cleanup close_reads = [&] {
    close(out_pipe[0]);
    close(err_pipe[0]);
  };
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, out_pipe[1], 1);
  posix_spawn_file_actions_adddup2(&actions, err_pipe[1], 2);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  // extra_env replaces what this process has of the same names: a name listed twice is read
  // as its first entry by getenv.
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    const absl::string_view entry(*e);
    const absl::string_view name = entry.substr(0, entry.find('='));
    const bool replaced = std::any_of(extra_env.begin(), extra_env.end(), [&](const auto& x) {
      return absl::string_view(x).substr(0, x.find('=')) == name;
    });
    if (!replaced) env_strings.emplace_back(entry);
  }
  for (const std::string& e : extra_env) env_strings.push_back(e);
  std::vector<char*> env;
  for (std::string& e : env_strings) env.push_back(e.data());
  env.push_back(nullptr);
  // Every signal at its default and none blocked, whatever this process ignores or blocks (as
  // common/child_signals.h does for tasks).
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  sigset_t all;
  sigset_t none;
  sigfillset(&all);
  sigemptyset(&none);
  posix_spawnattr_setsigdefault(&attributes, &all);
  posix_spawnattr_setsigmask(&attributes, &none);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
  pid_t pid = 0;
  const int spawned =
      posix_spawnp(&pid, argv[0].c_str(), &actions, &attributes, args.data(), env.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  close(out_pipe[1]);
  close(err_pipe[1]);
  if (spawned == ENOENT) return absl::NotFoundError(absl::StrCat(argv[0], ": no such program"));
  if (spawned != 0) {
    return absl::InternalError(absl::StrCat("cannot run ", argv[0], ": ", strerror(spawned)));
  }
  CommandResult result;
  // A wall-clock limit on a child process: measured, not logic's time.
  const auto deadline =
      MonotonicNow() + std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout));
  bool out_open = true;
  bool err_open = true;
  bool killed = false;
  while (out_open || err_open) {
    pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
    const int64_t left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - MonotonicNow()).count();
    if (left <= 0) {
      kill(pid, SIGKILL);
      killed = true;
      break;
    }
    const int ready = poll(fds, 2, static_cast<int>(std::min<int64_t>(left, 60000)) + 1);
    if (ready < 0 && errno != EINTR) break;
    if (out_open && (fds[0].revents & (POLLIN | POLLHUP)))
      out_open = Drain(out_pipe[0], result.out);
    if (err_open && (fds[1].revents & (POLLIN | POLLHUP)))
      err_open = Drain(err_pipe[0], result.err);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFSIGNALED(status)) result.signal = WTERMSIG(status);
  if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  if (killed && result.signal == 0) result.signal = SIGKILL;
  return result;
}

std::string DescribeCommandEnd(const CommandResult& r) {
  std::string how = r.signal != 0 ? absl::StrCat("killed by signal ", r.signal)
                                  : absl::StrCat("exit ", r.exit_code);
  std::string last;
  for (absl::string_view text : {absl::string_view(r.err), absl::string_view(r.out)}) {
    for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipWhitespace())) {
      last = std::string(absl::StripAsciiWhitespace(line));
    }
    if (!last.empty()) break;
  }
  return last.empty() ? how : absl::StrCat(how, ": ", last.substr(0, 500));
}

}  // namespace trainyard
