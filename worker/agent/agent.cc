#include "worker/agent/agent.h"

#include <unistd.h>

#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/backoff.h"
#include "common/log.h"

namespace trainyard {
namespace {

std::string Utc(absl::Time t) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", t, absl::UTCTimeZone());
}

// Whether a preemption report that failed this way may succeed if sent again.
bool Retryable(const absl::Status& status) {
  return absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status) ||
         absl::IsAborted(status) || absl::IsResourceExhausted(status) || absl::IsCancelled(status);
}

constexpr int kPreemptionReportAttempts = 3;
// While stopping, every wait is this short: the end of the last trainer ends the wait for it.
constexpr absl::Duration kStoppingPoll = absl::Milliseconds(200);

}  // namespace

class Agent::CoordinatorLogSink final : public LogSink {
 public:
  explicit CoordinatorLogSink(Agent& agent) : agent_(agent) {}
  absl::StatusOr<int64_t> Ship(const std::string& task_id, int64_t offset,
                               absl::string_view data) override {
    v1::ShipLogsRequest request;
    {
      absl::MutexLock lock(&agent_.mu_);
      request.set_worker_id(agent_.worker_id_);
    }
    request.set_task_id(task_id);
    request.set_offset(offset);
    request.set_data(std::string(data));
    CallLimits limits;
    limits.deadline = agent_.RpcDeadline(absl::Seconds(10));
    absl::StatusOr<v1::ShipLogsResponse> response = agent_.link_->ShipLogs(request, limits);
    if (!response.ok()) return response.status();
    return response->next_offset();
  }

 private:
  Agent& agent_;
};

Agent::Agent(AgentOptions options, std::unique_ptr<CoordinatorLink> link,
             std::unique_ptr<ProcessLauncher> launcher, const Clock& clock)
    : options_(std::move(options)),
      clock_(clock),
      link_(std::move(link)),
      launcher_(std::move(launcher)),
      log_sink_(std::make_unique<CoordinatorLogSink>(*this)),
      shipper_(*log_sink_, LogShipper::kMaxChunkBytes, options_.task_log_max_bytes),
      gpu_health_(options_.gpus, clock_),
      reconciler_(
          ReconcilerOptions{options_.work_dir, options_.trainer_path, options_.coordinator,
                            options_.gpus, options_.stop_grace_period,
                            [this](const std::string& task_id) {
                              absl::Status status = shipper_.Finish(task_id);
                              if (!status.ok() && !absl::IsNotFound(status)) {
                                LogWarning("cannot ship the rest of the log of task ", task_id,
                                           " now (later passes retry): ", status.message());
                              }
                              CheckGpusAfterTask(task_id);
                            },
                            options_.task_retention, options_.trainer_env, options_.isolation,
                            options_.trainer_env_pass, options_.task_uids, options_.s3_gateway,
                            [this](int gpu) { return gpu_health_.InService(gpu); }},
          *launcher_, clock_),
      gpu_guard_(
          GpuGuardOptions{options_.gpus, options_.gpu_monitor, options_.gpu_compute_check,
                          options_.gpu_poll_interval, absl::Minutes(1), absl::Milliseconds(500),
                          [this](int gpu, const std::string& reason) { OnGpuFault(gpu, reason); }},
          gpu_health_, clock_),
      debug_(DebugResponder::Options{
                 [this](const std::string& id) { return reconciler_.TaskDir(id); },
                 [this](const std::string& id) { return reconciler_.RunningPid(id); },
                 [this](const v1::ReportDebugRequest& answer) {
                   CallLimits limits;
                   limits.deadline = RpcDeadline(absl::Seconds(10));
                   return link_->ReportDebug(answer, limits);
                 }},
             clock_) {
  absl::MutexLock lock(&mu_);
  last_contact_ = clock_.Now();
}

Agent::~Agent() = default;

void Agent::Wake() {
  ++wake_seq_;
  wake_cv_.SignalAll();
  // A long poll would hold the news up to sync_wait.
  if (active_call_ != nullptr) active_call_->Cancel();
}

