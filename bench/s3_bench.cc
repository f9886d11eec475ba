// Benchmarks for object storage (docs/benchmarks.md, "Object storage"); bench/s3_throughput.sh
// and bench/checkpoint_inflation.sh drive it.
//
//   s3_bench put LOCAL_FILE s3://bucket/key     streaming (multipart) upload; prints seconds
//   s3_bench get s3://bucket/key LOCAL_FILE     parallel ranged download; prints seconds
//   s3_bench checkpoint URI_PREFIX MB [TRAIN_CPU UPLOAD_CPU]
//                                               step time of a model of MB megabytes of
//                                               parameters, without and while asynchronous
//                                               checkpoints to URI_PREFIX (s3:// or file://) are
//                                               written, and the CPU time each save costs; with
//                                               the CPUs given, the training thread runs on
//                                               TRAIN_CPU and the checkpoint's threads on
//                                               UPLOAD_CPU
//   s3_bench save URI_PREFIX MB [REPEATS]       wall and CPU time of saves alone (no training)
// Endpoint and credentials come from the environment as for the trainer (AWS_ENDPOINT_URL, ...).

#include <sched.h>
#include <sys/resource.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "common/storage/object_store.h"
#include "common/storage/s3_client.h"
#include "common/storage/s3_object_store.h"
#include "worker/trainer/checkpoint/checkpoint.h"
#include "worker/trainer/loop/trainer.h"

namespace {

using trainyard::ObjectStore;
using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// The store for `uri`, configured from the environment as for the trainer; for s3:// the
// multipart part size and parallelism may be set with S3_BENCH_PART_MIB and S3_BENCH_PARALLELISM.
std::shared_ptr<ObjectStore> Open(const std::string& uri) {
  const char* part_mib = std::getenv("S3_BENCH_PART_MIB");
  const char* parallelism = std::getenv("S3_BENCH_PARALLELISM");
  if (absl::StartsWith(uri, "s3://") && (part_mib != nullptr || parallelism != nullptr)) {
    auto options =
        trainyard::S3ClientOptionsFromEnv([](const char* name) { return std::getenv(name); });
    int64_t mib = 0;
    if (!options.ok() || (part_mib != nullptr && !absl::SimpleAtoi(part_mib, &mib)) ||
        (parallelism != nullptr && !absl::SimpleAtoi(parallelism, &options->parallelism))) {
      std::fprintf(stderr, "bad S3 settings\n");
      std::exit(1);
    }
    if (mib > 0) options->part_size = mib << 20;
    return std::make_unique<trainyard::S3ObjectStore>(
        std::make_unique<trainyard::S3Client>(*std::move(options)));
  }
  auto store = trainyard::OpenObjectStore(uri);
  if (!store.ok()) {
    std::fprintf(stderr, "%s\n", store.status().ToString().c_str());
    std::exit(1);
  }
  return *std::move(store);
}

// CPU seconds (user + system) of the process or of the calling thread.
double CpuSeconds(int who) {
  struct rusage usage;
  getrusage(who, &usage);
  auto seconds = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec / 1e6; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

double ThreadCpuSeconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) / 1e9;
}

// How long the calling thread has waited, runnable, for a core (the kernel's run delay).
double RunDelaySeconds() {
  std::ifstream schedstat("/proc/thread-self/schedstat");
  double on_cpu_ns = 0, waiting_ns = 0;
  schedstat >> on_cpu_ns >> waiting_ns;
  return waiting_ns / 1e9;
}

int ThreadCount() {
  int threads = 0;
  for ([[maybe_unused]] const auto& entry :
       std::filesystem::directory_iterator("/proc/self/task")) {
    ++threads;
  }
  return threads;
}

double PeakRssMb() {
  struct rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) * 1024 / 1e6;
}

double RssMb() {
  std::ifstream statm("/proc/self/statm");
  long pages = 0, resident = 0;
  statm >> pages >> resident;
  return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE)) / 1e6;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double Mean(const std::vector<double>& v) {
  double s = 0;
  for (double d : v) s += d;
  return v.empty() ? 0.0 : s / static_cast<double>(v.size());
}

void PinThisThread(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (sched_setaffinity(0, sizeof(set), &set) != 0) {
    std::perror("sched_setaffinity");
    std::exit(1);
  }
}

