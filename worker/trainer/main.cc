// trainyard-trainer: runs one task (one rank of one attempt of a job). Started by the worker
// agent in the task's own folder; see --help.

#include <fcntl.h>
#include <semaphore.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/exit_codes.h"
#include "common/flight_record.h"
#include "common/log.h"
#include "common/spec/job_spec.h"
#include "common/storage/object_store.h"
#include "google/protobuf/text_format.h"
#include "trainyard/v1/agent_service.pb.h"
#include "worker/trainer/coordinator/coordinator_client.h"
#include "worker/trainer/coordinator/grpc_channel.h"
#include "worker/trainer/coordinator/rendezvous_client.h"
#include "worker/trainer/loop/errors.h"
#include "worker/trainer/loop/shard_task.h"
#include "worker/trainer/loop/trainer.h"
#include "worker/trainer/model/gpu_check.h"
#include "worker/trainer/model/model.h"
#include "worker/trainer/program/program.h"

ABSL_FLAG(std::string, task_file, "",
          "Path of the task to run: a binary-serialised trainyard.v1.Task.");
ABSL_FLAG(std::string, coordinator, "",
          "host:port (or comma-separated list) of the coordinators' AgentService for progress, "
          "checkpoint "
          "commits and the "
          "model report. Empty: standalone (no reports; checkpoints are written but not "
          "committed or retired). A data_parallel task with several ranks needs it: the ranks "
          "meet through the coordinator's rendezvous store.");
ABSL_FLAG(absl::Duration, coordinator_retry, absl::Seconds(60),
          "How long checkpoint commits and the final reports keep retrying while the coordinator "
          "is unreachable (it may be restarting). Progress reports retry for as long as the "
          "trainer runs.");
ABSL_FLAG(
    bool, runtime, false,
    "Print what this trainer runs and exit: its LibTorch's version, CUDA and NCCL, the newest "
    "TorchScript archive format it loads and every operator it has (a "
    "trainyard.v1.TrainerRuntime in text format; the agent reports it at registration).");
ABSL_FLAG(int, gpu_check, -1,
          "Check CUDA device N and exit (the worker agent runs it before it gives a GPU out): "
          "known matrix products against the CPU's and a 256 MiB memory pattern. Prints one line; "
          "exits 0 when it passed, 3 when the GPU failed it, 1 when nothing was checked (no CUDA "
          "in this LibTorch, no device N).");
ABSL_FLAG(std::string, python_module_dir, "",
          "A job's own program: the folder holding the Python module trainyard/ that its "
          "PYTHONPATH starts with. Empty: share/trainyard/python beside this binary's bin/.");
ABSL_FLAG(absl::Duration, peer_loss_grace, absl::Seconds(15),
          "A job's own program of several ranks that fails (not with exit code 2): how long its "
          "host waits for the coordinator to end the attempt for a lost peer (whose loss then "
          "names the cause) before it reports the failure as the program's own.");
ABSL_FLAG(bool, overlap_communication, true,
          "data_parallel: start each gradient bucket's all-reduce from autograd hooks as soon as "
          "backward has produced it (true), or all of them after backward (false).");

namespace {

std::atomic<int> stop_signal{0};
// Posted by the stop handler (sem_post is async-signal-safe) and at a StopWatchdog's end: what the
// watchdog sleeps on, so that a run that is never stopped never wakes it.
sem_t stop_posted;

void OnStopSignal(int signo) {
  stop_signal.store(signo);
  sem_post(&stop_posted);
}

int Fail(int code, const std::string& message) {
  trainyard::LogError(message);
  trainyard::trainer::WriteTerminationMessage("", message);
  return code;
}

// Ends the process with kExitStoppedBySignal just before a stop's deadline if the run is still
// busy then (a checkpoint that does not finish in time), so that it exits with the stop's code
// rather than by the SIGKILL the agent sends at the deadline.
class StopWatchdog {
 public:
  StopWatchdog() : thread_([this] { Loop(); }) {}
  ~StopWatchdog() {
    {
      absl::MutexLock lock(&mu_);
      done_ = true;
    }
    sem_post(&stop_posted);
    thread_.join();
  }

 private:
  static constexpr absl::Duration kExitAhead = absl::Milliseconds(200);

