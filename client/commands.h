#ifndef TRAINYARD_CLIENT_COMMANDS_H_
#define TRAINYARD_CLIENT_COMMANDS_H_

// The `trainyard` CLI's commands, one group per file: jobs and workers (job_commands.cc),
// searches (search_commands.cc), tokens (token_commands.cc), queues (queue_commands.cc), and data
// (data_commands.cc, which needs no coordinator); cli.cc holds the command table and hands each
// command to its group. Internal to the CLI.

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/args.h"
#include "client/cli.h"
#include "common/storage/object_store.h"
#include "grpcpp/grpcpp.h"
#include "trainyard/v1/admin_service.grpc.pb.h"
#include "trainyard/v1/job_service.grpc.pb.h"
#include "trainyard/v1/search_service.grpc.pb.h"

namespace trainyard::cli {

inline constexpr absl::Duration kRpcTimeout = absl::Seconds(30);

// Whether standard output is a terminal (live lines are redrawn there, printed otherwise).
bool IsTerminal();
// Bounds a call by kRpcTimeout; after WaitForLeader(true) (the CLI was given several
// coordinators) the call also waits for one that serves, within that time.
void SetDeadline(grpc::ClientContext& context);
void WaitForLeader(bool wait);
// The waiting part alone, for a stream without a deadline (`watch`).
void FollowLeader(grpc::ClientContext& context);
// A spec from a file, or from stdin for "-".
absl::StatusOr<std::string> ReadSpecFile(const std::string& file);

// `trainyard data inspect|pack ...` (data_commands.cc), reading through `stores`.
int Data(const ParsedArgs& args, const ObjectStoreResolver& stores);

// The commands that talk to the coordinator, over one channel.
class Client {
 public:
  // `stores` (not owned) serves `delete --checkpoints`.
  Client(std::string address, const ParsedArgs& args, std::shared_ptr<grpc::Channel> channel,
         const ObjectStoreResolver& stores)
      : address_(std::move(address)),
        args_(args),
        stores_(stores),
        stub_(v1::JobService::NewStub(channel)),
        admin_(v1::AdminService::NewStub(channel)),
        search_(v1::SearchService::NewStub(channel)) {}

  int Submit();
  int Jobs();
  int Describe();
  int Debug();
  int Logs();
  int Cancel();
  int Delete();
  int Workers();
  int Checkpoints();
  int Token();
  int Queue();
  // Queue's actions (queue_commands.cc), and the queues listed into `response` (an exit code:
  // kExitSucceeded, or the call's failure).
  int ListQueuesInto(v1::ListQueuesResponse* response);
  int WriteQueue(const std::string& action, const std::string& name);
  int DeleteQueue(const std::string& name);
  int ListQueues(const v1::ListQueuesResponse& response);
  int DescribeQueueAndJobs(const v1::ListQueuesResponse& response, const std::string& name);
  int Search();

 private:
  // Prints the error and returns the exit code for it.
  int RpcError(const grpc::Status& status) const;
  // One unary call bounded by kRpcTimeout: nullopt when it succeeded, else the error printed and
  // the exit code for it.
  template <typename Stub, typename Request, typename Response>
  std::optional<int> Call(Stub& stub,
                          grpc::Status (Stub::*rpc)(grpc::ClientContext*, const Request&,
                                                    Response*),
                          const Request& request, Response* response) const {
    grpc::ClientContext context;
    SetDeadline(context);
    const grpc::Status status = (stub.*rpc)(&context, request, response);
    if (status.ok()) return std::nullopt;
    return RpcError(status);
  }
  bool Json() const {
    const std::string output = args_.Get("output", "table");
    return output == "json";
  }
  int Follow(const std::string& id);
  int FollowSearch(const std::string& id);
  // A spec read from `spec_file` whose program.workdir (a job's) or template.program.workdir (a
  // search's) names a folder on this machine (no scheme; relative to the spec file's folder):
  // that folder packed (common/formats/workdir_archive.h), sent to the coordinator, and the spec
  // given back naming where it was kept. Other specs come back as they are. Progress on stderr.
  // Errors name the folder (over the size limit, unreadable) or the call that failed.
  absl::StatusOr<std::string> UploadWorkdir(const std::string& yaml, const std::string& spec_file);
  absl::StatusOr<v1::UploadWorkdirResponse> SendWorkdirArchive(const std::string& path,
                                                               const std::string& sha256,
                                                               int64_t size);

  const std::string address_;
  const ParsedArgs& args_;
  const ObjectStoreResolver& stores_;
  std::unique_ptr<v1::JobService::Stub> stub_;
  std::unique_ptr<v1::AdminService::Stub> admin_;
  std::unique_ptr<v1::SearchService::Stub> search_;
};

}  // namespace trainyard::cli

#endif  // TRAINYARD_CLIENT_COMMANDS_H_
