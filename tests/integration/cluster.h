#ifndef TRAINYARD_TESTS_INTEGRATION_CLUSTER_H_
#define TRAINYARD_TESTS_INTEGRATION_CLUSTER_H_

// A whole Trainyard cluster on loopback for integration tests: the real coordinator, worker
// agents and trainers as separate processes, ports picked by the kernel, state in a temporary
// folder. Everything started is stopped by the destructor.

#include <sys/types.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "tests/common/loopback.h"
#include "tests/common/processes.h"
#include "tests/common/run_shell.h"
#include "trainyard/v1/admin_service.grpc.pb.h"
#include "trainyard/v1/agent_service.grpc.pb.h"
#include "trainyard/v1/job_service.grpc.pb.h"

namespace trainyard::testing {

// A folder removed (recursively) on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A child process with stdout and stderr appended to `log_path`. Killed (SIGKILL) and reaped on
// destruction if still running. Not thread-safe.
class Process {
 public:
  Process(std::vector<std::string> argv, std::string log_path,
          std::map<std::string, std::string> env = {});
  ~Process();
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const { return pid_; }
  bool running();
  void Signal(int sig);
  // Waits up to `timeout` for the process to end; its wait status, or nullopt on timeout.
  std::optional<int> Wait(absl::Duration timeout);
  // SIGTERM, then SIGKILL if it has not ended within `grace`.
  void Stop(absl::Duration grace = absl::Seconds(10));
  std::string Log() const;

 private:
  pid_t pid_ = -1;
  std::optional<int> status_;
  std::string log_path_;
};

struct ClusterOptions {
  int workers = 1;
  int slots_per_worker = 1;
  absl::Duration worker_timeout = absl::Seconds(10);
  // Extra environment for the coordinator and the workers (and so their trainers), e.g.
  // AWS_ENDPOINT_URL and credentials for an s3:// checkpoint URI.
  std::map<std::string, std::string> env;
  // Extra flags for the coordinator and for every worker agent; "{i}" in a worker's flag becomes
  // the worker's index.
  std::vector<std::string> coordinator_args;
  std::vector<std::string> worker_args;
  // The CA of the coordinator's TLS certificate (its --tls_cert in coordinator_args): the
  // workers, the CLI and the test's own channels verify it. Empty: plaintext.
  std::string ca_file;
  // A PostgreSQL --store for the coordinators (empty: SQLite in the state folder), and how many
  // coordinators share it: one leads, the others stand by. With more than one, each listens on
  // a port picked up front, address() lists them all, and each has a state folder of its own
  // (for task logs) while the admin token goes to one file.
  std::string store;
  int coordinators = 1;
  // Coordinator i's --store when given (e.g. each through a relay a test can cut), else `store`.
  std::vector<std::string> coordinator_stores;
};

class Cluster {
 public:
  // Starts the coordinator and waits until it serves; then the workers and waits until they are
  // all registered. Fails the current test (ADD_FAILURE) if any step does not finish in time.
  explicit Cluster(ClusterOptions options = {});
  ~Cluster();

  const std::string& address() const { return address_; }
  // The admin token the coordinator made at its first start (<state_dir>/admin.token).
  const std::string& admin_token() const { return admin_token_; }
  // A channel to the coordinator presenting `token` (the admin token when empty).
  std::shared_ptr<grpc::Channel> NewChannel(const std::string& token = "") const;
  // A new token from the coordinator (AdminService.CreateToken); a test failure if it fails.
  std::string CreateToken(const std::string& name, trainyard::v1::TokenRole role);
  const std::string& state_dir() const { return state_dir_; }
  std::string worker_dir(int i) const;
  trainyard::v1::JobService::Stub& jobs() { return *job_stub_; }

  // Restarts the coordinator on the same state folder (after a crash or a stop).
  void KillCoordinator(int sig);
  void StartCoordinator();
  // The --store of the coordinator's next start (a state migrated into PostgreSQL).
  void set_store(std::string store) { options_.store = std::move(store); }
  Process& coordinator() { return *coordinators_[0]; }
  // With several coordinators: coordinator i, started again with StartCoordinator(i) (which
  // does not wait for it to lead), and which one leads now: the running one that has written
  // its port file (a standby writes it when it starts to lead), or -1. A frozen (SIGSTOP)
  // coordinator still counts: WaitForLeader with `not_this` looks past it.
  Process& coordinator(int i) { return *coordinators_[i]; }
  std::string coordinator_address(int i) const {
    return absl::StrCat("127.0.0.1:", coordinator_ports_[i]);
  }
  void StartCoordinator(int i);
  int Leader();
  // Waits up to `timeout` for a coordinator other than `not_this` (-1: any) to lead; its index
  // or -1.
  int WaitForLeader(absl::Duration timeout, int not_this = -1);
  Process& worker(int i) { return *workers_[i]; }

