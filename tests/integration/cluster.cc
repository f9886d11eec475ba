#include "tests/integration/cluster.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <regex>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/formats/safetensors.h"
#include "common/rpc/channel.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace trainyard::testing {
namespace {

namespace fs = std::filesystem;
using trainyard::v1::Job;

absl::Status FromGrpc(const grpc::Status& status) {
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

bool IsFinal(v1::JobState state) {
  return state == v1::SUCCEEDED || state == v1::FAILED || state == v1::CANCELLED;
}

}  // namespace

bool PollUntil(const std::function<bool()>& condition, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (condition()) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return condition();
}

std::string SyntheticJobYaml(const std::string& name, int64_t max_steps, const std::string& extra) {
  return absl::StrCat("name: ", name, R"(
strategy: single
model:
  builtin: mlp
  args: {inputs: 16, hidden: [32], classes: 4}
data:
  synthetic: {samples: 2048, features: 16, classes: 4, noise: 0.5}
batch_size: 32
optimizer: {name: adamw, lr: 0.01}
log_every_steps: 1
seed: 7
max_steps: )",
                      max_steps, "\n", extra);
}

std::string WriteTokens(const std::string& dir) {
  std::string ids(6000, '\0');
  uint32_t state = 12345;
  for (size_t i = 0; i < ids.size(); ++i) {
    state = state * 1103515245u + 12345u;
    ids[i] = static_cast<char>((i % 28) + ((state >> 16) % 4));
  }
  absl::StatusOr<std::string> header = EncodeSafetensorsHeader(
      {TensorView{"tokens", "U8", {static_cast<int64_t>(ids.size())}, ids}}, {});
  EXPECT_TRUE(header.ok()) << header.status();
  std::ofstream(dir + "/text-0.safetensors", std::ios::binary) << *header << ids;
  return dir + "/text-*.safetensors";
}

std::string ScriptFilesJobYaml(const std::string& name, const std::string& strategy_lines,
                               const std::vector<std::string>& files) {
  return absl::StrCat("name: ", name, "\n", strategy_lines, "\nmodel: {stages: [",
                      absl::StrJoin(files, ", "), "]}\n",
                      R"(data: {synthetic: {samples: 256, features: 8, classes: 3, noise: 1.0}}
batch_size: 16
optimizer: {name: sgd, lr: 0.05, momentum: 0.9}
seed: 7
collective_timeout: 20s
checkpoint: {every_steps: 10}
max_steps: 20
)");
}

std::string BinDir() {
  const char* dir = getenv("TRAINYARD_BIN_DIR");
  return dir != nullptr ? dir : "bin";
}

std::string SourceDir() {
  const char* dir = getenv("TRAINYARD_SOURCE_DIR");
  return dir != nullptr ? dir : ".";
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

std::map<int64_t, double> ParseStepLosses(const std::string& log) {
  std::map<int64_t, double> losses;
  // " loss=": not val_loss.
  static const std::regex kLine(R"(step=(\d+) (?:.* )?loss=([-+0-9.eE]+|nan|inf))");
  for (absl::string_view line : absl::StrSplit(log, '\n')) {
    std::smatch match;
    std::string text(line);
    if (!std::regex_search(text, match, kLine)) continue;
    int64_t step = 0;
    double loss = 0;
    if (absl::SimpleAtoi(match[1].str(), &step) && absl::SimpleAtod(match[2].str(), &loss)) {
      losses[step] = loss;
    }
  }
  return losses;
}

TempDir::TempDir() {
  std::string tmpl = (fs::temp_directory_path() / "trainyard-test-XXXXXX").string();
  char* made = mkdtemp(tmpl.data());
  path_ = made != nullptr ? made : "";
}

TempDir::~TempDir() {
  std::error_code ignored;
  if (!path_.empty() && getenv("TRAINYARD_KEEP_TEST_DIRS") == nullptr) {
    fs::remove_all(path_, ignored);
  }
}

Process::Process(std::vector<std::string> argv, std::string log_path,
                 std::map<std::string, std::string> env)
    : log_path_(std::move(log_path)) {
  std::vector<char*> args;
  for (std::string& arg : argv) args.push_back(arg.data());
  args.push_back(nullptr);
  const pid_t parent = getpid();
  pid_ = fork();
  if (pid_ == 0) {
    // The test binary may die without running destructors: take the child with it.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    setpgid(0, 0);
    int fd = open(log_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd >= 0) {
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
    }
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, STDIN_FILENO);
    for (const auto& [key, value] : env) setenv(key.c_str(), value.c_str(), 1);
    execv(args[0], args.data());
    _exit(127);
  }
}

