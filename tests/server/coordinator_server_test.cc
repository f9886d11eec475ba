#include "server/api/coordinator_server.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "common/rpc/channel.h"
#include "common/rpc/credentials.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/store/sqlite_job_store.h"
#include "tests/common/fake_clock.h"
#include "tests/server/test_util.h"
#include "trainyard/v1/agent_service.grpc.pb.h"
#include "trainyard/v1/job_service.grpc.pb.h"

namespace trainyard {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

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

// Polls `condition` until it holds or 20 s pass (the server's tick thread acts on its own time).
bool PollUntilTrue(const std::function<bool()>& condition) {
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (!condition()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return true;
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
    auto token_store = SqliteJobStore::Open(dir_.path() + "/state.db");
    ASSERT_TRUE(token_store.ok()) << token_store.status();
    token_store_ = *std::move(token_store);
    task_key_ = RandomBytes(32);
    auto auth = Authenticator::Create(*token_store_, task_key_, auth_clock_);
    ASSERT_TRUE(auth.ok()) << auth.status();
    auth_ = *std::move(auth);
    JobManagerOptions options;
    options.checkpoint_root = "file:///ckpt";
    options.task_credential_key = task_key_;
    auto manager = JobManager::Create(RealClock::Get(), *std::move(store),
                                      std::make_unique<LogStore>(dir_.path() + "/logs"), options);
    ASSERT_TRUE(manager.ok()) << manager.status();
    manager_ = *std::move(manager);
    CoordinatorServerOptions server_options;
    server_options.max_streams_per_caller = 2;
    server_options.health_listen = "127.0.0.1:0";
    StartServer(server_options);
    admin_token_ = Token("root", Role::kAdmin);
    channel_ = Channel(admin_token_);
    jobs_ = v1::JobService::NewStub(channel_);
    agents_ = v1::AgentService::NewStub(Channel(Token("w1", Role::kAgent)));
  }

  void StartServer(const CoordinatorServerOptions& options) {
    auto server = CoordinatorServer::Start(*manager_, *auth_, options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    ASSERT_GT(server_->port(), 0);
    address_ = absl::StrCat("127.0.0.1:", server_->port());
  }

  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown(absl::Seconds(2));
  }

  std::string Token(const std::string& name, Role role,
                    absl::Duration ttl = absl::InfiniteDuration()) {
    auto made = auth_->CreateToken(name, role, ttl, "test");
    EXPECT_TRUE(made.ok()) << made.status();
    return made.ok() ? made->first : "";
  }

  std::shared_ptr<grpc::Channel> Channel(const std::string& token) {
    ClientCredentials credentials;
    credentials.token = token;
    auto channel = NewClientChannel(address_, credentials);
    EXPECT_TRUE(channel.ok()) << channel.status();
    return *channel;
  }

  std::unique_ptr<grpc::ClientContext> Context() {
    auto context = std::make_unique<grpc::ClientContext>();
    context->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
    return context;
  }

  TempDir dir_;
  FakeClock auth_clock_;
  std::string task_key_;
  std::unique_ptr<SqliteJobStore> token_store_;
  std::unique_ptr<Authenticator> auth_;
  std::unique_ptr<JobManager> manager_;
  std::unique_ptr<CoordinatorServer> server_;
  std::string address_;
  std::string admin_token_;
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

  // The task carries the credential of its own attempt.
  auto scope = VerifyTaskCredential(task_key_, placed.tasks(0).credential());
  ASSERT_TRUE(scope.ok()) << scope.status();
  EXPECT_EQ(scope->job_id, "tiny-1");
  EXPECT_EQ(scope->generation, 1);
  EXPECT_EQ(scope->index, 0);
  // And the secret its attempt's parameter servers ask for, which a later attempt does not share.
  EXPECT_EQ(placed.tasks(0).attempt_secret(), AttemptSecret(task_key_, "tiny-1", 1));
  EXPECT_NE(placed.tasks(0).attempt_secret(), AttemptSecret(task_key_, "tiny-1", 2));

  // A trainer of an attempt before it is fenced off.
  TaskScope old_attempt = *scope;
  old_attempt.generation = 0;
  auto old_trainer = v1::AgentService::NewStub(Channel(SignTaskCredential(task_key_, old_attempt)));
  v1::ReportProgressRequest progress;
  progress.set_job_id("tiny-1");
  progress.set_generation(0);
  v1::ReportProgressResponse progress_response;
  grpc::Status status = old_trainer->ReportProgress(Context().get(), progress, &progress_response);
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

// grpc.health.v1.Health/Check of `service` ("": the whole server) through `channel`: its status
// and response bytes.
std::pair<grpc::Status, std::string> HealthCheck(std::shared_ptr<grpc::Channel> channel,
                                                 const std::string& service = "") {
  // HealthCheckRequest{service: 1}.
  const std::string request =
      service.empty() ? std::string()
                      : std::string("\x0a") + static_cast<char>(service.size()) + service;
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue cq;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
  auto call =
      stub.PrepareUnaryCall(&context, "/grpc.health.v1.Health/Check", ToBuffer(request), &cq);
  call->StartCall();
  grpc::ByteBuffer response;
  grpc::Status status;
  call->Finish(&response, &status, reinterpret_cast<void*>(1));
  Await(cq, reinterpret_cast<void*>(1));
  cq.Shutdown();
  void* tag;
  bool ok;
  while (cq.Next(&tag, &ok)) {
  }
  return {status, status.ok() ? FromBuffer(response) : ""};
}

TEST_F(CoordinatorServerTest, ServesHealth) {
  // HealthCheckResponse{status: SERVING (1)}, without a credential.
  auto [status, response] = HealthCheck(Channel(""));
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response, std::string("\x08\x01", 2));
  // And on the probe port, which serves nothing else.
  auto probe = grpc::CreateChannel(absl::StrCat("127.0.0.1:", server_->health_port()),
                                   grpc::InsecureChannelCredentials());
  std::tie(status, response) = HealthCheck(probe);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response, std::string("\x08\x01", 2));
  std::tie(status, response) = HealthCheck(probe, kLivenessService);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response, std::string("\x08\x01", 2));
  v1::ListJobsResponse listed;
  grpc::ClientContext context;
  context.AddMetadata("authorization", "Bearer " + admin_token_);
  EXPECT_EQ(v1::JobService::NewStub(probe)
                ->ListJobs(&context, v1::ListJobsRequest(), &listed)
                .error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
}