  absl::StatusOr<trainyard::v1::Job> Submit(const std::string& yaml);
  absl::StatusOr<trainyard::v1::Job> Get(const std::string& id);
  // Follows WatchJob until `done(job)` holds or the timeout passes. Returns the last job seen.
  absl::StatusOr<trainyard::v1::Job> WaitFor(const std::string& id,
                                             const std::function<bool(const v1::Job&)>& done,
                                             absl::Duration timeout = absl::Seconds(120));
  absl::StatusOr<trainyard::v1::Job> WaitForFinal(const std::string& id,
                                                  absl::Duration timeout = absl::Seconds(120));
  // Every log line of `rank` (or all ranks with -1) as the coordinator serves them.
  absl::StatusOr<std::string> Logs(const std::string& id, int rank = -1);

  struct CliResult {
    int exit_code = -1;
    std::string output;  // stdout and stderr
    // `trainyard submit` prints the new job's id as its first line.
    std::string FirstLine() const { return output.substr(0, output.find('\n')); }
  };
  // Runs the `trainyard` CLI against this cluster as an admin and waits for it.
  CliResult Cli(const std::vector<std::string>& args, absl::Duration timeout = absl::Seconds(120));

  // Holds every attempt of the job named `job_name` (its spec's name) once it has done `updates`
  // updates past the step it started from, until Release, or until the attempt is told to stop
  // (its ranks then go on to the step they agree on). Set it before submitting; the trainers
  // read it through TRAINYARD_TEST_HOLD_DIR, which every worker of the cluster gets.
  void Hold(const std::string& job_name, int64_t updates);
  void Release(const std::string& job_name);
  // Writes (whole) or removes another of the trainers' hold files in that folder: `{job}.data`
  // and `{job}.send` hold "RANK K" (worker/trainer/main.cc: TestDataHold, TestSendHold).
  void WriteHoldFile(const std::string& name, const std::string& contents);
  void RemoveHoldFile(const std::string& name);

  // A trainer process of a task, from the pid file the worker writes in the task folder.
  std::optional<pid_t> TrainerPid(int worker, const std::string& task_id) const;

  // Ports of the /metrics endpoints (every process serves them on 127.0.0.1, port picked by the
  // kernel); waits up to 30 s for the process to write its port file. 0 if it never does.
  int coordinator_metrics_port() const;
  int worker_metrics_port(int i) const;

 private:
  void StartWorker(int i);
  void WaitForWorkers();

