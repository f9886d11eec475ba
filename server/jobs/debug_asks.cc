#include "server/jobs/debug_asks.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace trainyard {

std::string DebugAsks::Add(Ask ask) {
  std::string id = absl::StrCat("debug-", ++next_);
  asks_[id] = std::move(ask);
  return id;
}

void DebugAsks::Remove(const std::string& id) { asks_.erase(id); }

const DebugAsks::Ask* DebugAsks::Find(const std::string& id) const {
  auto it = asks_.find(id);
  return it == asks_.end() ? nullptr : &it->second;
}

bool DebugAsks::Done(const std::string& id) const {
  const Ask* ask = Find(id);
  return ask == nullptr || ask->answered.size() == ask->tasks.size();
}

std::vector<v1::DebugAsk> DebugAsks::For(const std::string& worker_id) const {
  std::vector<v1::DebugAsk> out;
  for (const auto& [id, ask] : asks_) {
    auto tasks = ask.tasks.find(worker_id);
    if (tasks == ask.tasks.end() || ask.answered.count(worker_id) > 0) continue;
    v1::DebugAsk& message = out.emplace_back();
    message.set_ask_id(id);
    message.set_stacks(ask.stacks);
    for (const std::string& task_id : tasks->second) message.add_task_ids(task_id);
  }
  return out;
}

absl::Status DebugAsks::Answer(const v1::ReportDebugRequest& answer) {
  auto it = asks_.find(answer.ask_id());
  if (it == asks_.end()) {
    return absl::NotFoundError(absl::StrCat("debug ask '", answer.ask_id(), "' is over"));
  }
  Ask& ask = it->second;
  auto tasks = ask.tasks.find(answer.worker_id());
  if (tasks == ask.tasks.end()) {
    return absl::PermissionDeniedError(
        absl::StrCat("worker '", answer.worker_id(), "' was not asked in ", answer.ask_id()));
  }
  for (const v1::TaskRecord& t : answer.tasks()) {
    if (std::find(tasks->second.begin(), tasks->second.end(), t.task_id()) != tasks->second.end()) {
      ask.records[t.task_id()] = t.record();
    }
  }
  ask.answered.insert(answer.worker_id());
  return absl::OkStatus();
}

}  // namespace trainyard
