#ifndef TRAINYARD_WORKER_AGENT_DEBUG_RESPONDER_H_
#define TRAINYARD_WORKER_AGENT_DEBUG_RESPONDER_H_

// Answers `trainyard debug`'s asks (SyncResponse.debug_asks) on a thread of its own, so that a
// debugger attaching to a trainer never holds up the agent's Syncs: reads each asked task's
// flight record and process state (rank_record.h), with its threads' stacks when asked, and
// reports them (ReportDebug).

#include <cstdint>
#include <deque>
#include <functional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "trainyard/v1/agent_service.pb.h"

namespace trainyard {

// The most of a trainer's stacks reported.
inline constexpr size_t kMaxStackBytes = 256 << 10;

// Every thread's stack of process `pid`, as `gdb -p PID -batch` prints them (cut at
// kMaxStackBytes). NOT_FOUND when gdb is not installed; UNAVAILABLE when it cannot attach or
// takes longer than `timeout`, with its last words.
absl::StatusOr<std::string> ThreadStacks(int64_t pid, absl::Duration timeout);

class DebugResponder {
 public:
  struct Options {
    std::function<std::string(const std::string& task_id)> task_dir;
    // The process of a running task; 0 when it does not run here.
    std::function<int64_t(const std::string& task_id)> pid_of;
    std::function<absl::Status(const v1::ReportDebugRequest&)> report;
    std::function<absl::StatusOr<std::string>(int64_t pid)> stacks = [](int64_t pid) {
      return ThreadStacks(pid, absl::Seconds(20));
    };
  };
  DebugResponder(Options options, const Clock& clock);
  ~DebugResponder();  // finishes the ask in hand, drops the rest
  DebugResponder(const DebugResponder&) = delete;
  DebugResponder& operator=(const DebugResponder&) = delete;

  // Queues the asks not taken before (the coordinator repeats an ask until it is answered).
  // Does not block. Thread-safe.
  void Take(const std::string& worker_id, const std::vector<v1::DebugAsk>& asks);

  // The answer to `ask` (what the thread sends). Public for tests.
  v1::ReportDebugRequest Answer(const std::string& worker_id, const v1::DebugAsk& ask) const;

 private:
  void Loop();

  const Options options_;
  const Clock& clock_;
  absl::Mutex mu_;
  std::deque<std::pair<std::string, v1::DebugAsk>> queue_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> taken_ ABSL_GUARDED_BY(mu_);  // ask ids queued, in hand or answered
  std::deque<std::string> taken_order_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: it starts in the constructor
};

}  // namespace trainyard

#endif  // TRAINYARD_WORKER_AGENT_DEBUG_RESPONDER_H_
