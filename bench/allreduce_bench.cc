// All-reduce bus bandwidth of the Gloo communicator, or its point-to-point round trip (what a
// pipeline's stages send each other), one process per rank (see allreduce.sh, which runs it
// beside torch.distributed and prints the comparison).
//
//   allreduce_bench --rank=R --world=N --dir=/tmp/shared [--min_bytes=4096 --max_bytes=268435456]
//                   [--async] [--point_to_point]
//
// Ranks meet through files in --dir (a rendezvous store good enough for one machine). Prints one
// JSON line per size: {"bytes":..., "iters":..., "seconds_per_iter":..., "gbps":...}. For an
// all-reduce, gbps is the bus bandwidth bytes * 2 (N - 1) / N / time, the convention of
// nccl-tests; for --point_to_point (2 ranks: rank 0 sends the tensor, rank 1 receives it into a
// tensor of its own and sends it back), the bytes moved per round trip, 2 * bytes / time.

#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "worker/trainer/collective/gloo_communicator.h"

ABSL_FLAG(int, rank, 0, "this process's rank");
ABSL_FLAG(int, world, 2, "number of ranks");
ABSL_FLAG(std::string, dir, "", "folder shared by the ranks, for the rendezvous");
ABSL_FLAG(int64_t, min_bytes, 4096, "smallest message");
ABSL_FLAG(int64_t, max_bytes, 256 << 20, "largest message");
ABSL_FLAG(double, seconds_per_size, 2.0, "rough time budget per size");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(120),
          "collective timeout (a peer that stops answering fails the run after it)");
ABSL_FLAG(bool, async, false,
          "time AllReduceAsync and Wait (the communicator's thread) instead of the blocking "
          "AllReduce (the calling thread)");
ABSL_FLAG(bool, point_to_point, false,
          "time a round trip of SendAsync and Recv between ranks 0 and 1 (the pipeline's "
          "transport) instead of an all-reduce; needs --world=2");

namespace {

class FileRendezvous final : public trainyard::trainer::RendezvousClient {
 public:
  explicit FileRendezvous(std::string dir) : dir_(std::move(dir)) {}
  absl::Status Set(const std::string& key, const std::string& value) override {
    const std::string path = Path(key);
    const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
    std::ofstream(tmp, std::ios::binary) << value;
    std::filesystem::rename(tmp, path);
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    const absl::Time deadline = absl::Now() + timeout;
    while (!std::filesystem::exists(Path(key))) {
      if (absl::Now() > deadline) return absl::DeadlineExceededError(key);
      absl::SleepFor(absl::Milliseconds(2));
    }
    std::ifstream in(Path(key), std::ios::binary);
    std::stringstream buffer;
    buffer << in.rdbuf();
    return buffer.str();
  }

 private:
  std::string Path(const std::string& key) const {
    std::string name = key;
    std::replace(name.begin(), name.end(), '/', '_');
    return dir_ + "/" + name;
  }
  const std::string dir_;
};

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  torch::set_num_threads(1);
  const int rank = absl::GetFlag(FLAGS_rank);
  const int world = absl::GetFlag(FLAGS_world);
  FileRendezvous rendezvous(absl::GetFlag(FLAGS_dir));
  const bool point_to_point = absl::GetFlag(FLAGS_point_to_point);
  if (point_to_point && world != 2) {
    std::fprintf(stderr, "--point_to_point needs --world=2\n");
    return 1;
  }
  trainyard::trainer::GlooOptions options;
  options.timeout = absl::GetFlag(FLAGS_timeout);
  options.point_to_point = point_to_point;
  auto comm = trainyard::trainer::NewGlooCommunicator(rank, world, rendezvous, options);
  if (!comm.ok()) {
    std::fprintf(stderr, "%s\n", comm.status().ToString().c_str());
    return 1;
  }
  const bool async = absl::GetFlag(FLAGS_async);
  torch::Tensor back;  // where a point-to-point message is received
  auto round_trip = [&](const torch::Tensor& t) -> absl::Status {
    if (!back.defined() || back.sizes() != t.sizes()) back = torch::empty_like(t);
    if (rank == 0) {
      std::unique_ptr<trainyard::trainer::Work> sent = (*comm)->SendAsync(t, 1);
      if (absl::Status received = (*comm)->Recv(back, 1); !received.ok()) return received;
      return sent->Wait();
    }
    if (absl::Status received = (*comm)->Recv(back, 0); !received.ok()) return received;
    return (*comm)->SendAsync(back, 0)->Wait();
  };
  // One timed operation.
  auto once = [&](const torch::Tensor& t) {
    if (point_to_point) return round_trip(t);
    return async ? (*comm)->AllReduceAsync({t}, trainyard::trainer::ReduceOp::kSum)->Wait()
                 : (*comm)->AllReduce({t}, trainyard::trainer::ReduceOp::kSum);
  };
  using Clock = std::chrono::steady_clock;
  for (int64_t bytes = absl::GetFlag(FLAGS_min_bytes); bytes <= absl::GetFlag(FLAGS_max_bytes);
       bytes *= 4) {
    torch::Tensor t = torch::ones({bytes / 4}, torch::kFloat);
    // Warm up and time one call to pick an iteration count all ranks agree on (rank 0's).
    for (int i = 0; i < 2; ++i) (void)once(t);
    const auto probe_start = Clock::now();
    (void)once(t);
    const double probe = std::chrono::duration<double>(Clock::now() - probe_start).count();
    torch::Tensor iters_t = torch::tensor(
        {std::clamp(absl::GetFlag(FLAGS_seconds_per_size) / std::max(probe, 1e-6), 5.0, 2000.0)},
        torch::kDouble);
    (void)(*comm)->Broadcast({iters_t}, 0);
    const int iters = static_cast<int>(iters_t.item<double>());
    (void)(*comm)->Barrier();
    const auto start = Clock::now();
    for (int i = 0; i < iters; ++i) {
      absl::Status s = once(t);
      if (!s.ok()) {
        std::fprintf(stderr, "%s: %s\n", absl::FormatTime(absl::Now()).c_str(),
                     s.ToString().c_str());
        return 1;
      }
    }
    const double per_iter = std::chrono::duration<double>(Clock::now() - start).count() / iters;
    const double moved = point_to_point ? 2.0 : 2.0 * (world - 1) / world;
    const double gbps = static_cast<double>(bytes) * moved / per_iter / 1e9;
    if (rank == 0) {
      std::printf("{\"bytes\": %ld, \"iters\": %d, \"seconds_per_iter\": %.9f, \"gbps\": %.6f}\n",
                  static_cast<long>(bytes), iters, per_iter, gbps);
      std::fflush(stdout);
    }
  }
  return 0;
}
