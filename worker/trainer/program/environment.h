#ifndef TRAINYARD_WORKER_TRAINER_PROGRAM_ENVIRONMENT_H_
#define TRAINYARD_WORKER_TRAINER_PROGRAM_ENVIRONMENT_H_

// What a program's process is given: torchrun's layout of the ranks over machines, and the whole
// environment (common/spec/program_env.h names it). Pure functions, internal to program/.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "trainyard/v1/agent_service.pb.h"

namespace trainyard::trainer::program {

// What each rank tells its peers at the start: where it runs and its GPUs.
struct Peer {
  std::string address;  // its worker's advertised address: one per machine
  std::string gpus;     // its CUDA_VISIBLE_DEVICES ("0,1"; empty without GPUs)
};

// torchrun's view of rank `rank` among `peers` (indexed by rank): the machines are the
// addresses in the order of their lowest rank, the local ranks a machine's ranks in rank order,
// and CUDA_VISIBLE_DEVICES every GPU of the machine's ranks in local-rank order, so that a
// script's torch.cuda.set_device(LOCAL_RANK) picks this rank's own GPU (with one per rank).
struct Layout {
  int local_rank = 0;
  int local_world_size = 1;
  int group_rank = 0;
  int group_world_size = 1;
  std::string cuda_visible_devices;
};
Layout LayoutOf(const std::vector<Peer>& peers, int rank);

// Where the program's things are in the task folder.
struct Paths {
  std::string workdir;         // its files, and its working directory
  std::string checkpoint_dir;  // where it writes a save
  std::string restore_dir;     // the restored checkpoint; empty when none
  std::string socket;          // the host's
  std::string step_file;       // the rank's last-step file
  std::string python_module_dir;
};

// Where the ranks meet (agent_store.h).
struct StorePlace {
  std::string master;          // "host:port"
  bool on_host = false;        // served by rank 0's host: TORCHELASTIC_USE_AGENT_STORE=True
  bool without_libuv = false;  // this worker's torch makes stores only without libuv: USE_LIBUV=0
};

// The environment of rank `task.rank()`: `inherited` (the trainer's own, PYTHONPATH and the
// names below replaced), the spec's program.env, then torchrun's variables and TRAINYARD_*.
// `restore_step` is the restored checkpoint's step (0: none).
std::vector<std::pair<std::string, std::string>> ProgramEnvironment(
    const trainyard::v1::Task& task, const Layout& layout, const StorePlace& store,
    const Paths& paths, int64_t restore_step,
    const std::vector<std::pair<std::string, std::string>>& inherited);

// The file that `command` (the first word of program.command) starts: a path with a '/' as it is
// (relative to `workdir`), else the first executable match in `path` (a PATH value), then in
// `workdir`. INVALID_ARGUMENT naming the command and where it was looked for.
absl::StatusOr<std::string> FindCommand(const std::string& command, const std::string& path,
                                        const std::string& workdir);

}  // namespace trainyard::trainer::program

#endif  // TRAINYARD_WORKER_TRAINER_PROGRAM_ENVIRONMENT_H_