// A standby (PostgreSQL store, another coordinator leads) is alive but not ready: probes keep
// clients on the leader without restarting the standby.
TEST(StandbyServerTest, AliveButNotServing) {
  auto standby = StandbyServer::Start("127.0.0.1:0");
  ASSERT_TRUE(standby.ok()) << standby.status();
  auto probe = grpc::CreateChannel(absl::StrCat("127.0.0.1:", (*standby)->port()),
                                   grpc::InsecureChannelCredentials());
  auto [status, response] = HealthCheck(probe);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response, std::string("\x08\x02", 2));  // NOT_SERVING
  std::tie(status, response) = HealthCheck(probe, kLivenessService);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response, std::string("\x08\x01", 2));  // SERVING
  EXPECT_EQ(StandbyServer::Start("256.0.0.1:1").status().code(), absl::StatusCode::kUnavailable);
}

// A client given only a standby's address is told where the leader serves, in the message and
// in the trailing metadata; while none leads, to try again.
TEST(StandbyServerTest, RefusesCallsNamingTheLeader) {
  auto standby = StandbyServer::Start("127.0.0.1:0");
  ASSERT_TRUE(standby.ok()) << standby.status();
  auto channel = NewClientChannel(absl::StrCat("127.0.0.1:", (*standby)->port()), {});
  ASSERT_TRUE(channel.ok()) << channel.status();
  auto jobs = v1::JobService::NewStub(*channel);
  {
    grpc::ClientContext context;
    v1::ListJobsResponse listed;
    const grpc::Status status = jobs->ListJobs(&context, v1::ListJobsRequest(), &listed);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
    EXPECT_THAT(status.error_message(), HasSubstr("no coordinator leads at the moment"));
    EXPECT_EQ(context.GetServerTrailingMetadata().count(kLeaderMetadata), 0u);
  }
  (*standby)->SetLeader("10.1.2.3:7070");
  grpc::ClientContext context;
  v1::ListJobsResponse listed;
  const grpc::Status status = jobs->ListJobs(&context, v1::ListJobsRequest(), &listed);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(status.error_message(),
              HasSubstr("this coordinator stands by; the leader serves at 10.1.2.3:7070"));
  const auto& trailers = context.GetServerTrailingMetadata();
  auto leader = trailers.find(kLeaderMetadata);
  ASSERT_NE(leader, trailers.end());
  EXPECT_EQ(std::string(leader->second.data(), leader->second.size()), "10.1.2.3:7070");
  // A stream is refused the same way.
  grpc::ClientContext lease_context;
  auto agents = v1::AgentService::NewStub(*channel);
  auto lease = agents->HoldLease(&lease_context);
  v1::LeaseResponse answer;
  EXPECT_FALSE(lease->Read(&answer));
  EXPECT_EQ(lease->Finish().error_code(), grpc::StatusCode::UNAVAILABLE);
}

// A client given every coordinator's address, the standby's first, calls the leader: it keeps
// to the one whose health says SERVING.
TEST_F(CoordinatorServerTest, AClientGivenSeveralCoordinatorsCallsTheOneThatLeads) {
  auto standby = StandbyServer::Start("127.0.0.1:0");
  ASSERT_TRUE(standby.ok()) << standby.status();
  (*standby)->SetLeader(address_);
  ClientCredentials credentials;
  credentials.token = admin_token_;
  auto channel =
      NewClientChannel(absl::StrCat("127.0.0.1:", (*standby)->port(), ",", address_), credentials);
  ASSERT_TRUE(channel.ok()) << channel.status();
  auto jobs = v1::JobService::NewStub(*channel);
  for (int i = 0; i < 5; ++i) {
    auto context = Context();
    context->set_wait_for_ready(true);
    v1::ListJobsResponse listed;
    const grpc::Status status = jobs->ListJobs(context.get(), v1::ListJobsRequest(), &listed);
    EXPECT_TRUE(status.ok()) << i << ": " << status.error_message();
  }
}