Process::~Process() {
  if (pid_ > 0 && !status_.has_value()) {
    kill(pid_, SIGKILL);
    Wait(absl::Seconds(10));
  }
}

bool Process::running() {
  if (status_.has_value() || pid_ <= 0) return false;
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) == pid_) {
    status_ = status;
    return false;
  }
  return true;
}

void Process::Signal(int sig) {
  if (running()) kill(pid_, sig);
}

std::optional<int> Process::Wait(absl::Duration timeout) {
  PollUntil([this] { return !running(); }, timeout);
  return status_;
}

void Process::Stop(absl::Duration grace) {
  if (!running()) return;
  kill(pid_, SIGTERM);
  if (!Wait(grace).has_value()) {
    kill(pid_, SIGKILL);
    Wait(absl::Seconds(10));
  }
}

std::string Process::Log() const { return ReadFile(log_path_); }

Cluster::Cluster(ClusterOptions options) : options_(options) {
  state_dir_ = root_.path() + "/coordinator";
  hold_dir_ = root_.path() + "/holds";
  fs::create_directories(hold_dir_);
  options_.env[kTestHoldDirEnv] = hold_dir_;
  coordinators_.resize(std::max(1, options_.coordinators));
  if (options_.coordinators > 1) {
    std::vector<std::string> addresses;
    for (int i = 0; i < options_.coordinators; ++i) {
      coordinator_ports_.push_back(FreeLoopbackPort());
      addresses.push_back(absl::StrCat("127.0.0.1:", coordinator_ports_.back()));
    }
    for (int i = 0; i < options_.coordinators; ++i) StartCoordinator(i);
    if (WaitForLeader(absl::Seconds(60)) < 0) {
      ADD_FAILURE() << "no coordinator leads:\n" << coordinators_[0]->Log();
      return;
    }
    address_ = absl::StrJoin(addresses, ",");
    admin_token_ = std::string(absl::StripAsciiWhitespace(ReadFile(root_.path() + "/admin.token")));
    if (admin_token_.empty()) ADD_FAILURE() << "the coordinators wrote no admin token";
    job_stub_ = v1::JobService::NewStub(NewChannel());
  } else {
    StartCoordinator();
  }
  for (int i = 0; i < options_.workers; ++i) StartWorker(i);
  WaitForWorkers();
}

Cluster::~Cluster() {
  // Signal every worker first so that their shutdowns overlap.
  for (auto& worker : workers_) {
    // SIGINT is the agents' plain stop; SIGTERM would be a preemption notice.
    if (worker != nullptr) worker->Signal(SIGINT);
  }
  for (auto& worker : workers_) {
    if (worker != nullptr) worker->Stop();
  }
  // An idle but connected client holds up the server's graceful shutdown until its deadline.
  job_stub_.reset();
  for (auto& coordinator : coordinators_) {
    if (coordinator != nullptr) coordinator->Stop();
  }
  if (::testing::Test::HasFailure()) {
    // Leave what the processes said in the test output: the only trace once the folder is gone.
    for (size_t i = 0; i < coordinators_.size(); ++i) {
      if (coordinators_[i] != nullptr) {
        std::cerr << "---- coordinator " << i << " log ----\n" << coordinators_[i]->Log() << "\n";
      }
    }
    for (size_t i = 0; i < workers_.size(); ++i) {
      if (workers_[i] != nullptr) {
        std::cerr << "---- worker " << i << " log ----\n" << workers_[i]->Log() << "\n";
      }
    }
  }
}

std::string Cluster::worker_dir(int i) const { return absl::StrCat(root_.path(), "/worker-", i); }

std::string Cluster::PortFile(int i) const {
  return i == 0 ? root_.path() + "/coordinator.port"
                : absl::StrCat(root_.path(), "/coordinator-", i, ".port");
}

