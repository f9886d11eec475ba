#ifndef TRAINYARD_WORKER_TRAINER_PROGRAM_PROGRAM_H_
#define TRAINYARD_WORKER_TRAINER_PROGRAM_PROGRAM_H_

// Part program/ of the trainer (worker/trainer/PARTS): a rank of a job that runs the user's own
// program (JobSpec.program). It may call coordinator/. LibTorch only in torch_store.cc (the
// ranks' TCPStore, agent_store.h): the program brings its own torch (Python's).
//
// The trainer process of such a rank is the program's host: it fetches the program's files and
// the last committed checkpoint, agrees with its peers on torchrun's environment (MASTER_ADDR
// and MASTER_PORT, each rank's LOCAL_RANK; rank 0's host serves the ranks' store there, as
// torchrun's agent does, when the program's torch is the trainer's release), starts the
// program as its child with that
// environment and the TRAINYARD_* of common/spec/program_env.h, and serves it on a Unix socket
// in the task folder, where the Python module (trainyard/__init__.py) reports steps and commits
// checkpoints. The host ends when the program does, with an exit code the restart policy reads
// as it reads a trainer's (common/exit_codes.h):
//   the program exits 0                   -> 0, or 143 when it stopped where the ranks agreed to
//                                            (SIGTERM, and the module's should_stop said so)
//   the program exits 2                   -> 2, the user's error: no retry
//   other codes, or killed by a signal    -> 1, a failure (143 for SIGTERM, as asked)
//   the command cannot be started, or a Python without torch -> 2
//   the host's own infrastructure fails (store, coordinator, peers) -> 3
// and a one-line cause in the termination message.

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/storage/object_store.h"
#include "trainyard/v1/agent_service.pb.h"
#include "worker/trainer/coordinator/coordinator_client.h"
#include "worker/trainer/coordinator/rendezvous_client.h"
#include "worker/trainer/program/agent_store.h"

namespace trainyard::trainer::program {

struct ProgramOptions {
  // Null: standalone (no reports or commits; a single rank only). Not owned.
  CoordinatorClient* coordinator = nullptr;
  RendezvousClient* rendezvous = nullptr;
  // Where the workdir and the checkpoints are read and written; required. Not owned.
  const ObjectStoreResolver* stores = nullptr;
  // Non-zero once the agent asked the rank to stop (SIGTERM). Not owned.
  const std::atomic<int>* stop_signal = nullptr;
  // The folder of the Python module `trainyard`, put first on the program's PYTHONPATH.
  std::string python_module_dir;
  // The task's folder (the trainer's working directory): the program's files, checkpoints and
  // socket go below it.
  std::string task_dir = ".";
  const Clock* clock = &RealClock::Get();
  absl::Duration coordinator_retry_for = absl::Seconds(60);
  absl::Duration report_interval = absl::Seconds(1);
  // How long a rank waits for its peers: at the start, and for their part of a commit.
  absl::Duration peer_timeout = absl::Minutes(10);
  // A program of several ranks that fails (not exit 2) may have failed because a peer's machine
  // vanished (its collectives then fail at once): its host waits this long for the coordinator
  // to end the attempt for a lost worker, which then names the cause, before it reports the
  // failure as the program's own.
  absl::Duration peer_loss_grace = absl::Seconds(15);
  // Called with each step the program reports and the step its attempt started from, before the
  // report is answered; it may block (a test holding the run at a step, main.cc).
  std::function<void(int64_t step, int64_t attempt_start_step)> before_step;
  // Rank 0 of a program that has reported no step this long after it started (it does not use
  // the module, or not yet) reports its attempt's start with steps_unknown: the coordinator then
  // counts the restart before it recovered (its backoff starts over), its steps lost unknown.
  // The trainer's main makes it the job's stall_timeout when that is shorter.
  absl::Duration silent_program_after = absl::Seconds(30);
  // Serves the ranks' store on rank 0's host (agent_store.h), for programs whose torch is
  // `trainer_torch_version`'s release; unset: rank 0's program serves it.
  AgentStoreServer serve_agent_store;
  std::string trainer_torch_version;
  // The trainer's LibTorch makes TCPStores only without libuv (TorchStoreDefaultsWork() is
  // false): programs get USE_LIBUV=0 (unless their env sets it), and no store is served for them.
  bool store_without_libuv = false;
};

struct ProgramResult {
  int exit_code = 0;    // the host's (see the table above)
  std::string message;  // why it ended, when not plainly
};

// Runs the program of `task` (task.spec().program()) to its end. Blocks.
ProgramResult RunProgram(const trainyard::v1::Task& task, const ProgramOptions& options);

}  // namespace trainyard::trainer::program

#endif  // TRAINYARD_WORKER_TRAINER_PROGRAM_PROGRAM_H_