struct ReflectionAnswer {
  grpc::Status status;
  std::string bytes;  // the first response, serialized
};

// Asks the server behind `channel` for its services through server reflection
// (ServerReflectionRequest{list_services: ""}), without a credential.
ReflectionAnswer ListServicesByReflection(const std::shared_ptr<grpc::Channel>& channel) {
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue cq;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
  auto call = stub.PrepareCall(
      &context, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  void* const tag = reinterpret_cast<void*>(1);
  call->StartCall(tag);
  Await(cq, tag);
  // Field 7 (list_services), length-delimited, empty.
  call->Write(ToBuffer(std::string("\x3a\x00", 2)), tag);
  Await(cq, tag);
  call->WritesDone(tag);
  Await(cq, tag);
  grpc::ByteBuffer response;
  call->Read(&response, tag);
  Await(cq, tag);
  ReflectionAnswer answer;
  if (response.Length() > 0) answer.bytes = FromBuffer(response);
  call->Finish(&answer.status, tag);
  Await(cq, tag);
  cq.Shutdown();
  void* t;
  bool ok;
  while (cq.Next(&t, &ok)) {
  }
  return answer;
}

// Reflection answers anyone who connects, so it is off unless asked for: on the API port, the
// plaintext health port and a standby alike (gRPC's reflection library, once linked, would add
// it to every server of the process).
TEST_F(CoordinatorServerTest, ServesNoReflectionUnlessAskedFor) {
  ReflectionAnswer answer = ListServicesByReflection(Channel(""));
  EXPECT_EQ(answer.status.error_code(), grpc::StatusCode::UNIMPLEMENTED)
      << answer.status.error_message();
  EXPECT_THAT(answer.bytes, Not(HasSubstr("trainyard.v1.JobService")));
  answer = ListServicesByReflection(grpc::CreateChannel(
      absl::StrCat("127.0.0.1:", server_->health_port()), grpc::InsecureChannelCredentials()));
  EXPECT_EQ(answer.status.error_code(), grpc::StatusCode::UNIMPLEMENTED)
      << answer.status.error_message();
  auto standby = StandbyServer::Start("127.0.0.1:0");
  ASSERT_TRUE(standby.ok()) << standby.status();
  answer = ListServicesByReflection(grpc::CreateChannel(
      absl::StrCat("127.0.0.1:", (*standby)->port()), grpc::InsecureChannelCredentials()));
  EXPECT_EQ(answer.status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << answer.status.error_message();
  EXPECT_THAT(answer.bytes, Not(HasSubstr("grpc.health.v1.Health")));
}

TEST_F(CoordinatorServerTest, ServesReflectionWhenAskedFor) {
  server_->Shutdown(absl::Seconds(1));
  CoordinatorServerOptions options;
  options.health_listen = "127.0.0.1:0";
  options.reflection = true;
  StartServer(options);
  const ReflectionAnswer answer = ListServicesByReflection(Channel(""));
  EXPECT_TRUE(answer.status.ok()) << answer.status.error_message();
  EXPECT_THAT(answer.bytes, HasSubstr("trainyard.v1.JobService"));
  EXPECT_THAT(answer.bytes, HasSubstr("trainyard.v1.AgentService"));
  EXPECT_THAT(answer.bytes, HasSubstr("grpc.health.v1.Health"));
  // The API port only: the plaintext health port still serves health alone.
  const ReflectionAnswer health = ListServicesByReflection(grpc::CreateChannel(
      absl::StrCat("127.0.0.1:", server_->health_port()), grpc::InsecureChannelCredentials()));
  EXPECT_EQ(health.status.error_code(), grpc::StatusCode::UNIMPLEMENTED)
      << health.status.error_message();
}

// Each privilege, refused to whoever lacks it, through the real server.
// gRPC ends a process that sends metadata outside printable ASCII: a token file holding such a
// byte is refused with an error instead.
TEST_F(CoordinatorServerTest, AClientTokenThatIsNotPrintableAsciiIsRefusedBeforeAnyCall) {
  for (const std::string& token : {std::string("tyk_\xe4"), std::string("tyk_a\tb")}) {
    ClientCredentials credentials;
    credentials.token = token;
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
        NewClientChannel(address_, credentials);
    EXPECT_EQ(channel.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(channel.status().message()), HasSubstr("printable ASCII"));
  }
}

TEST_F(CoordinatorServerTest, CallsWithoutAValidCredentialAreRefused) {
  v1::ListJobsResponse listed;
  auto anonymous = v1::JobService::NewStub(Channel(""));
  grpc::Status status = anonymous->ListJobs(Context().get(), v1::ListJobsRequest(), &listed);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(status.error_message(), HasSubstr("no credential"));

  auto unknown = v1::JobService::NewStub(Channel(GenerateToken().token));
  status = unknown->ListJobs(Context().get(), v1::ListJobsRequest(), &listed);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);

  auto forged = v1::JobService::NewStub(Channel(admin_token_.substr(0, 17) + "forged-secret"));
  status = forged->ListJobs(Context().get(), v1::ListJobsRequest(), &listed);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);

  // Expired: valid for an hour, then not.
  const std::string brief = Token("brief", Role::kUser, absl::Hours(1));
  auto brief_jobs = v1::JobService::NewStub(Channel(brief));
  EXPECT_TRUE(brief_jobs->ListJobs(Context().get(), v1::ListJobsRequest(), &listed).ok());
  auth_clock_.Advance(absl::Hours(1));
  status = brief_jobs->ListJobs(Context().get(), v1::ListJobsRequest(), &listed);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(status.error_message(), HasSubstr("expired"));

  // Revoked by an admin through AdminService.
  const std::string doomed = Token("doomed", Role::kUser);
  auto doomed_jobs = v1::JobService::NewStub(Channel(doomed));
  EXPECT_TRUE(doomed_jobs->ListJobs(Context().get(), v1::ListJobsRequest(), &listed).ok());
  auto admin = v1::AdminService::NewStub(channel_);
  v1::RevokeTokenRequest revoke;
  revoke.set_id(*TokenId(doomed));
  v1::Token revoked;
  ASSERT_TRUE(admin->RevokeToken(Context().get(), revoke, &revoked).ok());
  EXPECT_EQ(revoked.revoked_by(), "root");
  status = doomed_jobs->ListJobs(Context().get(), v1::ListJobsRequest(), &listed);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(status.error_message(), HasSubstr("revoked"));
}

