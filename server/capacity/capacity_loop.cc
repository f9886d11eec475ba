#include "server/capacity/capacity_loop.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "server/jobs/capacity.h"

namespace trainyard {
namespace {

namespace v1 = trainyard::v1;

// The scheduler's reasons for a job that more machines would let run (schedule_pass.cc).
bool WaitsForMachines(absl::string_view reason) {
  for (absl::string_view prefix : {"no workers registered", "no ready workers", "no ready worker",
                                   "waiting for capacity", "queued behind", "needs ", "only "}) {
    if (absl::StartsWith(reason, prefix)) return true;
  }
  return false;
}

}  // namespace

std::vector<WaitingJob> WaitingForCapacity(const std::vector<v1::Job>& pending) {
  std::vector<const v1::Job*> jobs;
  for (const v1::Job& job : pending) {
    if (job.state() == v1::PENDING && WaitsForMachines(job.reason())) jobs.push_back(&job);
  }
  // Queue order: places in line first (1, 2, ...), then the oldest.
  std::stable_sort(jobs.begin(), jobs.end(), [](const v1::Job* a, const v1::Job* b) {
    const int pa = a->position() > 0 ? a->position() : 1 << 30;
    const int pb = b->position() > 0 ? b->position() : 1 << 30;
    if (pa != pb) return pa < pb;
    return a->created_unix_ms() < b->created_unix_ms();
  });
  std::vector<WaitingJob> waiting;
  for (const v1::Job* job : jobs) {
    const v1::JobSpec& spec = job->spec();
    WaitingJob w;
    w.id = job->id();
    w.ranks = MinRanks(spec);
    w.slots_per_rank = SlotsPerRank(spec);
    w.gpus_per_rank = GpusPerRank(spec);
    w.memory_per_rank = MemoryPerRank(spec);
    w.shards = Shards(spec);
    w.slots_per_shard = SlotsPerShard(spec);
    w.memory_per_shard = MemoryPerShard(spec);
    waiting.push_back(std::move(w));
  }
  return waiting;
}

CapacityLoop::CapacityLoop(JobManager& manager, std::unique_ptr<CapacityProvider> provider,
                           CapacityOptions options, absl::Duration interval, const Clock& clock)
    : manager_(manager),
      provider_(std::move(provider)),
      asker_(std::move(options), *provider_, clock),
      interval_(interval),
      clock_(clock) {}

CapacityLoop::~CapacityLoop() { Stop(); }

void CapacityLoop::RoundOnce() {
  std::vector<v1::Job> pending;
  std::string token;
  do {
    absl::StatusOr<ListJobsResult> page = manager_.ListJobs({v1::PENDING}, 1000, token);
    if (!page.ok()) return;
    for (v1::Job& job : page->jobs) pending.push_back(std::move(job));
    token = page->next_page_token;
  } while (!token.empty());
  std::vector<WorkerView> workers;
  for (const v1::Worker& w : manager_.ListWorkers()) {
    workers.push_back({w.id(), w.slots_used() > 0 || w.gpus_used() > 0 || w.task_ids_size() > 0});
  }
  manager_.SetCapacityNotes(asker_.Round(WaitingForCapacity(pending), workers));
}

void CapacityLoop::Start() {
  thread_ = std::thread([this] {
    absl::MutexLock lock(&mu_);
    while (!stopping_) {
      mu_.Unlock();
      RoundOnce();
      mu_.Lock();
      const absl::Time next = clock_.Now() + interval_;
      while (!stopping_ && !clock_.WaitWithDeadline(wake_, mu_, next)) {
      }
    }
  });
}

void CapacityLoop::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    wake_.SignalAll();
  }
  if (thread_.joinable()) thread_.join();
}

}  // namespace trainyard
