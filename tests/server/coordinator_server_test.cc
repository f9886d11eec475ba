#include "server/coordinator_server.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/sqlite_job_store.h"
#include "tests/server/test_util.h"
#include "trainyard/v1/agent_service.grpc.pb.h"
#include "trainyard/v1/job_service.grpc.pb.h"

namespace trainyard {
namespace {

using ::testing::HasSubstr;

grpc::ByteBuffer ToBuffer(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

std::string FromBuffer(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices) {
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return out;
}

void Await(grpc::CompletionQueue& cq, void* expected) {
  void* tag = nullptr;
  bool ok = false;
  ASSERT_TRUE(cq.Next(&tag, &ok));
  EXPECT_EQ(tag, expected);
}

class CoordinatorServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = SqliteJobStore::Open(dir_.path() + "/state.db");
    ASSERT_TRUE(store.ok()) << store.status();
    JobManagerOptions options;
    options.checkpoint_root = "file:///ckpt";
    auto manager = JobManager::Create(RealClock::Get(), *std::move(store),
                                      std::make_unique<LogStore>(dir_.path() + "/logs"), options);
    ASSERT_TRUE(manager.ok()) << manager.status();
    manager_ = *std::move(manager);
    auto server = CoordinatorServer::Start(*manager_, "127.0.0.1:0");
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    ASSERT_GT(server_->port(), 0);
    channel_ = grpc::CreateChannel(absl::StrCat("127.0.0.1:", server_->port()),
                                   grpc::InsecureChannelCredentials());
    jobs_ = v1::JobService::NewStub(channel_);
    agents_ = v1::AgentService::NewStub(channel_);
  }

  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown(absl::Seconds(2));
  }

  std::unique_ptr<grpc::ClientContext> Context() {
    auto context = std::make_unique<grpc::ClientContext>();
    context->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
    return context;
  }

  TempDir dir_;
  std::unique_ptr<JobManager> manager_;
  std::unique_ptr<CoordinatorServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
  std::unique_ptr<v1::AgentService::Stub> agents_;
};

