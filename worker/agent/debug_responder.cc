#include "worker/agent/debug_responder.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/log.h"
#include "common/run_command.h"
#include "worker/agent/rank_record.h"

namespace trainyard {

namespace {
// Ask ids remembered, so that the coordinator's repeats of an answered ask are not read again.
constexpr size_t kRememberedAsks = 256;
}  // namespace

absl::StatusOr<std::string> ThreadStacks(int64_t pid, absl::Duration timeout) {
  absl::StatusOr<CommandResult> gdb =
      RunCommand({"gdb", "-nx", "-batch", "-p", absl::StrCat(pid), "-ex", "set pagination off",
                  "-ex", "thread apply all bt"},
                 {}, timeout);
  if (absl::IsNotFound(gdb.status())) {
    return absl::NotFoundError("no stacks: gdb is not installed on this worker");
  }
  if (!gdb.ok()) return gdb.status();
  // gdb prints the stacks even when it complains of missing debug symbols; no "Thread" line
  // means it could not attach.
  if (gdb->out.find("Thread ") == std::string::npos) {
    return absl::UnavailableError(
        absl::StrCat("no stacks: gdb could not attach to ", pid, ": ", DescribeCommandEnd(*gdb)));
  }
  // gdb's own chatter (threads found, its thread library) says nothing of the trainer.
  std::string out;
  for (absl::string_view line : absl::StrSplit(gdb->out, '\n')) {
    if (absl::StartsWith(line, "[New LWP") || absl::StartsWith(line, "[Thread debugging") ||
        absl::StartsWith(line, "Using host libthread_db")) {
      continue;
    }
    absl::StrAppend(&out, line, "\n");
  }
  if (out.size() > kMaxStackBytes) {
    out.resize(kMaxStackBytes);
    absl::StrAppend(&out, "\n(cut at ", kMaxStackBytes, " bytes)\n");
  }
  return out;
}

DebugResponder::DebugResponder(Options options, const Clock& clock)
    : options_(std::move(options)), clock_(clock), thread_([this] { Loop(); }) {}

DebugResponder::~DebugResponder() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void DebugResponder::Take(const std::string& worker_id, const std::vector<v1::DebugAsk>& asks) {
  absl::MutexLock lock(&mu_);
  for (const v1::DebugAsk& ask : asks) {
    if (!taken_.insert(ask.ask_id()).second) continue;
    taken_order_.push_back(ask.ask_id());
    if (taken_order_.size() > kRememberedAsks) {
      taken_.erase(taken_order_.front());
      taken_order_.pop_front();
    }
    queue_.emplace_back(worker_id, ask);
  }
}

v1::ReportDebugRequest DebugResponder::Answer(const std::string& worker_id,
                                              const v1::DebugAsk& ask) const {
  v1::ReportDebugRequest answer;
  answer.set_worker_id(worker_id);
  answer.set_ask_id(ask.ask_id());
  for (const std::string& task_id : ask.task_ids()) {
    const int64_t pid = options_.pid_of(task_id);
    if (pid <= 0) continue;  // not here any more: the coordinator says so
    v1::TaskRecord* task = answer.add_tasks();
    task->set_task_id(task_id);
    std::optional<v1::RankRecord> record = ReadRankRecord(options_.task_dir(task_id), pid, clock_);
    v1::RankRecord& out = *task->mutable_record();
    if (record.has_value()) {
      out = *std::move(record);
    } else {
      out.set_process_state(ProcessStateOf(pid));
      out.set_read_unix_ms(absl::ToUnixMillis(clock_.Now()));
      out.set_error("no flight record (a job's own program or a parameter-server shard)");
    }
    if (ask.stacks()) {
      absl::StatusOr<std::string> stacks = options_.stacks(pid);
      if (stacks.ok()) {
        out.set_stacks(*std::move(stacks));
      } else {
        out.set_error(out.error().empty()
                          ? std::string(stacks.status().message())
                          : absl::StrCat(out.error(), "; ", stacks.status().message()));
      }
    }
  }
  return answer;
}

void DebugResponder::Loop() {
  while (true) {
    std::pair<std::string, v1::DebugAsk> next;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](DebugResponder* r)
               ABSL_EXCLUSIVE_LOCKS_REQUIRED(r->mu_) { return r->stop_ || !r->queue_.empty(); },
          this));
      if (stop_) return;
      next = std::move(queue_.front());
      queue_.pop_front();
    }
    const v1::ReportDebugRequest answer = Answer(next.first, next.second);
    if (absl::Status s = options_.report(answer); !s.ok()) {
      // Too late (the ask is over) or the link failed: the coordinator's wait ends either way.
      LogWarning("debug ", next.second.ask_id(), ": answer not delivered: ", s.ToString());
    }
  }
}

}  // namespace trainyard
