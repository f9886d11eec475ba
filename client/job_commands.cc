// The job and worker commands: submit (and follow), jobs, describe, logs, cancel, delete, workers,
// checkpoints.

#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "client/commands.h"
#include "client/format.h"
#include "client/views.h"
#include "common/clock.h"
#include "common/storage/object_store.h"
#include "common/storage/uri.h"

namespace trainyard::cli {
namespace {

bool IsFinal(v1::JobState state) {
  return state == v1::SUCCEEDED || state == v1::FAILED || state == v1::CANCELLED;
}

// Deletes every object under a job's checkpoint URI (and, for a local folder, the folder).
absl::Status DeleteCheckpointObjects(const ObjectStoreResolver& stores,
                                     const std::string& checkpoint_uri) {
  if (checkpoint_uri.empty()) return absl::OkStatus();
  absl::StatusOr<std::shared_ptr<ObjectStore>> store = stores.Open(checkpoint_uri);
  if (!store.ok()) return store.status();
  // The trailing '/' keeps job-1 from matching job-10's objects.
  const std::string prefix = absl::StrCat(absl::StripSuffix(checkpoint_uri, "/"), "/");
  absl::StatusOr<std::vector<ObjectInfo>> objects = (*store)->List(prefix);
  if (!objects.ok()) return objects.status();
  int64_t bytes = 0;
  size_t done = 0;
  for (const ObjectInfo& object : *objects) {
    if (absl::Status s = (*store)->Delete(object.uri); !s.ok()) return s;
    bytes += object.size_bytes;
    if (++done % 100 == 0 && IsTerminal()) {
      std::cerr << "\rdeleted " << done << " of " << objects->size() << " objects" << std::flush;
    }
  }
  if (done >= 100 && IsTerminal()) std::cerr << "\r";
  // A local folder is left without its empty subfolders.
  if (absl::StatusOr<std::string> path = LocalPath(checkpoint_uri); path.ok()) {
    std::error_code ec;
    std::vector<std::filesystem::path> dirs;
    for (auto it = std::filesystem::recursive_directory_iterator(*path, ec);
         !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
      if (it->is_directory(ec)) dirs.push_back(it->path());
    }
    // Deepest first, the folder itself last.
    for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) std::filesystem::remove(*it, ec);
    std::filesystem::remove(*path, ec);
  }
  std::cout << "deleted " << done << " checkpoint objects (" << HumanBytes(bytes) << ") under "
            << checkpoint_uri << "\n";
  return absl::OkStatus();
}

}  // namespace

int Client::Submit() {
  absl::StatusOr<std::string> read = ReadSpecFile(args_.args[0]);
  if (!read.ok()) {
    std::cerr << "error: " << read.status().message() << "\n";
    return kExitUsage;
  }
  // A program's workdir on this machine goes to the coordinator first.
  absl::StatusOr<std::string> yaml = UploadWorkdir(*read, args_.args[0]);
  if (!yaml.ok()) {
    std::cerr << "error: " << yaml.status().message() << "\n";
    return absl::IsFailedPrecondition(yaml.status()) || absl::IsInvalidArgument(yaml.status()) ||
                   absl::IsNotFound(yaml.status())
               ? kExitUsage
               : kExitRpcError;
  }
  v1::SubmitJobRequest request;
  request.set_spec_yaml(*std::move(yaml));
  if (args_.Has("resume-from")) request.set_resume_from(args_.Get("resume-from"));
  v1::Job job;
  grpc::ClientContext context;
  SetDeadline(context);
  grpc::Status status = stub_->SubmitJob(&context, request, &job);
  if (status.error_code() == grpc::StatusCode::INVALID_ARGUMENT) {
    const std::string& message = status.error_message();
    std::cerr << "error: "
              << (message.rfind("invalid job spec", 0) == 0 ? "" : "invalid job spec: ") << message
              << "\n";
    return kExitUsage;
  }
  if (!status.ok()) return RpcError(status);
  std::cout << job.id() << "\n" << std::flush;
  if (!args_.Has("wait")) return kExitSucceeded;
  return Follow(job.id());
}

