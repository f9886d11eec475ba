#ifndef TRAINYARD_WORKER_AGENT_NOTICE_POLLER_H_
#define TRAINYARD_WORKER_AGENT_NOTICE_POLLER_H_

#include <functional>
#include <optional>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "worker/agent/preemption_notice.h"

namespace trainyard {

// The polling that the agent's notice sources share (a cloud's metadata endpoint, a drain
// command): on a thread of its own, a poll every `interval` until the first notice, which goes
// to `on_notice` once, on that thread, before the polling stops. A poll that fails is never acted
// on; `failed` hears the first failure of each run of them, `recovered` the poll that works
// after one, so that a source that is down is said once rather than at every poll.
class NoticePoller {
 public:
  struct Hooks {
    std::function<absl::StatusOr<std::optional<PreemptionNotice>>()> poll;
    std::function<void(const PreemptionNotice&)> on_notice;
    std::function<void(const absl::Status&)> failed;
    std::function<void()> recovered;
  };

  NoticePoller() = default;
  ~NoticePoller() { Stop(); }
  NoticePoller(const NoticePoller&) = delete;
  NoticePoller& operator=(const NoticePoller&) = delete;

  // At most once.
  void Start(absl::Duration interval, Hooks hooks) {
    thread_ = std::thread([this, interval, hooks = std::move(hooks)] {
      bool failing = false;
      do {
        absl::StatusOr<std::optional<PreemptionNotice>> polled = hooks.poll();
        if (stopping_.HasBeenNotified()) return;
        if (!polled.ok()) {
          if (!failing) hooks.failed(polled.status());
          failing = true;
          continue;
        }
        if (failing) hooks.recovered();
        failing = false;
        if (polled->has_value()) {
          hooks.on_notice(**polled);
          return;
        }
      } while (!stopping_.WaitForNotificationWithTimeout(interval));
    });
  }

  // Ends the polling and waits for its thread (a poll in flight ends first). Idempotent.
  void Stop() {
    if (!stopping_.HasBeenNotified()) stopping_.Notify();
    if (thread_.joinable()) thread_.join();
  }

  // Notified once Stop is called: a poll that can be cut short watches it.
  const absl::Notification& stopping() const { return stopping_; }

 private:
  absl::Notification stopping_;
  std::thread thread_;
};

}  // namespace trainyard

#endif  // TRAINYARD_WORKER_AGENT_NOTICE_POLLER_H_
