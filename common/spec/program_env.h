#ifndef TRAINYARD_COMMON_SPEC_PROGRAM_ENV_H_
#define TRAINYARD_COMMON_SPEC_PROGRAM_ENV_H_

// What a job's own program (JobSpec.program) finds in its environment, the one home of these
// names: the spec's validation refuses them in program.env, the trainer's program host
// (worker/trainer/program/) sets them, and the Python module (trainyard/__init__.py) reads them.
// The contract is docs/user-guide.md's ("Your own program").

#include <cstdint>

#include "absl/strings/match.h"
#include "absl/strings/string_view.h"

namespace trainyard {

// torchrun's, so that init_process_group("gloo" | "nccl") with env:// works unchanged.
inline constexpr char kEnvRank[] = "RANK";
inline constexpr char kEnvWorldSize[] = "WORLD_SIZE";
inline constexpr char kEnvLocalRank[] = "LOCAL_RANK";
inline constexpr char kEnvLocalWorldSize[] = "LOCAL_WORLD_SIZE";
inline constexpr char kEnvGroupRank[] = "GROUP_RANK";
inline constexpr char kEnvGroupWorldSize[] = "GROUP_WORLD_SIZE";
inline constexpr char kEnvRoleRank[] = "ROLE_RANK";
inline constexpr char kEnvRoleWorldSize[] = "ROLE_WORLD_SIZE";
inline constexpr char kEnvMasterAddr[] = "MASTER_ADDR";
inline constexpr char kEnvMasterPort[] = "MASTER_PORT";
inline constexpr char kEnvTorchelasticRestartCount[] = "TORCHELASTIC_RESTART_COUNT";
// "True" when rank 0's host serves the ranks' store at MASTER_ADDR:MASTER_PORT (PyTorch's
// init_process_group then connects every rank to it as a client, as under torchrun's agent).
inline constexpr char kEnvTorchelasticUseAgentStore[] = "TORCHELASTIC_USE_AGENT_STORE";
inline constexpr char kEnvCudaVisibleDevices[] = "CUDA_VISIBLE_DEVICES";

// Trainyard's own.
inline constexpr char kEnvJobId[] = "TRAINYARD_JOB_ID";
inline constexpr char kEnvAttempt[] = "TRAINYARD_ATTEMPT";               // the generation, from 1
inline constexpr char kEnvCheckpointDir[] = "TRAINYARD_CHECKPOINT_DIR";  // write a save here
// The last committed checkpoint, fetched and verified before the program starts; unset on a
// first start. Its step is TRAINYARD_RESTORE_STEP.
inline constexpr char kEnvRestoreDir[] = "TRAINYARD_RESTORE_DIR";
inline constexpr char kEnvRestoreStep[] = "TRAINYARD_RESTORE_STEP";
// The host's socket (a Unix socket path): reports, the stop step, commits.
inline constexpr char kEnvSocket[] = "TRAINYARD_SOCKET";
// The rank's last-step file (common/exit_codes.h's kLastStepFile): the module writes each step
// there as it reports it, so the agent knows the exact last step however the program ends.
inline constexpr char kEnvStepFile[] = "TRAINYARD_STEP_FILE";
inline constexpr char kEnvCheckpointEvery[] = "TRAINYARD_CHECKPOINT_EVERY_STEPS";  // 0: none
inline constexpr char kEnvStopAtStep[] = "TRAINYARD_STOP_AT_STEP";  // a search's rung; 0: none
inline constexpr char kEnvPrefix[] = "TRAINYARD_";

// Whether program.env may not set `name`: Trainyard sets it for every rank.
inline bool IsProgramEnvSetByTrainyard(absl::string_view name) {
  for (absl::string_view taken :
       {kEnvRank, kEnvWorldSize, kEnvLocalRank, kEnvLocalWorldSize, kEnvGroupRank,
        kEnvGroupWorldSize, kEnvRoleRank, kEnvRoleWorldSize, kEnvMasterAddr, kEnvMasterPort,
        kEnvTorchelasticRestartCount, kEnvTorchelasticUseAgentStore, kEnvCudaVisibleDevices}) {
    if (name == taken) return true;
  }
  // The S3 gateway's scoped key (worker/agent/s3_gateway.h) is the program's only S3 credential.
  return absl::StartsWith(name, kEnvPrefix) || absl::StartsWith(name, "AWS_");
}

// Bounds of program (every request field bounded in one place: here and job_spec.h).
inline constexpr int kMaxProgramArgs = 1024;
inline constexpr int64_t kMaxProgramCommandBytes = 64 * 1024;
inline constexpr int kMaxProgramEnv = 256;
inline constexpr int kMaxProgramEnvNameBytes = 256;
inline constexpr int64_t kMaxProgramEnvValueBytes = 32 * 1024;

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_SPEC_PROGRAM_ENV_H_
