// Writes a state folder holding one finished job whose trainer reported a very long run: the
// coordinator's own job manager over its SQLite store takes `--reports` progress reports, one
// every `--every` steps and a second apart (a simulated clock), as a trainer's would come; then
// the job is cancelled. bench/console_bench.py starts a coordinator on the folder and times the
// job's chart in the console. Prints the history's size as the coordinator kept it.

#include <cstdio>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "server/jobs/job_manager.h"
#include "server/store/log_store.h"
#include "server/store/sqlite_job_store.h"
#include "tests/common/fake_clock.h"

ABSL_FLAG(std::string, state_dir, "", "the state folder to write (state.db, logs/)");
ABSL_FLAG(int64_t, reports, 100000, "progress reports");
ABSL_FLAG(int64_t, every, 10, "steps between reports");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string dir = absl::GetFlag(FLAGS_state_dir);
  trainyard::FakeClock clock(absl::FromUnixSeconds(1700000000));
  auto store = trainyard::SqliteJobStore::Open(dir + "/state.db");
  if (!store.ok()) {
    std::fprintf(stderr, "%s\n", store.status().ToString().c_str());
    return 1;
  }
  trainyard::JobManagerOptions options;
  options.checkpoint_root = "file://" + dir + "/checkpoints";
  auto manager = trainyard::JobManager::Create(
      clock, *std::move(store), std::make_unique<trainyard::LogStore>(dir + "/logs"), options);
  if (!manager.ok()) {
    std::fprintf(stderr, "%s\n", manager.status().ToString().c_str());
    return 1;
  }
  trainyard::v1::RegisterWorkerRequest worker;
  worker.set_name("bench-worker");
  worker.set_slots(1);
  if (!(*manager)->RegisterWorker(worker).ok()) return 1;
  const int64_t every = absl::GetFlag(FLAGS_every);
  const int64_t reports = absl::GetFlag(FLAGS_reports);
  absl::StatusOr<trainyard::v1::Job> job = (*manager)->SubmitJobYaml(
      absl::StrCat("name: long-run\nmodel: {builtin: mlp, args: {inputs: 4, hidden: [8], "
                   "classes: 2}}\ndata: {synthetic: {samples: 64, features: 4, classes: 2}}\n"
                   "batch_size: 16\nmax_steps: ",
                   reports * every, "\n"),
      nullptr, {});
  if (!job.ok()) {
    std::fprintf(stderr, "%s\n", job.status().ToString().c_str());
    return 1;
  }
  (*manager)->Tick();
  for (int64_t i = 1; i <= reports; ++i) {
    clock.Advance(absl::Seconds(1));
    trainyard::v1::JobProgress p;
    p.set_step(i * every);
    p.set_total_steps(reports * every);
    p.set_loss(2.0 / (1.0 + 1e-4 * static_cast<double>(i)));
    p.set_samples_per_second(1000 + (i % 100));
    p.set_compute_seconds(0.004);
    p.set_data_wait_seconds(0.001);
    if (absl::Status s = (*manager)->ReportProgress(job->id(), 1, 0, p); !s.ok()) {
      std::fprintf(stderr, "report %lld: %s\n", static_cast<long long>(i), s.ToString().c_str());
      return 1;
    }
  }
  if (!(*manager)->CancelJob(job->id(), "the bench's run is over", "bench").ok()) return 1;
  auto history = (*manager)->MetricHistoryOf(job->id(), 0);
  if (!history.ok()) return 1;
  std::printf("%s %lld %zu\n", job->id().c_str(), static_cast<long long>(reports * every),
              history->size());
  return 0;
}