std::vector<std::string> Cluster::CoordinatorArgv(int i, const std::string& listen) const {
  std::vector<std::string> argv = {
      BinDir() + "/trainyard-coordinator", "--listen=" + listen,
      "--state_dir=" + (i == 0 ? state_dir_ : absl::StrCat(state_dir_, "-", i)),
      "--port_file=" + PortFile(i),
      absl::StrCat("--worker_timeout=", absl::FormatDuration(options_.worker_timeout)),
      "--metrics_listen=127.0.0.1:0",
      // Tests read data from temporary folders (and some from nowhere, to fail); a test of the
      // restriction gives its own value, which comes later and wins.
      "--allowed_local_paths=*"};
  if (i == 0) argv.push_back("--metrics_port_file=" + root_.path() + "/coordinator.metrics_port");
  const std::string store = static_cast<size_t>(i) < options_.coordinator_stores.size()
                                ? options_.coordinator_stores[i]
                                : options_.store;
  if (!store.empty()) argv.push_back("--store=" + store);
  // Several coordinators: the first to lead makes the admin token, in one place for all.
  if (coordinators_.size() > 1)
    argv.push_back("--admin_token_file=" + root_.path() + "/admin.token");
  argv.insert(argv.end(), options_.coordinator_args.begin(), options_.coordinator_args.end());
  return argv;
}

void Cluster::StartCoordinator(int i) {
  fs::remove(PortFile(i));
  coordinators_[i] = std::make_unique<Process>(
      CoordinatorArgv(i, absl::StrCat("127.0.0.1:", coordinator_ports_[i])),
      absl::StrCat(root_.path(), "/coordinator-", i, ".log"), options_.env);
}

bool Cluster::Leads(int i) {
  return coordinators_[i] != nullptr && coordinators_[i]->running() &&
         !absl::StripAsciiWhitespace(ReadFile(PortFile(i))).empty();
}

int Cluster::Leader() { return WaitForLeader(absl::ZeroDuration()); }

int Cluster::WaitForLeader(absl::Duration timeout, int not_this) {
  int leader = -1;
  PollUntil(
      [&] {
        for (int i = 0; i < static_cast<int>(coordinators_.size()); ++i) {
          if (i != not_this && Leads(i)) {
            leader = i;
            return true;
          }
        }
        return false;
      },
      timeout);
  return leader;
}

void Cluster::StartCoordinator() {
  const std::string port_file = PortFile(0);
  fs::remove(port_file);
  fs::remove(root_.path() + "/coordinator.metrics_port");
  coordinators_[0] =
      std::make_unique<Process>(CoordinatorArgv(0, address_.empty() ? "127.0.0.1:0" : address_),
                                root_.path() + "/coordinator.log", options_.env);
  std::string port;
  const bool ready = PollUntil(
      [&] {
        port = std::string(absl::StripAsciiWhitespace(ReadFile(port_file)));
        return !port.empty() || !coordinators_[0]->running();
      },
      absl::Seconds(30));
  if (!ready || port.empty()) {
    ADD_FAILURE() << "coordinator did not start:\n" << coordinators_[0]->Log();
    return;
  }
  address_ = "127.0.0.1:" + port;
  admin_token_ = std::string(absl::StripAsciiWhitespace(ReadFile(state_dir_ + "/admin.token")));
  if (admin_token_.empty()) ADD_FAILURE() << "the coordinator wrote no admin token";
  job_stub_ = v1::JobService::NewStub(NewChannel());
}

std::shared_ptr<grpc::Channel> Cluster::NewChannel(const std::string& token) const {
  ClientCredentials credentials;
  credentials.token = token.empty() ? admin_token_ : token;
  credentials.ca_file = options_.ca_file;
  // With several coordinators, reconnecting as agents and trainers do, to whichever leads.
  auto channel = NewClientChannel(
      address_, credentials,
      coordinators_.size() > 1 ? CoordinatorClientArguments() : grpc::ChannelArguments());
  EXPECT_TRUE(channel.ok()) << channel.status();
  return channel.ok() ? *channel : nullptr;
}

