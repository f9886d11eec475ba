// `trainyard debug JOB`: what every running rank of a job is doing now.

#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/commands.h"
#include "client/views.h"
#include "common/clock.h"

namespace trainyard::cli {

int Client::Debug() {
  v1::DebugJobRequest request;
  request.set_id(args_.args[0]);
  request.set_stacks(args_.Has("stacks"));
  v1::DebugJobResponse response;
  grpc::ClientContext context;
  // The coordinator waits up to a minute for the agents' debuggers.
  context.set_deadline(absl::ToChronoTime(RealClock::Get().Now() + absl::Seconds(90)));
  FollowLeader(context);
  const grpc::Status status = stub_->DebugJob(&context, request, &response);
  if (!status.ok()) return RpcError(status);
  std::cout << (Json() ? ToJson(response) : DebugView(response, RealClock::Get().Now()));
  return kExitSucceeded;
}

}  // namespace trainyard::cli