void Agent::Sleep(absl::Duration d, uint64_t seen) {
  absl::MutexLock lock(&mu_);
  const absl::Time deadline = std::min(clock_.Now() + d, leave_by_);
  while (wake_seq_ == seen) {
    if (clock_.WaitWithDeadline(wake_cv_, mu_, deadline)) break;
  }
}

absl::Duration Agent::SyncWait() {
  absl::MutexLock lock(&mu_);
  return lease_held_ ? options_.sync_wait : std::min(options_.sync_wait, kSyncLeaseWait);
}

absl::Time Agent::RpcDeadline(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  return std::min(clock_.Now() + timeout, leave_by_);
}

absl::StatusOr<CallLimits> Agent::BeginCall(absl::Duration timeout, uint64_t seen,
                                            CallCanceller& canceller) {
  CallLimits limits;
  limits.deadline = RpcDeadline(timeout);
  limits.wait_for_ready = true;
  limits.canceller = &canceller;
  absl::MutexLock lock(&mu_);
  if (wake_seq_ != seen) return absl::CancelledError("woken");
  active_call_ = &canceller;
  return limits;
}

void Agent::EndCall() {
  absl::MutexLock lock(&mu_);
  active_call_ = nullptr;
}

void Agent::RequestStop() {
  absl::MutexLock lock(&mu_);
  if (stop_requested_ || preemption_.has_value()) {
    LogInfo("stop requested again: already stopping");
    return;
  }
  LogInfo("stop requested: stopping trainers");
  stop_requested_ = true;
  Wake();
}

void Agent::RequestPreemption(const PreemptionNotice& notice) {
  absl::MutexLock lock(&mu_);
  if (preemption_.has_value()) {
    LogInfo("another preemption notice (", notice.source, ": ", notice.message,
            "); the deadline stays ", Utc(preemption_->deadline));
    return;
  }
  const absl::Time now = clock_.Now();
  // The agent must be gone by the deadline with its trainers reaped and their ends reported.
  const absl::Duration margin =
      std::min(absl::Seconds(2), std::max(absl::ZeroDuration(), notice.deadline - now) / 10);
  preemption_ = notice;
  // Whole milliseconds, as written to the trainers' stop-deadline files.
  kill_at_ = absl::FromUnixMillis(absl::ToUnixMillis(notice.deadline - margin));
  leave_by_ = notice.deadline - margin / 4;
  LogWarning("preemption notice (", notice.source, ": ", notice.message, "): this machine goes at ",
             Utc(notice.deadline), "; trainers are asked to save and exit by ", Utc(kill_at_));
  Wake();
}

absl::Status Agent::RegisterOnce(absl::Duration timeout, uint64_t seen) {
  v1::RegisterWorkerRequest request;
  request.set_name(options_.name);
  request.set_address(options_.address);
  request.set_slots(options_.slots);
  request.set_gpus(options_.gpus);
  request.set_memory_bytes(options_.memory_bytes);
  if (options_.isolation != nullptr) request.set_isolation(options_.isolation->Name());
  request.set_hostname(options_.hostname);
  request.set_pid(static_cast<int32_t>(getpid()));
  if (!options_.runtime.libtorch_version().empty()) *request.mutable_runtime() = options_.runtime;
  for (v1::TaskStatus& status : reconciler_.Statuses()) *request.add_tasks() = std::move(status);
  for (v1::GpuFault& fault : gpu_health_.Faults()) *request.add_gpu_faults() = std::move(fault);
  // Waits for the channel's own reconnection instead of failing at once while it backs off: a
  // restarted coordinator is found within moments of listening.
  CallCanceller canceller;
  absl::StatusOr<CallLimits> limits = BeginCall(timeout, seen, canceller);
  if (!limits.ok()) return limits.status();
  absl::StatusOr<v1::RegisterWorkerResponse> response = link_->RegisterWorker(request, *limits);
  EndCall();
  if (!response.ok()) return response.status();
  absl::MutexLock lock(&mu_);
  worker_id_ = response->worker_id().empty() ? options_.name : response->worker_id();
  known_version_ = 0;
  // A new registration: the lease stream of the last one ends, and one for this one opens.
  ++registrations_;
  lease_held_ = false;
  if (lease_call_ != nullptr) lease_call_->Cancel();
  lease_cv_.SignalAll();
  LogInfo("registered as ", worker_id_, " with ", options_.slots, " slots, ", options_.gpus,
          " GPUs at ", options_.coordinator);
  return absl::OkStatus();
}

