#ifndef TRAINYARD_WORKER_TRAINER_PROGRAM_AGENT_STORE_H_
#define TRAINYARD_WORKER_TRAINER_PROGRAM_AGENT_STORE_H_

// The ranks' store of a program of several ranks, served by rank 0's host as torchrun's agent
// serves it: a PyTorch TCPStore listening at MASTER_ADDR:MASTER_PORT before any rank's program
// starts, the programs told by TORCHELASTIC_USE_AGENT_STORE=True to connect to it as clients.
// Without it, rank 0's program serves the store once it has imported torch; another rank that
// connects before that is refused, and PyTorch's client waits a second before it tries again.
//
// The store's protocol is PyTorch's and changes between its versions, so the host serves it only
// when the program's torch is the trainer's LibTorch release: it asks the program's Python where
// its torch is (without importing it) and reads that torch's version.py.

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace trainyard::trainer::program {

// A store being served; it stops when destroyed.
class AgentStore {
 public:
  virtual ~AgentStore() = default;
  virtual int port() const = 0;
};

// Serves a store for `world_size` ranks on a port the kernel picks, on every address.
using AgentStoreServer = std::function<absl::StatusOr<std::unique_ptr<AgentStore>>(int world_size)>;

// The trainer's own: LibTorch's TCPStore (torch_store.cc) with PyTorch's defaults, and that
// LibTorch's version.
absl::StatusOr<std::unique_ptr<AgentStore>> ServeTorchStore(int world_size);
std::string TrainerTorchVersion();

// Whether LibTorch's TCPStore works with PyTorch's defaults. Not where LibTorch was built without
// libuv, which PyTorch 2.4 and later ask for by default (Debian 13's 2.6): there a program's
// init_process_group needs USE_LIBUV=0, and PyTorch's clients of a store served elsewhere cannot
// be made at all (they ask for libuv whatever USE_LIBUV says), so the host serves none.
bool TorchStoreDefaultsWork();

// Whether `file` is a Python interpreter, by its name: python, python3, python3.11.
bool IsPython(absl::string_view file);

// The version of the torch that the Python `python` imports with `env` and the program's
// `workdir` first on its path ("1.13.0a0"), read from its version.py without importing torch;
// empty when that Python has no torch. An error when the Python cannot be asked.
absl::StatusOr<std::string> ProgramTorchVersion(
    const std::string& python, const std::vector<std::pair<std::string, std::string>>& env,
    const std::string& workdir);

// Whether two torch versions are one release: the same major.minor.patch ("1.13.0a0" and
// "1.13.0+cpu" are; "2.6.0" and "2.6.1" are not).
bool SameTorchRelease(absl::string_view a, absl::string_view b);

}  // namespace trainyard::trainer::program

#endif  // TRAINYARD_WORKER_TRAINER_PROGRAM_AGENT_STORE_H_
