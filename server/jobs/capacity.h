#ifndef TRAINYARD_SERVER_JOBS_CAPACITY_H_
#define TRAINYARD_SERVER_JOBS_CAPACITY_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/jobs/job_table.h"
#include "trainyard/v1/job.pb.h"

namespace trainyard {

// Slots, GPUs and memory: what one rank or parameter-server shard of a job holds on its worker.
// A rank holds ceil(resources.cpus) slots (a CPU rank at least one; a GPU rank none without
// cpus), gpus_per_worker GPUs and resources.memory (a pipeline stage's rank its stage's
// pipeline.memory); a shard parameter_servers.slots slots (at
// least one) and parameter_servers.memory.
int SlotsPerRank(const trainyard::v1::JobSpec& spec);
int GpusPerRank(const trainyard::v1::JobSpec& spec);
int64_t MemoryPerRank(const trainyard::v1::JobSpec& spec);
// Rank `rank`'s memory: its stage's pipeline.memory, else MemoryPerRank.
int64_t MemoryOfRank(const trainyard::v1::JobSpec& spec, int rank);
int SlotsPerShard(const trainyard::v1::JobSpec& spec);
// The ranks a job's gang holds at least (1 for a single-process job), and its parameter-server
// shards (0 unless parameter_server).
int MinRanks(const trainyard::v1::JobSpec& spec);
int Shards(const trainyard::v1::JobSpec& spec);
int64_t MemoryPerShard(const trainyard::v1::JobSpec& spec);

// What one task holds, and the limits its agent enforces.
struct TaskResources {
  int slots = 0;
  int gpus = 0;
  int64_t memory_bytes = 0;  // reserved and enforced; 0 = none
  double cpu_limit = 0;      // CPU quota in CPUs; 0 = none
};
// Those of one task of a job with `spec`.
TaskResources TaskUsage(const trainyard::v1::JobSpec& spec, const trainyard::v1::TaskInfo& task);

// What a worker's trainers hold.
struct WorkerUsage {
  int slots = 0;
  int gpus = 0;
  int64_t memory_bytes = 0;
  std::vector<std::string> task_ids;
};

// The jobs that hold capacity now: those with an attempt placed or running (`stopping` false),
// and those whose last attempt's ranks may still be stopping, restarting or ended less than
// `stopping_hold` ago (`stopping` true).
void ForEachHolder(const JobTable& table, absl::Time now, absl::Duration stopping_hold,
                   absl::FunctionRef<void(const JobEntry& entry, bool stopping)> fn);

// The one count of used capacity, by worker id, for scheduling, the workers' views and the
// metrics. A task holds its slots and GPUs until its agent reports it ended: the tasks of
// scheduled and running attempts; those of an attempt that is restarting, or of a job that
// ended, for at most `stopping_hold` after that (an agent that never saw a task never reports
// it) and not on a worker that is gone (`gone(worker_id)`: lost or unknown).
std::map<std::string, WorkerUsage> UsedCapacity(const JobTable& table, absl::Time now,
                                                absl::Duration stopping_hold,
                                                absl::FunctionRef<bool(absl::string_view)> gone);

}  // namespace trainyard

#endif  // TRAINYARD_SERVER_JOBS_CAPACITY_H_
