#include "server/api/request_limits.h"

#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/reflection.h"

namespace trainyard {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

// Names and ids are short; free text and URIs get the default; the few large fields say why.
constexpr FieldBound kBounds[] = {
    // A spec in YAML: JobManagerOptions::max_spec_yaml_bytes also applies.
    {"trainyard.v1.SubmitJobRequest.spec_yaml", 1 << 20},
    {"trainyard.v1.JobSpec.name", 128},
    {"trainyard.v1.GetJobRequest.id", 256},
    {"trainyard.v1.CancelJobRequest.id", 256},
    {"trainyard.v1.CancelJobRequest.reason", 1024},
    {"trainyard.v1.DeleteJobRequest.id", 256},
    // A search spec in YAML: SearchManagerOptions::max_spec_yaml_bytes also applies.
    {"trainyard.v1.SubmitSearchRequest.spec_yaml", 1 << 20},
    {"trainyard.v1.GetSearchRequest.id", 256},
    {"trainyard.v1.CancelSearchRequest.id", 256},
    {"trainyard.v1.CancelSearchRequest.reason", 1024},
    {"trainyard.v1.ExtendSearchRequest.id", 256},
    {"trainyard.v1.WatchJobRequest.id", 256},
    {"trainyard.v1.GetJobLogsRequest.id", 256},
    {"trainyard.v1.ListCheckpointsRequest.job_id", 256},
    {"trainyard.v1.ListJobsRequest.states", 16},
    {"trainyard.v1.ListJobsRequest.page_token", 256},
    {"trainyard.v1.ListJobsRequest.name_contains", 128},
    {"trainyard.v1.ListJobsRequest.owner", 128},
    {"trainyard.v1.ListJobsRequest.queue", 128},
    {"trainyard.v1.GetJobMetricsRequest.id", 256},
    {"trainyard.v1.RedeemConsoleLoginRequest.code", 64},
    {"trainyard.v1.CreateTokenRequest.name", 128},
    {"trainyard.v1.RevokeTokenRequest.id", 64},
    {"trainyard.v1.Queue.name", 128},
    {"trainyard.v1.Queue.users", 1000},
    {"trainyard.v1.DeleteQueueRequest.name", 128},
    {"trainyard.v1.JobSpec.queue", 128},
    // A program: its environment (common/spec/program_env.h has the bounds it is validated to).
    {"trainyard.v1.ProgramSpec.env", 256},
    {"trainyard.v1.ProgramSpec.EnvEntry.value", 32 << 10},
    {"trainyard.v1.ProgramSpec.command", 1024},
    // A program's own figures: the host forwards at most 64.
    {"trainyard.v1.JobProgress.metrics", 64},
    {"trainyard.v1.UploadWorkdirRequest.sha256", 64},
    {"trainyard.v1.UploadWorkdirRequest.data", 1 << 20},
    {"trainyard.v1.RegisterWorkerRequest.name", 128},
    {"trainyard.v1.RegisterWorkerRequest.address", 256},
    {"trainyard.v1.RegisterWorkerRequest.hostname", 256},
    // What a worker runs: at most a few hundred tasks even on a large machine.
    {"trainyard.v1.RegisterWorkerRequest.tasks", 4096},
    // Every operator of the trainer's LibTorch: about 2,100 in 1.13, 2,600 in 2.6.
    {"trainyard.v1.TrainerRuntime.ops", 20000},
    {"trainyard.v1.TrainerRuntime.libtorch_version", 64},
    {"trainyard.v1.SyncRequest.worker_id", 128},
    {"trainyard.v1.LeaseRequest.worker_id", 128},
    {"trainyard.v1.SyncRequest.tasks", 4096},
    {"trainyard.v1.ReportTaskStatusRequest.worker_id", 128},
    {"trainyard.v1.TaskStatus.task_id", 512},
    {"trainyard.v1.TaskStatus.job_id", 256},
    // The trainer's last words or its log's tail; JobManager keeps the first 4 KiB.
    {"trainyard.v1.TaskStatus.message", 64 << 10},
    {"trainyard.v1.ShipLogsRequest.worker_id", 128},
    {"trainyard.v1.ShipLogsRequest.task_id", 512},
    // The agent ships at most 256 KiB at a time (LogShipper::kMaxChunkBytes).
    {"trainyard.v1.ShipLogsRequest.data", 1 << 20},
    {"trainyard.v1.ReportProgressRequest.job_id", 256},
    {"trainyard.v1.CommitCheckpointRequest.job_id", 256},
    {"trainyard.v1.ReportModelRequest.job_id", 256},
    {"trainyard.v1.RendezvousSetRequest.job_id", 256},
    {"trainyard.v1.RendezvousSetRequest.key", 256},
    // A Gloo address or an NCCL unique id (128 bytes).
    {"trainyard.v1.RendezvousSetRequest.value", 16 << 10},
    {"trainyard.v1.RendezvousGetRequest.job_id", 256},
    {"trainyard.v1.RendezvousGetRequest.key", 256},
    {"trainyard.v1.ReportEventRequest.job_id", 256},
    {"trainyard.v1.ReportEventRequest.message", 4096},
    {"trainyard.v1.DebugJobRequest.id", 256},
    {"trainyard.v1.ReturnGpuRequest.worker_id", 128},
    // What a worker's agent says of its GPUs out of service.
    {"trainyard.v1.GpuFault.reason", 1024},
    {"trainyard.v1.SyncRequest.gpu_faults", 1024},
    {"trainyard.v1.RegisterWorkerRequest.gpu_faults", 1024},
    {"trainyard.v1.ReportDebugRequest.worker_id", 128},
    {"trainyard.v1.ReportDebugRequest.ask_id", 64},
    {"trainyard.v1.TaskRecord.task_id", 512},
    // Every thread's stack of a trainer, as gdb prints them (the agent cuts them at 256 KiB).
    {"trainyard.v1.RankRecord.stacks", 512 << 10},
    {"trainyard.v1.ReportPreemptionRequest.worker_id", 128},
    {"trainyard.v1.ReportPreemptionRequest.source", 64},
    {"trainyard.v1.ReportPreemptionRequest.message", 4096},
};

const absl::flat_hash_map<std::string, int64_t>& BoundsByField() {
  static const auto* const kMap = [] {
    auto* map = new absl::flat_hash_map<std::string, int64_t>();
    for (const FieldBound& b : kBounds) (*map)[b.field] = b.max;
    return map;
  }();
  return *kMap;
}

int64_t BoundOf(const FieldDescriptor* field, int64_t fallback) {
  const auto& map = BoundsByField();
  auto it = map.find(field->full_name());
  return it == map.end() ? fallback : it->second;
}

absl::Status TooBig(const std::string& path, int64_t size, int64_t max, const char* unit) {
  return absl::InvalidArgumentError(
      absl::StrCat(path, ": ", size, " ", unit, " is over the limit of ", max));
}

absl::Status Check(const Message& message, const std::string& prefix, int depth) {
  if (depth > kMaxMessageDepth) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, ": nested too deep"));
  }
  const Reflection* reflection = message.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  reflection->ListFields(message, &fields);
  for (const FieldDescriptor* field : fields) {
    const std::string path =
        prefix.empty() ? field->name() : absl::StrCat(prefix, ".", field->name());
    const bool is_string = field->cpp_type() == FieldDescriptor::CPPTYPE_STRING;
    const bool is_message = field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE;
    if (field->is_repeated()) {
      const int n = reflection->FieldSize(message, field);
      if (const int64_t max = BoundOf(field, kDefaultMaxRepeated); n > max) {
        return TooBig(path, n, max, "entries");
      }
      for (int i = 0; i < n; ++i) {
        const std::string item = absl::StrCat(path, "[", i, "]");
        if (is_string) {
          std::string scratch;
          const std::string& value =
              reflection->GetRepeatedStringReference(message, field, i, &scratch);
          if (value.size() > kDefaultMaxStringBytes) {
            return TooBig(item, value.size(), kDefaultMaxStringBytes, "bytes");
          }
        } else if (is_message) {
          if (absl::Status s =
                  Check(reflection->GetRepeatedMessage(message, field, i), item, depth + 1);
              !s.ok()) {
            return s;
          }
        }
      }
      continue;
    }
    if (is_string) {
      std::string scratch;
      const std::string& value = reflection->GetStringReference(message, field, &scratch);
      if (const int64_t max = BoundOf(field, kDefaultMaxStringBytes);
          static_cast<int64_t>(value.size()) > max) {
        return TooBig(path, value.size(), max, "bytes");
      }
    } else if (is_message) {
      if (absl::Status s = Check(reflection->GetMessage(message, field), path, depth + 1);
          !s.ok()) {
        return s;
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckRequestLimits(const Message& request) { return Check(request, "", 0); }

const FieldBound* RequestBounds(int* count) {
  *count = static_cast<int>(sizeof(kBounds) / sizeof(kBounds[0]));
  return kBounds;
}

}  // namespace trainyard
