// The coordinator's gRPC services (JobService, AgentService, AdminService, SearchService) fed calls
// of any bytes from any caller, as anyone who reaches the port may send them: each input is a run
// of calls, each call's bytes parsed by gRPC into the method's request type and handed to the real
// service, JobManager and SearchManager, on a clock that moves only with the calls and an in-memory
// store. After the run, what the coordinator shows must be what it committed: a second coordinator
// recovering from the store shows the same jobs (state, attempt, tasks, events, checkpoints),
// workers and searches. A crash, a leak, undefined behaviour or a difference stops the fuzzer.
//
// An input is a run of records: [method][caller][seconds to move the clock][length, 2 bytes LE]
// [request bytes]. The method indexes the services' methods in their proto's order (those taking
// a stream of requests left out); the caller is an admin, one of two users, one of two agents, a
// task of job "mlp-1", or nobody.

#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/client_unary_call.h>
#include <grpcpp/impl/codegen/sync_stream.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/rpc/credentials.h"
#include "server/api/coordinator_server.h"
#include "server/auth/auth.h"
#include "server/jobs/job_manager.h"
#include "server/searches/search_manager.h"
#include "tests/fuzz/coordinator_world.h"
#include "tests/fuzz/fuzz_support.h"
#include "tests/server/fake_job_store.h"
#include "trainyard/v1/admin_service.grpc.pb.h"
#include "trainyard/v1/agent_service.grpc.pb.h"
#include "trainyard/v1/job_service.grpc.pb.h"

namespace fs = std::filesystem;