int Client::Follow(const std::string& id) {
  const bool tty = IsTerminal();
  EtaEstimator eta;
  v1::JobState last_state = v1::JOB_STATE_UNSPECIFIED;
  std::string last_state_line;
  int64_t last_printed_step = -1;
  bool progress_shown = false;  // a redrawn line is on screen
  int failures = 0;
  v1::Job job;
  auto end_progress_line = [&]() {
    if (tty && progress_shown) std::cout << "\r\x1b[K";
    progress_shown = false;
  };
  while (true) {
    v1::WatchJobRequest request;
    request.set_id(id);
    grpc::ClientContext context;
    FollowLeader(context);
    std::unique_ptr<grpc::ClientReader<v1::WatchJobResponse>> reader =
        stub_->WatchJob(&context, request);
    v1::WatchJobResponse response;
    while (reader->Read(&response)) {
      failures = 0;
      job = response.job();
      const std::string state_line = StateLine(job);
      if (job.state() != last_state || (state_line != last_state_line && !IsFinal(job.state()))) {
        end_progress_line();
        if (!IsFinal(job.state())) std::cout << state_line << "\n";
        if (job.state() != last_state) last_printed_step = -1;
        last_state = job.state();
        last_state_line = state_line;
      }
      const v1::JobProgress& p = job.progress();
      if (job.state() == v1::RUNNING && p.step() > 0) {
        eta.Observe(RealClock::Get().Now(), p.step());
        const std::string line = ProgressLine(p, eta.Eta(p.total_steps()));
        if (tty) {
          std::cout << "\r" << line << "\x1b[K";
          progress_shown = true;
        } else {
          const int64_t step_gap =
              p.total_steps() > 0 ? std::max<int64_t>(1, p.total_steps() / 20) : 1;
          if (last_printed_step < 0 || p.step() - last_printed_step >= step_gap ||
              (p.total_steps() > 0 && p.step() == p.total_steps() &&
               last_printed_step != p.step())) {
            std::cout << line << "\n";
            last_printed_step = p.step();
          }
        }
      }
      std::cout << std::flush;
      if (IsFinal(job.state())) break;
    }
    grpc::Status status = reader->Finish();
    if (IsFinal(job.state())) break;
    if (status.ok()) continue;  // the stream ended early (coordinator restart): watch again
    if (status.error_code() != grpc::StatusCode::UNAVAILABLE || ++failures > 30) {
      end_progress_line();
      return RpcError(status);
    }
    RealClock::Get().SleepFor(absl::Seconds(1));
  }
  end_progress_line();
  const v1::JobProgress& p = job.progress();
  std::cout << "job " << job.id() << " " << JobStateName(job.state());
  if (!job.reason().empty()) std::cout << ": " << job.reason();
  std::cout << "\n";
  if (p.step() > 0) std::cout << "  final: " << ProgressLine(p, std::nullopt) << "\n";
  if (!job.model_uri().empty()) std::cout << "  model:       " << job.model_uri() << "\n";
  if (!job.checkpoint_uri().empty()) {
    std::cout << "  checkpoints: " << job.checkpoint_uri() << "\n";
  }
  std::cout << std::flush;
  switch (job.state()) {
    case v1::SUCCEEDED:
      return kExitSucceeded;
    case v1::CANCELLED:
      return kExitJobCancelled;
    default:
      return kExitJobFailed;
  }
}