  void Loop() {
    while (sem_wait(&stop_posted) != 0 && errno == EINTR) {
    }
    absl::MutexLock lock(&mu_);
    if (done_ || stop_signal.load() == 0) return;
    const std::optional<absl::Time> deadline =
        trainyard::trainer::ReadStopDeadline(trainyard::trainer::kStopDeadlineFile);
    if (!deadline.has_value()) return;  // a stop without a deadline: nothing to enforce
    if (mu_.AwaitWithTimeout(absl::Condition(&done_),
                             *deadline - kExitAhead - trainyard::RealClock::Get().Now())) {
      return;
    }
    const std::string message =
        "stopped by SIGTERM: the deadline came before the checkpoint of the stop was saved";
    trainyard::LogWarning(message);
    trainyard::trainer::WriteTerminationMessage("", message);
    std::fflush(nullptr);
    std::_Exit(trainyard::kExitStoppedBySignal);
  }

  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: it starts in the constructor
};

// The environment variable naming the folder of test holds (see TestHold).
constexpr char kTestHoldDirEnv[] = "TRAINYARD_TEST_HOLD_DIR";

// The path of the test hold file `name` (TRAINYARD_TEST_HOLD_DIR/name); empty when the variable
// is unset, as in production.
std::string TestHoldPath(const std::string& name) {
  const char* dir = std::getenv(kTestHoldDirEnv);
  if (dir == nullptr || *dir == '\0') return "";
  return absl::StrCat(dir, "/", name);
}

// Waits while `held()` and no stop has arrived, saying so in the log ("held by PATH WHERE",
// "released WHERE") when it waits at all.
void HoldWhile(const std::string& path, const std::string& where,
               const std::function<bool()>& held) {
  if (!held()) return;
  trainyard::LogInfo("held by ", path, " ", where);
  while (stop_signal.load() == 0 && held())
    trainyard::RealClock::Get().SleepFor(absl::Milliseconds(10));
  trainyard::LogInfo("released ", where);
}

// A hold for tests that must act while a job is running, so that none depends on how fast the
// machine trains. With TRAINYARD_TEST_HOLD_DIR set, a file named after the job in that folder
// holding a number K makes every attempt wait before its update K + 1 (K updates after the step
// it started from) until the file is removed or holds a larger K, or a stop arrives: a stopped
// rank goes on to the step its gang agrees on, as it would have without the hold. Unset (as in
// production), it costs nothing.
std::function<void(int64_t, int64_t)> TestHold(const trainyard::v1::Task& task) {
  const std::string path = TestHoldPath(task.spec().name());
  if (path.empty()) return nullptr;
  return [path](int64_t step, int64_t attempt_start_step) {
    HoldWhile(path, absl::StrCat("at step ", step), [&] {
      std::ifstream in(path);
      int64_t updates = 0;
      return in >> updates && step - attempt_start_step >= updates;
    });
  };
}

// Whether the hold file at `path` holds "R K" with R this task's rank and K at most `count`.
bool RankHeld(const std::string& path, const trainyard::v1::Task& task, int64_t count) {
  std::ifstream in(path);
  int64_t rank = -1;
  int64_t k = 0;
  return in >> rank >> k && rank == task.rank() && count >= k;
}

// A test hold of one rank in its data read (a rank whose data never comes, while the others wait
// for it in a collective). With TRAINYARD_TEST_HOLD_DIR set, a file {job}.data in that folder
// holding "R K" (two integers) makes rank R of every attempt, in the data phase of its flight
// record, wait before it takes the batch of its update K + 1 (K updates after the step it started
// from) until the file is removed or a stop arrives. Unset, it costs nothing (no hook).
std::function<void(int64_t, int64_t)> TestDataHold(const trainyard::v1::Task& task) {
  const std::string path = TestHoldPath(task.spec().name() + ".data");
  if (path.empty()) return nullptr;
  return [path, task](int64_t step, int64_t attempt_start_step) {
    HoldWhile(path, absl::StrCat("in its data read at step ", step),
              [&] { return RankHeld(path, task, step - attempt_start_step); });
  };
}

// A test hold of one rank before a point-to-point send (a pipeline stage that never sends, while
// the next stage waits to receive). With TRAINYARD_TEST_HOLD_DIR set, a file {job}.send in that
// folder holding "R K" (two integers) makes rank R of every attempt wait before its K-th send
// (the K-th SendAsync of its attempt, every peer counted, and each later one) until the file is
// removed or a stop arrives; the rank is then in its forward or backward phase, the send neither
// recorded nor issued. Needs the flight record (the recording communicator calls it). Unset, it
// costs nothing (no hook).
std::function<void(int, int64_t)> TestSendHold(const trainyard::v1::Task& task) {
  const std::string path = TestHoldPath(task.spec().name() + ".send");
  if (path.empty()) return nullptr;
  return [path, task](int peer, int64_t send) {
    HoldWhile(path, absl::StrCat("before its send ", send, " (to rank ", peer, ")"),
              [&] { return RankHeld(path, task, send); });
  };
}

// Keeps kLastStepFile in the task folder at the last completed update: one pwrite of a fixed-width
// line per update (the page cache only; nothing is synced), so that the agent can report the
// rank's exact last step however the trainer ends, kill -9 included. Null when the file cannot
// be opened (the report then says unknown).
std::function<void(int64_t)> LastStepRecorder() {
  const int fd = ::open(trainyard::kLastStepFile, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    trainyard::LogWarning("cannot write ", trainyard::kLastStepFile, ": ", std::strerror(errno));
    return nullptr;
  }
  // The process's lifetime: the descriptor closes when the trainer exits.
  return [fd](int64_t step) {
    char line[24];
    const int n = std::snprintf(line, sizeof(line), "%-20lld\n", static_cast<long long>(step));
    if (::pwrite(fd, line, n, 0) != n) return;  // best effort: the report falls back to progress
  };
}

int ThreadCount(const trainyard::v1::Task& task) {
  const char* omp = std::getenv("OMP_NUM_THREADS");
  int n = 0;
  if (omp != nullptr && absl::SimpleAtoi(omp, &n) && n > 0) return n;
  return task.slots() > 0 ? task.slots() : 1;
}

}  // namespace

