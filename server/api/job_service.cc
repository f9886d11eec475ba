#include "server/api/job_service.h"

#include <map>
#include <string>
#include <vector>

#include "common/rpc/grpc_status.h"
#include "server/api/request_limits.h"

namespace trainyard {

using grpc::ServerContext;
using grpc::Status;

namespace {
// How long the token a console login gives a browser lasts.
constexpr absl::Duration kConsoleSessionLifetime = absl::Hours(12);
}  // namespace

absl::StatusOr<Principal> JobServiceImpl::AdmitForJob(const ServerContext& context,
                                                      const google::protobuf::Message& request,
                                                      absl::string_view rpc,
                                                      absl::string_view job_id) {
  absl::StatusOr<Principal> caller = gate_.Admit(context, request, Audience::kPeople, rpc);
  if (!caller.ok() || caller->admin()) return caller;
  absl::StatusOr<std::string> owner = manager_.JobOwner(job_id);
  if (!owner.ok()) return owner.status();
  if (absl::Status s = AllowJob(*caller, job_id, *owner); !s.ok()) return s;
  return caller;
}

Status JobServiceImpl::SubmitJob(ServerContext* context, const v1::SubmitJobRequest* request,
                                 v1::Job* response) {
  absl::StatusOr<Principal> caller =
      gate_.Admit(*context, *request, Audience::kPeople, "SubmitJob");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  SubmitOptions options;
  options.resume_from = request->resume_from();
  absl::StatusOr<v1::Job> job;
  switch (request->spec_source_case()) {
    case v1::SubmitJobRequest::kSpecYaml:
      job = manager_.SubmitJobYaml(request->spec_yaml(), &*caller, options);
      break;
    case v1::SubmitJobRequest::kSpec:
      job = manager_.SubmitJob(request->spec(), &*caller, options);
      break;
    default:
      return ToGrpcStatus(absl::InvalidArgumentError("spec_yaml or spec: required"));
  }
  if (!job.ok()) return ToGrpcStatus(job.status());
  *response = *std::move(job);
  return Status::OK;
}

Status JobServiceImpl::GetJob(ServerContext* context, const v1::GetJobRequest* request,
                              v1::Job* response) {
  absl::StatusOr<Principal> caller = gate_.Admit(*context, *request, Audience::kPeople, "GetJob");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  // The job carries its owner: one read, also for a job that is only in the store.
  absl::StatusOr<v1::Job> job = manager_.GetJob(request->id());
  if (!job.ok()) return ToGrpcStatus(job.status());
  if (absl::Status s = AllowJob(*caller, request->id(), job->owner()); !s.ok()) {
    return ToGrpcStatus(s);
  }
  *response = *std::move(job);
  return Status::OK;
}

Status JobServiceImpl::ListJobs(ServerContext* context, const v1::ListJobsRequest* request,
                                v1::ListJobsResponse* response) {
  absl::StatusOr<Principal> caller = gate_.Admit(*context, *request, Audience::kPeople, "ListJobs");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  std::vector<v1::JobState> states;
  for (int s : request->states()) states.push_back(static_cast<v1::JobState>(s));
  // Users list their own jobs; admins everyone's.
  JobFilter filter;
  filter.owner = caller->admin() ? request->owner() : caller->name;
  filter.name_contains = request->name_contains();
  filter.queue = request->queue();
  absl::StatusOr<ListJobsResult> result =
      manager_.ListJobs(states, request->page_size(), request->page_token(), filter);
  if (!result.ok()) return ToGrpcStatus(result.status());
  for (v1::Job& job : result->jobs) *response->add_jobs() = std::move(job);
  response->set_next_page_token(result->next_page_token);
  return Status::OK;
}

Status JobServiceImpl::CancelJob(ServerContext* context, const v1::CancelJobRequest* request,
                                 v1::Job* response) {
  absl::StatusOr<Principal> caller = AdmitForJob(*context, *request, "CancelJob", request->id());
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  absl::StatusOr<v1::Job> job = manager_.CancelJob(request->id(), request->reason(), caller->name);
  if (!job.ok()) return ToGrpcStatus(job.status());
  *response = *std::move(job);
  return Status::OK;
}

Status JobServiceImpl::GetJobMetrics(ServerContext* context,
                                     const v1::GetJobMetricsRequest* request,
                                     v1::JobMetrics* response) {
  absl::StatusOr<Principal> caller =
      AdmitForJob(*context, *request, "GetJobMetrics", request->id());
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  // An admin's call was not checked against the job: an unknown one is NOT_FOUND all the same.
  if (caller->admin()) {
    if (absl::StatusOr<std::string> owner = manager_.JobOwner(request->id()); !owner.ok()) {
      return ToGrpcStatus(owner.status());
    }
  }
  absl::StatusOr<std::vector<v1::MetricPoint>> points =
      manager_.MetricHistoryOf(request->id(), request->after_unix_ms());
  if (!points.ok()) return ToGrpcStatus(points.status());
  response->mutable_points()->Reserve(static_cast<int>(points->size()));
  for (v1::MetricPoint& point : *points) *response->add_points() = std::move(point);
  return Status::OK;
}

Status JobServiceImpl::DebugJob(ServerContext* context, const v1::DebugJobRequest* request,
                                v1::DebugJobResponse* response) {
  absl::StatusOr<Principal> caller = AdmitForJob(*context, *request, "DebugJob", request->id());
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  // Stacks take a debugger's attach per trainer; records are read at once.
  const absl::Duration wait = request->stacks() ? absl::Seconds(60) : absl::Seconds(15);
  absl::StatusOr<v1::DebugJobResponse> debug =
      manager_.DebugJob(request->id(), request->stacks(), wait);
  if (!debug.ok()) return ToGrpcStatus(debug.status());
  *response = *std::move(debug);
  return Status::OK;
}

Status JobServiceImpl::CreateConsoleLogin(ServerContext* context,
                                          const v1::CreateConsoleLoginRequest* request,
                                          v1::ConsoleLogin* response) {
  absl::StatusOr<Principal> caller =
      gate_.Admit(*context, *request, Audience::kPeople, "CreateConsoleLogin");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  absl::StatusOr<std::pair<std::string, absl::Time>> login = logins_.Create(*caller);
  if (!login.ok()) return ToGrpcStatus(login.status());
  response->set_code(login->first);
  response->set_expires_unix_ms(absl::ToUnixMillis(login->second));
  return Status::OK;
}

Status JobServiceImpl::RedeemConsoleLogin(ServerContext*,
                                          const v1::RedeemConsoleLoginRequest* request,
                                          v1::ConsoleSession* response) {
  // The code is the credential: no other is asked for.
  if (absl::Status s = CheckRequestLimits(*request); !s.ok()) return ToGrpcStatus(s);
  absl::StatusOr<Principal> person = logins_.Redeem(request->code());
  if (!person.ok()) return ToGrpcStatus(person.status());
  absl::StatusOr<std::pair<std::string, TokenInfo>> token =
      auth_.CreateToken(person->name, person->role, kConsoleSessionLifetime, "console login");
  if (!token.ok()) return ToGrpcStatus(token.status());
  response->set_token(token->first);
  response->set_name(person->name);
  response->set_admin(person->admin());
  response->set_expires_unix_ms(token->second.expires_unix_ms);
  return Status::OK;
}

Status JobServiceImpl::DeleteJob(ServerContext* context, const v1::DeleteJobRequest* request,
                                 v1::DeleteJobResponse*) {
  absl::StatusOr<Principal> caller = AdmitForJob(*context, *request, "DeleteJob", request->id());
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  return ToGrpcStatus(manager_.DeleteJob(request->id(), request->validate_only()));
}

Status JobServiceImpl::WatchJob(ServerContext* context, const v1::WatchJobRequest* request,
                                grpc::ServerWriter<v1::WatchJobResponse>* writer) {
  absl::StatusOr<Principal> caller = AdmitForJob(*context, *request, "WatchJob", request->id());
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  absl::StatusOr<CallGate::StreamSlot> slot = gate_.OpenStream(*caller);
  if (!slot.ok()) return ToGrpcStatus(slot.status());
  return ToGrpcStatus(manager_.WatchJob(
      request->id(),
      [writer](const v1::Job& job) {
        v1::WatchJobResponse response;
        *response.mutable_job() = job;
        return writer->Write(response);
      },
      [context] { return context->IsCancelled(); }));
}

Status JobServiceImpl::GetJobLogs(ServerContext* context, const v1::GetJobLogsRequest* request,
                                  grpc::ServerWriter<v1::LogChunk>* writer) {
  absl::StatusOr<Principal> caller = AdmitForJob(*context, *request, "GetJobLogs", request->id());
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  absl::StatusOr<CallGate::StreamSlot> slot = gate_.OpenStream(*caller);
  if (!slot.ok()) return ToGrpcStatus(slot.status());
  LogSelection selection;
  selection.rank = request->rank();
  if (request->has_shard()) selection.shard = request->shard();
  return ToGrpcStatus(manager_.StreamLogs(
      request->id(), selection, request->follow(),
      [writer](const v1::TaskInfo& task, absl::string_view data) {
        v1::LogChunk chunk;
        chunk.set_rank(task.rank());
        chunk.set_role(task.role());
        chunk.set_shard(task.shard());
        chunk.set_data(std::string(data));
        return writer->Write(chunk);
      },
      [context] { return context->IsCancelled(); }));
}

Status JobServiceImpl::ListWorkers(ServerContext* context, const v1::ListWorkersRequest* request,
                                   v1::ListWorkersResponse* response) {
  absl::StatusOr<Principal> caller =
      gate_.Admit(*context, *request, Audience::kPeople, "ListWorkers");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  std::map<std::string, bool> mine;  // job id -> whether the caller may see it
  for (v1::Worker& w : manager_.ListWorkers()) {
    if (!caller->admin()) {
      // A user sees every machine, but only the tasks of their own jobs on it.
      std::vector<std::string> kept;
      for (std::string& task_id : *w.mutable_task_ids()) {
        const std::string job_id = task_id.substr(0, task_id.rfind(".g"));
        auto [it, added] = mine.emplace(job_id, false);
        if (added) {
          absl::StatusOr<std::string> owner = manager_.JobOwner(job_id);
          it->second = owner.ok() && AllowJob(*caller, job_id, *owner).ok();
        }
        if (it->second) kept.push_back(std::move(task_id));
      }
      w.clear_task_ids();
      for (std::string& task_id : kept) w.add_task_ids(std::move(task_id));
    }
    *response->add_workers() = std::move(w);
  }
  return Status::OK;
}

Status JobServiceImpl::ListCheckpoints(ServerContext* context,
                                       const v1::ListCheckpointsRequest* request,
                                       v1::ListCheckpointsResponse* response) {
  absl::StatusOr<Principal> caller =
      AdmitForJob(*context, *request, "ListCheckpoints", request->job_id());
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  absl::StatusOr<std::vector<v1::Checkpoint>> list = manager_.ListCheckpoints(request->job_id());
  if (!list.ok()) return ToGrpcStatus(list.status());
  for (v1::Checkpoint& c : *list) *response->add_checkpoints() = std::move(c);
  return Status::OK;
}

Status JobServiceImpl::ListQueues(ServerContext* context, const v1::ListQueuesRequest* request,
                                  v1::ListQueuesResponse* response) {
  absl::StatusOr<Principal> caller =
      gate_.Admit(*context, *request, Audience::kPeople, "ListQueues");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  for (v1::Queue& q : manager_.ListQueues()) *response->add_queues() = std::move(q);
  return Status::OK;
}

Status JobServiceImpl::UploadWorkdir(ServerContext* context,
                                     grpc::ServerReader<v1::UploadWorkdirRequest>* reader,
                                     v1::UploadWorkdirResponse* response) {
  v1::UploadWorkdirRequest first;
  if (!reader->Read(&first)) {
    return ToGrpcStatus(absl::InvalidArgumentError("no message: the first names the archive"));
  }
  absl::StatusOr<Principal> caller =
      gate_.Admit(*context, first, Audience::kPeople, "UploadWorkdir");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  if (workdirs_ == nullptr) {
    return ToGrpcStatus(absl::UnimplementedError("this coordinator keeps no workdirs"));
  }
  std::string pending = std::move(*first.mutable_data());
  absl::Status limits;
  auto next = [&](std::string* chunk) {
    if (!pending.empty()) {
      chunk->swap(pending);
      pending.clear();
      return true;
    }
    v1::UploadWorkdirRequest message;
    if (!reader->Read(&message)) return false;
    limits = CheckRequestLimits(message);
    if (!limits.ok()) return false;
    *chunk = std::move(*message.mutable_data());
    return true;
  };
  absl::StatusOr<WorkdirStore::Stored> stored =
      workdirs_->Keep(caller->name, first.sha256(), first.size_bytes(), next);
  if (!limits.ok()) return ToGrpcStatus(limits);
  if (!stored.ok()) return ToGrpcStatus(stored.status());
  response->set_uri(stored->uri);
  response->set_already_stored(stored->already_stored);
  return Status::OK;
}

}  // namespace trainyard