absl::Status Agent::SyncOnce(absl::Duration wait, absl::Duration timeout, uint64_t seen) {
  v1::SyncRequest request;
  {
    absl::MutexLock lock(&mu_);
    request.set_worker_id(worker_id_);
    request.set_known_version(known_version_);
  }
  request.set_wait_ms(absl::ToInt64Milliseconds(wait));
  for (v1::TaskStatus& status : reconciler_.StatusesForSync()) {
    *request.add_tasks() = std::move(status);
  }
  for (v1::GpuFault& fault : gpu_health_.Faults()) *request.add_gpu_faults() = std::move(fault);
  CallCanceller canceller;
  absl::StatusOr<CallLimits> limits = BeginCall(wait + timeout, seen, canceller);
  if (!limits.ok()) return limits.status();
  const absl::Time start = clock_.Now();
  absl::StatusOr<v1::SyncResponse> response = link_->Sync(request, *limits);
  EndCall();
  if (!response.ok()) return response.status();
  if (response->reregister()) return absl::NotFoundError("the coordinator asks to register again");

  {
    absl::MutexLock lock(&mu_);
    const int before = desired_tasks_;
    desired_tasks_ = response->tasks_size() + response->kill_task_ids_size();
    if (before == 0 && desired_tasks_ > 0) lease_cv_.SignalAll();  // BeatLoop: beat at once
  }
  if (response->debug_asks_size() > 0) {
    std::string worker_id;
    {
      absl::MutexLock lock(&mu_);
      worker_id = worker_id_;
    }
    debug_.Take(worker_id, std::vector<v1::DebugAsk>(response->debug_asks().begin(),
                                                     response->debug_asks().end()));
  }
  if (response->return_gpus_size() > 0) {
    gpu_guard_.RequestReturn(
        std::vector<int>(response->return_gpus().begin(), response->return_gpus().end()));
  }
  std::vector<v1::Task> desired(response->tasks().begin(), response->tasks().end());
  const std::set<std::string> kill(response->kill_task_ids().begin(),
                                   response->kill_task_ids().end());
  for (const v1::TaskStatus& change : reconciler_.Apply(desired, kill)) {
    if (change.state() == v1::TASK_RUNNING) {
      shipper_.Track(change.task_id(), reconciler_.LogPath(change.task_id()));
    }
    Report(change);
  }
  bool changed;
  {
    absl::MutexLock lock(&mu_);
    changed = known_version_ != response->version();
    known_version_ = response->version();
  }
  // A coordinator that answers at once without a change would otherwise be polled in a tight
  // loop.
  if (!changed && clock_.Now() - start < absl::Milliseconds(20)) {
    Sleep(std::min(wait, absl::Milliseconds(200)), seen);
  }
  return absl::OkStatus();
}

absl::Status Agent::ReportPreemption(const PreemptionNotice& notice) {
  v1::ReportPreemptionRequest request;
  {
    absl::MutexLock lock(&mu_);
    request.set_worker_id(worker_id_.empty() ? options_.name : worker_id_);
  }
  request.set_deadline_unix_ms(absl::ToUnixMillis(notice.deadline));
  request.set_source(notice.source);
  request.set_message(notice.message);
  CallLimits limits;
  limits.deadline = RpcDeadline(absl::Seconds(1));
  return link_->ReportPreemption(request, limits);
}

void Agent::Report(const v1::TaskStatus& status) {
  v1::ReportTaskStatusRequest request;
  {
    absl::MutexLock lock(&mu_);
    request.set_worker_id(worker_id_);
  }
  *request.mutable_status() = status;
  CallLimits limits;
  limits.deadline = RpcDeadline(absl::Seconds(5));
  const absl::Status result = link_->ReportTaskStatus(request, limits);
  if (!result.ok()) {
    // The next Sync carries it as well.
    LogWarning("cannot report task ", status.task_id(), ": ", result.message());
  }
}

