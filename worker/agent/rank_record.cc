#include "worker/agent/rank_record.h"

#include <fstream>
#include <sstream>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/flight_record.h"

namespace trainyard {

std::string ProcessStateOf(int64_t pid) {
  if (pid <= 0) return "";
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  if (!std::getline(in, line)) return "exited";
  // "pid (comm) S ...": the command may hold spaces and parentheses, the state follows the last.
  const size_t close = line.rfind(')');
  if (close == std::string::npos || close + 2 >= line.size()) return "unknown";
  switch (line[close + 2]) {
    case 'R':
      return "running";
    case 'S':
      return "sleeping";
    case 'D':
      return "disk sleep";
    case 'T':
    case 't':
      return "stopped";
    case 'Z':
      return "zombie";
    case 'X':
      return "exited";
    default:
      return "unknown";
  }
}

std::optional<v1::RankRecord> ReadRankRecord(const std::string& task_dir, int64_t pid,
                                             const Clock& clock) {
  const absl::StatusOr<FlightRecordSnapshot> snapshot =
      ReadFlightRecord(absl::StrCat(task_dir, "/", kFlightRecordFile));
  if (absl::IsNotFound(snapshot.status())) return std::nullopt;
  v1::RankRecord record;
  record.set_read_unix_ms(absl::ToUnixMillis(clock.Now()));
  record.set_process_state(pid > 0 ? ProcessStateOf(pid) : "exited");
  if (!snapshot.ok()) {
    record.set_error(std::string(snapshot.status().message()));
    return record;
  }
  record.set_phase(RankPhaseName(snapshot->phase));
  record.set_phase_code(static_cast<int32_t>(snapshot->phase));
  record.set_phase_since_unix_ms(snapshot->phase_since_unix_ms);
  record.set_step(snapshot->step);
  for (const CollectiveEntry& e : snapshot->recent) {
    v1::CollectiveRecord* out = record.add_recent();
    out->set_seq(e.seq);
    out->set_kind(CollectiveKindName(e.kind));
    out->set_peer(e.peer);
    out->set_bytes(e.bytes);
    out->set_started_unix_ms(e.started_unix_ms);
    out->set_ended_unix_ms(e.ended_unix_ms);
    out->set_failed(e.failed);
  }
  return record;
}

}  // namespace trainyard
