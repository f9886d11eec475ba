// The queue commands: queue create, update, delete (admins), list, describe.

#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/commands.h"
#include "client/format.h"
#include "client/views.h"
#include "common/clock.h"

namespace trainyard::cli {
namespace {

// Applies the flags given to `queue`: false (the error printed) for a bad value.
bool ApplyQueueFlags(const ParsedArgs& args, v1::Queue& queue) {
  auto limit = [&args](const char* flag, int32_t* out) {
    if (!args.Has(flag)) return true;
    const std::string text = args.Get(flag);
    int32_t value = 0;
    if (text == "unlimited") {
      *out = -1;
      return true;
    }
    if (!absl::SimpleAtoi(text, &value) || value < 0) {
      std::cerr << "error: --" << flag << " takes a number >= 0 or 'unlimited', got '" << text
                << "'\n";
      return false;
    }
    *out = value;
    return true;
  };
  int32_t slots = queue.quota_slots();
  int32_t gpus = queue.quota_gpus();
  int32_t borrow_slots = queue.borrow_slots();
  int32_t borrow_gpus = queue.borrow_gpus();
  if (!limit("slots", &slots) || !limit("gpus", &gpus) || !limit("borrow-slots", &borrow_slots) ||
      !limit("borrow-gpus", &borrow_gpus)) {
    return false;
  }
  queue.set_quota_slots(slots);
  queue.set_quota_gpus(gpus);
  queue.set_borrow_slots(borrow_slots);
  queue.set_borrow_gpus(borrow_gpus);
  if (args.Has("weight")) {
    double weight = 0;
    if (!absl::SimpleAtod(args.Get("weight"), &weight) || !(weight > 0)) {
      std::cerr << "error: --weight takes a number > 0, got '" << args.Get("weight") << "'\n";
      return false;
    }
    queue.set_weight(weight);
  }
  if (args.Has("max-priority")) {
    const std::string text = args.Get("max-priority");
    int32_t cap = 0;
    if (text == "none") {
      queue.clear_max_priority();
    } else if (absl::SimpleAtoi(text, &cap)) {
      queue.set_max_priority(cap);
    } else {
      std::cerr << "error: --max-priority takes a priority (an integer) or 'none', got '" << text
                << "'\n";
      return false;
    }
  }
  if (args.Has("users")) {
    queue.clear_users();
    for (absl::string_view user : absl::StrSplit(args.Get("users"), ',', absl::SkipEmpty())) {
      queue.add_users(std::string(user));
    }
  }
  return true;
}

std::string Limit(int32_t n) { return n < 0 ? "unlimited" : absl::StrCat(n); }

// "6/8 (+2)": held of the quota, and what is borrowed beyond it.
std::string Use(int32_t used, int32_t quota, int32_t borrowed) {
  std::string out = absl::StrCat(used, "/", quota < 0 ? "-" : absl::StrCat(quota));
  if (borrowed > 0) absl::StrAppend(&out, " (+", borrowed, ")");
  return out;
}

std::string Users(const v1::Queue& q) {
  return q.users_size() == 0 ? "everyone" : absl::StrJoin(q.users(), ",");
}

// The highest priority its users' jobs may ask for; "-": no cap.
std::string MaxPriority(const v1::Queue& q) {
  return q.has_max_priority() ? absl::StrCat(q.max_priority()) : "-";
}

}  // namespace

int Client::ListQueuesInto(v1::ListQueuesResponse* response) {
  return Call(*stub_, &v1::JobService::Stub::ListQueues, v1::ListQueuesRequest(), response)
      .value_or(kExitSucceeded);
}

// queue create / update NAME: a new queue, or one changed, with the flags' settings.
int Client::WriteQueue(const std::string& action, const std::string& name) {
  v1::Queue queue;
  queue.set_name(name);
  if (action == "create") {
    // Unless told otherwise: no quota of its own, borrowing what others leave idle.
    queue.set_borrow_slots(-1);
    queue.set_borrow_gpus(-1);
    queue.set_weight(1);
  } else {
    v1::ListQueuesResponse current;
    if (int failed = ListQueuesInto(&current); failed != kExitSucceeded) return failed;
    bool found = false;
    for (const v1::Queue& q : current.queues()) {
      if (q.name() == name && !q.status().implicit()) {
        queue = q;
        found = true;
      }
    }
    if (!found) {
      std::cerr << "error: no queue '" << name << "'"
                << (name == "default" ? " (create it to give the default queue a quota)" : "")
                << "\n";
      return kExitRpcError;
    }
    queue.clear_status();
  }
  if (!ApplyQueueFlags(args_, queue)) return kExitUsage;
  v1::Queue response;
  std::optional<int> failed;
  if (action == "create") {
    v1::CreateQueueRequest request;
    *request.mutable_queue() = queue;
    failed = Call(*admin_, &v1::AdminService::Stub::CreateQueue, request, &response);
  } else {
    v1::UpdateQueueRequest request;
    *request.mutable_queue() = queue;
    failed = Call(*admin_, &v1::AdminService::Stub::UpdateQueue, request, &response);
  }
  if (failed) return *failed;
  if (Json()) {
    std::cout << ToJson(response);
  } else {
    std::cout << "queue " << name << (action == "create" ? " created" : " updated") << ": quota "
              << Limit(response.quota_slots()) << " slots, " << Limit(response.quota_gpus())
              << " GPUs; borrowing up to " << Limit(response.borrow_slots()) << " slots, "
              << Limit(response.borrow_gpus()) << " GPUs; weight " << response.weight()
              << "; users " << Users(response) << "; users' max priority "
              << (response.has_max_priority() ? MaxPriority(response) : "none") << "\n";
  }
  return kExitSucceeded;
}

int Client::DeleteQueue(const std::string& name) {
  v1::DeleteQueueRequest request;
  request.set_name(name);
  v1::DeleteQueueResponse response;
  if (std::optional<int> failed =
          Call(*admin_, &v1::AdminService::Stub::DeleteQueue, request, &response)) {
    return *failed;
  }
  std::cout << "queue " << name << " deleted\n";
  return kExitSucceeded;
}

int Client::ListQueues(const v1::ListQueuesResponse& response) {
  if (Json()) {
    std::cout << ToJson(response);
    return kExitSucceeded;
  }
  std::vector<std::vector<std::string>> rows;
  for (const v1::Queue& q : response.queues()) {
    const v1::QueueStatus& s = q.status();
    rows.push_back({q.name(), absl::StrCat(q.weight() > 0 ? q.weight() : 1),
                    Use(s.used_slots(), s.quota_slots(), s.borrowed_slots()),
                    Use(s.used_gpus(), s.quota_gpus(), s.borrowed_gpus()),
                    absl::StrCat(s.pending_jobs()), absl::StrCat(s.running_jobs()),
                    absl::StrCat(s.preemptions()), MaxPriority(q), Users(q)});
  }
  std::cout << Table({"QUEUE", "WEIGHT", "SLOTS USED/QUOTA", "GPUS USED/QUOTA", "PENDING",
                      "RUNNING", "PREEMPTED", "MAX PRIORITY", "USERS"},
                     rows);
  return kExitSucceeded;
}

// queue describe NAME: the queue and its jobs not finished, in line order.
int Client::DescribeQueueAndJobs(const v1::ListQueuesResponse& response, const std::string& name) {
  const v1::Queue* found = nullptr;
  for (const v1::Queue& q : response.queues()) {
    if (q.name() == name) found = &q;
  }
  if (found == nullptr) {
    std::cerr << "error: no queue '" << name << "'\n";
    return kExitRpcError;
  }
  // Its jobs not finished, as far as the caller may see them.
  v1::ListJobsRequest request;
  for (v1::JobState state : {v1::PENDING, v1::SCHEDULED, v1::RUNNING, v1::RESTARTING}) {
    request.add_states(state);
  }
  request.set_page_size(1000);
  v1::ListJobsResponse jobs;
  if (std::optional<int> failed = Call(*stub_, &v1::JobService::Stub::ListJobs, request, &jobs)) {
    return *failed;
  }
  std::vector<const v1::Job*> mine;
  for (const v1::Job& job : jobs.jobs()) {
    if (job.spec().queue() == name || (job.spec().queue().empty() && name == "default")) {
      mine.push_back(&job);
    }
  }
  if (Json()) {
    v1::ListJobsResponse out;
    for (const v1::Job* job : mine) *out.add_jobs() = *job;
    std::cout << ToJson(*found) << ToJson(out);
    return kExitSucceeded;
  }
  std::cout << DescribeQueue(*found);
  if (!mine.empty()) {
    std::vector<v1::Job> shown;
    for (const v1::Job* job : mine) shown.push_back(*job);
    std::cout << "\n" << QueueJobsTable(shown, IsTerminal());
  }
  return kExitSucceeded;
}

int Client::Queue() {
  const std::string& action = args_.args[0];
  const std::string name = args_.args.size() > 1 ? args_.args[1] : "";
  if (name.empty() &&
      (action == "create" || action == "update" || action == "delete" || action == "describe")) {
    std::cerr << "error: queue " << action << " needs NAME\n";
    return kExitUsage;
  }
  if (action == "create" || action == "update") return WriteQueue(action, name);
  if (action == "delete") return DeleteQueue(name);
  if (action == "list" || action == "describe") {
    v1::ListQueuesResponse response;
    if (int failed = ListQueuesInto(&response); failed != kExitSucceeded) return failed;
    return action == "list" ? ListQueues(response) : DescribeQueueAndJobs(response, name);
  }
  std::cerr << "error: queue takes create, update, delete, list or describe, got '" << action
            << "'\n";
  return kExitUsage;
}

}  // namespace trainyard::cli
