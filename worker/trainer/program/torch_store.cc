// The one file of program/ that includes LibTorch: its TCPStore, served for the ranks of a
// program (agent_store.h).

#include <torch/version.h>

#include <exception>
#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/trainer/program/agent_store.h"

namespace trainyard::trainer::program {
namespace {

// Whether TCPStoreOptions has useLibUV (PyTorch 2.3 and later: the libuv server, the default
// from 2.4, which a LibTorch built without libuv refuses).
template <typename T, typename = void>
struct HasUseLibUV : std::false_type {};
template <typename T>
struct HasUseLibUV<T, std::void_t<decltype(std::declval<T&>().useLibUV)>> : std::true_type {};

// Asks for the classic server, where there is a choice (a template, so that the member is
// looked for only where it exists).
template <typename Options>
void WithoutLibUV(Options& options) {
  if constexpr (HasUseLibUV<Options>::value) options.useLibUV = false;
}

class TorchStore : public AgentStore {
 public:
  explicit TorchStore(std::unique_ptr<c10d::TCPStore> store) : store_(std::move(store)) {}
  int port() const override { return store_->getPort(); }

 private:
  std::unique_ptr<c10d::TCPStore> store_;
};

std::unique_ptr<c10d::TCPStore> Serve(int world_size, bool without_libuv) {
  c10d::TCPStoreOptions options;
  options.port = 0;  // the kernel's choice
  options.isServer = true;
  options.numWorkers = static_cast<std::size_t>(world_size);
  options.waitWorkers = false;
  if (without_libuv) WithoutLibUV(options);
  // The server's own client connects here; the ranks connect to MASTER_ADDR.
  return std::make_unique<c10d::TCPStore>("127.0.0.1", options);
}

}  // namespace

absl::StatusOr<std::unique_ptr<AgentStore>> ServeTorchStore(int world_size) {
  std::string first_error;
  for (const bool without_libuv : {false, true}) {
    if (without_libuv && !HasUseLibUV<c10d::TCPStoreOptions>::value) break;
    try {
      return std::make_unique<TorchStore>(Serve(world_size, without_libuv));
    } catch (const std::exception& e) {
      // c10's messages go on with a backtrace after their first line.
      if (first_error.empty()) first_error = std::string(e.what()).substr(0, 400);
      first_error = first_error.substr(0, first_error.find('\n'));
    }
  }
  return absl::UnavailableError(absl::StrCat("cannot serve the ranks' TCPStore: ", first_error));
}

std::string TrainerTorchVersion() {
  return absl::StrCat(TORCH_VERSION_MAJOR, ".", TORCH_VERSION_MINOR, ".", TORCH_VERSION_PATCH);
}

}  // namespace trainyard::trainer::program
