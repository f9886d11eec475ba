#ifndef TRAINYARD_WORKER_AGENT_PREEMPTION_WATCHER_H_
#define TRAINYARD_WORKER_AGENT_PREEMPTION_WATCHER_H_

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "worker/agent/notice_poller.h"
#include "worker/agent/preemption_notice.h"

namespace trainyard {

struct PreemptionWatcherOptions {
  // The cloud's preemption notice endpoint, e.g.
  // http://metadata.google.internal/computeMetadata/v1/instance/preempted or
  // http://169.254.169.254/latest/meta-data/spot/instance-action.
  std::string url;
  absl::Duration poll_interval = absl::Seconds(1);
  absl::Duration request_timeout = absl::Seconds(1);  // each HTTP request, connecting included
  absl::Duration grace_period = absl::Seconds(25);    // see ParsePreemptionAnswer
};

// Polls a cloud metadata endpoint for a preemption notice (both answer shapes of
// ParsePreemptionAnswer). Every GET carries `Metadata-Flavor: Google` (GCE requires it, others
// ignore it) and goes around any HTTP proxy. When the endpoint answers 401 (AWS with IMDSv2
// required), a session token is fetched with PUT {origin}/latest/api/token and sent from then on
// (fetched again when refused); when that PUT fails the poll fails as the plain GET did.
class PreemptionWatcher {
 public:
  // `clock` dates notices (their deadlines); waits between polls use real time.
  PreemptionWatcher(PreemptionWatcherOptions options, const Clock& clock);
  // Stops the polling thread, aborting a request in flight.
  ~PreemptionWatcher();
  PreemptionWatcher(const PreemptionWatcher&) = delete;
  PreemptionWatcher& operator=(const PreemptionWatcher&) = delete;

  // One poll: nullopt when no preemption is announced. UNAVAILABLE when the endpoint cannot be
  // reached, times out or answers an HTTP error; INVALID_ARGUMENT for an answer not understood.
  // Blocks up to a few request timeouts. Not to be called while Start's thread runs.
  absl::StatusOr<std::optional<PreemptionNotice>> PollOnce();

  // Polls every poll_interval on a thread of its own until the first notice, passes it to
  // `on_notice` (on that thread, exactly once) and stops polling. Errors are logged once per
  // run of failures, never acted on. Call at most once.
  void Start(std::function<void(const PreemptionNotice&)> on_notice);

 private:
  struct Answer {
    int status = 0;
    std::string body;
  };
  // One HTTP request; UNAVAILABLE on transport errors or when aborted by the destructor.
  absl::StatusOr<Answer> Request(const std::string& method, const std::string& url,
                                 const std::vector<std::string>& headers);
  absl::StatusOr<Answer> Get();

  // Fixed at construction.
  const PreemptionWatcherOptions options_;
  const Clock& clock_;
  const std::string token_url_;  // {scheme}://{host}/latest/api/token

  // Used by PollOnce only (one caller at a time).
  void* curl_ = nullptr;  // CURL*, reused so that the connection is kept alive
  std::string token_;     // IMDSv2 session token, empty when not in use

  NoticePoller poller_;  // its stopping() also aborts a request in flight
};

}  // namespace trainyard

#endif  // TRAINYARD_WORKER_AGENT_PREEMPTION_WATCHER_H_