// A deep MLP of `megabytes` of float32 parameters (1024-wide layers of 4 MiB each), trained with
// SGD on one LibTorch thread.
struct Net {
  explicit Net(int64_t megabytes) {
    const int64_t layers = std::max<int64_t>(1, megabytes / 4);
    for (int64_t i = 0; i < layers; ++i) {
      net->push_back(torch::nn::Linear(kWidth, kWidth));
      net->push_back(torch::nn::ReLU());
    }
    optimizer =
        std::make_unique<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.001));
  }
  static constexpr int64_t kWidth = 1024;
  torch::nn::Sequential net;
  std::unique_ptr<torch::optim::SGD> optimizer;
  torch::Tensor x = torch::randn({32, kWidth});

  struct Step {
    double wall_s;
    // The training thread's own CPU time: the step less the time it waited for a core, which on
    // a machine shared with other work is mostly spent on that work, not on the checkpoint.
    double cpu_s;
    double waited_s;  // runnable but waiting for a core
  };
  Step Train() {
    const Clock::time_point t = Clock::now();
    const double cpu = ThreadCpuSeconds();
    const double waited = RunDelaySeconds();
    optimizer->zero_grad();
    torch::Tensor loss = net->forward(x).pow(2).mean();
    loss.backward();
    optimizer->step();
    return {Since(t), ThreadCpuSeconds() - cpu, RunDelaySeconds() - waited};
  }
  double MegaBytes() {
    int64_t params = 0;
    for (const auto& p : net->parameters()) params += p.numel();
    return static_cast<double>(params) * 4 / 1e6;
  }
  // What the trainer hands to the checkpointer: a clone of every parameter.
  trainyard::trainer::CheckpointData Snapshot(int64_t step) {
    trainyard::trainer::CheckpointData data;
    torch::NoGradGuard no_grad;
    for (const auto& item : net->named_parameters()) {
      data.model.emplace_back(item.key(), item.value().detach().clone());
    }
    data.state.step = step;
    data.state.lr_schedule = "constant";
    return data;
  }
};

// Step time without and while `saves` asynchronous checkpoints are written, one after the
// other with kIdleSteps steps between them. The baseline of each save is the mean of the idle
// steps just before and just after it, so that a drift of the machine's load does not show up
// as inflation. One line per save.
int Checkpoint(const std::string& base, int64_t megabytes, int train_cpu, int upload_cpu) {
  // Before LibTorch starts any thread, so that all of them inherit it.
  if (train_cpu >= 0) PinThisThread(train_cpu);
  trainyard::trainer::KeepStepMemory();  // as the trainer runs: snapshots reuse freed memory
  torch::set_num_threads(1);
  Net net(megabytes);
  for (int i = 0; i < 5; ++i) net.Train();  // warm up
  // Training must be this one thread: a BLAS worker thread would train on another core and be
  // counted as the checkpoint's CPU time.
  if (const int threads = ThreadCount(); threads != 1) {
    std::fprintf(stderr,
                 "training runs on %d threads, not 1: run with OPENBLAS_NUM_THREADS=1 "
                 "OMP_NUM_THREADS=1\n",
                 threads);
    return 1;
  }

  std::shared_ptr<ObjectStore> store = Open(base);
  trainyard::trainer::Checkpointer::Options options;
  options.base_uri = base;
  if (upload_cpu >= 0) options.upload_cpus = {upload_cpu};
  trainyard::trainer::Checkpointer checkpointer(store.get(), nullptr, trainyard::RealClock::Get(),
                                                options);
  constexpr int kSaves = 6;
  constexpr int kIdleSteps = 15;
  auto idle = [&] {
    std::vector<Net::Step> steps;
    for (int i = 0; i < kIdleSteps; ++i) steps.push_back(net.Train());
    return steps;
  };
  std::vector<Net::Step> previous_idle = idle();
  for (int save = 1; save <= kSaves; ++save) {
    const double rss_before = RssMb();
    // The checkpoint's threads are every thread but this one: the process's CPU time less this
    // thread's, from the snapshot to the end of the save.
    const double process_cpu_start = CpuSeconds(RUSAGE_SELF);
    const double train_cpu_start = CpuSeconds(RUSAGE_THREAD);
    const Clock::time_point snap_start = Clock::now();
    checkpointer.SaveAsync(net.Snapshot(save));
    const double snapshot_s = Since(snap_start);
    const Clock::time_point upload_start = Clock::now();
    std::vector<Net::Step> during;
    while (checkpointer.Uploading()) during.push_back(net.Train());
    const double upload_s = Since(upload_start);
    absl::Status saved = checkpointer.Wait();
    const double save_cpu = (CpuSeconds(RUSAGE_SELF) - process_cpu_start) -
                            (CpuSeconds(RUSAGE_THREAD) - train_cpu_start);
    if (!saved.ok()) {
      std::fprintf(stderr, "checkpoint failed: %s\n", saved.ToString().c_str());
      return 1;
    }
    std::vector<Net::Step> next_idle = idle();
    std::vector<double> base_wall, base_cpu, base_waited, during_wall, during_cpu, during_waited;
    for (const auto* steps : {&previous_idle, &next_idle}) {
      for (const Net::Step& s : *steps) {
        base_wall.push_back(s.wall_s);
        base_cpu.push_back(s.cpu_s);
        base_waited.push_back(s.waited_s);
      }
    }
    for (const Net::Step& s : during) {
      during_wall.push_back(s.wall_s);
      during_cpu.push_back(s.cpu_s);
      during_waited.push_back(s.waited_s);
    }
    const double b = Mean(base_wall), d = Mean(during_wall);
    const double bm = Median(base_wall), dm = Median(during_wall);
    const double bc = Mean(base_cpu), dc = Mean(during_cpu);
    std::printf(
        "save=%d model_mb=%.1f baseline_step_ms=%.1f during_upload_step_ms=%.1f "
        "steps_during_upload=%zu inflation_pct=%.1f median_inflation_pct=%.1f step_cpu_ms=%.1f "
        "during_step_cpu_ms=%.1f cpu_inflation_pct=%.1f waited_ms=%.1f during_waited_ms=%.1f "
        "snapshot_ms=%.1f upload_s=%.2f save_cpu_s=%.3f rss_mb=%.0f peak_rss_mb=%.0f\n",
        save, net.MegaBytes(), b * 1e3, d * 1e3, during.size(), b > 0 ? (d / b - 1) * 100 : 0.0,
        bm > 0 ? (dm / bm - 1) * 100 : 0.0, bc * 1e3, dc * 1e3, bc > 0 ? (dc / bc - 1) * 100 : 0.0,
        Mean(base_waited) * 1e3, Mean(during_waited) * 1e3, snapshot_s * 1e3, upload_s, save_cpu,
        rss_before, PeakRssMb());
    std::fflush(stdout);
    previous_idle = std::move(next_idle);
  }
  return 0;
}

