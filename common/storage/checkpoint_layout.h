#ifndef TRAINYARD_COMMON_STORAGE_CHECKPOINT_LAYOUT_H_
#define TRAINYARD_COMMON_STORAGE_CHECKPOINT_LAYOUT_H_

// Where a job's checkpoints live under its checkpoint URI, the one fact that the trainer (which
// writes them), the coordinator (which checks a commit names the job's own folder and later
// deletes it) and the tests share: one folder per step, {checkpoint_uri}/step-{S:%012d}/, and the
// exported model in {checkpoint_uri}/final/. What a step folder holds is the trainer's
// (worker/trainer/checkpoint/checkpoint.h).

#include <cstdint>
#include <string>

namespace trainyard {

// Every step folder's name starts with it (listing a job's folders lists this prefix).
inline constexpr char kCheckpointStepPrefix[] = "step-";
// The folder of a finished job's exported model.
inline constexpr char kFinalModelFolder[] = "final";

// {checkpoint_uri}/step-{step:%012d}
std::string CheckpointStepUri(const std::string& checkpoint_uri, int64_t step);

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_STORAGE_CHECKPOINT_LAYOUT_H_
