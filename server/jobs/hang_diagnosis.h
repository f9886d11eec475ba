#ifndef TRAINYARD_SERVER_JOBS_HANG_DIAGNOSIS_H_
#define TRAINYARD_SERVER_JOBS_HANG_DIAGNOSIS_H_

// Which rank held up the others when an attempt hung or a collective timed out: a pure function
// of the ranks' flight records (common/flight_record.h, read by their agents), which the
// JobManager records on the restart, in an event, and `trainyard debug` prints.

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "trainyard/v1/job.pb.h"

namespace trainyard {

struct RankView {
  int rank = 0;
  std::string worker_id;
  const trainyard::v1::RankRecord* record = nullptr;  // null: none came (not owned)
};

// In order, the first that applies:
//  - a rank that never entered the newest collective others entered: "rank 1 (worker-b) never
//    entered all-reduce #1532: it has been in data loading for 61 s";
//  - a rank that never sent the message another waits for: "rank 0 (worker-a) never sent message
//    #7 to rank 1: it has been in the forward pass for 40 s";
//  - a rank whose process was stopped (SIGSTOP, a debugger);
//  - every rank in the same collective, none finished it (the network, or a rank's
//    communication thread);
//  - with `stalled` (no step for stall_timeout): the rank longest in its phase.
// How long a rank has been in its phase is counted to when its record was read. Empty when the
// records name nothing (none came, or they show no difference).
// `held`: what counts as holding the others up. A rank behind, a message not sent or a collective
// none finished is named only once a rank has waited on it that long when its record was read (a
// healthy job read at one moment shows ranks milliseconds apart); a stopped process always is.
std::string DiagnoseHang(const std::vector<RankView>& ranks, bool stalled,
                         absl::Duration held = absl::ZeroDuration());

}  // namespace trainyard

#endif  // TRAINYARD_SERVER_JOBS_HANG_DIAGNOSIS_H_
