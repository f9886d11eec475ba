// A cloud's preemption notice endpoint's answer (GCE's TRUE/FALSE, AWS's JSON), as the agent
// polls it: the first two bytes pick the HTTP status (200, 404 or another), the rest is the body.

#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "worker/agent/preemption_notice.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int statuses[] = {200, 404, 503, 200};
  const absl::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  trainyard::ParsePreemptionAnswer(statuses[data[0] % 4], body, absl::FromUnixSeconds(1800000000),
                                   absl::Seconds(30))
      .IgnoreError();
  return 0;
}