int Client::Jobs() {
  v1::ListJobsRequest request;
  if (args_.Has("state")) {
    const v1::JobState state = ParseJobState(args_.Get("state"));
    if (state == v1::JOB_STATE_UNSPECIFIED) {
      std::cerr << "error: unknown state '" << args_.Get("state")
                << "' (PENDING, SCHEDULED, RUNNING, SUCCEEDED, FAILED, CANCELLED, RESTARTING)\n";
      return kExitUsage;
    }
    request.add_states(state);
  }
  request.set_page_size(1000);
  v1::ListJobsResponse all;
  while (true) {
    v1::ListJobsResponse response;
    if (std::optional<int> failed =
            Call(*stub_, &v1::JobService::Stub::ListJobs, request, &response)) {
      return *failed;
    }
    for (v1::Job& job : *response.mutable_jobs()) *all.add_jobs() = std::move(job);
    if (response.next_page_token().empty()) break;
    request.set_page_token(response.next_page_token());
  }
  if (Json()) {
    std::cout << ToJson(all);
  } else {
    std::cout << JobsTable(std::vector<v1::Job>(all.jobs().begin(), all.jobs().end()),
                           RealClock::Get().Now(), IsTerminal());
  }
  return kExitSucceeded;
}

int Client::Describe() {
  v1::GetJobRequest request;
  request.set_id(args_.args[0]);
  v1::Job job;
  if (std::optional<int> failed = Call(*stub_, &v1::JobService::Stub::GetJob, request, &job)) {
    return *failed;
  }
  std::cout << (Json() ? ToJson(job) : DescribeJob(job));
  return kExitSucceeded;
}

int Client::Logs() {
  int rank = -1;
  if (args_.Has("rank") && (!absl::SimpleAtoi(args_.Get("rank"), &rank) || rank < 0)) {
    std::cerr << "error: --rank takes a rank number, got '" << args_.Get("rank") << "'\n";
    return kExitUsage;
  }
  int shard = -1;
  if (args_.Has("shard") && (!absl::SimpleAtoi(args_.Get("shard"), &shard) || shard < 0)) {
    std::cerr << "error: --shard takes a shard number, got '" << args_.Get("shard") << "'\n";
    return kExitUsage;
  }
  if (rank >= 0 && shard >= 0) {
    std::cerr << "error: --rank and --shard select different tasks; give one\n";
    return kExitUsage;
  }
  // With several tasks in one stream, each line says which task wrote it.
  bool prefix = false;
  if (rank < 0 && shard < 0) {
    v1::GetJobRequest request;
    request.set_id(args_.args[0]);
    v1::Job job;
    if (std::optional<int> failed = Call(*stub_, &v1::JobService::Stub::GetJob, request, &job)) {
      return *failed;
    }
    std::set<std::pair<int, int>> tasks;  // (role, rank or shard)
    for (const v1::TaskInfo& task : job.tasks()) {
      tasks.emplace(task.role(), task.role() == v1::TASK_ROLE_SHARD ? task.shard() : task.rank());
    }
    prefix = tasks.size() > 1;
  }
  v1::GetJobLogsRequest request;
  request.set_id(args_.args[0]);
  request.set_rank(rank);
  if (shard >= 0) request.set_shard(shard);
  request.set_follow(args_.Has("follow"));
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReader<v1::LogChunk>> reader = stub_->GetJobLogs(&context, request);
  v1::LogChunk chunk;
  std::map<std::string, std::string> partial;  // "[rank 0] " or "[shard 1] " -> unfinished line
  while (reader->Read(&chunk)) {
    if (!prefix) {
      std::cout << chunk.data() << std::flush;
      continue;
    }
    const std::string label = chunk.role() == v1::TASK_ROLE_SHARD
                                  ? absl::StrCat("[shard ", chunk.shard(), "] ")
                                  : absl::StrCat("[rank ", chunk.rank(), "] ");
    std::string& buffer = partial[label];
    buffer += chunk.data();
    size_t start = 0;
    for (size_t nl; (nl = buffer.find('\n', start)) != std::string::npos; start = nl + 1) {
      std::cout << label << buffer.substr(start, nl + 1 - start);
    }
    buffer.erase(0, start);
    std::cout << std::flush;
  }
  for (const auto& [label, rest] : partial) {
    if (!rest.empty()) std::cout << label << rest << "\n";
  }
  grpc::Status status = reader->Finish();
  if (!status.ok()) return RpcError(status);
  return kExitSucceeded;
}

