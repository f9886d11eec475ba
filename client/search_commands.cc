// The hyperparameter search commands: search submit (and follow), list, describe, cancel, extend.

#include <iostream>
#include <optional>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/time/clock.h"
#include "client/commands.h"
#include "client/format.h"
#include "client/views.h"
#include "common/clock.h"

namespace trainyard::cli {

// Polls the search (it has no watch stream) until it ends, redrawing one line on a terminal and
// printing each new line otherwise; rides out a coordinator restart as Follow does.
int Client::FollowSearch(const std::string& id) {
  constexpr absl::Duration kPollInterval = absl::Seconds(1);
  const bool tty = IsTerminal();
  std::string last_line;
  int failures = 0;
  v1::Search search;
  while (true) {
    grpc::ClientContext context;
    SetDeadline(context);
    v1::GetSearchRequest request;
    request.set_id(id);
    grpc::Status status = search_->GetSearch(&context, request, &search);
    if (!status.ok()) {
      if (status.error_code() != grpc::StatusCode::UNAVAILABLE || ++failures > 30) {
        if (tty && !last_line.empty()) std::cout << "\n";
        return RpcError(status);
      }
    } else {
      failures = 0;
      if (search.state() != v1::SEARCH_RUNNING) break;
      const std::string line = SearchProgressLine(search);
      if (line != last_line) {
        std::cout << (tty ? "\r" : "") << line << (tty ? "\x1b[K" : "\n") << std::flush;
        last_line = line;
      }
    }
    RealClock::Get().SleepFor(kPollInterval);
  }
  if (tty && !last_line.empty()) std::cout << "\r\x1b[K";
  if (Json()) {
    std::cout << ToJson(search);
  } else {
    std::cout << SearchProgressLine(search) << "\n";
    if (!search.reason().empty()) std::cout << "  " << search.reason() << "\n";
    if (!search.best_model_uri().empty()) {
      std::cout << "  best model: " << search.best_model_uri() << "\n";
    }
  }
  std::cout << std::flush;
  switch (search.state()) {
    case v1::SEARCH_SUCCEEDED:
      return kExitSucceeded;
    case v1::SEARCH_CANCELLED:
      return kExitJobCancelled;
    default:
      return kExitJobFailed;
  }
}

int Client::Search() {
  const std::string& action = args_.args[0];
  const bool has_arg = args_.args.size() > 1;
  auto needs_arg = [&](const char* what) {
    std::cerr << "error: search " << action << " takes " << what << "\n";
    return kExitUsage;
  };
  auto print = [&](const v1::Search& search) {
    if (Json()) {
      std::cout << ToJson(search);
    } else {
      std::cout << "search " << search.id() << " " << SearchStateName(search.state()) << " ("
                << search.reason() << ")\n";
    }
    return kExitSucceeded;
  };
  v1::Search search;
  if (action == "submit") {
    if (!has_arg) return needs_arg("a spec file (or - for stdin)");
    absl::StatusOr<std::string> yaml = ReadSpecFile(args_.args[1]);
    if (!yaml.ok()) {
      std::cerr << "error: " << yaml.status().message() << "\n";
      return kExitUsage;
    }
    yaml = UploadWorkdir(*yaml, args_.args[1]);
    if (!yaml.ok()) {
      std::cerr << "error: " << yaml.status().message() << "\n";
      return kExitUsage;
    }
    v1::SubmitSearchRequest request;
    request.set_spec_yaml(*yaml);
    grpc::ClientContext context;
    SetDeadline(context);
    grpc::Status status = search_->SubmitSearch(&context, request, &search);
    if (status.error_code() == grpc::StatusCode::INVALID_ARGUMENT) {
      std::cerr << "error: invalid search spec: " << status.error_message() << "\n";
      return kExitUsage;
    }
    if (!status.ok()) return RpcError(status);
    if (Json() && !args_.Has("wait")) return print(search);
    std::cout << search.id() << "\n" << std::flush;
    return args_.Has("wait") ? FollowSearch(search.id()) : kExitSucceeded;
  }
  if (action == "list") {
    if (has_arg) return needs_arg("no argument");
    v1::ListSearchesResponse response;
    if (std::optional<int> failed = Call(*search_, &v1::SearchService::Stub::ListSearches,
                                         v1::ListSearchesRequest(), &response)) {
      return *failed;
    }
    if (Json()) {
      std::cout << ToJson(response);
    } else {
      std::cout << SearchesTable({response.searches().begin(), response.searches().end()},
                                 RealClock::Get().Now(), IsTerminal());
    }
    return kExitSucceeded;
  }
  if (!has_arg) return needs_arg("a search id");
  const std::string& id = args_.args[1];
  if (action == "describe") {
    v1::GetSearchRequest request;
    request.set_id(id);
    if (std::optional<int> failed =
            Call(*search_, &v1::SearchService::Stub::GetSearch, request, &search)) {
      return *failed;
    }
    std::cout << (Json() ? ToJson(search) : DescribeSearch(search));
    return kExitSucceeded;
  }
  if (action == "cancel") {
    v1::CancelSearchRequest request;
    request.set_id(id);
    request.set_reason("cancelled by the user");
    if (std::optional<int> failed =
            Call(*search_, &v1::SearchService::Stub::CancelSearch, request, &search)) {
      return *failed;
    }
    return print(search);
  }
  if (action == "extend") {
    int max_trials = 0;
    if (!absl::SimpleAtoi(args_.Get("max-trials"), &max_trials) || max_trials <= 0) {
      std::cerr << "error: search extend takes --max-trials N (the new total)\n";
      return kExitUsage;
    }
    v1::ExtendSearchRequest request;
    request.set_id(id);
    request.set_max_trials(max_trials);
    if (std::optional<int> failed =
            Call(*search_, &v1::SearchService::Stub::ExtendSearch, request, &search)) {
      return *failed;
    }
    return print(search);
  }
  std::cerr << "error: unknown search action '" << action
            << "' (submit, list, describe, cancel, extend)\n";
  return kExitUsage;
}

}  // namespace trainyard::cli
