// JobManager: queues (what admins create and users submit to), and what the scheduler is told of
// them and of the jobs holding capacity; the preemptions it decides.

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/log.h"
#include "common/spec/job_spec.h"
#include "server/jobs/capacity.h"
#include "server/jobs/job_manager.h"
#include "server/jobs/job_manager_internal.h"
#include "server/lifecycle/job_state.h"

namespace trainyard {
using job_manager_internal::kStoppingHold;
using job_manager_internal::RankRange;
using job_manager_internal::RunBoundMs;
using job_manager_internal::ShardCount;

namespace {

constexpr size_t kMaxQueues = 1000;
constexpr int kMaxQueueUsers = 1000;
constexpr size_t kMaxUserName = 128;
constexpr double kMaxWeight = 1e6;

// Negative limits all mean "none": one spelling of it.
void Normalize(v1::Queue& q) {
  for (auto [get, set] : {std::pair{&v1::Queue::quota_slots, &v1::Queue::set_quota_slots},
                          std::pair{&v1::Queue::quota_gpus, &v1::Queue::set_quota_gpus},
                          std::pair{&v1::Queue::borrow_slots, &v1::Queue::set_borrow_slots},
                          std::pair{&v1::Queue::borrow_gpus, &v1::Queue::set_borrow_gpus}}) {
    if ((q.*get)() < 0) (q.*set)(-1);
  }
  q.clear_status();
}

absl::Status ValidateQueue(const v1::Queue& q) {
  if (!IsValidName(q.name())) {
    return absl::InvalidArgumentError(
        absl::StrCat("name: '", q.name(), "' must match ", kNameRule));
  }
  if (!std::isfinite(q.weight()) || q.weight() < 0 || q.weight() > kMaxWeight) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight: must be between 0 (meaning 1) and ", kMaxWeight));
  }
  if (q.users_size() > kMaxQueueUsers) {
    return absl::InvalidArgumentError(absl::StrCat("users: at most ", kMaxQueueUsers));
  }
  std::set<std::string> seen;
  for (const std::string& user : q.users()) {
    if (user.empty() || user.size() > kMaxUserName) {
      return absl::InvalidArgumentError(
          absl::StrCat("users: a name must be 1 to ", kMaxUserName, " characters"));
    }
    if (!seen.insert(user).second) {
      return absl::InvalidArgumentError(absl::StrCat("users: '", user, "' twice"));
    }
  }
  return absl::OkStatus();
}

SchedQueue ToSched(const v1::Queue& q) {
  SchedQueue s;
  s.name = q.name();
  s.quota_slots = q.quota_slots();
  s.quota_gpus = q.quota_gpus();
  s.borrow_slots = q.borrow_slots();
  s.borrow_gpus = q.borrow_gpus();
  s.weight = q.weight() > 0 ? q.weight() : 1;
  return s;
}

bool Lists(const v1::Queue& q, absl::string_view user) {
  return std::find(q.users().begin(), q.users().end(), user) != q.users().end();
}

bool Preemptible(const v1::JobSpec& spec) { return !spec.has_preemptible() || spec.preemptible(); }

}  // namespace