TEST_F(CoordinatorServerTest, StatusCodesAreMapped) {
  v1::SubmitJobRequest submit;
  submit.set_spec_yaml("name: x\nbatch_size: abc\n");
  v1::Job job;
  grpc::Status status = jobs_->SubmitJob(Context().get(), submit, &job);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("batch_size"));

  v1::GetJobRequest get;
  get.set_id("missing-1");
  status = jobs_->GetJob(Context().get(), get, &job);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);

  v1::SubmitJobRequest empty;
  status = jobs_->SubmitJob(Context().get(), empty, &job);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(CoordinatorServerTest, SubmittedJobReachesASyncingWorker) {
  v1::RegisterWorkerRequest reg;
  reg.set_name("w1");
  reg.set_slots(1);
  v1::RegisterWorkerResponse reg_response;
  ASSERT_TRUE(agents_->RegisterWorker(Context().get(), reg, &reg_response).ok());
  v1::SyncRequest sync;
  sync.set_worker_id("w1");
  v1::SyncResponse sync_response;
  ASSERT_TRUE(agents_->Sync(Context().get(), sync, &sync_response).ok());
  EXPECT_EQ(sync_response.tasks_size(), 0);

  v1::SubmitJobRequest submit;
  *submit.mutable_spec() = TestSpec("tiny");
  v1::Job job;
  ASSERT_TRUE(jobs_->SubmitJob(Context().get(), submit, &job).ok());
  EXPECT_EQ(job.id(), "tiny-1");

  // The coordinator's tick thread places it; the long poll hands it over.
  sync.set_known_version(sync_response.version());
  sync.set_wait_ms(5000);
  v1::SyncResponse placed;
  for (int i = 0; i < 5 && placed.tasks_size() == 0; ++i) {
    ASSERT_TRUE(agents_->Sync(Context().get(), sync, &placed).ok());
    sync.set_known_version(placed.version());
  }
  ASSERT_EQ(placed.tasks_size(), 1);
  EXPECT_EQ(placed.tasks(0).task_id(), "tiny-1.g1.r0");

  v1::ReportProgressRequest progress;
  progress.set_job_id("tiny-1");
  progress.set_generation(0);
  v1::ReportProgressResponse progress_response;
  grpc::Status status = agents_->ReportProgress(Context().get(), progress, &progress_response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(status.error_message(), "stale generation 0, current 1");

  v1::CancelJobRequest cancel;
  cancel.set_id("tiny-1");
  ASSERT_TRUE(jobs_->CancelJob(Context().get(), cancel, &job).ok());
  EXPECT_EQ(job.state(), v1::CANCELLED);
  EXPECT_EQ(jobs_->CancelJob(Context().get(), cancel, &job).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);

  // A watch of a final job sends it once and ends.
  v1::WatchJobRequest watch;
  watch.set_id("tiny-1");
  auto context = Context();
  auto reader = jobs_->WatchJob(context.get(), watch);
  v1::WatchJobResponse update;
  int updates = 0;
  while (reader->Read(&update)) ++updates;
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_EQ(updates, 1);
  EXPECT_EQ(update.job().state(), v1::CANCELLED);
}

TEST_F(CoordinatorServerTest, ServesHealth) {
  grpc::GenericStub stub(channel_);
  grpc::CompletionQueue cq;
  auto context = Context();
  auto call = stub.PrepareUnaryCall(context.get(), "/grpc.health.v1.Health/Check",
                                    ToBuffer(std::string()), &cq);
  call->StartCall();
  grpc::ByteBuffer response;
  grpc::Status status;
  call->Finish(&response, &status, reinterpret_cast<void*>(1));
  Await(cq, reinterpret_cast<void*>(1));
  ASSERT_TRUE(status.ok()) << status.error_message();
  // HealthCheckResponse{status: SERVING (1)}.
  EXPECT_EQ(FromBuffer(response), std::string("\x08\x01", 2));
  cq.Shutdown();
  void* tag;
  bool ok;
  while (cq.Next(&tag, &ok)) {
  }
}

TEST_F(CoordinatorServerTest, ServesReflection) {
  grpc::GenericStub stub(channel_);
  grpc::CompletionQueue cq;
  auto context = Context();
  auto call = stub.PrepareCall(
      context.get(), "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  void* const tag = reinterpret_cast<void*>(1);
  call->StartCall(tag);
  Await(cq, tag);
  // ServerReflectionRequest{list_services: ""} (field 7, length-delimited).
  call->Write(ToBuffer(std::string("\x3a\x00", 2)), tag);
  Await(cq, tag);
  call->WritesDone(tag);
  Await(cq, tag);
  grpc::ByteBuffer response;
  call->Read(&response, tag);
  Await(cq, tag);
  const std::string bytes = FromBuffer(response);
  EXPECT_THAT(bytes, HasSubstr("trainyard.v1.JobService"));
  EXPECT_THAT(bytes, HasSubstr("trainyard.v1.AgentService"));
  EXPECT_THAT(bytes, HasSubstr("grpc.health.v1.Health"));
  grpc::Status status;
  call->Finish(&status, tag);
  Await(cq, tag);
  EXPECT_TRUE(status.ok()) << status.error_message();
  cq.Shutdown();
  void* t;
  bool ok;
  while (cq.Next(&t, &ok)) {
  }
}

// The real binary: listens on a kernel-picked port, reports it through --port_file, stops
// cleanly on SIGTERM and finds its jobs again after a restart on the same --state_dir.
class CoordinatorProcess {
 public:
  CoordinatorProcess(const std::string& state_dir, const std::string& port_file) {
    const char* bin_dir = std::getenv("TRAINYARD_BIN_DIR");
    const std::string binary =
        absl::StrCat(bin_dir != nullptr ? bin_dir : "bin", "/trainyard-coordinator");
    unlink(port_file.c_str());
    std::vector<std::string> args = {binary, "--listen=127.0.0.1:0", "--state_dir=" + state_dir,
                                     "--port_file=" + port_file};
    pid_ = fork();
    if (pid_ == 0) {
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    // Polls for the file the coordinator writes once it listens (an external process: there is
    // nothing to wait on but the file system).
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (absl::Now() < deadline) {
      std::ifstream in(port_file);
      std::string text;
      if (in >> text && absl::SimpleAtoi(text, &port_)) break;
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        break;
      }
      usleep(20 * 1000);
    }
  }
  ~CoordinatorProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  int port() const { return port_; }
  // SIGTERM, then the exit status.
  int Stop() {
    if (pid_ <= 0) return -1;
    kill(pid_, SIGTERM);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
};

TEST(CoordinatorBinaryTest, RestartOnTheSameStateDirKeepsJobs) {
  TempDir dir;
  const std::string state = dir.path() + "/state";
  const std::string port_file = dir.path() + "/port";
  std::string id;
  {
    CoordinatorProcess process(state, port_file);
    ASSERT_GT(process.port(), 0);
    {
      // The channel closes before the stop: the server's shutdown waits for connected clients
      // to go away, and an idle client only notices while it polls.
      auto stub = v1::JobService::NewStub(grpc::CreateChannel(
          absl::StrCat("127.0.0.1:", process.port()), grpc::InsecureChannelCredentials()));
      v1::SubmitJobRequest submit;
      *submit.mutable_spec() = TestSpec("persist");
      v1::Job job;
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
      ASSERT_TRUE(stub->SubmitJob(&context, submit, &job).ok());
      id = job.id();
    }
    EXPECT_EQ(process.Stop(), 0);
  }
  CoordinatorProcess process(state, port_file);
  ASSERT_GT(process.port(), 0);
  v1::Job job;
  {
    auto stub = v1::JobService::NewStub(grpc::CreateChannel(
        absl::StrCat("127.0.0.1:", process.port()), grpc::InsecureChannelCredentials()));
    v1::GetJobRequest get;
    get.set_id(id);
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
    grpc::Status status = stub->GetJob(&context, get, &job);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  EXPECT_EQ(job.state(), v1::PENDING);
  ASSERT_GE(job.events_size(), 1);
  EXPECT_EQ(job.events(0).reason(), "submitted");
  EXPECT_EQ(job.checkpoint_uri(), absl::StrCat("file://", state, "/checkpoints/", id));
  EXPECT_EQ(process.Stop(), 0);
}

}  // namespace
}  // namespace trainyard
