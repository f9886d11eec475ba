#ifndef TRAINYARD_WORKER_AGENT_TASK_USER_H_
#define TRAINYARD_WORKER_AGENT_TASK_USER_H_

// What a trainer is given of its agent: the environment it starts with, and, where the agent
// runs as root, a user of its own. A trainer runs the job's spec, which any user with a token
// writes; it must not inherit the agent's secrets (its token file, S3 keys it was not meant to
// have, other tasks' credentials) by running as the agent's user with the agent's environment.

#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace trainyard {

// Whether the agent's variable `name` passes to its trainers: what the runtime needs (PATH,
// HOME, locale, time zone, proxies, the math and GPU libraries' settings, OMP_*, CUDA_*,
// NCCL_*, GLOO_*, TORCH_*, ...), the S3 settings (AWS_*: without the S3 gateway, trainers use
// the agent's), and the names in `extra` (--trainer_env_pass). Never TRAINYARD_TOKEN and its kin:
// the agent's own credentials stay with it; what a trainer needs of TRAINYARD_* the agent sets
// itself.
bool PassesToTrainers(absl::string_view name, const std::vector<std::string>& extra);

// --task_uid_range "FIRST-LAST": user ids for jobs' trainers, one per job on a worker.
struct TaskUidRange {
  int first = 0;
  int last = -1;
  bool empty() const { return last < first; }
};
// "" is the empty range (trainers run as the agent's user). INVALID_ARGUMENT naming the flag
// for anything but two numbers in [1000, 2^31 - 2], FIRST <= LAST.
absl::StatusOr<TaskUidRange> ParseTaskUidRange(absl::string_view text);

// The user id of `job_id`'s trainers: the same on every worker (a hash of the id into the
// range), so that a job's files keep one owner across restarts and machines; the next one up
// (wrapping) when another job running here holds it (`taken`), and the hashed one again when
// every id is taken.
int TaskUid(const TaskUidRange& range, absl::string_view job_id, const std::set<int>& taken);

// Gives `path` to `uid` (its group the same number) with `mode`, without following a link
// there. INTERNAL naming the path and the error.
absl::Status GiveTo(const std::string& path, int uid, int mode);

}  // namespace trainyard

#endif  // TRAINYARD_WORKER_AGENT_TASK_USER_H_
