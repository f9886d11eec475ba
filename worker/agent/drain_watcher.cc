#include "worker/agent/drain_watcher.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/log.h"
#include "common/run_command.h"

namespace trainyard {

bool SaysDrained(absl::string_view output) {
  const std::string lower = absl::AsciiStrToLower(output);
  for (absl::string_view word : absl::StrSplit(lower, absl::ByAnyChar(" \t\n+,"))) {
    word = absl::StripSuffix(absl::StripSuffix(word, "*"), "~");
    if (word == "drain" || word == "drained" || word == "draining") return true;
  }
  return false;
}

DrainWatcher::DrainWatcher(DrainWatcherOptions options, const Clock& clock)
    : options_(std::move(options)), clock_(clock) {}

absl::StatusOr<std::optional<PreemptionNotice>> DrainWatcher::PollOnce() {
  absl::StatusOr<CommandResult> r = RunCommand(options_.command, {}, options_.command_timeout);
  if (!r.ok()) return absl::UnavailableError(std::string(r.status().message()));
  if (!r->ok()) {
    return absl::UnavailableError(
        absl::StrCat(absl::StrJoin(options_.command, " "), ": ", DescribeCommandEnd(*r)));
  }
  if (!SaysDrained(r->out)) return std::nullopt;
  PreemptionNotice notice;
  notice.source = "drain";
  notice.deadline = clock_.Now() + options_.grace_period;
  notice.message = absl::StrCat("the machine is being drained (", options_.command.front(), ": ",
                                absl::StripAsciiWhitespace(r->out).substr(0, 200), ")");
  return notice;
}

void DrainWatcher::Start(std::function<void(const PreemptionNotice&)> on_notice) {
  poller_.Start(options_.poll_interval,
                {[this] { return PollOnce(); }, std::move(on_notice),
                 [](const absl::Status& s) { LogWarning("drain check failed: ", s.message()); },
                 [] { LogInfo("drain check works again"); }});
}

}  // namespace trainyard