int Client::Cancel() {
  v1::CancelJobRequest request;
  request.set_id(args_.args[0]);
  request.set_reason("cancelled by the user");
  v1::Job job;
  if (std::optional<int> failed = Call(*stub_, &v1::JobService::Stub::CancelJob, request, &job)) {
    return *failed;
  }
  std::cout << "job " << job.id() << " " << JobStateName(job.state()) << "\n";
  return kExitSucceeded;
}

int Client::Delete() {
  const std::string& id = args_.args[0];
  v1::DeleteJobRequest request;
  request.set_id(id);
  v1::DeleteJobResponse response;
  if (args_.Has("checkpoints")) {
    // Checked first, so that the objects go only when the job can go too.
    request.set_validate_only(true);
    if (std::optional<int> failed =
            Call(*stub_, &v1::JobService::Stub::DeleteJob, request, &response)) {
      return *failed;
    }
    v1::GetJobRequest get;
    get.set_id(id);
    v1::Job job;
    if (std::optional<int> failed = Call(*stub_, &v1::JobService::Stub::GetJob, get, &job)) {
      return *failed;
    }
    if (absl::Status s = DeleteCheckpointObjects(stores_, job.checkpoint_uri()); !s.ok()) {
      std::cerr << "error: deleting the checkpoints under " << job.checkpoint_uri() << ": "
                << s.message() << "\n(job " << id << " was not deleted; run the command again)\n";
      return kExitStorageError;
    }
    request.set_validate_only(false);
  }
  if (std::optional<int> failed =
          Call(*stub_, &v1::JobService::Stub::DeleteJob, request, &response)) {
    return *failed;
  }
  std::cout << "job " << id << " deleted\n";
  return kExitSucceeded;
}

int Client::Workers() {
  if (!args_.args.empty()) {
    int index = -1;
    if (args_.args[0] != "return-gpu" || args_.args.size() != 3 ||
        !absl::SimpleAtoi(args_.args[2], &index) || index < 0) {
      std::cerr << "error: usage: workers [return-gpu WORKER INDEX]\n";
      return kExitUsage;
    }
    v1::ReturnGpuRequest request;
    request.set_worker_id(args_.args[1]);
    request.set_index(index);
    v1::Worker worker;
    if (std::optional<int> failed =
            Call(*admin_, &v1::AdminService::Stub::ReturnGpu, request, &worker)) {
      return *failed;
    }
    std::cout << "GPU " << index << " of " << worker.id()
              << " returned: its agent checks it again and takes it back into service if the "
                 "check passes (`workers` shows it)\n";
    return kExitSucceeded;
  }
  v1::ListWorkersResponse response;
  if (std::optional<int> failed =
          Call(*stub_, &v1::JobService::Stub::ListWorkers, v1::ListWorkersRequest(), &response)) {
    return *failed;
  }
  if (Json()) {
    std::cout << ToJson(response);
  } else {
    std::cout << WorkersTable(
        std::vector<v1::Worker>(response.workers().begin(), response.workers().end()),
        RealClock::Get().Now());
  }
  return kExitSucceeded;
}

int Client::Checkpoints() {
  v1::ListCheckpointsRequest request;
  request.set_job_id(args_.args[0]);
  v1::ListCheckpointsResponse response;
  if (std::optional<int> failed =
          Call(*stub_, &v1::JobService::Stub::ListCheckpoints, request, &response)) {
    return *failed;
  }
  if (Json()) {
    std::cout << ToJson(response);
  } else {
    std::cout << CheckpointsTable(
        std::vector<v1::Checkpoint>(response.checkpoints().begin(), response.checkpoints().end()));
  }
  return kExitSucceeded;
}

}  // namespace trainyard::cli