// Spec edits for the path tests: a model or data source replaced whole, a teacher with its
// temperature and weight.
v1::ModelSpec* Model(v1::JobSpec& spec) {
  spec.mutable_model()->Clear();
  return spec.mutable_model();
}
v1::DataSpec* Data(v1::JobSpec& spec) {
  spec.mutable_data()->Clear();
  return spec.mutable_data();
}
void Teacher(v1::JobSpec& spec, const std::string& uri) {
  spec.mutable_distill()->set_teacher(uri);
  spec.mutable_distill()->set_temperature(2);
  spec.mutable_distill()->set_alpha(0.5);
}

// Job ids are predictable and the checkpoint root is a folder every job may name: a user's spec
// cannot read another user's checkpoints or exports through a path, a file:// or an s3:// URI
// or a pattern, nor write into another job's folder; its own it can.
TEST_F(CoordinatorServerTest, UsersCannotReachOtherUsersCheckpointsThroughPaths) {
  auto alice = v1::JobService::NewStub(Channel(Token("alice", Role::kUser)));
  auto bob = v1::JobService::NewStub(Channel(Token("bob", Role::kUser)));
  v1::SubmitJobRequest submit;
  *submit.mutable_spec() = TestSpec("mine");
  v1::Job local;
  ASSERT_TRUE(alice->SubmitJob(Context().get(), submit, &local).ok());
  submit.mutable_spec()->mutable_checkpoint()->set_uri("s3://bucket/team");
  v1::Job remote;
  ASSERT_TRUE(alice->SubmitJob(Context().get(), submit, &remote).ok());
  ASSERT_EQ(remote.checkpoint_uri(), "s3://bucket/team/" + remote.id());

  auto submit_as = [&](v1::JobService::Stub& who, const std::function<void(v1::JobSpec&)>& set) {
    v1::SubmitJobRequest request;
    *request.mutable_spec() = TestSpec("theft");
    set(*request.mutable_spec());
    v1::Job job;
    return who.SubmitJob(Context().get(), request, &job);
  };
  const std::string folder = local.checkpoint_uri();
  ASSERT_EQ(folder, "file:///ckpt/alice/" + local.id());  // her own folder under the root
  const std::string plain = folder.substr(std::string("file://").size());
  const std::vector<std::pair<std::string, std::function<void(v1::JobSpec&)>>> reads = {
      {"model.torchscript",
       [&](v1::JobSpec& s) { Model(s)->set_torchscript(folder + "/final/model.pt"); }},
      {"model.torchscript",
       [&](v1::JobSpec& s) { Model(s)->set_torchscript(plain + "/final/model.pt"); }},
      {"model.stages[0]",
       [&](v1::JobSpec& s) { Model(s)->add_stages(plain + "/final/stages/0.pt"); }},
      {"distill.teacher", [&](v1::JobSpec& s) { Teacher(s, plain + "/final/model.pt"); }},
      {"data.train",
       [&](v1::JobSpec& s) {
         Data(s)->set_train(plain + "/step-000000000010/model*.safetensors");
       }},
      {"model.torchscript",
       [&](v1::JobSpec& s) {
         Model(s)->set_torchscript(remote.checkpoint_uri() + "/final/model.pt");
       }},
      // Patterns over the root, and a job's folder before the job exists.
      {"data.train", [&](v1::JobSpec& s) { Data(s)->set_train("/ckpt/*/final/x"); }},
      {"data.train", [&](v1::JobSpec& s) { Data(s)->set_train("/*/mine-1/final/x"); }},
      {"data.train", [&](v1::JobSpec& s) { Data(s)->set_train("/ckpt/alice/*/final/x"); }},
      {"model.torchscript",
       [&](v1::JobSpec& s) { Model(s)->set_torchscript("/ckpt/mine-99/final/model.pt"); }},
  };
  for (const auto& [field, set] : reads) {
    grpc::Status status = submit_as(*bob, set);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED)
        << field << ": " << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr(field + ": "));
  }
  // Writing into her job's folder is refused to anyone.
  grpc::Status status = submit_as(*bob, [&](v1::JobSpec& s) {
    s.mutable_checkpoint()->set_uri(remote.checkpoint_uri() + "/step-000000000010");
  });
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("is inside the checkpoints of job " + remote.id()));
  // What she shares (checkpoint.share_with) he reads and resumes from; "*" shares with all.
  for (const std::string& with : {std::string("bob"), std::string("*")}) {
    v1::SubmitJobRequest shared;
    *shared.mutable_spec() = TestSpec("shared");
    shared.mutable_spec()->mutable_checkpoint()->add_share_with(with);
    v1::Job given;
    ASSERT_TRUE(alice->SubmitJob(Context().get(), shared, &given).ok());
    status = submit_as(*bob, [&](v1::JobSpec& s) {
      Model(s)->set_torchscript(given.checkpoint_uri() + "/final/model.pt");
    });
    EXPECT_NE(status.error_code(), grpc::StatusCode::PERMISSION_DENIED) << status.error_message();
    status = submit_as(
        *bob, [&](v1::JobSpec& s) { s.mutable_checkpoint()->set_resume_from(given.id()); });
    EXPECT_TRUE(status.ok()) << with << ": " << status.error_message();
  }
  status = submit_as(
      *bob, [&](v1::JobSpec& s) { Model(s)->set_torchscript(folder + "/final/model.pt"); });
  EXPECT_THAT(status.error_message(), HasSubstr("is not shared with you"));

  // Nor into her folder under the root; his own, or the root itself, is his.
  status = submit_as(*bob, [&](v1::JobSpec& s) { s.mutable_checkpoint()->set_uri("/ckpt/alice"); });
  EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED) << status.error_message();
  v1::SubmitJobRequest own;
  *own.mutable_spec() = TestSpec("bobs");
  own.mutable_spec()->mutable_checkpoint()->set_uri("file:///ckpt/");
  v1::Job bobs;
  ASSERT_TRUE(bob->SubmitJob(Context().get(), own, &bobs).ok());
  EXPECT_EQ(bobs.checkpoint_uri(), "file:///ckpt/bob/" + bobs.id());
  own.mutable_spec()->mutable_checkpoint()->set_uri("/ckpt/bob/experiments");
  ASSERT_TRUE(bob->SubmitJob(Context().get(), own, &bobs).ok());
  EXPECT_EQ(bobs.checkpoint_uri(), "/ckpt/bob/experiments/" + bobs.id());
  // Alice reads her own jobs' and her folder, patterns included (not a folder of no job, nor
  // patterns over the root); the admin reads anyone's.
  for (auto* who : {alice.get(), jobs_.get()}) {
    for (size_t i = 0; i < reads.size(); ++i) {
      const auto& [field, set] = reads[i];
      const bool own_pattern = i + 2 == reads.size();
      if (who == alice.get() &&
          ((field == "data.train" && !own_pattern) || i + 1 == reads.size())) {
        continue;
      }
      status = submit_as(*who, set);
      EXPECT_NE(status.error_code(), grpc::StatusCode::PERMISSION_DENIED)
          << field << ": " << status.error_message();
    }
  }
}

