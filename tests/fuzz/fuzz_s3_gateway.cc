// A request to the agent's S3 gateway, from the user's own program (any bytes it likes), as the
// gateway's HTTP server hands it over: "METHOD /path" on the first line, the query ("k=v&k=v")
// on the second, then "name: value" headers. Through the Authorization header's parser, the
// signature check and the rules of what a task may do. The rules are checked against the
// scope independently: whatever is allowed lies inside the task's places, with no segment of
// dots or empty segment that a server could take elsewhere.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "worker/agent/s3_gateway_rules.h"

namespace {

// Whether `key` is `folder` or below it, by plain segments only.
bool Inside(absl::string_view key, absl::string_view folder, bool prefix) {
  if (key != folder && !absl::StartsWith(key, std::string(folder) + "/")) return false;
  const std::vector<absl::string_view> segments = absl::StrSplit(key, '/');
  for (size_t i = 0; i < segments.size(); ++i) {
    const absl::string_view s = segments[i];
    if (s == "." || s == "..") return false;
    if (s.empty() && !(prefix && i + 1 == segments.size())) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  const std::vector<absl::string_view> lines = absl::StrSplit(input, '\n');
  trainyard::GatewayRequest request;
  const size_t space = lines[0].find(' ');
  if (space == absl::string_view::npos) return 0;
  request.method = std::string(lines[0].substr(0, space));
  request.path = std::string(lines[0].substr(space + 1));
  if (lines.size() > 1 && !lines[1].empty()) {
    for (absl::string_view pair : absl::StrSplit(lines[1], '&')) {
      const size_t eq = pair.find('=');
      request.query.emplace_back(
          std::string(pair.substr(0, eq)),
          eq == absl::string_view::npos ? "" : std::string(pair.substr(eq + 1)));
    }
  }
  for (size_t i = 2; i < lines.size(); ++i) {
    const size_t colon = lines[i].find(':');
    if (colon == absl::string_view::npos) continue;
    request.headers[absl::AsciiStrToLower(lines[i].substr(0, colon))] =
        std::string(absl::StripAsciiWhitespace(lines[i].substr(colon + 1)));
  }

  absl::StatusOr<trainyard::SigV4Authorization> auth =
      trainyard::ParseSigV4Authorization(request.headers["authorization"]);
  if (auth.ok()) {
    trainyard::VerifyGatewaySignature(request, *auth, "secret-of-this-task",
                                      absl::FromUnixSeconds(1800000000))
        .IgnoreError();
  }
  trainyard::ObjectScope scope;
  scope.read.push_back({"data", "sets/train"});
  scope.write.push_back({"ckpt", "jobs/j-1"});
  absl::StatusOr<trainyard::GatewayOperation> op =
      trainyard::AuthorizeGatewayRequest(request, scope);
  if (!op.ok()) return 0;
  const bool in_checkpoints = op->bucket == "ckpt" && Inside(op->key, "jobs/j-1", op->list);
  const bool in_data = op->bucket == "data" && Inside(op->key, "sets/train", op->list);
  if (op->write && !in_checkpoints) __builtin_trap();
  if (!op->write && !in_checkpoints && !in_data) __builtin_trap();
  if (op->list && !absl::StrContains(op->key, '/')) __builtin_trap();
  return 0;
}
