#ifndef TRAINYARD_SERVER_JOBS_JOB_MANAGER_INTERNAL_H_
#define TRAINYARD_SERVER_JOBS_JOB_MANAGER_INTERNAL_H_

// Constants and small helpers shared by the files of the JobManager (job_manager.cc, the front;
// job_manager_jobs.cc, submissions and the jobs' calls; job_manager_queues.cc, queues;
// job_manager_agents.cc, what agents report; job_manager_reports.cc, what trainers report;
// job_manager_upkeep.cc, the tick). Not for use elsewhere.

#include <algorithm>
#include <cstdint>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "common/exit_codes.h"
#include "common/spec/job_spec.h"
#include "trainyard/v1/job.pb.h"

namespace trainyard {
namespace job_manager_internal {

inline constexpr int kDefaultPageSize = 100;
// How long a stopping trainer of an ended job may hold its capacity without its agent reporting
// it gone: above the agents' default stop grace period, bounded for tasks an agent never saw.
inline constexpr absl::Duration kStoppingHold = absl::Seconds(60);
inline constexpr int kMaxPageSize = 1000;
// The most finished jobs one ListJobs filtered by name or queue reads from the store.
inline constexpr int kMaxListScan = 5000;
// Between passes triggered by changes, the scheduler looks at the whole queue at least this
// often (everything time-driven, such as backoffs and holds, is also woken up on time).
inline constexpr absl::Duration kFullSchedulePeriod = absl::Seconds(10);
inline constexpr int64_t kLogChunkBytes = 64 * 1024;
inline constexpr char kPageTokenPrefix[] = "before:";
// How often blocked streams look at client cancellation and shutdown.
inline constexpr absl::Duration kStreamPoll = absl::Milliseconds(250);
// After a job ends, how long a followed log waits for the last pieces the agents ship.
inline constexpr absl::Duration kFinalLogGrace = absl::Milliseconds(500);

inline bool TaskSucceeded(const v1::TaskInfo& t) {
  return t.state() == v1::TASK_EXITED && t.exit_code() == 0 && t.signal() == 0;
}

inline std::string TaskId(absl::string_view job_id, int64_t generation, int rank) {
  return absl::StrCat(job_id, ".g", generation, ".r", rank);
}

inline std::string ShardTaskId(absl::string_view job_id, int64_t generation, int shard) {
  return absl::StrCat(job_id, ".g", generation, ".s", shard);
}

inline bool IsShard(const v1::TaskInfo& t) { return t.role() == v1::TASK_ROLE_SHARD; }

// "rank 2" or "shard 0", as messages name a task.
inline std::string TaskName(const v1::TaskInfo& t) {
  return IsShard(t) ? absl::StrCat("shard ", t.shard()) : absl::StrCat("rank ", t.rank());
}

// Why a task's end fails its job: "rank 0 exited with code 2: data.train: no files match ...".
inline std::string TaskFailureReason(const v1::TaskInfo& t) {
  std::string reason;
  switch (t.state()) {
    case v1::TASK_FAILED_TO_START:
      reason = absl::StrCat(TaskName(t), " failed to start");
      break;
    case v1::TASK_STOPPED:
      reason = absl::StrCat(TaskName(t), " stopped unexpectedly");
      break;
    default:
      reason = absl::StrCat(TaskName(t), " ", DescribeExit(t.exit_code(), t.signal()));
  }
  if (!t.message().empty()) absl::StrAppend(&reason, ": ", t.message());
  return reason;
}

inline void RankRange(const v1::JobSpec& spec, int& min_ranks, int& max_ranks) {
  if (spec.strategy() == v1::SINGLE || spec.strategy() == v1::STRATEGY_UNSPECIFIED) {
    min_ranks = max_ranks = 1;
    return;
  }
  min_ranks = std::max(spec.workers().min(), 1);
  max_ranks = std::max(spec.workers().max(), min_ranks);
}

inline absl::Time LastEventTime(const v1::Job& job, v1::JobState to) {
  for (int i = job.events_size() - 1; i >= 0; --i) {
    if (job.events(i).to() == to && job.events(i).from() != to) {
      return absl::FromUnixMillis(job.events(i).time_unix_ms());
    }
  }
  return absl::InfinitePast();
}

inline int ShardCount(const v1::JobSpec& spec) {
  return spec.strategy() == v1::PARAMETER_SERVER ? std::max(spec.parameter_servers().shards(), 0)
                                                 : 0;
}

// How long what is left of a job's steps takes at the speed it last ran, in milliseconds (0:
// unknown).
inline int64_t RemainingRunMs(const v1::Job& job) {
  const v1::JobProgress& p = job.progress();
  const int64_t left = p.total_steps() - p.step();
  if (p.samples_per_second() <= 0 || left <= 0 || job.spec().batch_size() <= 0) return 0;
  return static_cast<int64_t>(1000.0 * static_cast<double>(left) * job.spec().batch_size() /
                              p.samples_per_second());
}

// How much longer a job runs at most, in milliseconds from `now_ms` (0: unknown): what its
// max_runtime leaves (counted from its first start, restarts included) or what is left of its
// steps at the speed it last ran, whichever ends first. What the scheduler's reservation and
// backfill count on.
inline int64_t RunBoundMs(const v1::Job& job, int64_t now_ms) {
  int64_t bound = 0;
  if (const int64_t limit_ms = job.spec().max_runtime_seconds() * 1000; limit_ms > 0) {
    const int64_t started = job.started_unix_ms();
    bound = std::max<int64_t>(started > 0 ? started + limit_ms - now_ms : limit_ms, 1);
  }
  if (const int64_t left = RemainingRunMs(job); left > 0) {
    bound = bound > 0 ? std::min(bound, left) : left;
  }
  return bound;
}

// Ranks (not shards) of one attempt.
inline int RanksOf(const v1::Job& job, int64_t generation) {
  int ranks = 0;
  for (const v1::TaskInfo& t : job.tasks()) ranks += t.generation() == generation && !IsShard(t);
  return ranks;
}

// Whether `segment` has the form of a job id: NAME-N (a submission), or NAME-sN.tK.rR (rung R of
// trial K of search NAME-sN, searches/search_manager.cc). What the checks of a spec's paths look
// up in the job table: other segments name no job, and cost no read of the store.
inline bool IsJobIdForm(absl::string_view segment) {
  auto number = [](absl::string_view& s, absl::string_view prefix) {
    if (!absl::ConsumePrefix(&s, prefix)) return false;
    size_t digits = 0;
    while (digits < s.size() && absl::ascii_isdigit(static_cast<unsigned char>(s[digits]))) {
      ++digits;
    }
    s.remove_prefix(digits);
    return digits > 0;
  };
  const size_t dash = segment.rfind('-');
  if (dash == absl::string_view::npos || !IsValidName(segment.substr(0, dash))) return false;
  if (absl::string_view rest = segment.substr(dash); number(rest, "-")) return rest.empty();
  absl::string_view rest = segment.substr(dash);
  return number(rest, "-s") && number(rest, ".t") && number(rest, ".r") && rest.empty();
}

}  // namespace job_manager_internal
}  // namespace trainyard

#endif  // TRAINYARD_SERVER_JOBS_JOB_MANAGER_INTERNAL_H_
