#ifndef TRAINYARD_SERVER_CAPACITY_H_
#define TRAINYARD_SERVER_CAPACITY_H_

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/job_table.h"
#include "trainyard/v1/job.pb.h"

namespace trainyard {

// Slots and GPUs: what one rank or parameter-server shard of a job holds on its worker. A rank of
// a GPU job holds gpus_per_worker GPUs and no CPU slot; a rank of a CPU job one slot; a shard
// parameter_servers.slots slots (at least one).
int SlotsPerRank(const trainyard::v1::JobSpec& spec);
int GpusPerRank(const trainyard::v1::JobSpec& spec);
int SlotsPerShard(const trainyard::v1::JobSpec& spec);
// (slots, GPUs) of one task of a job with `spec`.
std::pair<int, int> TaskUsage(const trainyard::v1::JobSpec& spec,
                              const trainyard::v1::TaskInfo& task);

// What a worker's trainers hold.
struct WorkerUsage {
  int slots = 0;
  int gpus = 0;
  std::vector<std::string> task_ids;
};

// The one count of used capacity, by worker id, for scheduling, the workers' views and the
// metrics. A task holds its slots and GPUs until its agent reports it ended: the tasks of
// scheduled and running attempts; those of an attempt that is restarting, or of a job that
// ended, for at most `stopping_hold` after that (an agent that never saw a task never reports
// it) and not on a worker that is gone (`gone(worker_id)`: lost or unknown).
std::map<std::string, WorkerUsage> UsedCapacity(const JobTable& table, absl::Time now,
                                                absl::Duration stopping_hold,
                                                absl::FunctionRef<bool(absl::string_view)> gone);

}  // namespace trainyard

#endif  // TRAINYARD_SERVER_CAPACITY_H_
