// Data-parallel scaling of the real trainer: the same job (same global batch) on 1 rank and on 2
// ranks, one CPU each, with gradient all-reduce overlapped with backward or not. Ranks are real
// trainyard-trainer processes meeting through a coordinator run inside this program.
//
//   ddp_scaling --bin_dir=BUILD/bin [--steps=200 --batch=64 --inputs=256 --hidden=1024]
//
// Prints one JSON line per configuration with rank 0's steady-state samples per second (median
// of its progress lines after the first two) and its CPU time over its wall time (about 1 when it
// keeps to its one core).

#include <fcntl.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "common/rpc/credentials.h"
#include "server/api/coordinator_server.h"
#include "server/jobs/job_manager.h"
#include "server/store/sqlite_job_store.h"

ABSL_FLAG(std::string, bin_dir, "", "folder with trainyard-trainer");
ABSL_FLAG(int, steps, 200, "updates per run");
ABSL_FLAG(int, batch, 64, "global batch size");
ABSL_FLAG(int, inputs, 256, "features per sample");
ABSL_FLAG(int, hidden, 1024, "width of the two hidden layers");

namespace {

using trainyard::v1::JobSpec;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

pid_t Spawn(const std::vector<std::string>& argv, const std::string& cwd, int cpu) {
  const pid_t pid = fork();
  if (pid == 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu % std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)), &set);
    sched_setaffinity(0, sizeof(set), &set);
    if (chdir(cwd.c_str()) != 0) _exit(126);
    const int fd = open("log", O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    setenv("OMP_NUM_THREADS", "1", 1);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  return pid;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  // The trainers run in their own folders: the path must not be relative.
  const std::string trainer =
      std::filesystem::absolute(absl::GetFlag(FLAGS_bin_dir) + "/trainyard-trainer").string();
  char pattern[] = "/tmp/ddp_scaling.XXXXXX";
  const std::string dir = mkdtemp(pattern);
  trainyard::JobManagerOptions options;
  options.checkpoint_root = "file://" + dir + "/ckpt";
  options.worker_timeout = absl::Hours(1);  // no agents here to renew the leases
  // The trainers present the credentials their tasks carry, as under a real agent.
  options.task_credential_key = trainyard::RandomBytes(32);
  auto manager = trainyard::JobManager::Create(
      trainyard::RealClock::Get(), *trainyard::SqliteJobStore::Open(dir + "/state.db"),
      std::make_unique<trainyard::LogStore>(dir + "/logs"), options);
  if (!manager.ok()) return 1;
  auto token_store = trainyard::SqliteJobStore::Open(dir + "/state.db");
  if (!token_store.ok()) return 1;
  auto auth = trainyard::Authenticator::Create(**token_store, options.task_credential_key,
                                               trainyard::RealClock::Get());
  if (!auth.ok()) return 1;
  auto server = trainyard::CoordinatorServer::Start(**manager, **auth, {});
  if (!server.ok()) return 1;
  for (int i = 0; i < 2; ++i) {
    trainyard::v1::RegisterWorkerRequest request;
    request.set_name(absl::StrCat("w", i));
    request.set_address("127.0.0.1");
    request.set_slots(4);
    (void)(*manager)->RegisterWorker(request);
  }
  struct Config {
    int world;
    bool overlap;
  };
  for (const Config& config : {Config{1, true}, Config{2, true}, Config{2, false}}) {
    JobSpec spec;
    spec.set_name(absl::StrCat("scale-", config.world, config.overlap ? "-overlap" : "-serial"));
    spec.set_strategy(trainyard::v1::DATA_PARALLEL);
    spec.mutable_workers()->set_min(config.world);
    spec.mutable_workers()->set_max(config.world);
    auto& args = *spec.mutable_model()->mutable_args();
    spec.mutable_model()->set_builtin("mlp");
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
    spec.set_log_every_steps(20);
    spec.mutable_optimizer()->set_name("sgd");
    spec.mutable_optimizer()->set_lr(0.01);
    spec.mutable_optimizer()->set_momentum(0.9);
    auto job = (*manager)->SubmitJob(spec);
    if (!job.ok()) {
      std::fprintf(stderr, "%s\n", job.status().ToString().c_str());
      return 1;
    }
    (*manager)->Tick();
    std::vector<pid_t> pids;
    const auto started = std::chrono::steady_clock::now();
    for (int rank = 0; rank < config.world; ++rank) {
      auto task = (*manager)->TaskFor(absl::StrCat(job->id(), ".g1.r", rank));
      const std::string task_dir = absl::StrCat(dir, "/", task->task_id());
      std::filesystem::create_directories(task_dir);
      std::ofstream(task_dir + "/task.pb", std::ios::binary) << task->SerializeAsString();
      pids.push_back(Spawn({trainer, "--task_file=task.pb",
                            absl::StrCat("--coordinator=127.0.0.1:", (*server)->port()),
                            absl::StrCat("--overlap_communication=", config.overlap)},
                           task_dir, rank));
    }
    double cpu_per_wall = 0;
    for (size_t i = 0; i < pids.size(); ++i) {
      struct rusage usage = {};
      wait4(pids[i], nullptr, 0, &usage);
      if (i > 0) continue;
      const double wall =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      const double cpu =
          static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
          1e-6 * static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
      cpu_per_wall = cpu / wall;
    }
    const std::string log = ReadFile(absl::StrCat(dir, "/", job->id(), ".g1.r0/log"));
    std::vector<double> rates;
    const std::regex re("samples_per_s=([0-9.]+)");
    for (auto it = std::sregex_iterator(log.begin(), log.end(), re); it != std::sregex_iterator();
         ++it) {
      rates.push_back(std::stod((*it)[1]));
    }
    if (rates.size() < 3) {
      std::fprintf(stderr, "run %s: too few progress lines:\n%s\n", spec.name().c_str(),
                   log.c_str());
      return 1;
    }
    rates.erase(rates.begin(), rates.begin() + 2);
    std::sort(rates.begin(), rates.end());
    std::printf(
        "{\"world\": %d, \"overlap\": %s, \"samples_per_second\": %.1f, \"cpu_per_wall\": %.2f}\n",
        config.world, config.overlap ? "true" : "false", rates[rates.size() / 2], cpu_per_wall);
    std::fflush(stdout);
  }
  (*server)->Shutdown(absl::Seconds(1));
  std::filesystem::remove_all(dir);
  return 0;
}