  ClusterOptions options_;
  TempDir root_;
  std::string state_dir_;
  std::string hold_dir_;
  std::string address_;
  std::string admin_token_;
  std::string PortFile(int i) const;
  // Coordinator i's command line, listening on `listen`; ClusterOptions::coordinator_args last.
  std::vector<std::string> CoordinatorArgv(int i, const std::string& listen) const;
  bool Leads(int i);
  std::vector<std::unique_ptr<Process>> coordinators_;
  std::vector<int> coordinator_ports_;  // with several coordinators
  std::vector<std::unique_ptr<Process>> workers_;
  std::unique_ptr<trainyard::v1::JobService::Stub> job_stub_;
};

// The trainer's test hold (worker/trainer/main.cc): with TRAINYARD_TEST_HOLD_DIR=`hold_dir` in
// the trainers' environment, every attempt of the job named `job_name` waits after `updates`
// updates past its start until the hold is cleared or the attempt is told to stop.
inline constexpr char kTestHoldDirEnv[] = "TRAINYARD_TEST_HOLD_DIR";
void SetTestHold(const std::string& hold_dir, const std::string& job_name, int64_t updates);
void ClearTestHold(const std::string& hold_dir, const std::string& job_name);

// Follows WatchJob on `jobs` until `done(job)` holds or the timeout passes, watching again
// after a coordinator restart. Returns the last job seen; DEADLINE_EXCEEDED naming its state
// when the condition never held.
absl::StatusOr<trainyard::v1::Job> WatchJobUntil(
    trainyard::v1::JobService::Stub& jobs, const std::string& id,
    const std::function<bool(const trainyard::v1::Job&)>& done, absl::Duration timeout);

// Runs the `trainyard` CLI against the coordinator at `address` with `env` added to its
// environment (TRAINYARD_TOKEN, ...), its output in a file under `log_dir`, and waits for it.
Cluster::CliResult RunCli(const std::string& address, const std::string& log_dir,
                          const std::vector<std::string>& args,
                          absl::Duration timeout = absl::Seconds(120),
                          std::map<std::string, std::string> env = {});

// A small job that learns in seconds: a 2-layer MLP on 4 separable synthetic classes, seed 7,
// a log line every step. `extra` is appended as more top-level YAML (a checkpoint section, ...).
std::string SyntheticJobYaml(const std::string& name, int64_t max_steps,
                             const std::string& extra = "");

// A text of 6,000 byte tokens below 32 with some structure to learn, as one shard; its glob.
std::string WriteTokens(const std::string& dir);

// A job of 20 steps on the TorchScript files `files` (model.stages: each maps 8 features on to
// what the next takes, the last to 3 classes), on synthetic data, checkpointing at steps 10 and
// 20; `strategy_lines` says how it is distributed ("strategy: pipeline\nworkers: 2").
std::string ScriptFilesJobYaml(const std::string& name, const std::string& strategy_lines,
                               const std::vector<std::string>& files);

// Made with `openssl` in `dir` (a test failure if it fails): a CA (ca.pem, ca.key), a server
// certificate for 127.0.0.1 and localhost signed by it (server.pem, server.key), a client
// certificate for alice with OU=user (alice.pem, alice.key), and another CA that signed nothing
// here (other-ca.pem).
struct TestCertificates {
  explicit TestCertificates(const std::string& dir);
  std::string Path(const std::string& name) const { return dir + "/" + name; }
  std::string dir;
};

std::string BinDir();
std::string SourceDir();
// Reads a whole file; empty if it cannot.
std::string ReadFile(const std::string& path);
// Parses the trainer's "step=N ... loss=X" lines: step -> loss.
std::map<int64_t, double> ParseStepLosses(const std::string& log);
// Polls `condition` until it holds or `timeout` passes: waiting on an observable condition with a
// deadline, never a fixed sleep. Returns whether it holds.
bool PollUntil(const std::function<bool()>& condition, absl::Duration timeout);

// The index of a local cluster's worker ("worker-2" -> 2), -1 for another name.
int WorkerIndex(const std::string& worker_id);
// The index of the worker running `rank` of the job's current attempt, -1 if none.
// `workers` workers of one slot each that restart jobs quickly: a worker is lost after 2 s
// without its agent, a restart backs off 200 ms, an agent syncs within 500 ms.
ClusterOptions QuickRestarts(int workers);
int WorkerOfRank(const trainyard::v1::Job& job, int rank);
// The task id of `rank` of the job's current attempt ("{job}.g{generation}.r{rank}").
std::string TaskId(const trainyard::v1::Job& job, int rank);
// The step a stopped trainer of attempt `generation` saved at, from its "stopped by SIGTERM at
// step N" termination message; -1 if no task of the attempt stopped that way.
int64_t StoppedAtStep(const trainyard::v1::Job& job, int64_t generation);
// Submits `yaml` (a job named `name`) held after `held_at` updates (Cluster::Hold), and waits
// until it is held there with a checkpoint of `committed` or later committed. The caller
// releases it.
absl::StatusOr<trainyard::v1::Job> SubmitAndHold(Cluster& cluster, const std::string& name,
                                                 const std::string& yaml, int64_t held_at,
                                                 int64_t committed);
// Runs `yaml` to its end (within 240 s), expecting SUCCEEDED, and returns the final job.
trainyard::v1::Job RunToSuccess(Cluster& cluster, const std::string& yaml);

// The float32 tensors of a safetensors file, by name (a test failure when it does not decode).
std::map<std::string, std::vector<float>> ModelTensors(const std::string& path);
// The parameters in the job's newest committed checkpoint (a file:// URI), by name.
std::map<std::string, std::vector<float>> CommittedModel(const trainyard::v1::Job& job);
// The largest absolute difference between two models with the same tensors (a test failure, and
// infinity, when their tensors differ in name or size).
double MaxDifference(const std::map<std::string, std::vector<float>>& a,
                     const std::map<std::string, std::vector<float>>& b);

}  // namespace trainyard::testing

#endif  // TRAINYARD_TESTS_INTEGRATION_CLUSTER_H_