absl::StatusOr<v1::Queue> JobManager::CreateQueue(v1::Queue queue, absl::string_view by) {
  Normalize(queue);
  if (absl::Status s = ValidateQueue(queue); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  if (queues_.count(queue.name())) {
    return absl::AlreadyExistsError(absl::StrCat("queue '", queue.name(), "' exists"));
  }
  if (queues_.size() >= kMaxQueues) {
    return absl::ResourceExhaustedError(absl::StrCat("at most ", kMaxQueues, " queues"));
  }
  const int64_t now_ms = absl::ToUnixMillis(clock_.Now());
  queue.set_created_unix_ms(now_ms);
  queue.set_updated_unix_ms(now_ms);
  queue.set_created_by(std::string(by));
  StoreMutation m;
  m.queues.push_back(queue);
  if (absl::Status s = WriteLocked(std::move(m)); !s.ok()) return s;
  queues_[queue.name()] = queue;
  LogInfo("queue ", queue.name(), " created by ", by.empty() ? "(anyone)" : by);
  schedule_all_ = true;
  RequestTickLocked();
  return queue;
}

absl::StatusOr<v1::Queue> JobManager::UpdateQueue(v1::Queue queue, absl::string_view by) {
  Normalize(queue);
  if (absl::Status s = ValidateQueue(queue); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  auto it = queues_.find(queue.name());
  if (it == queues_.end()) {
    return absl::NotFoundError(absl::StrCat(
        "queue '", queue.name(), "' not found",
        queue.name() == kDefaultQueue ? " (create it to give the default queue a quota)" : ""));
  }
  queue.set_created_unix_ms(it->second.created_unix_ms());
  queue.set_created_by(it->second.created_by());
  queue.set_updated_unix_ms(absl::ToUnixMillis(clock_.Now()));
  StoreMutation m;
  m.queues.push_back(queue);
  if (absl::Status s = WriteLocked(std::move(m)); !s.ok()) return s;
  it->second = queue;
  LogInfo("queue ", queue.name(), " updated by ", by.empty() ? "(anyone)" : by);
  schedule_all_ = true;
  RequestTickLocked();
  return queue;
}

absl::Status JobManager::DeleteQueue(absl::string_view name) {
  absl::MutexLock lock(&mu_);
  if (!queues_.count(std::string(name))) {
    return absl::NotFoundError(absl::StrCat("queue '", name, "' not found"));
  }
  std::vector<std::string> jobs;
  for (int64_t seq : table_.active()) {
    const JobEntry* entry = table_.FindBySeq(seq);
    if (entry != nullptr && entry->job.spec().queue() == name) jobs.push_back(entry->job.id());
  }
  if (!jobs.empty()) {
    const size_t shown = std::min<size_t>(jobs.size(), 5);
    return absl::FailedPreconditionError(absl::StrCat(
        "queue '", name, "' has ", jobs.size(),
        " jobs not finished: ", absl::StrJoin(jobs.begin(), jobs.begin() + shown, ", "),
        jobs.size() > shown ? ", ..." : "", " (cancel them or wait for them to end)"));
  }
  StoreMutation m;
  m.removed_queues.emplace_back(name);
  if (absl::Status s = WriteLocked(std::move(m)); !s.ok()) return s;
  queues_.erase(std::string(name));
  queue_usage_.erase(std::string(name));
  LogInfo("queue ", name, " deleted");
  schedule_all_ = true;
  RequestTickLocked();
  return absl::OkStatus();
}

std::vector<v1::Queue> JobManager::ListQueues() const {
  absl::MutexLock lock(&mu_);
  return ListQueuesLocked();
}

std::vector<v1::Queue> JobManager::ListQueuesLocked() const {
  std::map<std::string, v1::Queue> out = queues_;
  if (!out.count(kDefaultQueue)) {
    v1::Queue& q = out[kDefaultQueue];
    q.set_name(kDefaultQueue);
    q.set_quota_slots(-1);
    q.set_quota_gpus(-1);
    q.set_borrow_slots(-1);
    q.set_borrow_gpus(-1);
    q.set_weight(1);
    q.mutable_status()->set_implicit(true);
  }
  for (int64_t seq : table_.active()) {
    const JobEntry* entry = table_.FindBySeq(seq);
    if (entry == nullptr) continue;
    auto it = out.find(entry->job.spec().queue());
    v1::QueueStatus* status = (it != out.end() ? it->second : out[kDefaultQueue]).mutable_status();
    if (entry->job.state() == v1::PENDING) {
      status->set_pending_jobs(status->pending_jobs() + 1);
    } else {
      status->set_running_jobs(status->running_jobs() + 1);
    }
  }
  std::vector<v1::Queue> queues;
  for (auto& [name, q] : out) {
    v1::QueueStatus* status = q.mutable_status();
    // Before the first pass: the queue's own quota (the default one's is then unknown: none).
    QueueUsage usage{q.quota_slots(), q.quota_gpus(), 0, 0, 0};
    if (auto it = queue_usage_.find(name); it != queue_usage_.end()) usage = it->second;
    status->set_quota_slots(usage.quota_slots);
    status->set_quota_gpus(usage.quota_gpus);
    status->set_used_slots(usage.used_slots);
    status->set_used_gpus(usage.used_gpus);
    status->set_borrowed_slots(
        usage.quota_slots < 0 ? 0 : std::max(usage.used_slots - usage.quota_slots, 0));
    status->set_borrowed_gpus(
        usage.quota_gpus < 0 ? 0 : std::max(usage.used_gpus - usage.quota_gpus, 0));
    if (auto it = queue_preemptions_.find(name); it != queue_preemptions_.end()) {
      status->set_preemptions(it->second);
    }
    queues.push_back(std::move(q));
  }
  return queues;
}

absl::Status JobManager::AdmitToQueueLocked(v1::JobSpec& spec, const Principal* by) const {
  std::string name = spec.queue();
  if (name.empty()) {
    // The first queue that names the submitter, else the default one.
    for (const auto& [queue_name, q] : queues_) {
      if (by != nullptr && Lists(q, by->name)) {
        name = queue_name;
        break;
      }
    }
    if (name.empty()) name = kDefaultQueue;
  }
  auto it = queues_.find(name);
  if (it == queues_.end() && name != kDefaultQueue) {
    std::vector<std::string> names;
    for (const auto& [queue_name, q] : queues_) names.push_back(queue_name);
    if (!queues_.count(kDefaultQueue)) names.push_back(kDefaultQueue);
    return absl::InvalidArgumentError(
        absl::StrCat("queue: no queue '", name, "' (queues: ", absl::StrJoin(names, ", "), ")"));
  }
  if (it != queues_.end()) {
    const v1::Queue& q = it->second;
    if (by != nullptr && !by->admin() && q.users_size() > 0 && !Lists(q, by->name)) {
      return absl::PermissionDeniedError(
          absl::StrCat("queue: '", by->name, "' may not submit to queue '", name,
                       "' (its users: ", absl::StrJoin(q.users(), ", "), ")"));
    }
    // A job without a principal is the coordinator's own (tests, tools): as an admin's.
    if (by != nullptr && !by->admin() && q.has_max_priority() &&
        spec.priority() > q.max_priority()) {
      return absl::PermissionDeniedError(
          absl::StrCat("priority: ", spec.priority(), " is above the cap of queue '", name,
                       "' (max_priority ", q.max_priority(), "); only an admin may ask for more"));
    }
    // The most the queue ever lets one job hold.
    int min_ranks = 1;
    int max_ranks = 1;
    RankRange(spec, min_ranks, max_ranks);
    const bool preemptible = Preemptible(spec);
    const int slots = min_ranks * SlotsPerRank(spec) + ShardCount(spec) * SlotsPerShard(spec);
    const int gpus = min_ranks * GpusPerRank(spec);
    auto check = [&](int need, int quota, int borrow, const char* unit) -> absl::Status {
      const int allowed = QueueLimit(quota, borrow, preemptible);
      if (allowed < 0 || need <= allowed) return absl::OkStatus();
      return absl::InvalidArgumentError(absl::StrCat(
          "queue '", name, "' lets a job hold at most ",
          QueueAllowance(quota, borrow, preemptible, unit), "; this one needs ", need, " ", unit,
          preemptible ? "" : " (preemptible: false runs within the quota only)"));
    };
    if (absl::Status s = check(slots, q.quota_slots(), q.borrow_slots(), "slots"); !s.ok()) {
      return s;
    }
    if (absl::Status s = check(gpus, q.quota_gpus(), q.borrow_gpus(), "GPUs"); !s.ok()) return s;
  }
  spec.set_queue(name);
  return absl::OkStatus();
}

SchedContext JobManager::SchedContextLocked() const {
  SchedContext context;
  const absl::Time now = clock_.Now();
  context.now_ms = absl::ToUnixMillis(now);
  context.policy = options_.scheduler_policy;
  context.reserved_for = reserved_for_;
  for (const auto& [name, q] : queues_) context.queues.push_back(ToSched(q));
  auto gone = [this](absl::string_view worker_id) {
    const WorkerRecord* worker = workers_.Find(worker_id);
    return worker == nullptr || worker->info.state() == v1::LOST;
  };
  // As UsedCapacity counts them: the tasks of placed and running attempts, and those still
  // stopping of restarting and ended jobs.
  auto add = [&](const JobEntry& entry, bool stopping) {
    SchedRunning r;
    r.id = entry.job.id();
    r.queue = entry.job.spec().queue();
    r.priority = entry.job.spec().priority();
    r.seq = entry.seq;
    r.preemptible = Preemptible(entry.job.spec());
    r.stopping = stopping || !entry.job.preempted_for().empty();
    for (const v1::TaskInfo& t : entry.job.tasks()) {
      if (t.generation() != entry.job.generation() || TaskEnded(t.state())) continue;
      if (stopping && gone(t.worker_id())) continue;
      // Asked to save and stop (a preemption notice): coming free.
      if (t.stop_deadline_unix_ms() > 0) r.stopping = true;
      const TaskResources use = TaskUsage(entry.job.spec(), t);
      r.tasks.push_back({t.worker_id(), use.slots, use.gpus, use.memory_bytes});
    }
    if (r.tasks.empty()) return;
    if (const int64_t bound = RunBoundMs(entry.job, context.now_ms); bound > 0) {
      r.end_ms = context.now_ms + bound;
    }
    if (!entry.checkpoints.empty()) {
      r.checkpoint_ms = entry.checkpoints.back().checkpoint.created_unix_ms();
    }
    const auto& restarts = entry.job.restarts();
    if (!restarts.empty() && restarts[restarts.size() - 1].reason() == v1::SCHEDULER_PREEMPTED &&
        entry.attempt_placed != absl::InfinitePast()) {
      r.protected_until_ms = absl::ToUnixMillis(entry.attempt_placed + options_.preemption_exempt);
    }
    context.running.push_back(std::move(r));
  };
  ForEachHolder(table_, now, kStoppingHold, add);
  return context;
}

bool JobManager::AskToStopLocked(JobEntry& entry, int64_t deadline_ms, const std::string& reason) {
  v1::Job updated = entry.job;
  std::vector<std::string> changed;
  for (v1::TaskInfo& t : *updated.mutable_tasks()) {
    if (t.generation() != updated.generation() || TaskEnded(t.state()) ||
        t.stop_deadline_unix_ms() > 0) {
      continue;
    }
    t.set_stop_deadline_unix_ms(deadline_ms);
    changed.push_back(t.task_id());
  }
  if (changed.empty()) return false;  // asked already
  v1::JobEvent event;
  event.set_time_unix_ms(absl::ToUnixMillis(clock_.Now()));
  event.set_from(updated.state());
  event.set_to(updated.state());
  event.set_reason(reason);
  *updated.add_events() = event;
  updated.set_updated_unix_ms(event.time_unix_ms());
  CommitLocked(entry, std::move(updated), {event}, changed).IgnoreError();  // in a unit: deferred
  // The tasks' stop deadlines must reach their workers: wake their long polls.
  for (const v1::TaskInfo& t : entry.job.tasks()) {
    if (t.stop_deadline_unix_ms() == deadline_ms && IsActiveTask(entry, t)) {
      workers_.BumpVersion(t.worker_id());
      WakeWorkerLocked(t.worker_id());
    }
  }
  AfterCommitLocked([id = entry.job.id(), reason] { LogInfo("job ", id, ": ", reason); });
  return true;
}

void JobManager::PreemptLocked(const Preemption& preemption) {
  JobEntry* entry = FindLocked(preemption.victim);
  if (entry == nullptr || !entry->job.preempted_for().empty()) return;
  const absl::Time now = clock_.Now();
  const int64_t deadline_ms = absl::ToUnixMillis(now + options_.preemption_grace);
  BeginUnitLocked();
  // Marked first, so that its end is SCHEDULER_PREEMPTED however its ranks report it.
  v1::Job marked = entry->job;
  marked.set_preempted_for(preemption.reason.substr(0, 512));
  CommitLocked(*entry, std::move(marked), {}, {}).IgnoreError();  // deferred to EndUnitLocked
  const std::string queue =
      entry->job.spec().queue().empty() ? kDefaultQueue : entry->job.spec().queue();
  AskToStopLocked(
      *entry, deadline_ms,
      absl::StrFormat("preempted by the scheduler %s: every rank saves at the next "
                      "step they agree on and stops within %.1fs; the job then waits "
                      "in queue %s and resumes where it saved",
                      preemption.reason, absl::ToDoubleSeconds(options_.preemption_grace), queue));
  if (absl::Status s = EndUnitLocked(); !s.ok()) {
    LogWarning("job ", preemption.victim, ": preemption not recorded: ", s.message());
    return;
  }
  queue_preemptions_[queue]++;
}

}  // namespace trainyard