namespace {

// A parameter-server shard: serves its attempt's ranks until they finish or a stop signal.
int ServeShard(const trainyard::v1::Task& task, trainyard::trainer::RendezvousClient* rendezvous) {
  trainyard::trainer::ShardTaskOptions shard_options;
  shard_options.rendezvous = rendezvous;
  shard_options.stop_signal = &stop_signal;
  shard_options.stop_deadline_file = trainyard::trainer::kStopDeadlineFile;
  shard_options.metrics_file = trainyard::kShardMetricsFile;
  shard_options.tls = trainyard::PsTls::FromEnvironment();
  const absl::Status served = trainyard::trainer::RunShardTask(task, shard_options);
  if (!served.ok()) {
    return Fail(trainyard::trainer::ExitCodeForStatus(served), std::string(served.message()));
  }
  if (stop_signal.load() == 0) return trainyard::kExitOk;  // every rank finished
  const std::string message = absl::StrCat("parameter server stopped by ",
                                           stop_signal.load() == SIGINT ? "SIGINT" : "SIGTERM");
  trainyard::LogInfo(message);
  trainyard::trainer::WriteTerminationMessage("", message);
  return trainyard::kExitStoppedBySignal;
}

// The task's object stores, their S3 settings and credentials read once, here; local files only
// under the coordinator's allowed folders, symbolic links followed.
std::unique_ptr<trainyard::ObjectStoreResolver> TaskStores(const trainyard::v1::Task& task) {
  std::optional<std::vector<std::string>> local_roots;
  if (task.has_local_paths()) {
    local_roots.emplace(task.local_paths().allowed().begin(), task.local_paths().allowed().end());
  }
  return trainyard::NewObjectStoreResolver([](const char* name) { return std::getenv(name); },
                                           local_roots);
}

// The folder of the Python module for programs: --python_module_dir, else
// <this binary's folder>/../share/trainyard/python.
std::string PythonModuleDir() {
  std::string dir = absl::GetFlag(FLAGS_python_module_dir);
  if (!dir.empty()) return dir;
  char exe[4096];
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) return "";
  const std::string path(exe, static_cast<size_t>(n));
  const std::string bin = path.substr(0, path.rfind('/'));
  return bin.substr(0, bin.rfind('/')) + "/share/trainyard/python";
}