// The cost of saves alone, without training: `repeats` saves one after the other, each timed from
// SaveAsync to the end of Wait, with the CPU seconds of the checkpoint's threads (the snapshot,
// taken on this thread, is not counted).
int Save(const std::string& base, int64_t megabytes, int repeats) {
  trainyard::trainer::KeepStepMemory();
  torch::set_num_threads(1);
  Net net(megabytes);
  std::shared_ptr<ObjectStore> store = Open(base);
  trainyard::trainer::Checkpointer::Options options;
  options.base_uri = base;
  trainyard::trainer::Checkpointer checkpointer(store.get(), nullptr, trainyard::RealClock::Get(),
                                                options);
  for (int save = 1; save <= repeats; ++save) {
    trainyard::trainer::CheckpointData data = net.Snapshot(save);
    const double process_cpu_start = CpuSeconds(RUSAGE_SELF);
    const double main_cpu_start = CpuSeconds(RUSAGE_THREAD);
    const Clock::time_point start = Clock::now();
    checkpointer.SaveAsync(std::move(data));
    absl::Status saved = checkpointer.Wait();
    const double wall = Since(start);
    const double cpu = (CpuSeconds(RUSAGE_SELF) - process_cpu_start) -
                       (CpuSeconds(RUSAGE_THREAD) - main_cpu_start);
    if (!saved.ok()) {
      std::fprintf(stderr, "checkpoint failed: %s\n", saved.ToString().c_str());
      return 1;
    }
    std::printf("save=%d model_mb=%.1f save_s=%.3f save_cpu_s=%.3f peak_rss_mb=%.0f\n", save,
                net.MegaBytes(), wall, cpu, PeakRssMb());
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string command = argc > 1 ? argv[1] : "";
  if (!(argc == 4 || (argc == 5 && command == "save") || (argc == 6 && command == "checkpoint"))) {
    std::fprintf(
        stderr,
        "usage: s3_bench put LOCAL URI | get URI LOCAL | "
        "checkpoint URI_PREFIX MB [TRAIN_CPU UPLOAD_CPU] | save URI_PREFIX MB [REPEATS]\n");
    return 2;
  }
  if (command == "put") {
    std::shared_ptr<ObjectStore> store = Open(argv[3]);
    const Clock::time_point t = Clock::now();
    absl::Status status = store->PutFile(argv[3], argv[2]);
    if (!status.ok()) {
      std::fprintf(stderr, "%s\n", status.ToString().c_str());
      return 1;
    }
    std::printf("%.3f\n", Since(t));
    return 0;
  }
  if (command == "get") {
    std::shared_ptr<ObjectStore> store = Open(argv[2]);
    const Clock::time_point t = Clock::now();
    auto info = store->GetToFile(argv[2], argv[3]);
    if (!info.ok()) {
      std::fprintf(stderr, "%s\n", info.status().ToString().c_str());
      return 1;
    }
    std::printf("%.3f\n", Since(t));
    return 0;
  }
  if (command == "checkpoint") {
    int64_t mb = 0;
    int train_cpu = -1, upload_cpu = -1;
    if (!absl::SimpleAtoi(argv[3], &mb) || mb <= 0) return 2;
    if (argc == 6 && (!absl::SimpleAtoi(argv[4], &train_cpu) ||
                      !absl::SimpleAtoi(argv[5], &upload_cpu) || train_cpu < 0 || upload_cpu < 0)) {
      return 2;
    }
    return Checkpoint(argv[2], mb, train_cpu, upload_cpu);
  }
  if (command == "save") {
    int64_t mb = 0;
    int repeats = 3;
    if (!absl::SimpleAtoi(argv[3], &mb) || mb <= 0) return 2;
    if (argc == 5 && (!absl::SimpleAtoi(argv[4], &repeats) || repeats <= 0)) return 2;
    return Save(argv[2], mb, repeats);
  }
  return 2;
}
