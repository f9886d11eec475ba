#include "worker/agent/agent.h"

#include <fstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "worker/agent/backoff.h"

namespace trainyard {
namespace {

absl::Status FromGrpc(const grpc::Status& status) {
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

void SetDeadline(grpc::ClientContext& context, absl::Duration timeout) {
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}

}  // namespace

int64_t MachineMemoryBytes() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    if (!absl::StartsWith(line, "MemTotal:")) continue;
    std::vector<absl::string_view> parts =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    int64_t kib = 0;
    if (parts.size() >= 2 && absl::SimpleAtoi(parts[1], &kib)) return kib * 1024;
  }
  return 0;
}

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
    v1::ShipLogsResponse response;
    grpc::ClientContext context;
    SetDeadline(context, absl::Seconds(10));
    grpc::Status status = agent_.stub_->ShipLogs(&context, request, &response);
    if (!status.ok()) return FromGrpc(status);
    return response.next_offset();
  }

 private:
  Agent& agent_;
};

Agent::Agent(AgentOptions options, std::shared_ptr<grpc::Channel> channel)
    : options_(std::move(options)),
      stub_(v1::AgentService::NewStub(channel)),
      launcher_(NewRealProcessLauncher()),
      log_sink_(std::make_unique<CoordinatorLogSink>(*this)),
      shipper_(*log_sink_),
      reconciler_(ReconcilerOptions{options_.work_dir, options_.trainer_path, options_.coordinator,
                                    options_.gpus, options_.stop_grace_period,
                                    [this](const std::string& task_id) {
                                      absl::Status status = shipper_.Finish(task_id);
                                      if (!status.ok() && !absl::IsNotFound(status)) {
                                        LogWarning("cannot ship the rest of the log of task ",
                                                   task_id, " now (later passes retry): ",
                                                   status.message());
                                      }
                                    }},
                  *launcher_, RealClock::Get()) {}

Agent::~Agent() = default;

void Agent::RequestStop(StopReason reason) {
  absl::MutexLock lock(&mu_);
  if (stop_requested_.HasBeenNotified()) return;
  switch (reason) {
    case StopReason::kTerminationSignal:
      LogInfo("termination requested: stopping trainers");
      break;
  }
  stop_requested_.Notify();
  if (active_call_ != nullptr) active_call_->TryCancel();
}

bool Agent::WaitOrStop(absl::Duration d) {
  return stop_requested_.WaitForNotificationWithTimeout(d);
}

bool Agent::Register() {
  Backoff backoff;
  while (!stop_requested_.HasBeenNotified()) {
    v1::RegisterWorkerRequest request;
    request.set_name(options_.name);
    request.set_address(options_.address);
    request.set_slots(options_.slots);
    request.set_gpus(options_.gpus);
    request.set_memory_bytes(options_.memory_bytes);
    request.set_hostname(options_.hostname);
    for (v1::TaskStatus& status : reconciler_.Statuses()) *request.add_tasks() = std::move(status);
    v1::RegisterWorkerResponse response;
    grpc::ClientContext context;
    SetDeadline(context, absl::Seconds(10));
    {
      absl::MutexLock lock(&mu_);
      active_call_ = &context;
    }
    grpc::Status status = stub_->RegisterWorker(&context, request, &response);
    {
      absl::MutexLock lock(&mu_);
      active_call_ = nullptr;
      if (status.ok()) {
        worker_id_ = response.worker_id().empty() ? options_.name : response.worker_id();
        known_version_ = 0;
        LogInfo("registered as ", worker_id_, " with ", options_.slots, " slots, ", options_.gpus,
                " GPUs at ", options_.coordinator);
        return true;
      }
    }
    if (stop_requested_.HasBeenNotified()) break;
    const absl::Duration delay = backoff.Next();
    LogWarning("cannot register with the coordinator at ", options_.coordinator, ": ",
               status.error_message(), "; retrying in ",
               absl::FormatDuration(absl::Trunc(delay, absl::Milliseconds(1))));
    WaitOrStop(delay);
  }
  return false;
}