std::string Cluster::CreateToken(const std::string& name, v1::TokenRole role) {
  auto admin = v1::AdminService::NewStub(NewChannel());
  v1::CreateTokenRequest request;
  request.set_name(name);
  request.set_role(role);
  v1::CreateTokenResponse response;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::Status status = admin->CreateToken(&context, request, &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return response.secret();
}

void SetTestHold(const std::string& hold_dir, const std::string& job_name, int64_t updates) {
  // Written whole under another name, then renamed: a trainer never reads half a number.
  const std::string path = absl::StrCat(hold_dir, "/", job_name);
  std::ofstream(path + ".new") << updates << "\n";
  fs::rename(path + ".new", path);
}

void ClearTestHold(const std::string& hold_dir, const std::string& job_name) {
  fs::remove(absl::StrCat(hold_dir, "/", job_name));
}

void Cluster::Hold(const std::string& job_name, int64_t updates) {
  SetTestHold(hold_dir_, job_name, updates);
}

void Cluster::Release(const std::string& job_name) { ClearTestHold(hold_dir_, job_name); }

void Cluster::WriteHoldFile(const std::string& name, const std::string& contents) {
  const std::string path = absl::StrCat(hold_dir_, "/", name);
  std::ofstream(path + ".new") << contents << "\n";
  fs::rename(path + ".new", path);
}

void Cluster::RemoveHoldFile(const std::string& name) {
  fs::remove(absl::StrCat(hold_dir_, "/", name));
}

void Cluster::KillCoordinator(int sig) {
  job_stub_.reset();
  coordinators_[0]->Signal(sig);
  coordinators_[0]->Wait(absl::Seconds(30));
}

void Cluster::StartWorker(int i) {
  const std::string dir = worker_dir(i);
  fs::create_directories(dir);
  std::vector<std::string> argv = {BinDir() + "/trainyard-worker",
                                   "--coordinator=" + address_,
                                   absl::StrCat("--name=worker-", i),
                                   "--address=127.0.0.1",
                                   absl::StrCat("--slots=", options_.slots_per_worker),
                                   "--gpus=0",
                                   "--work_dir=" + dir,
                                   "--stop_grace_period=5s",
                                   "--metrics_listen=127.0.0.1:0",
                                   "--metrics_port_file=" + dir + ".metrics_port"};
  for (const std::string& arg : options_.worker_args) {
    argv.push_back(absl::StrReplaceAll(arg, {{"{i}", absl::StrCat(i)}}));
  }
  // Each worker registers with an agent token of its own name, kept across restarts.
  const std::string token_file = dir + ".token";
  if (ReadFile(token_file).empty()) {
    std::ofstream(token_file) << CreateToken(absl::StrCat("worker-", i), v1::TOKEN_AGENT) << "\n";
  }
  argv.push_back("--token_file=" + token_file);
  if (!options_.ca_file.empty()) argv.push_back("--ca_file=" + options_.ca_file);
  workers_.push_back(std::make_unique<Process>(std::move(argv), dir + ".log", options_.env));
}

void Cluster::WaitForWorkers() {
  if (job_stub_ == nullptr) return;
  const bool ready = PollUntil(
      [&] {
        grpc::ClientContext context;
        context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
        v1::ListWorkersResponse response;
        if (!job_stub_->ListWorkers(&context, v1::ListWorkersRequest(), &response).ok()) {
          return false;
        }
        int ready_workers = 0;
        for (const auto& worker : response.workers()) ready_workers += worker.state() == v1::READY;
        return ready_workers == options_.workers;
      },
      absl::Seconds(30));
  if (!ready) ADD_FAILURE() << "workers did not register";
}

absl::StatusOr<Job> Cluster::Submit(const std::string& yaml) {
  grpc::ClientContext context;
  v1::SubmitJobRequest request;
  request.set_spec_yaml(yaml);
  Job job;
  grpc::Status status = job_stub_->SubmitJob(&context, request, &job);
  if (!status.ok()) return FromGrpc(status);
  return job;
}

absl::StatusOr<Job> Cluster::Get(const std::string& id) {
  grpc::ClientContext context;
  v1::GetJobRequest request;
  request.set_id(id);
  Job job;
  grpc::Status status = job_stub_->GetJob(&context, request, &job);
  if (!status.ok()) return FromGrpc(status);
  return job;
}

absl::StatusOr<Job> Cluster::WaitFor(const std::string& id,
                                     const std::function<bool(const Job&)>& done,
                                     absl::Duration timeout) {
  return WatchJobUntil(*job_stub_, id, done, timeout);
}

absl::StatusOr<Job> WatchJobUntil(v1::JobService::Stub& jobs, const std::string& id,
                                  const std::function<bool(const Job&)>& done,
                                  absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  Job last;
  // A watch ends when the job is final or the coordinator goes away; watch again until the
  // deadline so a coordinator restart in the middle is survived.
  while (absl::Now() < deadline) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(deadline));
    v1::WatchJobRequest request;
    request.set_id(id);
    auto reader = jobs.WatchJob(&context, request);
    v1::WatchJobResponse update;
    while (reader->Read(&update)) {
      last = update.job();
      if (done(last)) {
        context.TryCancel();
        reader->Finish();
        return last;
      }
    }
    grpc::Status status = reader->Finish();
    if (status.error_code() == grpc::StatusCode::NOT_FOUND ||
        status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      break;
    }
    if (IsFinal(last.state())) break;
    absl::SleepFor(absl::Milliseconds(100));  // backoff before re-watching, not a synchronisation
  }
  return absl::DeadlineExceededError(
      absl::StrCat("job ", id, " did not reach the expected condition; last state ",
                   v1::JobState_Name(last.state()), " (", last.reason(), ")"));
}

