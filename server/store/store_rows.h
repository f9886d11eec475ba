#ifndef TRAINYARD_SERVER_STORE_STORE_ROWS_H_
#define TRAINYARD_SERVER_STORE_STORE_ROWS_H_

// What the SQL job stores (SQLite, PostgreSQL) share: the state lists their queries select by and
// the decoding of their task and event rows. Internal to the *_job_store*.cc files.

#include <cstdint>
#include <set>
#include <vector>

#include "server/lifecycle/job_state.h"
#include "trainyard/v1/job.pb.h"

namespace trainyard::store_rows {

// States of jobs not finished, and of tasks not ended, as SQL lists (from the proto's numbers).
inline constexpr char kActiveJobStates[] = "(1, 2, 3, 7)";  // PENDING SCHEDULED RUNNING RESTARTING
inline constexpr char kFinalJobStates[] = "(4, 5, 6)";      // SUCCEEDED FAILED CANCELLED
inline constexpr char kLiveTaskStates[] = "(0, 1, 2)";      // unspecified, STARTING, RUNNING
static_assert(v1::PENDING == 1 && v1::SCHEDULED == 2 && v1::RUNNING == 3 && v1::RESTARTING == 7);
static_assert(v1::SUCCEEDED == 4 && v1::FAILED == 5 && v1::CANCELLED == 6);
static_assert(v1::TASK_STARTING == 1 && v1::TASK_RUNNING == 2);

inline constexpr char kTaskColumns[] =
    "t.task_id, t.generation, t.rank, t.worker_id, t.state, t.exit_code, t.signal, t.message, "
    "t.role, t.shard, t.stop_deadline_ms, t.out_of_memory, t.memory_limit, t.memory_peak";
inline constexpr char kTaskOrder[] = "t.generation, t.role, t.rank, t.shard";
inline constexpr char kEventColumns[] = "time_ms, from_state, to_state, reason";

// The final states a listing of finished jobs asks for: those of `states` that are final, or all
// three when `states` is empty.
inline std::set<int> FinalStatesWanted(const std::vector<v1::JobState>& states) {
  if (states.empty()) return {v1::SUCCEEDED, v1::FAILED, v1::CANCELLED};
  std::set<int> wanted;
  for (v1::JobState state : states) {
    if (IsFinalJobState(state)) wanted.insert(state);
  }
  return wanted;
}

// Reads the kTaskColumns of a row, from column `first` on. `Row` has Int(col) and Text(col).
template <typename Row>
void ReadTask(Row& row, int first, v1::TaskInfo* t) {
  t->set_task_id(row.Text(first));
  t->set_generation(row.Int(first + 1));
  t->set_rank(static_cast<int32_t>(row.Int(first + 2)));
  t->set_worker_id(row.Text(first + 3));
  t->set_state(static_cast<v1::TaskState>(row.Int(first + 4)));
  t->set_exit_code(static_cast<int32_t>(row.Int(first + 5)));
  t->set_signal(static_cast<int32_t>(row.Int(first + 6)));
  t->set_message(row.Text(first + 7));
  t->set_role(static_cast<v1::TaskRole>(row.Int(first + 8)));
  t->set_shard(static_cast<int32_t>(row.Int(first + 9)));
  t->set_stop_deadline_unix_ms(row.Int(first + 10));
  t->set_out_of_memory(row.Int(first + 11) != 0);
  t->set_memory_limit_bytes(row.Int(first + 12));
  t->set_memory_peak_bytes(row.Int(first + 13));
}

// Reads the kEventColumns of a row, from column `first` on.
template <typename Row>
void ReadEvent(Row& row, int first, v1::JobEvent* e) {
  e->set_time_unix_ms(row.Int(first));
  e->set_from(static_cast<v1::JobState>(row.Int(first + 1)));
  e->set_to(static_cast<v1::JobState>(row.Int(first + 2)));
  e->set_reason(row.Text(first + 3));
}

}  // namespace trainyard::store_rows

#endif  // TRAINYARD_SERVER_STORE_STORE_ROWS_H_
