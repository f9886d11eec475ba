// What keeping a rank's flight record (common/flight_record.h) costs a training step.
//
//   flight_record_bench [--buckets=8] [--call_steps=200000] [--steps=300] [--rounds=5]
//                       [--batch=64 --inputs=256 --hidden=1024]
//
// 1. The recorder's calls of one data-parallel step, timed alone on the file the trainer keeps
//    (a memory-mapped file in a temporary folder, the real clock): the phases the loop enters
//    (data, then forward and backward of each of two micro-batches, then optimizer: six changes),
//    the step, and the Begin and End of each of --buckets gradient all-reduces and of the step's
//    agreement.
// 2. The trainer's step (RunTrainer, one rank, one LibTorch thread, standalone) on the MLP of
//    bench/ddp_scaling (--inputs -> --hidden -> --hidden -> 10, batch --batch), with and without a
//    recorder, the two taking turns for --rounds rounds: each round's mean step time
//    (TrainResult.step_seconds over its updates), and the median of the rounds.
//
// Prints one JSON line per part; the second gives the calls' share of the step.

#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "common/clock.h"
#include "common/flight_record.h"
#include "common/storage/object_store.h"
#include "worker/trainer/loop/trainer.h"

ABSL_FLAG(int, buckets, 8, "gradient all-reduces per step in the timed calls");
ABSL_FLAG(int, call_steps, 200000, "steps' worth of recorder calls timed");
ABSL_FLAG(int, steps, 300, "updates per training round");
ABSL_FLAG(int, rounds, 5, "training rounds with and without a recorder, taking turns");
ABSL_FLAG(int, batch, 64, "batch size");
ABSL_FLAG(int, inputs, 256, "features per sample");
ABSL_FLAG(int, hidden, 1024, "width of the two hidden layers");

namespace {

using Steady = std::chrono::steady_clock;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// A new folder under /tmp, removed on destruction.
class TempFolder {
 public:
  TempFolder() {
    char name[] = "/tmp/flight_record_bench.XXXXXX";
    path_ = ::mkdtemp(name);
  }
  ~TempFolder() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Nanoseconds of recorder calls per step.
double TimeCalls(trainyard::FlightRecorder& recorder, int buckets, int steps) {
  using trainyard::CollectiveKind;
  using trainyard::RankPhase;
  std::vector<uint64_t> tokens(static_cast<size_t>(buckets));
  const Steady::time_point start = Steady::now();
  for (int step = 0; step < steps; ++step) {
    recorder.SetPhase(RankPhase::kData);
    for (int m = 0; m < 2; ++m) {
      recorder.SetPhase(RankPhase::kForward);
      recorder.SetPhase(RankPhase::kBackward);
    }
    for (int b = 0; b < buckets; ++b) {
      tokens[static_cast<size_t>(b)] = recorder.Begin(CollectiveKind::kAllReduce, 25 << 20);
    }
    recorder.SetPhase(RankPhase::kOptimizer);
    for (int b = 0; b < buckets; ++b) recorder.End(tokens[static_cast<size_t>(b)], true);
    recorder.End(recorder.Begin(CollectiveKind::kAllReduce, 16), true);
    recorder.SetStep(step + 1);
  }
  const double seconds = std::chrono::duration<double>(Steady::now() - start).count();
  return seconds * 1e9 / steps;
}

const trainyard::ObjectStoreResolver& Stores() {
  static const trainyard::ObjectStoreResolver* const kStores =
      trainyard::NewObjectStoreResolver([](const char* name) {
        return std::getenv(name);
      }).release();
  return *kStores;
}

trainyard::v1::Task MlpTask() {
  trainyard::v1::Task task;
  task.set_task_id("bench.g1.r0");
  task.set_job_id("bench");
  task.set_generation(1);
  task.set_world_size(1);
  task.set_slots(1);
  auto& spec = *task.mutable_spec();
  spec.set_strategy(trainyard::v1::SINGLE);
  spec.mutable_model()->set_builtin("mlp");
  auto& args = *spec.mutable_model()->mutable_args();
  args.set_inputs(absl::GetFlag(FLAGS_inputs));
  args.add_hidden(absl::GetFlag(FLAGS_hidden));
  args.add_hidden(absl::GetFlag(FLAGS_hidden));
  args.set_classes(10);
  auto& data = *spec.mutable_data()->mutable_synthetic();
  data.set_samples(8192);
  data.set_features(absl::GetFlag(FLAGS_inputs));
  data.set_classes(10);
  spec.set_batch_size(absl::GetFlag(FLAGS_batch));
  spec.set_max_steps(absl::GetFlag(FLAGS_steps));
  spec.set_log_every_steps(100);
  spec.mutable_optimizer()->set_name("sgd");
  spec.mutable_optimizer()->set_lr(0.01);
  spec.mutable_optimizer()->set_momentum(0.9);
  return task;
}

// Seconds per update of one training round; negative when it fails.
double TrainRound(trainyard::FlightRecorder* recorder) {
  trainyard::trainer::TrainerOptions options;
  options.stores = &Stores();
  options.num_threads = 1;
  options.print_line = [](const std::string&) {};
  options.recorder = recorder;
  absl::StatusOr<trainyard::trainer::TrainResult> result =
      trainyard::trainer::RunTrainer(MlpTask(), options);
  if (!result.ok() || result->step <= 0) {
    std::fprintf(stderr, "training: %s\n", result.status().ToString().c_str());
    return -1;
  }
  return result->step_seconds / static_cast<double>(result->step - result->start_step);
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  TempFolder folder;
  const std::string path = folder.path() + "/" + trainyard::kFlightRecordFile;
  absl::StatusOr<std::unique_ptr<trainyard::FlightRecorder>> recorder =
      trainyard::FlightRecorder::Create(path, trainyard::RealClock::Get());
  if (!recorder.ok()) {
    std::fprintf(stderr, "%s\n", recorder.status().ToString().c_str());
    return 1;
  }
  const int buckets = absl::GetFlag(FLAGS_buckets);
  TimeCalls(**recorder, buckets, 1000);  // warm-up
  const double call_ns = TimeCalls(**recorder, buckets, absl::GetFlag(FLAGS_call_steps));
  std::printf("{\"part\": \"calls\", \"buckets\": %d, \"ns_per_step\": %.0f}\n", buckets, call_ns);
  std::fflush(stdout);

  std::vector<double> with;
  std::vector<double> without;
  for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
    const double plain = TrainRound(nullptr);
    const double recorded = TrainRound(recorder->get());
    if (plain < 0 || recorded < 0) return 1;
    without.push_back(plain);
    with.push_back(recorded);
    std::fprintf(stderr, "round %d: %.3f ms without, %.3f ms with\n", round, plain * 1e3,
                 recorded * 1e3);
  }
  const double step_without = Median(without);
  const double step_with = Median(with);
  std::printf(
      "{\"part\": \"steps\", \"batch\": %d, \"step_ms_without\": %.3f, \"step_ms_with\": %.3f, "
      "\"with_over_without\": %.4f, \"calls_share_of_step\": %.6f}\n",
      absl::GetFlag(FLAGS_batch), step_without * 1e3, step_with * 1e3, step_with / step_without,
      call_ns * 1e-9 / step_without);
  return 0;
}
