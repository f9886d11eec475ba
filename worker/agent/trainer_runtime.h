#ifndef TRAINYARD_WORKER_AGENT_TRAINER_RUNTIME_H_
#define TRAINYARD_WORKER_AGENT_TRAINER_RUNTIME_H_

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "trainyard/v1/agent_service.pb.h"

namespace trainyard {

// What the trainer at `trainer_path` runs (`trainyard-trainer --runtime`: its LibTorch, CUDA,
// NCCL and operators), asked once at the agent's start with `env` set as for its tasks; the
// output goes through `scratch_file` (replaced, then removed). Blocks up to `timeout`, then kills
// it: DEADLINE_EXCEEDED. NOT_FOUND / PERMISSION_DENIED when it cannot start, INTERNAL when it
// fails or prints something else, with its output's tail in the message.
absl::StatusOr<v1::TrainerRuntime> QueryTrainerRuntime(
    const std::string& trainer_path, const std::map<std::string, std::string>& env,
    const std::string& scratch_file, absl::Duration timeout = absl::Seconds(60));

// "LibTorch 2.6.0 (cuda, nccl), 2,431 operators"
std::string DescribeTrainerRuntime(const v1::TrainerRuntime& runtime);

// The compute check of local GPU `gpu` (NVML's index): `trainyard-trainer --gpu_check=0` with
// only that GPU visible (CUDA_VISIBLE_DEVICES, in PCI bus order as tasks see theirs) and `env`
// as for tasks, its output through `scratch_file`. Blocks until it ends, up to `timeout` of
// `clock`'s time. Its one-line summary when the GPU passed; FAILED_PRECONDITION with the reason
// when the GPU failed it (the trainer's kExitInfrastructure, a death by a signal, or no end within
// `timeout`: a hung GPU); another error when the check could not run (the trainer cannot start,
// or fails for another reason: INTERNAL with its output's tail).
absl::StatusOr<std::string> RunTrainerGpuCheck(const std::string& trainer_path,
                                               const std::map<std::string, std::string>& env,
                                               int gpu, const std::string& scratch_file,
                                               const Clock& clock,
                                               absl::Duration timeout = absl::Seconds(60));

}  // namespace trainyard

#endif  // TRAINYARD_WORKER_AGENT_TRAINER_RUNTIME_H_
