// The data path of the trainer, measured. Three modes:
//
//   data_bench --mode=gen --dir=D --samples=N --width=W [--shards=K]
//       writes K shards D/train-00000.safetensors, ...: "x" uint8 [n, W] and "y" int64 [n] with
//       10 learnable classes (the first 16 features sit around 20 * class), recording the labels'
//       extremes as `trainyard data pack` does.
//   data_bench --mode=read --spec=JOB.yaml [--epochs=1]
//       the data path alone: the spec's data opened and every batch of the epochs built by the
//       trainer's prefetcher, consumed at once (no model).
//   data_bench --mode=train --spec=JOB.yaml
//       the real training loop (RunTrainer, standalone: no coordinator), one LibTorch thread.
//
// Each prints one JSON line: samples/s, bytes/s of tensor data for `read`, the share of step
// time spent waiting for batches for `train`, and the process's peak resident memory.

#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/formats/safetensors.h"
#include "common/spec/job_spec.h"
#include "common/storage/object_store.h"
#include "worker/trainer/data/data.h"
#include "worker/trainer/data/schedule.h"
#include "worker/trainer/loop/trainer.h"

ABSL_FLAG(std::string, mode, "", "gen, read or train");
ABSL_FLAG(std::string, dir, "", "gen: output folder");
ABSL_FLAG(int64_t, samples, 100000, "gen: samples in all");
ABSL_FLAG(int64_t, width, 256, "gen: uint8 features per sample");
ABSL_FLAG(int, shards, 8, "gen: shards");
ABSL_FLAG(std::string, spec, "", "read, train: a job spec (YAML)");
ABSL_FLAG(int, epochs, 1, "read: epochs to read");
ABSL_FLAG(int64_t, data_memory, 0,
          "train: the job's data memory (Job.data_memory_bytes: what the coordinator fixes at the "
          "first placement of a job without resources.memory, its workers' smallest task memory)");

