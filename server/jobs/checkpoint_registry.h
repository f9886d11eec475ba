#ifndef TRAINYARD_SERVER_JOBS_CHECKPOINT_REGISTRY_H_
#define TRAINYARD_SERVER_JOBS_CHECKPOINT_REGISTRY_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "server/store/job_store.h"

namespace trainyard {

// What committing a checkpoint does to a job's checkpoint records: the rules of retention as a
// pure function, which the JobManager writes and applies.
struct CheckpointCommitPlan {
  // The same step and folder were committed before (the answer to that call was lost): nothing
  // changes, and `retired` is what that commit retired, to be deleted again.
  bool retry = false;
  std::vector<StoredCheckpoint> records;  // the job's records afterwards, by step
  std::vector<std::string> retired;       // folders now outside retention, for the caller to delete
  std::vector<StoredCheckpoint> upserts;  // records to write
  std::vector<std::pair<std::string, int64_t>> removals;  // records to delete: (job id, step)
};

// Commits `added` to `records` (the job's, by step). The latest `keep_last` checkpoints not
// retired are kept (the spec's checkpoint.keep_last); 0 keeps all. A commit for a step already
// recorded replaces it. Records retired by an earlier commit are removed: their folders were handed
// out then (and the trainer's garbage collection deletes them if that failed); only the latest
// commit's are kept, to answer a retry of it.
CheckpointCommitPlan PlanCheckpointCommit(const std::vector<StoredCheckpoint>& records,
                                          const StoredCheckpoint& added, int keep_last);

}  // namespace trainyard

#endif  // TRAINYARD_SERVER_JOBS_CHECKPOINT_REGISTRY_H_