absl::StatusOr<Job> Cluster::WaitForFinal(const std::string& id, absl::Duration timeout) {
  return WaitFor(
      id, [](const Job& job) { return IsFinal(job.state()); }, timeout);
}

absl::StatusOr<std::string> Cluster::Logs(const std::string& id, int rank) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::GetJobLogsRequest request;
  request.set_id(id);
  request.set_rank(rank);
  auto reader = job_stub_->GetJobLogs(&context, request);
  std::string text;
  v1::LogChunk chunk;
  while (reader->Read(&chunk)) text += chunk.data();
  grpc::Status status = reader->Finish();
  if (!status.ok()) return FromGrpc(status);
  return text;
}

TestCertificates::TestCertificates(const std::string& dir) : dir(dir) {
  const std::string script = absl::StrCat(
      "set -e; cd ", dir, "\n",
      "openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=trainyard-test-ca "
      "-keyout ca.key -out ca.pem\n",
      "openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=other-ca "
      "-keyout other.key -out other-ca.pem\n",
      "openssl req -newkey rsa:2048 -nodes -subj /CN=coordinator -keyout server.key "
      "-out server.csr\n",
      "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > server.ext\n",
      "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 "
      "-extfile server.ext -out server.pem\n",
      "openssl req -newkey rsa:2048 -nodes -subj /CN=alice/OU=user -keyout alice.key "
      "-out alice.csr\n",
      "openssl x509 -req -in alice.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 "
      "-out alice.pem\n");
  auto [code, output] = RunShell(script);
  EXPECT_EQ(code, 0) << output;
}

Cluster::CliResult Cluster::Cli(const std::vector<std::string>& args, absl::Duration timeout) {
  std::map<std::string, std::string> env = {{"TRAINYARD_TOKEN", admin_token_}};
  if (!options_.ca_file.empty()) env["TRAINYARD_CA_FILE"] = options_.ca_file;
  return RunCli(address_, root_.path(), args, timeout, std::move(env));
}

Cluster::CliResult RunCli(const std::string& address, const std::string& log_dir,
                          const std::vector<std::string>& args, absl::Duration timeout,
                          std::map<std::string, std::string> env) {
  static int counter = 0;
  const std::string log = absl::StrCat(log_dir, "/cli-", ++counter, ".log");
  std::vector<std::string> argv = {BinDir() + "/trainyard", "--coordinator=" + address};
  argv.insert(argv.end(), args.begin(), args.end());
  Process cli(argv, log, std::move(env));
  Cluster::CliResult result;
  std::optional<int> status = cli.Wait(timeout);
  if (status.has_value() && WIFEXITED(*status)) result.exit_code = WEXITSTATUS(*status);
  result.output = cli.Log();
  return result;
}

namespace {

int WaitForPortFile(const std::string& path) {
  int port = 0;
  PollUntil(
      [&] {
        return absl::SimpleAtoi(absl::StripAsciiWhitespace(ReadFile(path)), &port) && port > 0;
      },
      absl::Seconds(30));
  return port;
}

}  // namespace

int Cluster::coordinator_metrics_port() const {
  return WaitForPortFile(root_.path() + "/coordinator.metrics_port");
}

int Cluster::worker_metrics_port(int i) const {
  return WaitForPortFile(worker_dir(i) + ".metrics_port");
}

std::optional<pid_t> Cluster::TrainerPid(int worker, const std::string& task_id) const {
  const std::string text = std::string(absl::StripAsciiWhitespace(
      ReadFile(absl::StrCat(worker_dir(worker), "/tasks/", task_id, "/pid"))));
  int pid = 0;
  if (!absl::SimpleAtoi(text, &pid) || pid <= 0) return std::nullopt;
  return pid;
}