// A rank of a job's own program: runs it to its end (worker/trainer/program/program.h).
int RunProgramRank(const trainyard::v1::Task& task,
                   trainyard::trainer::CoordinatorClient* coordinator,
                   trainyard::trainer::RendezvousClient* rendezvous) {
  const std::unique_ptr<trainyard::ObjectStoreResolver> stores = TaskStores(task);
  trainyard::trainer::program::ProgramOptions options;
  options.coordinator = coordinator;
  options.rendezvous = rendezvous;
  options.stores = stores.get();
  options.stop_signal = &stop_signal;
  options.python_module_dir = PythonModuleDir();
  options.coordinator_retry_for = absl::GetFlag(FLAGS_coordinator_retry);
  options.peer_loss_grace = absl::GetFlag(FLAGS_peer_loss_grace);
  options.serve_agent_store = trainyard::trainer::program::ServeTorchStore;
  options.trainer_torch_version = trainyard::trainer::program::TrainerTorchVersion();
  options.store_without_libuv = !trainyard::trainer::program::TorchStoreDefaultsWork();
  // A program silent for its stall_timeout reports no steps (its stall clock starts at its first
  // report): it is taken for one sooner, when the job says a step never takes so long.
  if (const int64_t stall = task.spec().stall_timeout_seconds(); stall > 0) {
    options.silent_program_after = std::min(options.silent_program_after, absl::Seconds(stall));
  }
  const std::function<void(int64_t, int64_t)> hold = TestHold(task);
  if (hold) options.before_step = hold;
  trainyard::trainer::program::ProgramResult result;
  {
    StopWatchdog watchdog;
    result = trainyard::trainer::program::RunProgram(task, options);
  }
  if (!result.message.empty()) {
    if (result.exit_code == trainyard::kExitOk ||
        result.exit_code == trainyard::kExitStoppedBySignal) {
      trainyard::LogInfo(result.message);
    } else {
      trainyard::LogError(result.message);
    }
    trainyard::trainer::WriteTerminationMessage("", result.message);
  }
  return result.exit_code;
}