void Agent::SupervisorLoop() {
  do {
    SelfFence();
    const std::vector<v1::TaskStatus> ended = reconciler_.Tick();
    for (const v1::TaskStatus& change : ended) Report(change);
    reconciler_.RemoveExpiredTaskDirs();
    if (!ended.empty() && reconciler_.RunningCount() == 0) {
      // The last trainer of a stop is gone: Run need not finish a call to a coordinator that
      // may not answer.
      absl::MutexLock lock(&mu_);
      if (stop_requested_ || preemption_.has_value()) Wake();
    }
  } while (!threads_done_.WaitForNotificationWithTimeout(absl::Milliseconds(100)));
}

void Agent::SelfFence() {
  if (options_.self_fence_after <= absl::ZeroDuration()) return;
  absl::Duration without;
  {
    absl::MutexLock lock(&mu_);
    without = lease_held_ ? absl::ZeroDuration() : clock_.Now() - last_contact_;
  }
  if (without <= options_.self_fence_after) {
    fenced_ = false;
    return;
  }
  if (fenced_) return;
  fenced_ = true;
  without = absl::Trunc(without, absl::Seconds(1));
  const int killed = reconciler_.FenceAll(without);
  if (killed > 0) {
    LogError("no lease from the coordinator for ", absl::FormatDuration(without),
             " (--self_fence_after=", absl::FormatDuration(options_.self_fence_after), "): killed ",
             killed,
             " trainers, whose work the coordinator has presumably given to "
             "others; this worker takes new work once it reaches the coordinator again");
  }
}

void Agent::LeaseLoop() {
  Backoff backoff(absl::Milliseconds(100), absl::Seconds(1));
  while (true) {
    v1::LeaseRequest request;
    uint64_t registration;
    {
      absl::MutexLock lock(&mu_);
      // Not before the first registration: a stream needs the worker's id.
      while (!lease_done_ && registrations_ == 0) lease_cv_.Wait(&mu_);
      if (lease_done_) return;
      registration = registrations_;
      request.set_worker_id(worker_id_);
      request.set_beats(true);
    }
    CallCanceller canceller;
    {
      absl::MutexLock lock(&mu_);
      if (lease_done_) return;
      lease_call_ = &canceller;
    }
    CallLimits limits;
    limits.wait_for_ready = true;
    limits.canceller = &canceller;
    absl::StatusOr<v1::LeaseResponse> ended = link_->HoldLease(
        request, limits,
        [this, registration](absl::Duration beat_interval, std::shared_ptr<LeaseBeater> beater) {
          absl::MutexLock lock(&mu_);
          if (registrations_ != registration) return;
          lease_held_ = true;
          beater_ = std::move(beater);
          beat_interval_ = beat_interval;
          lease_cv_.SignalAll();  // BeatLoop
        });
    bool renewed;  // registered again meanwhile
    {
      absl::MutexLock lock(&mu_);
      lease_call_ = nullptr;
      beater_ = nullptr;
      if (lease_held_) last_contact_ = clock_.Now();  // held until now
      lease_held_ = false;
      if (lease_done_) return;
      renewed = registrations_ != registration;
    }
    if (absl::IsUnimplemented(ended.status())) {
      LogInfo("the coordinator keeps leases by Sync: polling every ",
              absl::FormatDuration(kSyncLeaseWait));
      return;
    }
    if (renewed) {
      backoff.Reset();
      continue;
    }
    absl::Duration delay;
    if (ended.ok()) {
      // Refused: the coordinator no longer knows this registration. Sync hears the same and
      // registers again, which starts the next stream.
      delay = absl::Seconds(1);
    } else {
      delay = backoff.Next();
      if (backoff.attempts() == 1) {
        LogWarning("lease stream to the coordinator ended: ", ended.status().message(),
                   "; opening another");
      }
    }
    absl::MutexLock lock(&mu_);
    const absl::Time until = clock_.Now() + delay;
    while (!lease_done_ && registrations_ == registration) {
      if (clock_.WaitWithDeadline(lease_cv_, mu_, until)) break;
    }
    if (ended.ok() || registrations_ != registration) backoff.Reset();
  }
}

