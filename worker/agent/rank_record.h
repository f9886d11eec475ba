#ifndef TRAINYARD_WORKER_AGENT_RANK_RECORD_H_
#define TRAINYARD_WORKER_AGENT_RANK_RECORD_H_

// What a rank was doing, as its agent sees it from outside: the flight record the trainer keeps
// in its task folder (common/flight_record.h) and the state of its process. The agent reads it
// when it stops a rank (before any signal, so a hang is seen as it was) and when a rank ends.

#include <cstdint>
#include <optional>
#include <string>

#include "common/clock.h"
#include "trainyard/v1/job.pb.h"

namespace trainyard {

// "running", "sleeping", "stopped" (SIGSTOP or a debugger), "disk sleep", "zombie", from
// /proc/<pid>/stat; "exited" when there is no such process; "" when `pid` <= 0.
std::string ProcessStateOf(int64_t pid);

// The record of the rank whose folder is `task_dir` and whose process is `pid` (<= 0: ended),
// read now. nullopt when the folder holds no flight record (shards, a job's own program, a rank
// that never started); a record that cannot be read gives a RankRecord with `error` set.
std::optional<v1::RankRecord> ReadRankRecord(const std::string& task_dir, int64_t pid,
                                             const Clock& clock);

}  // namespace trainyard

#endif  // TRAINYARD_WORKER_AGENT_RANK_RECORD_H_
