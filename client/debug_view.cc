// `trainyard debug`'s view: each rank's record, newest collectives last.

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/format.h"
#include "client/views.h"
#include "common/byte_size.h"

namespace trainyard::cli {

namespace {

// The newest collectives and messages shown per rank.
constexpr int kShownEntries = 6;

std::string Seconds(int64_t from_ms, int64_t to_ms) {
  if (from_ms <= 0 || to_ms < from_ms) return "-";
  return absl::StrCat((to_ms - from_ms) / 1000, " s");
}

// "all-reduce #1532 (4.0 MiB) waiting 61 s", "send #7 to rank 2 (512.0 KiB) done in 0 s".
std::string EntryLine(const v1::CollectiveRecord& c, int64_t read_ms) {
  std::string line = absl::StrCat(c.kind(), " #", c.seq());
  if (c.kind() == "send") absl::StrAppend(&line, " to rank ", c.peer());
  if (c.kind() == "receive") absl::StrAppend(&line, " from rank ", c.peer());
  absl::StrAppend(&line, " (", HumanBytes(c.bytes()), ") ");
  if (c.ended_unix_ms() == 0) {
    absl::StrAppend(&line, "waiting ", Seconds(c.started_unix_ms(), read_ms));
  } else {
    absl::StrAppend(&line, c.failed() ? "failed after " : "done in ",
                    Seconds(c.started_unix_ms(), c.ended_unix_ms()));
  }
  return line;
}

}  // namespace

std::string DebugView(const v1::DebugJobResponse& debug, absl::Time now) {
  std::vector<std::vector<std::string>> rows;
  for (const v1::RankDebug& r : debug.ranks()) {
    const v1::RankRecord& rec = r.record();
    if (!r.has_record()) {
      rows.push_back({absl::StrCat(r.rank()), r.worker_id(), "-", "-", "-", "-", r.error()});
      continue;
    }
    rows.push_back({absl::StrCat(r.rank()), r.worker_id(), rec.process_state(),
                    rec.phase().empty() ? "-" : rec.phase(),
                    Seconds(rec.phase_since_unix_ms(), rec.read_unix_ms()),
                    absl::StrCat(rec.step()), rec.error()});
  }
  std::string out = absl::StrCat("Attempt ", debug.generation(), ", read ",
                                 LocalTime(absl::ToUnixMillis(now)), "\n\n");
  absl::StrAppend(&out, Table({"RANK", "WORKER", "PROCESS", "PHASE", "FOR", "STEP", "NOTE"}, rows));
  for (const v1::RankDebug& r : debug.ranks()) {
    const v1::RankRecord& rec = r.record();
    if (!r.has_record() || (rec.recent().empty() && rec.stacks().empty())) continue;
    absl::StrAppend(&out, "\nRank ", r.rank(), " (", r.worker_id(), "), newest last:\n");
    const int first = std::max(0, rec.recent_size() - kShownEntries);
    for (int i = first; i < rec.recent_size(); ++i) {
      absl::StrAppend(&out, "  ", EntryLine(rec.recent(i), rec.read_unix_ms()), "\n");
    }
    if (!rec.stacks().empty()) {
      absl::StrAppend(&out, "  Stacks:\n");
      for (absl::string_view line : absl::StrSplit(rec.stacks(), '\n', absl::SkipEmpty())) {
        absl::StrAppend(&out, "    ", line, "\n");
      }
    }
  }
  absl::StrAppend(&out, "\nDiagnosis: ",
                  debug.diagnosis().empty() ? "no rank holds the others up" : debug.diagnosis(),
                  "\n");
  return out;
}

}  // namespace trainyard::cli
