#ifndef TRAINYARD_WORKER_AGENT_DRAIN_WATCHER_H_
#define TRAINYARD_WORKER_AGENT_DRAIN_WATCHER_H_

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "worker/agent/notice_poller.h"
#include "worker/agent/preemption_notice.h"

namespace trainyard {

struct DrainWatcherOptions {
  // What says whether this machine is being drained: Slurm's
  // `sinfo --noheader --nodes=NODE --format=%T` (the sbatch script sets it).
  std::vector<std::string> command;
  absl::Duration poll_interval = absl::Seconds(30);
  absl::Duration command_timeout = absl::Seconds(10);
  absl::Duration grace_period = absl::Seconds(25);  // the notice's deadline, from when it is seen
};

// Whether a drain command's output names a drained state: a word that is or ends with "drain",
// "drained" or "draining", in any case (Slurm's "drained", "draining", "mixed+drain").
bool SaysDrained(absl::string_view output);

// Runs the drain command every poll_interval; the first time it says the machine is drained, that
// is a notice like a preemption's (source "drain"): the machine's work is handed on and the agent
// leaves, so that the manager gets its node back. A command that fails is logged once per run of
// failures, never acted on.
class DrainWatcher {
 public:
  // `clock` dates the notice (its deadline); waits between polls use real time.
  DrainWatcher(DrainWatcherOptions options, const Clock& clock);
  ~DrainWatcher() = default;  // stops the polling (a command in flight runs to its timeout)
  DrainWatcher(const DrainWatcher&) = delete;
  DrainWatcher& operator=(const DrainWatcher&) = delete;

  // One poll: the notice when the command says drained, nullopt when not; UNAVAILABLE when it
  // cannot be run or fails.
  absl::StatusOr<std::optional<PreemptionNotice>> PollOnce();
  // Polls on a thread of its own until the first notice, passes it to `on_notice` once, stops.
  void Start(std::function<void(const PreemptionNotice&)> on_notice);

 private:
  const DrainWatcherOptions options_;
  const Clock& clock_;
  NoticePoller poller_;  // last: stopped before the rest goes
};

}  // namespace trainyard

#endif  // TRAINYARD_WORKER_AGENT_DRAIN_WATCHER_H_