// An agent token names one worker, but what it claims for the worker is its own word: a claim
// past the worker's limit is refused, so a compromised agent cannot draw every job to itself.
TEST_F(CoordinatorServerTest, AnAgentsClaimIsBounded) {
  for (const auto& [field, set] :
       std::vector<std::pair<std::string, std::function<void(v1::RegisterWorkerRequest&)>>>{
           {"gpus", [](v1::RegisterWorkerRequest& r) { r.set_gpus(1000000); }},
           {"slots", [](v1::RegisterWorkerRequest& r) { r.set_slots(1 << 30); }},
           {"memory_bytes",
            [](v1::RegisterWorkerRequest& r) { r.set_memory_bytes(int64_t{1} << 60); }}}) {
    v1::RegisterWorkerRequest request;
    request.set_name("w1");
    request.set_slots(4);
    set(request);
    v1::RegisterWorkerResponse response;
    grpc::Status status = agents_->RegisterWorker(Context().get(), request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << field;
    EXPECT_THAT(status.error_message(), HasSubstr(field + ": worker w1 claims "));
  }
  v1::ListWorkersResponse workers;
  ASSERT_TRUE(jobs_->ListWorkers(Context().get(), v1::ListWorkersRequest(), &workers).ok());
  EXPECT_EQ(workers.workers_size(), 0);
}

TEST_F(CoordinatorServerTest, UsersReachOnlyTheirOwnJobsAndNoAgentOrAdminCall) {
  auto alice = v1::JobService::NewStub(Channel(Token("alice", Role::kUser)));
  const std::string bob_token = Token("bob", Role::kUser);
  auto bob = v1::JobService::NewStub(Channel(bob_token));
  v1::SubmitJobRequest submit;
  *submit.mutable_spec() = TestSpec("mine");
  v1::Job job;
  ASSERT_TRUE(alice->SubmitJob(Context().get(), submit, &job).ok());
  EXPECT_EQ(job.owner(), "alice");
  EXPECT_EQ(job.events(0).reason(), "submitted by alice");

  // Bob neither sees, follows, lists nor cancels it; the admin does.
  v1::GetJobRequest get;
  get.set_id(job.id());
  v1::Job seen;
  EXPECT_EQ(bob->GetJob(Context().get(), get, &seen).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  v1::CancelJobRequest cancel;
  cancel.set_id(job.id());
  grpc::Status status = bob->CancelJob(Context().get(), cancel, &seen);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(status.error_message(), HasSubstr("belongs to another user"));
  v1::GetJobLogsRequest logs;
  logs.set_id(job.id());
  auto context = Context();
  auto reader = bob->GetJobLogs(context.get(), logs);
  v1::LogChunk chunk;
  while (reader->Read(&chunk)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::PERMISSION_DENIED);
  v1::ListJobsResponse listed;
  ASSERT_TRUE(bob->ListJobs(Context().get(), v1::ListJobsRequest(), &listed).ok());
  EXPECT_EQ(listed.jobs_size(), 0);
  ASSERT_TRUE(alice->ListJobs(Context().get(), v1::ListJobsRequest(), &listed).ok());
  EXPECT_EQ(listed.jobs_size(), 1);
  // Nor resumes from its checkpoints.
  v1::SubmitJobRequest resume;
  *resume.mutable_spec() = TestSpec("theft");
  resume.mutable_spec()->mutable_checkpoint()->set_resume_from(job.id());
  status = bob->SubmitJob(Context().get(), resume, &seen);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(status.error_message(), HasSubstr("checkpoint.resume_from"));
  // Nor through the request's resume_from (trainyard submit --resume-from).
  resume.mutable_spec()->mutable_checkpoint()->clear_resume_from();
  resume.set_resume_from(job.id());
  status = bob->SubmitJob(Context().get(), resume, &seen);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(status.error_message(), HasSubstr("checkpoint.resume_from"));
  EXPECT_TRUE(jobs_->GetJob(Context().get(), get, &seen).ok());

  // Bob sees the machines, not which of alice's tasks run on them.
  v1::RegisterWorkerRequest w1;
  w1.set_name("w1");
  w1.set_slots(4);
  v1::RegisterWorkerResponse w1_response;
  ASSERT_TRUE(agents_->RegisterWorker(Context().get(), w1, &w1_response).ok());
  v1::SubmitJobRequest placed;
  *placed.mutable_spec() = TestSpec("placed");
  v1::Job placed_job;
  ASSERT_TRUE(alice->SubmitJob(Context().get(), placed, &placed_job).ok());
  v1::ListWorkersResponse workers;
  ASSERT_TRUE(PollUntilTrue([&] {
    workers.Clear();
    grpc::ClientContext c;
    return alice->ListWorkers(&c, v1::ListWorkersRequest(), &workers).ok() &&
           workers.workers_size() == 1 && workers.workers(0).task_ids_size() >= 1;
  }));
  for (const std::string& task_id : workers.workers(0).task_ids()) {
    EXPECT_TRUE(task_id == job.id() + ".g1.r0" || task_id == placed_job.id() + ".g1.r0") << task_id;
  }
  ASSERT_TRUE(bob->ListWorkers(Context().get(), v1::ListWorkersRequest(), &workers).ok());
  ASSERT_EQ(workers.workers_size(), 1);
  EXPECT_EQ(workers.workers(0).task_ids_size(), 0);

  // A user is no agent, no trainer and no admin.
  auto bob_agent = v1::AgentService::NewStub(Channel(bob_token));
  v1::RegisterWorkerRequest reg;
  reg.set_name("bob-box");
  reg.set_slots(64);
  v1::RegisterWorkerResponse reg_response;
  status = bob_agent->RegisterWorker(Context().get(), reg, &reg_response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(status.error_message(), HasSubstr("RegisterWorker is for worker agents"));
  v1::ReportProgressRequest progress;
  progress.set_job_id(job.id());
  v1::ReportProgressResponse progress_response;
  EXPECT_EQ(bob_agent->ReportProgress(Context().get(), progress, &progress_response).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  auto bob_admin = v1::AdminService::NewStub(Channel(bob_token));
  v1::CreateTokenRequest create;
  create.set_name("bob2");
  create.set_role(v1::TOKEN_ADMIN);
  v1::CreateTokenResponse created;
  EXPECT_EQ(bob_admin->CreateToken(Context().get(), create, &created).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  v1::ReportPreemptionRequest drain;
  drain.set_worker_id("w1");
  v1::ReportPreemptionResponse drained;
  EXPECT_EQ(bob_agent->ReportPreemption(Context().get(), drain, &drained).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
}

TEST_F(CoordinatorServerTest, AnAgentSpeaksOnlyForItsOwnWorker) {
  v1::RegisterWorkerRequest reg;
  reg.set_name("w1");
  reg.set_slots(1);
  v1::RegisterWorkerResponse reg_response;
  ASSERT_TRUE(agents_->RegisterWorker(Context().get(), reg, &reg_response).ok());
  // Another agent cannot take the name, keep its lease, report for it or drain it.
  auto w2 = v1::AgentService::NewStub(Channel(Token("w2", Role::kAgent)));
  grpc::Status status = w2->RegisterWorker(Context().get(), reg, &reg_response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(status.error_message(), HasSubstr("may not speak for worker 'w1'"));
  v1::SyncRequest sync;
  sync.set_worker_id("w1");
  v1::SyncResponse synced;
  EXPECT_EQ(w2->Sync(Context().get(), sync, &synced).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  v1::ReportTaskStatusRequest report;
  report.set_worker_id("w1");
  v1::ReportTaskStatusResponse reported;
  EXPECT_EQ(w2->ReportTaskStatus(Context().get(), report, &reported).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  v1::ReportPreemptionRequest drain;
  drain.set_worker_id("w1");
  v1::ReportPreemptionResponse drained;
  EXPECT_EQ(w2->ReportPreemption(Context().get(), drain, &drained).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  // An agent is not a person: it submits nothing.
  auto w2_jobs = v1::JobService::NewStub(Channel(Token("w3", Role::kAgent)));
  v1::SubmitJobRequest submit;
  *submit.mutable_spec() = TestSpec("sneaky");
  v1::Job job;
  EXPECT_EQ(w2_jobs->SubmitJob(Context().get(), submit, &job).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  // The worker's own agent may; so may an admin drain it.
  EXPECT_TRUE(agents_->Sync(Context().get(), sync, &synced).ok());
  auto admin_agents = v1::AgentService::NewStub(channel_);
  drain.set_deadline_unix_ms(absl::ToUnixMillis(absl::Now() + absl::Minutes(1)));
  EXPECT_TRUE(admin_agents->ReportPreemption(Context().get(), drain, &drained).ok());
}

TEST_F(CoordinatorServerTest, ATaskCredentialServesOnlyItsJobAttemptAndRank) {
  v1::SubmitJobRequest submit;
  *submit.mutable_spec() = TestSpec("first");
  v1::Job first;
  ASSERT_TRUE(jobs_->SubmitJob(Context().get(), submit, &first).ok());
  *submit.mutable_spec() = TestSpec("second");
  v1::Job second;
  ASSERT_TRUE(jobs_->SubmitJob(Context().get(), submit, &second).ok());
  TaskScope scope;
  scope.job_id = first.id();
  scope.generation = 1;
  scope.index = 0;
  auto trainer = v1::AgentService::NewStub(Channel(SignTaskCredential(task_key_, scope)));

  v1::RendezvousSetRequest set;
  set.set_job_id(second.id());
  set.set_generation(1);
  set.set_key("addr");
  set.set_value("10.0.0.66:1234");
  v1::RendezvousSetResponse set_response;
  grpc::Status status = trainer->RendezvousSet(Context().get(), set, &set_response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(status.error_message(), HasSubstr("is not for job " + second.id()));
  set.set_job_id(first.id());
  set.set_generation(2);
  EXPECT_EQ(trainer->RendezvousSet(Context().get(), set, &set_response).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  set.set_generation(1);
  set.set_rank(1);
  EXPECT_EQ(trainer->RendezvousSet(Context().get(), set, &set_response).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  v1::CommitCheckpointRequest commit;
  commit.set_job_id(second.id());
  commit.set_generation(1);
  v1::CommitCheckpointResponse committed;
  EXPECT_EQ(trainer->CommitCheckpoint(Context().get(), commit, &committed).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  // A credential signed with another key is no credential.
  auto forged = v1::AgentService::NewStub(Channel(SignTaskCredential(RandomBytes(32), scope)));
  set.set_rank(0);
  EXPECT_EQ(forged->RendezvousSet(Context().get(), set, &set_response).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  // A trainer is no person.
  auto trainer_jobs = v1::JobService::NewStub(Channel(SignTaskCredential(task_key_, scope)));
  v1::ListJobsResponse listed;
  EXPECT_EQ(trainer_jobs->ListJobs(Context().get(), v1::ListJobsRequest(), &listed).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
}

TEST_F(CoordinatorServerTest, OversizedFieldsAndTooManyStreamsAreRefused) {
  v1::CancelJobRequest cancel;
  cancel.set_id("x");
  cancel.set_reason(std::string(5000, 'r'));
  v1::Job job;
  grpc::Status status = jobs_->CancelJob(Context().get(), cancel, &job);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(), "reason: 5000 bytes is over the limit of 1024");
  v1::RegisterWorkerRequest reg;
  reg.set_name("w1");
  reg.set_hostname(std::string(300, 'h'));
  v1::RegisterWorkerResponse registered;
  status = agents_->RegisterWorker(Context().get(), reg, &registered);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("hostname: 300 bytes"));
  v1::SubmitJobRequest submit;
  *submit.mutable_spec() = TestSpec("wide");
  for (int i = 0; i < 2000; ++i)
    submit.mutable_spec()->mutable_model()->mutable_args()->add_hidden(4);
  status = jobs_->SubmitJob(Context().get(), submit, &job);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(),
              HasSubstr("spec.model.args.hidden: 2001 entries is over the limit of 1024"));

  // Two streams per caller here: a third waits for one to end.
  *submit.mutable_spec() = TestSpec("watched");
  ASSERT_TRUE(jobs_->SubmitJob(Context().get(), submit, &job).ok());
  v1::WatchJobRequest watch;
  watch.set_id(job.id());
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientReader<v1::WatchJobResponse>>> readers;
  v1::WatchJobResponse update;
  for (int i = 0; i < 2; ++i) {
    contexts.push_back(Context());
    readers.push_back(jobs_->WatchJob(contexts.back().get(), watch));
    ASSERT_TRUE(readers.back()->Read(&update));  // the stream is open on the server
  }
  auto third_context = Context();
  auto third = jobs_->WatchJob(third_context.get(), watch);
  EXPECT_FALSE(third->Read(&update));
  status = third->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(), HasSubstr("already holds 2 streams"));
  // Another caller has streams of its own.
  auto other = v1::JobService::NewStub(Channel(Token("root2", Role::kAdmin)));
  auto other_context = Context();
  auto other_reader = other->WatchJob(other_context.get(), watch);
  EXPECT_TRUE(other_reader->Read(&update));
  other_context->TryCancel();
  for (auto& c : contexts) c->TryCancel();
  // Cancelled, so that nothing is placed on the worker below: a placement would change its
  // desired state and answer the long polls that must wait.
  v1::CancelJobRequest cancel_watched;
  cancel_watched.set_id(job.id());
  ASSERT_TRUE(jobs_->CancelJob(Context().get(), cancel_watched, &job).ok());

  // Long polls hold a server thread each while they wait: they count as streams.
  v1::RegisterWorkerRequest w1;
  w1.set_name("w1");
  w1.set_slots(1);
  ASSERT_TRUE(agents_->RegisterWorker(Context().get(), w1, &registered).ok());
  v1::SyncRequest poll;
  poll.set_worker_id("w1");
  v1::SyncResponse synced;
  ASSERT_TRUE(agents_->Sync(Context().get(), poll, &synced).ok());
  poll.set_known_version(synced.version());  // nothing new for it: it waits out wait_ms
  // Long enough that both are surely waiting at once however loaded the machine; the agent
  // registering again below wakes them.
  poll.set_wait_ms(30000);
  const int blocked_before = manager_->BlockedSyncsForTesting();
  std::vector<std::thread> polls;
  for (int i = 0; i < 2; ++i) {
    polls.emplace_back([&] {
      v1::SyncResponse response;
      agents_->Sync(Context().get(), poll, &response);
    });
  }
  ASSERT_TRUE(
      PollUntilTrue([&] { return manager_->BlockedSyncsForTesting() == blocked_before + 2; }));
  status = agents_->Sync(Context().get(), poll, &synced);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("Sync"));
  v1::SyncRequest at_once = poll;
  at_once.set_wait_ms(0);  // one that answers at once holds nothing
  EXPECT_TRUE(agents_->Sync(Context().get(), at_once, &synced).ok());
  // A long poll of the agent's earlier life answers when it registers again.
  ASSERT_TRUE(agents_->RegisterWorker(Context().get(), w1, &registered).ok());
  for (std::thread& t : polls) t.join();
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

// A channel with the admin token the coordinator wrote into its state folder.
std::shared_ptr<grpc::Channel> AdminChannel(const std::string& state_dir, int port) {
  ClientCredentials credentials;
  auto token = ReadCredentialFile(state_dir + "/admin.token");
  EXPECT_TRUE(token.ok()) << token.status();
  credentials.token = token.ok() ? *token : "";
  return *NewClientChannel(absl::StrCat("127.0.0.1:", port), credentials);
}

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
      auto stub = v1::JobService::NewStub(AdminChannel(state, process.port()));
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
    auto stub = v1::JobService::NewStub(AdminChannel(state, process.port()));
    v1::GetJobRequest get;
    get.set_id(id);
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
    grpc::Status status = stub->GetJob(&context, get, &job);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  EXPECT_EQ(job.state(), v1::PENDING);
  ASSERT_GE(job.events_size(), 1);
  EXPECT_EQ(job.events(0).reason(), "submitted by admin");
  EXPECT_EQ(job.owner(), "admin");
  EXPECT_EQ(job.checkpoint_uri(), absl::StrCat("file://", state, "/checkpoints/admin/", id));
  EXPECT_EQ(process.Stop(), 0);
}

}  // namespace
}  // namespace trainyard
