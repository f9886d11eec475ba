// An HTTP request to the metrics port (TLS ends before it: anyone who reaches the port), as the
// HTTPS metrics server answers it. With basic auth set, no request without the right
// Authorization header may get the metrics.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/rpc/tls_metrics_server.h"
#include "prometheus/counter.h"
#include "prometheus/registry.h"

namespace {

constexpr absl::string_view kExpected = "Basic dXNlcjpwYXNzd29yZA==";

// Whether a line of the request's head says exactly kExpected as its Authorization.
bool Authorized(absl::string_view request) {
  const absl::string_view head = request.substr(0, request.find("\r\n\r\n"));
  for (absl::string_view line : absl::StrSplit(head, "\r\n")) {
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos) continue;
    if (absl::EqualsIgnoreCase(absl::StripAsciiWhitespace(line.substr(0, colon)),
                               "authorization") &&
        absl::StripAsciiWhitespace(line.substr(colon + 1)) == kExpected) {
      return true;
    }
  }
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::shared_ptr<prometheus::Registry> registry = [] {
    auto r = std::make_shared<prometheus::Registry>();
    prometheus::BuildCounter()
        .Name("trainyard_fuzz_total")
        .Help("h")
        .Register(*r)
        .Add({})
        .Increment();
    return r;
  }();
  const absl::string_view request(reinterpret_cast<const char*>(data), size);
  const std::string open = trainyard::AnswerMetricsRequest(request, "", registry);
  const std::string guarded = trainyard::AnswerMetricsRequest(request, kExpected, registry);
  if (absl::StartsWith(guarded, "HTTP/1.1 200") && !Authorized(request)) __builtin_trap();
  if (absl::StrContains(guarded, "trainyard_fuzz_total") && !Authorized(request)) __builtin_trap();
  if (!absl::StartsWith(open, "HTTP/1.1 ")) __builtin_trap();
  return 0;
}
