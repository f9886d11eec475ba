#include "worker/agent/preemption_notice.h"

#include <algorithm>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "nlohmann/json.hpp"

namespace trainyard {
namespace {

// For error messages: the start of the answer on one line.
std::string Snippet(absl::string_view body) {
  std::string text(body.substr(0, 120));
  for (char& c : text) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return body.size() > 120 ? text + "..." : text;
}

absl::StatusOr<std::optional<PreemptionNotice>> ParseInstanceAction(absl::string_view body,
                                                                    absl::Time now,
                                                                    absl::Duration grace) {
  const nlohmann::json json = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the answer is not a JSON object: '", Snippet(body), "'"));
  }
  const auto action = json.find("action");
  if (action == json.end() || !action->is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the answer has no \"action\": '", Snippet(body), "'"));
  }
  const std::string verb = absl::AsciiStrToLower(action->get<std::string>());
  if (verb != "terminate" && verb != "stop" && verb != "hibernate") {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown instance action '", action->get<std::string>(), "'"));
  }
  PreemptionNotice notice;
  notice.source = "aws";
  notice.deadline = now + grace;
  const auto time = json.find("time");
  std::string when = time != json.end() && time->is_string() ? time->get<std::string>() : "";
  absl::Time at;
  std::string error;
  // The notice still holds when its time cannot be read: the machine goes all the same.
  if (!when.empty() && absl::ParseTime(absl::RFC3339_full, when, &at, &error)) {
    notice.deadline = std::min(notice.deadline, at);
    notice.message = absl::StrCat("spot instance action: ", verb, " at ", when);
  } else {
    notice.message =
        absl::StrCat("spot instance action: ", verb, " (unreadable time '", when, "')");
  }
  return notice;
}

}  // namespace

absl::StatusOr<std::optional<PreemptionNotice>> ParsePreemptionAnswer(int http_status,
                                                                      absl::string_view body,
                                                                      absl::Time now,
                                                                      absl::Duration grace_period) {
  if (http_status == 404) return std::nullopt;  // AWS: no stop scheduled
  if (http_status != 200) {
    return absl::UnavailableError(
        absl::StrCat("HTTP ", http_status, body.empty() ? "" : ": ", Snippet(body)));
  }
  const absl::string_view text = absl::StripAsciiWhitespace(body);
  if (absl::EqualsIgnoreCase(text, "FALSE")) return std::nullopt;
  if (absl::EqualsIgnoreCase(text, "TRUE")) {
    return PreemptionNotice{"gce", now + grace_period, "instance preempted (metadata: TRUE)"};
  }
  if (absl::StartsWith(text, "{")) return ParseInstanceAction(text, now, grace_period);
  return absl::InvalidArgumentError(
      absl::StrCat("not a preemption notice answer: '", Snippet(body), "'"));
}

}  // namespace trainyard
