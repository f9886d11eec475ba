// The one file of program/ that includes LibTorch: its TCPStore, served for the ranks of a
// program (agent_store.h).

#include <algorithm>
#include <exception>
#include <memory>
#include <string>
#include <utility>

// clang-format off
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/version.h>
// clang-format on

#include "absl/strings/str_cat.h"
#include "worker/trainer/program/agent_store.h"

namespace trainyard::trainer::program {
namespace {

class TorchStore : public AgentStore {
 public:
  explicit TorchStore(std::unique_ptr<c10d::TCPStore> store) : store_(std::move(store)) {}
  int port() const override { return store_->getPort(); }

 private:
  std::unique_ptr<c10d::TCPStore> store_;
};

std::unique_ptr<c10d::TCPStore> Serve(int world_size) {
  c10d::TCPStoreOptions options;  // PyTorch's defaults, as its clients take them
  options.port = 0;               // the kernel's choice
  options.isServer = true;
  options.numWorkers = static_cast<std::size_t>(world_size);
  options.waitWorkers = false;
  // The server's own client connects here; the ranks connect to MASTER_ADDR.
  return std::make_unique<c10d::TCPStore>("127.0.0.1", options);
}

// c10's messages go on with a backtrace after their first line.
std::string FirstLine(const char* what) {
  const std::string text(what);
  return text.substr(0, std::min<size_t>(text.find('\n'), 400));
}

}  // namespace

absl::StatusOr<std::unique_ptr<AgentStore>> ServeTorchStore(int world_size) {
  try {
    return std::make_unique<TorchStore>(Serve(world_size));
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve the ranks' TCPStore: ", FirstLine(e.what())));
  }
}

bool TorchStoreDefaultsWork() { return ServeTorchStore(1).ok(); }

std::string TrainerTorchVersion() {
  return absl::StrCat(TORCH_VERSION_MAJOR, ".", TORCH_VERSION_MINOR, ".", TORCH_VERSION_PATCH);
}

}  // namespace trainyard::trainer::program