bool Agent::Busy() const {
  {
    absl::MutexLock lock(&mu_);
    if (desired_tasks_ > 0) return true;
  }
  // Tasks the coordinator no longer lists but whose trainers have not ended (or been reported).
  return reconciler_.RunningCount() > 0;
}

void Agent::BeatLoop() {
  while (true) {
    std::shared_ptr<LeaseBeater> beater;
    absl::Duration interval;
    bool asked;  // the coordinator's last answer listed tasks
    {
      absl::MutexLock lock(&mu_);
      if (lease_done_) return;
      beater = beater_;
      interval = beat_interval_;
      asked = desired_tasks_ > 0;
    }
    const bool busy = beater != nullptr && interval > absl::ZeroDuration() && Busy();
    // A failed beat needs nothing more: the stream has ended, and LeaseLoop opens another.
    if (busy) beater->Beat();
    absl::MutexLock lock(&mu_);
    if (busy) {
      // Beats keep time by the real clock: they are the transport's business, like its pings.
      lease_cv_.WaitWithTimeout(&mu_, interval);
      continue;
    }
    // Idle until what made it idle changes: tasks (trainers start only when asked for), a new
    // stream or interval, the end. A change made since the first lock is seen here, so no wake
    // is lost.
    while (!lease_done_ && beater_ == beater && beat_interval_ == interval &&
           (desired_tasks_ > 0) == asked) {
      lease_cv_.Wait(&mu_);
    }
  }
}

void Agent::EndLease() {
  absl::MutexLock lock(&mu_);
  lease_done_ = true;
  if (lease_call_ != nullptr) lease_call_->Cancel();
  lease_cv_.SignalAll();
}

void Agent::ShipperLoop() {
  bool failing = false;
  do {
    absl::Status status = shipper_.ShipAll();
    if (!status.ok() && !failing) LogWarning("cannot ship logs: ", status.message());
    failing = !status.ok();
  } while (!threads_done_.WaitForNotificationWithTimeout(absl::Milliseconds(500)));
}

// What the agent's main loop keeps from one round to the next.
struct Agent::LoopState {
  Backoff backoff;
  bool registered = false;
  bool connected = false;  // the last call to the coordinator succeeded
  bool stopping = false;
  bool preempting = false;
  bool report_pending = false;  // the preemption has yet to reach the coordinator
  int report_attempts = 0;
  absl::Time next_report = absl::InfinitePast();
};

// Reported before the trainers hear of it, so that the coordinator reads their exits as part of
// the preemption; but only one quick try first: the deadline is theirs too.
void Agent::ReportPreemptionIfDue(LoopState& s, const PreemptionNotice& notice) {
  if (!s.report_pending || s.report_attempts >= kPreemptionReportAttempts ||
      clock_.Now() < s.next_report) {
    return;
  }
  absl::Status status = ReportPreemption(notice);
  ++s.report_attempts;
  if (status.ok()) {
    LogInfo("reported the preemption to the coordinator");
    s.report_pending = false;
    return;
  }
  // Best effort: the coordinator also learns of it from the trainers' exits.
  const bool retry = Retryable(status) && s.report_attempts < kPreemptionReportAttempts;
  LogWarning("cannot report the preemption to the coordinator: ", status.ToString(),
             retry ? "; trying again" : "");
  if (!retry) s.report_pending = false;
  s.next_report = clock_.Now() + absl::Milliseconds(300) * s.report_attempts;
}

void Agent::BeginStopIfAsked(LoopState& s, bool preemption_begins, bool stop_requested,
                             absl::Time kill_at) {
  if (preemption_begins) {
    s.stopping = true;
    const int running = reconciler_.RunningCount();
    if (running > 0) LogInfo("asking ", running, " trainers to save and exit");
    // Also brings forward the kill times of a plain stop in progress.
    reconciler_.StopAllBy(kill_at);
  } else if (stop_requested && !s.stopping) {
    s.stopping = true;
    const int running = reconciler_.RunningCount();
    if (running > 0) LogInfo("stopping ", running, " trainers");
    reconciler_.StopAll();
  }
}