namespace {

// The object stores of the environment, made once.
const trainyard::ObjectStoreResolver& Stores() {
  static const trainyard::ObjectStoreResolver* const kStores =
      trainyard::NewObjectStoreResolver([](const char* name) {
        return std::getenv(name);
      }).release();
  return *kStores;
}

using Clock = std::chrono::steady_clock;

double PeakRssMiB() {
  struct rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;
}

int Gen() {
  const std::string dir = absl::GetFlag(FLAGS_dir);
  const int64_t total = absl::GetFlag(FLAGS_samples);
  const int64_t width = absl::GetFlag(FLAGS_width);
  const int shards = absl::GetFlag(FLAGS_shards);
  uint64_t state = 0x9E3779B97F4A7C15ULL;
  auto next = [&state] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  const Clock::time_point start = Clock::now();
  int64_t bytes = 0;
  for (int s = 0; s < shards; ++s) {
    const int64_t first = total * s / shards;
    const int64_t n = total * (s + 1) / shards - first;
    std::string x(static_cast<size_t>(n * width), '\0');
    std::string y(static_cast<size_t>(n * 8), '\0');
    int64_t lo = 9, hi = 0;
    for (int64_t r = 0; r < n; ++r) {
      const int64_t label = static_cast<int64_t>(next() % 10);
      lo = std::min(lo, label);
      hi = std::max(hi, label);
      std::memcpy(&y[static_cast<size_t>(r * 8)], &label, 8);
      char* row = &x[static_cast<size_t>(r * width)];
      for (int64_t c = 0; c < width; c += 8) {
        const uint64_t noise = next();
        std::memcpy(row + c, &noise, static_cast<size_t>(std::min<int64_t>(8, width - c)));
      }
      for (int64_t c = 0; c < std::min<int64_t>(16, width); ++c) {
        row[c] = static_cast<char>(20 * label + (static_cast<unsigned char>(row[c]) % 40));
      }
    }
    auto header = trainyard::EncodeSafetensorsHeader(
        {{"x", "U8", {n, width}, x}, {"y", "I64", {n}, y}},
        {{"trainyard.min.y", absl::StrCat(lo)}, {"trainyard.max.y", absl::StrCat(hi)}});
    if (!header.ok()) {
      std::cerr << header.status() << "\n";
      return 1;
    }
    const std::string path = absl::StrFormat("%s/train-%05d.safetensors", dir, s);
    std::ofstream out(path, std::ios::binary);
    out << *header << x << y;
    if (!out) {
      std::cerr << "cannot write " << path << "\n";
      return 1;
    }
    bytes += static_cast<int64_t>(header->size() + x.size() + y.size());
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  std::cout << absl::StrFormat(R"({"mode": "gen", "samples": %d, "bytes": %d, "seconds": %.2f})",
                               total, bytes, seconds)
            << "\n";
  return 0;
}

absl::StatusOr<trainyard::v1::JobSpec> ReadSpec() {
  std::ifstream in(absl::GetFlag(FLAGS_spec));
  std::stringstream text;
  text << in.rdbuf();
  return trainyard::ParseJobSpecYaml(text.str());
}

int Read() {
  absl::StatusOr<trainyard::v1::JobSpec> spec = ReadSpec();
  if (!spec.ok()) {
    std::cerr << spec.status() << "\n";
    return 2;
  }
  using namespace trainyard::trainer;
  const Clock::time_point open_start = Clock::now();
  DataOptions options = DataOptions::FromEnvironment();
  options.stores = &Stores();
  auto data = OpenTrainingData(spec->data(), spec->seed(), true, options);
  if (!data.ok()) {
    std::cerr << data.status() << "\n";
    return 2;
  }
  const double open_seconds = std::chrono::duration<double>(Clock::now() - open_start).count();
  trainyard::v1::JobSpec epochs = *spec;
  epochs.set_max_steps(0);
  epochs.set_epochs(absl::GetFlag(FLAGS_epochs));
  auto plan = PlanSteps(epochs, (*data)->train_size(), 1);
  if (!plan.ok()) {
    std::cerr << plan.status() << "\n";
    return 2;
  }
  BatchPrefetcher::Order order;
  order.seed = spec->seed();
  order.shuffle = !spec->data().has_shuffle() || spec->data().shuffle();
  order.window = spec->data().shuffle_window();
  order.prefetch_shards = spec->data().prefetch_shards() > 0 ? spec->data().prefetch_shards() : 2;
  const Clock::time_point start = Clock::now();
  BatchPrefetcher prefetcher(**data, *plan, order, 0, 1, 0, plan->total_steps);
  int64_t samples = 0, bytes = 0;
  while (std::optional<Batch> batch = prefetcher.Next()) {
    samples += batch->features.size(0);
    // The bytes the batch was built from: the file's uint8 or other dtype, plus the labels.
    bytes += batch->features.numel() + batch->labels.numel() * 8;
  }
  if (!prefetcher.status().ok()) {
    std::cerr << prefetcher.status() << "\n";
    return 1;
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  std::cout
      << absl::StrFormat(
             R"({"mode": "read", "samples": %d, "seconds": %.3f, "samples_per_second": %.0f, )"
             R"("mib_per_second": %.1f, "open_seconds": %.3f, "fetched_bytes": %d, )"
             R"("peak_rss_mib": %.0f})",
             samples, seconds, samples / seconds, bytes / seconds / (1 << 20), open_seconds,
             (*data)->bytes_fetched(), PeakRssMiB())
      << "\n";
  return 0;
}

int Train() {
  absl::StatusOr<trainyard::v1::JobSpec> spec = ReadSpec();
  if (!spec.ok()) {
    std::cerr << spec.status() << "\n";
    return 2;
  }
  trainyard::v1::Task task;
  task.set_task_id("bench.g1.r0");
  task.set_job_id("bench");
  task.set_world_size(1);
  // As the coordinator hands a rank its limit (resources.memory); the caller puts this process
  // in a cgroup of that size, as the agent would.
  task.set_memory_limit_bytes(spec->resources().memory_bytes());
  task.set_data_memory_bytes(absl::GetFlag(FLAGS_data_memory));
  *task.mutable_spec() = *spec;
  trainyard::trainer::TrainerOptions options;
  options.stores = &Stores();
  options.num_threads = 1;
  options.data = trainyard::trainer::DataOptions::FromEnvironment();
  std::vector<double> rates;
  const std::regex rate(R"(samples_per_s=([0-9.]+))");
  options.print_line = [&](const std::string& line) {
    std::smatch m;
    if (std::regex_search(line, m, rate)) rates.push_back(std::stod(m[1]));
  };
  const Clock::time_point start = Clock::now();
  auto result = trainyard::trainer::RunTrainer(task, options);
  if (!result.ok()) {
    std::cerr << result.status() << "\n";
    return 1;
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  // The steady rate: the median of the progress lines after the first two.
  std::vector<double> steady(rates.begin() + std::min<size_t>(2, rates.size()), rates.end());
  std::sort(steady.begin(), steady.end());
  const double median = steady.empty() ? 0 : steady[steady.size() / 2];
  std::cout << absl::StrFormat(
                   R"({"mode": "train", "steps": %d, "seconds": %.2f, "samples_per_second": %.0f, )"
                   R"("data_wait_share": %.4f, "loss": %.4f, "val_accuracy": %.4f, )"
                   R"("peak_rss_mib": %.0f})",
                   result->step, seconds, median,
                   result->step_seconds > 0 ? result->data_wait_seconds / result->step_seconds : 0,
                   result->loss, result->val_accuracy.value_or(-1), PeakRssMiB())
            << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string mode = absl::GetFlag(FLAGS_mode);
  if (mode == "gen") return Gen();
  if (mode == "read") return Read();
  if (mode == "train") return Train();
  std::cerr << "--mode=gen|read|train\n";
  return 2;
}