namespace trainyard {
namespace {

struct Method {
  std::string path;  // "/trainyard.v1.JobService/GetJob"
  bool server_streaming;
};

const std::vector<Method>& Methods() {
  static const std::vector<Method>* methods = [] {
    auto* out = new std::vector<Method>;
    for (const char* name : {"trainyard.v1.JobService", "trainyard.v1.AgentService",
                             "trainyard.v1.AdminService", "trainyard.v1.SearchService"}) {
      const google::protobuf::ServiceDescriptor* service =
          google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(name);
      if (service == nullptr) std::abort();
      for (int i = 0; i < service->method_count(); ++i) {
        const google::protobuf::MethodDescriptor* m = service->method(i);
        if (m->client_streaming()) continue;
        out->push_back(
            {absl::StrCat("/", service->full_name(), "/", m->name()), m->server_streaming()});
      }
    }
    return out;
  }();
  return *methods;
}

constexpr char kTaskKey[] = "0123456789abcdef0123456789abcdef";

JobManagerOptions ManagerOptions(const std::string& dir) {
  JobManagerOptions options;
  options.checkpoint_root = "file://" + dir + "/ckpt";
  options.task_credential_key = kTaskKey;
  options.max_sync_wait = absl::Milliseconds(1);
  return options;
}

// One call: its bytes to `method` as `credential`, reading at most a few answers of a stream.
void Call(grpc::Channel& channel, const Method& method, const std::string& credential,
          const std::string& bytes) {
  grpc::ClientContext context;
  // A stream sends on changes that may never come: it is read for a moment of real time.
  context.set_deadline(
      GrpcDeadline(method.server_streaming ? absl::Milliseconds(100) : absl::Seconds(5)));
  if (!credential.empty()) context.AddMetadata("authorization", "Bearer " + credential);
  grpc::Slice slice(bytes);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  if (!method.server_streaming) {
    grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
        &channel,
        grpc::internal::RpcMethod(method.path.c_str(), grpc::internal::RpcMethod::NORMAL_RPC),
        &context, request, &response)
        .error_code();
    return;
  }
  std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> reader(
      grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(
          &channel,
          grpc::internal::RpcMethod(method.path.c_str(),
                                    grpc::internal::RpcMethod::SERVER_STREAMING),
          &context, request));
  for (int i = 0; i < 4 && reader->Read(&response); ++i) {
  }
  context.TryCancel();
  reader->Finish().error_code();
}

// What a coordinator shows of its jobs, workers and searches, in the terms the store keeps.
std::string Snapshot(const JobManager& manager, const SearchManager& searches) {
  std::string out;
  for (const trainyard::v1::Search& listed : searches.List()) {
    absl::StatusOr<trainyard::v1::Search> search = searches.Get(listed.id());
    if (!search.ok()) __builtin_trap();
    absl::StrAppend(&out, "search ", search->id(), " ", search->name(), " ", search->owner(), " ",
                    trainyard::v1::SearchState_Name(search->state()), " created ",
                    search->trials_created(), " best ", search->best_trial(), " trials ",
                    search->trials_size(), " spec ", search->spec().ShortDebugString(), "\n");
  }
  absl::StatusOr<ListJobsResult> listed = manager.ListJobs({}, 1000, "");
  if (!listed.ok()) __builtin_trap();
  for (const trainyard::v1::Job& summary : listed->jobs) {
    absl::StatusOr<trainyard::v1::Job> job = manager.GetJob(summary.id());
    if (!job.ok()) __builtin_trap();
    absl::StrAppend(&out, job->id(), " ", job->name(), " ", job->owner(), " ",
                    trainyard::v1::JobState_Name(job->state()), " g", job->generation(), " c",
                    job->committed_step(), " f", job->finished_unix_ms(), " e", job->events_size(),
                    " r", job->restarts_size(), " ", job->checkpoint_uri(), " ", job->model_uri(),
                    " spec ", job->spec().ShortDebugString(), "\n");
    for (const trainyard::v1::TaskInfo& t : job->tasks()) {
      absl::StrAppend(&out, "  task ", t.ShortDebugString(), "\n");
    }
  }
  for (const trainyard::v1::Worker& w : manager.ListWorkers()) {
    absl::StrAppend(&out, "worker ", w.id(), " slots ", w.slots(), " gpus ", w.gpus(), " used ",
                    w.slots_used(), " memory ", w.memory_bytes(), " since ", w.registered_unix_ms(),
                    "\n");
  }
  return out;
}

void Run(const uint8_t* data, size_t size) {
  static const std::string* dir = new std::string(fuzz::MakeScratchDir("coordinator"));
  fs::remove_all(*dir + "/logs");
  ImpatientClock clock;
  FakeJobStore store;
  FakeJobStore token_store;
  absl::StatusOr<std::unique_ptr<Authenticator>> auth =
      Authenticator::Create(token_store, kTaskKey, clock);
  if (!auth.ok()) __builtin_trap();
  std::vector<std::string> callers;
  for (const auto& [name, role] : std::vector<std::pair<std::string, Role>>{{"root", Role::kAdmin},
                                                                            {"alice", Role::kUser},
                                                                            {"bob", Role::kUser},
                                                                            {"w1", Role::kAgent},
                                                                            {"w2", Role::kAgent}}) {
    auto made = (*auth)->CreateToken(name, role, absl::InfiniteDuration(), "fuzz");
    if (!made.ok()) __builtin_trap();
    callers.push_back(made->first);
  }
  callers.push_back(SignTaskCredential(kTaskKey, TaskScope{"mlp-1", 1, false, 0}));
  callers.push_back("");

  absl::StatusOr<std::unique_ptr<JobManager>> manager =
      JobManager::Create(clock, std::make_unique<SharedStore>(store),
                         std::make_unique<LogStore>(*dir + "/logs"), ManagerOptions(*dir));
  if (!manager.ok()) __builtin_trap();
  std::unique_ptr<TrialJobs> trials = TrialJobsOf(**manager);
  absl::StatusOr<std::unique_ptr<SearchManager>> searches =
      SearchManager::Create(clock, *trials, std::make_unique<SharedStore>(store));
  if (!searches.ok()) __builtin_trap();
  CoordinatorServerOptions options;
  options.searches = searches->get();
  options.tick_interval = absl::Hours(1);  // ticks when the manager asks, and after each call
  absl::StatusOr<std::unique_ptr<CoordinatorServer>> server =
      CoordinatorServer::Start(**manager, **auth, options);
  if (!server.ok()) __builtin_trap();
  std::shared_ptr<grpc::Channel> channel = (*server)->InProcessChannel();

  const std::vector<Method>& methods = Methods();
  size_t at = 0;
  for (int calls = 0; at + 5 <= size && calls < 16; ++calls) {
    const Method& method = methods[data[at] % methods.size()];
    const std::string& caller = callers[data[at + 1] % callers.size()];
    const int seconds = data[at + 2];
    const size_t length = std::min<size_t>(data[at + 3] | (data[at + 4] << 8), size - at - 5);
    const std::string bytes(reinterpret_cast<const char*>(data) + at + 5, length);
    at += 5 + length;
    Call(*channel, method, caller, bytes);
    clock.Advance(absl::Seconds(seconds));
    (*manager)->Tick();
    (*searches)->Tick();
  }
  const std::string live = Snapshot(**manager, **searches);
  (*server)->Shutdown(absl::Seconds(1));
  server->reset();
  searches->reset();
  trials.reset();
  manager->reset();

  absl::StatusOr<std::unique_ptr<JobManager>> recovered =
      JobManager::Create(clock, std::make_unique<SharedStore>(store),
                         std::make_unique<LogStore>(*dir + "/logs"), ManagerOptions(*dir));
  if (!recovered.ok()) {
    fprintf(stderr, "recovery failed: %s\n", recovered.status().ToString().c_str());
    __builtin_trap();
  }
  std::unique_ptr<TrialJobs> recovered_trials = TrialJobsOf(**recovered);
  absl::StatusOr<std::unique_ptr<SearchManager>> recovered_searches =
      SearchManager::Create(clock, *recovered_trials, std::make_unique<SharedStore>(store));
  if (!recovered_searches.ok()) {
    fprintf(stderr, "recovery failed: %s\n", recovered_searches.status().ToString().c_str());
    __builtin_trap();
  }
  const std::string again = Snapshot(**recovered, **recovered_searches);
  // TRAINYARD_FUZZ_SHOW=1: what a run left, to read what an input does.
  if (getenv("TRAINYARD_FUZZ_SHOW") != nullptr) fprintf(stderr, "%s", live.c_str());
  if (again != live) {
    fprintf(stderr, "what the coordinator showed:\n%s\nwhat it committed:\n%s\n", live.c_str(),
            again.c_str());
    __builtin_trap();
  }
}

}  // namespace
}  // namespace trainyard

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  trainyard::fuzz::QuietLogsUnlessShown();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  trainyard::Run(data, size);
  return 0;
}
