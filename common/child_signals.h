#ifndef TRAINYARD_COMMON_CHILD_SIGNALS_H_
#define TRAINYARD_COMMON_CHILD_SIGNALS_H_

#include <signal.h>

namespace trainyard {

// In a child between fork and exec (async-signal-safe): every signal back to its default action
// and none blocked. Dispositions set to "ignore" and the blocked mask survive exec, and a process
// inherits them from whatever started its parent (a shell ignores SIGINT and SIGQUIT for the
// commands it runs in the background): a task starts as a program started by init would, with
// SIGQUIT, SIGUSR1, SIGXFSZ and the rest able to reach it.
inline void ResetSignalsForExec() {
  struct sigaction action = {};
  action.sa_handler = SIG_DFL;
  sigemptyset(&action.sa_mask);
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig == SIGKILL || sig == SIGSTOP) continue;
    // EINVAL for the C library's own two (32 and 33): left as they are, which its copy in the
    // program takes back as it needs them.
    sigaction(sig, &action, nullptr);
  }
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
}

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_CHILD_SIGNALS_H_