// A rank: trains to the end, or to the step every rank stops at on a stop signal.
int Train(const trainyard::v1::Task& task, trainyard::trainer::CoordinatorClient* coordinator,
          trainyard::trainer::RendezvousClient* rendezvous) {
  const std::unique_ptr<trainyard::ObjectStoreResolver> stores = TaskStores(task);
  trainyard::trainer::TrainerOptions options;
  options.stores = stores.get();
  options.coordinator = coordinator;
  options.rendezvous = rendezvous;
  options.overlap_communication = absl::GetFlag(FLAGS_overlap_communication);
  options.stop_signal = &stop_signal;
  options.stop_deadline_file = trainyard::trainer::kStopDeadlineFile;
  options.coordinator_retry_for = absl::GetFlag(FLAGS_coordinator_retry);
  options.num_threads = ThreadCount(task);
  options.data = trainyard::trainer::DataOptions::FromEnvironment();
  options.ps_tls = trainyard::PsTls::FromEnvironment();
  options.before_step = TestHold(task);
  options.in_data_wait = TestDataHold(task);
  options.before_send = TestSendHold(task);
  options.after_step = LastStepRecorder();
  // The flight record lives in the task folder (the working directory) for the agent to read;
  // it outlives RunTrainer, and so every Work of the run.
  absl::StatusOr<std::unique_ptr<trainyard::FlightRecorder>> recorder =
      trainyard::FlightRecorder::Create(trainyard::kFlightRecordFile, trainyard::RealClock::Get());
  if (recorder.ok()) {
    options.recorder = recorder->get();
  } else {
    trainyard::LogWarning("running without a flight record: ", recorder.status().message());
  }
  absl::StatusOr<trainyard::trainer::TrainResult> result;
  {
    StopWatchdog watchdog;
    result = trainyard::trainer::RunTrainer(task, options);
  }
  if (!result.ok()) {
    return Fail(trainyard::trainer::ExitCodeForStatus(result.status()),
                std::string(result.status().message()));
  }
  if (result->stopped) {
    const int signo = stop_signal.load();
    const std::string message = absl::StrCat(
        "stopped by ", signo == SIGINT ? "SIGINT" : "SIGTERM", " at step ", result->step,
        result->stop_checkpoint_skipped
            ? "; its checkpoint was skipped: it would not have been saved before "
              "the deadline"
            : "");
    trainyard::LogInfo(message);
    trainyard::trainer::WriteTerminationMessage("", message);
    return trainyard::kExitStoppedBySignal;
  }
  return trainyard::kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  // absl's Mutex checks every lock for lock-order cycles unless told not to (this build of it
  // has the check on); gRPC's locks go through it too. Measured in the coordinator: 9 % of its
  // CPU with 1,000 idle agents (docs/benchmarks.md).
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  absl::SetProgramUsageMessage(
      "Runs one training task. Usage: trainyard-trainer --task_file=PATH "
      "[--coordinator=HOST:PORT], or trainyard-trainer --runtime\nExit codes: 0 done, 1 internal "
      "error, 2 user error (spec, data, "
      "model), 3 infrastructure (object store, coordinator, a lost or stuck peer), 143 stopped by "
      "SIGTERM/SIGINT (after checkpointing the step all ranks stop at, unless ./stop-deadline "
      "holds a deadline in unix ms that the save would not meet). On failure the cause is "
      "written to ./termination-message.");
  absl::FlagsUsageConfig usage_config;
  usage_config.contains_help_flags = [](absl::string_view file) {
    return absl::EndsWith(file, "worker/trainer/main.cc");
  };
  usage_config.contains_helpshort_flags = usage_config.contains_help_flags;
  absl::SetFlagsUsageConfig(usage_config);
  absl::ParseCommandLine(argc, argv);
  trainyard::SetLogComponent("trainer");
  // `trainyard debug --stacks`: the agent (this process's parent) runs gdb, its child, to print
  // this trainer's stacks; Yama's ptrace_scope 1 lets only a process's ancestors trace it unless
  // it names one. Without Yama this fails harmlessly.
  prctl(PR_SET_PTRACER, getppid(), 0, 0, 0);

  sem_init(&stop_posted, /*pshared=*/0, /*value=*/0);
  struct sigaction action = {};
  action.sa_handler = OnStopSignal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);

  if (absl::GetFlag(FLAGS_gpu_check) >= 0) {
    return trainyard::trainer::GpuCheckMain(absl::GetFlag(FLAGS_gpu_check));
  }
  if (absl::GetFlag(FLAGS_runtime)) {
    std::string text;
    google::protobuf::TextFormat::PrintToString(trainyard::trainer::DescribeRuntime(), &text);
    std::fwrite(text.data(), 1, text.size(), stdout);
    return std::fflush(stdout) == 0 ? trainyard::kExitOk : trainyard::kExitInternal;
  }
  const std::string task_file = absl::GetFlag(FLAGS_task_file);
  if (task_file.empty()) return Fail(trainyard::kExitInternal, "--task_file is required");
  std::ifstream in(task_file, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  trainyard::v1::Task task;
  if (!in || !task.ParseFromString(bytes.str())) {
    return Fail(trainyard::kExitInternal,
                absl::StrCat("cannot read a trainyard.v1.Task from ", task_file));
  }
  // The coordinator sent the spec with its defaults; a task file made by hand gets them here.
  trainyard::ApplyJobSpecDefaults(*task.mutable_spec());
  trainyard::LogInfo("task ", task.task_id(), " job ", task.job_id(), " generation ",
                     task.generation(),
                     task.role() == trainyard::v1::TASK_ROLE_SHARD
                         ? absl::StrCat(" parameter-server shard ", task.shard(), "/",
                                        task.spec().parameter_servers().shards())
                         : absl::StrCat(" rank ", task.rank(), "/", task.world_size()));

  std::unique_ptr<trainyard::trainer::CoordinatorClient> coordinator;
  std::unique_ptr<trainyard::trainer::RendezvousClient> rendezvous;
  const std::string address = absl::GetFlag(FLAGS_coordinator);
  if (!address.empty()) {
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
        trainyard::trainer::NewCoordinatorChannel(address, task.credential());
    if (!channel.ok()) {
      return Fail(trainyard::kExitInfrastructure,
                  absl::StrCat("coordinator: ", channel.status().message()));
    }
    coordinator = trainyard::trainer::NewGrpcCoordinatorClient(
        *channel, task.job_id(), task.generation(), task.rank(), absl::Seconds(5));
    rendezvous = trainyard::trainer::NewGrpcRendezvousClient(*channel, task.job_id(),
                                                             task.generation(), task.rank());
  }

  if (task.role() == trainyard::v1::TASK_ROLE_SHARD) return ServeShard(task, rendezvous.get());
  if (task.spec().has_program()) {
    return RunProgramRank(task, coordinator.get(), rendezvous.get());
  }
  return Train(task, coordinator.get(), rendezvous.get());
}