std::map<std::string, std::vector<float>> CommittedModel(const trainyard::v1::Job& job) {
  const std::string dir = absl::StrFormat(
      "%s/step-%012d", absl::StripPrefix(job.checkpoint_uri(), "file://"), job.committed_step());
  // The whole model's object, or a pipeline's stages' (model.stage-K.safetensors), merged.
  std::map<std::string, std::vector<float>> out;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    if (!absl::StartsWith(name, "model.") || !absl::EndsWith(name, ".safetensors")) continue;
    for (auto& [tensor, values] : ModelTensors(entry.path().string())) {
      EXPECT_TRUE(out.emplace(tensor, std::move(values)).second) << tensor << " twice in " << dir;
    }
  }
  EXPECT_FALSE(out.empty()) << "no model in " << dir;
  return out;
}

std::map<std::string, std::vector<float>> ModelTensors(const std::string& path) {
  std::map<std::string, std::vector<float>> out;
  absl::StatusOr<SafetensorsFile> file = DecodeSafetensors(ReadFile(path));
  if (!file.ok()) {
    ADD_FAILURE() << path << ": " << file.status();
    return out;
  }
  for (const TensorView& t : file->tensors) {
    if (t.dtype != "F32") continue;
    std::vector<float>& values = out[t.name];
    values.resize(t.data.size() / sizeof(float));
    std::memcpy(values.data(), t.data.data(), t.data.size());
  }
  return out;
}

double MaxDifference(const std::map<std::string, std::vector<float>>& a,
                     const std::map<std::string, std::vector<float>>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (const auto& [name, values] : a) {
    auto it = b.find(name);
    if (it == b.end() || it->second.size() != values.size()) {
      ADD_FAILURE() << "tensor " << name << " differs in presence or size";
      return INFINITY;
    }
    for (size_t i = 0; i < values.size(); ++i) {
      worst = std::max(worst, static_cast<double>(std::fabs(values[i] - it->second[i])));
    }
  }
  return worst;
}

int WorkerIndex(const std::string& worker_id) {
  int i = -1;
  return absl::SimpleAtoi(absl::StripPrefix(worker_id, "worker-"), &i) ? i : -1;
}

ClusterOptions QuickRestarts(int workers) {
  ClusterOptions options;
  options.workers = workers;
  options.slots_per_worker = 1;
  options.worker_timeout = absl::Seconds(2);
  options.coordinator_args = {"--restart_backoff=200ms"};
  options.worker_args = {"--sync_wait=500ms"};
  return options;
}

int WorkerOfRank(const trainyard::v1::Job& job, int rank) {
  for (const auto& t : job.tasks()) {
    if (t.generation() == job.generation() && t.rank() == rank) return WorkerIndex(t.worker_id());
  }
  return -1;
}

std::string TaskId(const trainyard::v1::Job& job, int rank) {
  return absl::StrCat(job.id(), ".g", job.generation(), ".r", rank);
}

int64_t StoppedAtStep(const trainyard::v1::Job& job, int64_t generation) {
  for (const auto& t : job.tasks()) {
    if (t.generation() != generation) continue;
    const size_t at = t.message().find("at step ");
    int64_t step = -1;
    if (at != std::string::npos &&
        absl::SimpleAtoi(absl::string_view(t.message()).substr(at + 8), &step)) {
      return step;
    }
  }
  return -1;
}

// Submits `yaml` (a job named `name`) held after `held_at` updates, and waits until it is held
// there with a checkpoint of `committed` or later committed. The caller releases it.
absl::StatusOr<trainyard::v1::Job> SubmitAndHold(Cluster& cluster, const std::string& name,
                                                 const std::string& yaml, int64_t held_at,
                                                 int64_t committed) {
  cluster.Hold(name, held_at);
  auto submitted = cluster.Submit(yaml);
  if (!submitted.ok()) return submitted.status();
  return cluster.WaitFor(submitted->id(), [held_at, committed](const trainyard::v1::Job& job) {
    return job.state() == v1::RUNNING && job.progress().step() == held_at &&
           job.committed_step() >= committed;
  });
}

// Runs `yaml` to SUCCEEDED and returns the final job.
trainyard::v1::Job RunToSuccess(Cluster& cluster, const std::string& yaml) {
  auto submitted = cluster.Submit(yaml);
  EXPECT_TRUE(submitted.ok()) << submitted.status();
  if (!submitted.ok()) return trainyard::v1::Job();
  auto done = cluster.WaitForFinal(submitted->id(), absl::Seconds(240));
  EXPECT_TRUE(done.ok()) << done.status();
  if (!done.ok()) return trainyard::v1::Job();
  EXPECT_EQ(done->state(), v1::SUCCEEDED) << done->reason();
  return *done;
}

}  // namespace trainyard::testing