// While stopping, calls are short and waits too: the coordinator must hear of each exit at once,
// and the end of the last trainer ends the agent.
void Agent::Contact(LoopState& s, uint64_t seen) {
  absl::Status status;
  if (!s.registered) {
    status = RegisterOnce(s.stopping ? absl::Seconds(2) : absl::Seconds(10), seen);
    s.registered = status.ok();
    if (s.registered && s.preempting && !s.report_pending) {
      // A coordinator that had forgotten this worker has forgotten its preemption too.
      s.report_pending = true;
      s.report_attempts = 0;
    }
  } else {
    status = s.stopping ? SyncOnce(kStoppingPoll, absl::Seconds(2), seen)
                        : SyncOnce(SyncWait(), absl::Seconds(10), seen);
    if (absl::IsNotFound(status)) {
      LogWarning(status.message(), "; registering again");
      s.registered = false;
      return;
    }
  }
  if (status.ok()) {
    {
      absl::MutexLock lock(&mu_);
      last_contact_ = clock_.Now();
    }
    s.connected = true;
    if (s.backoff.attempts() > 0) LogInfo("connected to the coordinator again");
    s.backoff.Reset();
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    if (wake_seq_ != seen) return;  // cancelled for news, not failed
  }
  s.connected = false;
  const bool first_failure = s.backoff.attempts() == 0;
  const absl::Duration delay = s.stopping ? kStoppingPoll : s.backoff.Next();
  if (s.stopping) s.backoff.Next();  // counts the failure
  // Said once while stopping: the waits are short and the lines would be many.
  if (!s.stopping || first_failure) {
    LogWarning("cannot ", s.registered ? "sync" : "register", " with the coordinator at ",
               options_.coordinator, ": ", status.message(), "; trying again in ",
               absl::FormatDuration(absl::Trunc(delay, absl::Milliseconds(1))));
  }
  Sleep(delay, seen);
}

int Agent::Run() {
  const int leftovers = reconciler_.CleanUpLeftovers();
  if (leftovers > 0) LogInfo("killed ", leftovers, " trainers left over from an earlier run");
  // Before the first registration, which says which GPUs are out of service.
  gpu_guard_.Preflight();
  gpu_guard_.Start();
  std::thread supervisor([this] { SupervisorLoop(); });
  std::thread shipper([this] { ShipperLoop(); });
  std::thread lease([this] { LeaseLoop(); });
  std::thread beats([this] { BeatLoop(); });

  LoopState s;
  while (true) {
    uint64_t seen;
    bool stop_requested;
    std::optional<PreemptionNotice> notice;
    absl::Time kill_at, leave_by;
    {
      absl::MutexLock lock(&mu_);
      seen = wake_seq_;
      stop_requested = stop_requested_;
      notice = preemption_;
      kill_at = kill_at_;
      leave_by = leave_by_;
    }
    if (clock_.Now() >= leave_by) {
      LogWarning("leaving now: the machine goes at ", Utc(notice->deadline));
      break;
    }
    const bool preemption_begins = notice.has_value() && !s.preempting;
    if (preemption_begins) {
      s.preempting = true;
      s.report_pending = true;
      s.report_attempts = 0;
      s.next_report = absl::InfinitePast();
    }
    if (notice.has_value()) ReportPreemptionIfDue(s, *notice);
    BeginStopIfAsked(s, preemption_begins, stop_requested, kill_at);
    if (s.stopping && reconciler_.RunningCount() == 0 && !s.report_pending) break;
    Contact(s, seen);
  }

  for (const v1::TaskStatus& change : reconciler_.Tick()) Report(change);
  threads_done_.Notify();
  supervisor.join();
  shipper.join();
  // Reports of the last exits may have failed; a Sync carries every final status once more.
  if (s.registered && s.connected) {
    uint64_t seen;
    {
      absl::MutexLock lock(&mu_);
      seen = wake_seq_;
    }
    SyncOnce(absl::ZeroDuration(), absl::Seconds(2), seen).IgnoreError();
  }
  EndLease();
  lease.join();
  beats.join();
  gpu_guard_.Stop();
  LogInfo("stopped");
  return 0;
}

}  // namespace trainyard
