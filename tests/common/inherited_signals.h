#ifndef TRAINYARD_TESTS_COMMON_INHERITED_SIGNALS_H_
#define TRAINYARD_TESTS_COMMON_INHERITED_SIGNALS_H_

#include <signal.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

namespace trainyard::testing {

// While it lives, this process ignores `ignored` and the calling thread blocks `blocked` (what a
// fork from it passes on), as a process started from a shell's background job would; both are
// put back when it ends. For tests that what a process starts does not inherit them.
class InheritedSignals {
 public:
  InheritedSignals(std::initializer_list<int> ignored, std::initializer_list<int> blocked) {
    struct sigaction ignore = {};
    ignore.sa_handler = SIG_IGN;
    for (int sig : ignored) {
      struct sigaction before = {};
      sigaction(sig, &ignore, &before);
      saved_.emplace_back(sig, before);
    }
    sigset_t block;
    sigemptyset(&block);
    for (int sig : blocked) sigaddset(&block, sig);
    pthread_sigmask(SIG_BLOCK, &block, &mask_);
  }
  ~InheritedSignals() {
    for (const auto& [sig, before] : saved_) sigaction(sig, &before, nullptr);
    pthread_sigmask(SIG_SETMASK, &mask_, nullptr);
  }
  InheritedSignals(const InheritedSignals&) = delete;
  InheritedSignals& operator=(const InheritedSignals&) = delete;

 private:
  std::vector<std::pair<int, struct sigaction>> saved_;
  sigset_t mask_;
};

// A signal mask of /proc/PID/status text (`field`: "SigIgn", "SigBlk"; signal N is bit N - 1),
// or ~0 when the text has none.
inline uint64_t StatusSignalMask(const std::string& status, const std::string& field) {
  const size_t at = status.find(field + ":\t");
  if (at == std::string::npos) return ~uint64_t{0};
  return std::stoull(status.substr(at + field.size() + 2, 16), nullptr, 16);
}

// glibc's own two real-time signals (32 and 33), which it will not let a program reset: ignored
// in the parent (a test runner may leave them so; posix_spawn does when the parent has handlers
// for them), they stay ignored in the child, whose C library takes them back.
inline constexpr uint64_t kGlibcInternalSignals = (uint64_t{1} << 31) | (uint64_t{1} << 32);

}  // namespace trainyard::testing

#endif  // TRAINYARD_TESTS_COMMON_INHERITED_SIGNALS_H_