absl::Status Agent::SyncOnce() {
  v1::SyncRequest request;
  {
    absl::MutexLock lock(&mu_);
    request.set_worker_id(worker_id_);
    request.set_known_version(known_version_);
  }
  request.set_wait_ms(absl::ToInt64Milliseconds(options_.sync_wait));
  for (v1::TaskStatus& status : reconciler_.StatusesForSync()) {
    *request.add_tasks() = std::move(status);
  }
  v1::SyncResponse response;
  grpc::ClientContext context;
  SetDeadline(context, options_.sync_wait + absl::Seconds(10));
  {
    absl::MutexLock lock(&mu_);
    if (stop_requested_.HasBeenNotified()) return absl::CancelledError("stopping");
    active_call_ = &context;
  }
  const absl::Time start = absl::Now();
  grpc::Status status = stub_->Sync(&context, request, &response);
  {
    absl::MutexLock lock(&mu_);
    active_call_ = nullptr;
  }
  if (!status.ok()) return FromGrpc(status);
  if (response.reregister()) return absl::NotFoundError("the coordinator asks to register again");

  std::vector<v1::Task> desired(response.tasks().begin(), response.tasks().end());
  for (const v1::TaskStatus& change : reconciler_.Apply(desired)) {
    if (change.state() == v1::TASK_RUNNING) {
      shipper_.Track(change.task_id(), reconciler_.LogPath(change.task_id()));
    }
    Report(change);
  }
  bool changed;
  {
    absl::MutexLock lock(&mu_);
    changed = known_version_ != response.version();
    known_version_ = response.version();
  }
  // A coordinator that answers at once without a change would otherwise be polled in a tight
  // loop.
  if (!changed && absl::Now() - start < absl::Milliseconds(20)) {
    WaitOrStop(std::min(options_.sync_wait, absl::Milliseconds(200)));
  }
  return absl::OkStatus();
}

void Agent::Report(const v1::TaskStatus& status) {
  v1::ReportTaskStatusRequest request;
  {
    absl::MutexLock lock(&mu_);
    request.set_worker_id(worker_id_);
  }
  *request.mutable_status() = status;
  v1::ReportTaskStatusResponse response;
  grpc::ClientContext context;
  SetDeadline(context, absl::Seconds(5));
  grpc::Status result = stub_->ReportTaskStatus(&context, request, &response);
  if (!result.ok()) {
    // The next Sync carries it as well.
    LogWarning("cannot report task ", status.task_id(), ": ", result.error_message());
  }
}

void Agent::SupervisorLoop() {
  do {
    for (const v1::TaskStatus& change : reconciler_.Tick()) Report(change);
  } while (!threads_done_.WaitForNotificationWithTimeout(absl::Milliseconds(100)));
}

void Agent::ShipperLoop() {
  bool failing = false;
  do {
    absl::Status status = shipper_.ShipAll();
    if (!status.ok() && !failing) LogWarning("cannot ship logs: ", status.message());
    failing = !status.ok();
  } while (!threads_done_.WaitForNotificationWithTimeout(absl::Milliseconds(500)));
}

int Agent::Run() {
  const int leftovers = reconciler_.CleanUpLeftovers();
  if (leftovers > 0) LogInfo("killed ", leftovers, " trainers left over from an earlier run");
  std::thread supervisor([this] { SupervisorLoop(); });
  std::thread shipper([this] { ShipperLoop(); });

  if (Register()) {
    Backoff backoff;
    while (!stop_requested_.HasBeenNotified()) {
      absl::Status status = SyncOnce();
      if (status.ok()) {
        if (backoff.attempts() > 0) LogInfo("connected to the coordinator again");
        backoff.Reset();
        continue;
      }
      if (stop_requested_.HasBeenNotified()) break;
      if (absl::IsNotFound(status)) {
        LogWarning(status.message(), "; registering again");
        if (!Register()) break;
        continue;
      }
      const absl::Duration delay = backoff.Next();
      LogWarning("cannot sync with the coordinator at ", options_.coordinator, ": ",
                 status.message(), "; retrying in ",
                 absl::FormatDuration(absl::Trunc(delay, absl::Milliseconds(1))));
      WaitOrStop(delay);
    }
  }

  // Shutdown. This is where a preemption notice will differ: ask the trainers to checkpoint
  // first and report the preemption to the coordinator.
  const int running = reconciler_.RunningCount();
  if (running > 0) LogInfo("stopping ", running, " trainers");
  reconciler_.StopAll();
  // The supervisor thread reaps them, escalates to SIGKILL after the grace period and reports.
  while (reconciler_.RunningCount() > 0) absl::SleepFor(absl::Milliseconds(20));
  for (const v1::TaskStatus& change : reconciler_.Tick()) Report(change);
  threads_done_.Notify();
  supervisor.join();
  shipper.join();
  LogInfo("stopped");
  return 0;
}

}  // namespace trainyard
