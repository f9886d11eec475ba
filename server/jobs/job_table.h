#ifndef TRAINYARD_SERVER_JOBS_JOB_TABLE_H_
#define TRAINYARD_SERVER_JOBS_JOB_TABLE_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/node_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/jobs/metric_history.h"
#include "server/store/job_store.h"
#include "trainyard/v1/job.pb.h"

namespace trainyard {

// A job as the coordinator holds it in memory.
struct JobEntry {
  int64_t seq = 0;
  trainyard::v1::Job job;  // with its kept events and the tasks of every generation
  uint64_t version = 0;    // bumped on every visible change, for watchers
  std::vector<StoredCheckpoint> checkpoints;  // by step
  // Progress reports: counted when queued for writing, applied in that order once written.
  uint64_t progress_reports = 0;
  uint64_t progress_applied = 0;
  trainyard::v1::JobProgress queued_progress;  // the latest queued
  MetricHistory history;                       // the keys of its metric history, as queued
  absl::Time ended = absl::InfinitePast();     // when it reached a final state (in memory)
  // Hang detection: the highest step reported by the current attempt and when it changed (or
  // the attempt started running, or the coordinator started).
  int64_t last_step_seen = -1;
  absl::Time last_step_change = absl::InfinitePast();
  absl::Time restarting_since = absl::InfinitePast();  // when it entered RESTARTING
  // When the current attempt was placed (or the coordinator started), for start_timeout.
  absl::Time attempt_placed = absl::InfinitePast();
  // "worker w2 (SIGTERM)" once a preemption notice touched the current attempt (in memory).
  std::string preemption_notice;
  // Per rank, the flight record its agent sent when the rank ended (in memory only), for a hang's
  // diagnosis once every rank of the attempt has ended.
  struct EndedRank {
    int64_t generation = 0;
    std::string worker_id;
    trainyard::v1::RankRecord record;
  };
  std::map<int, EndedRank> ended_ranks;
};

// The coordinator's jobs in memory and the indexes that keep its work proportional to what
// changed rather than to how many jobs it holds: the queue in order, the jobs with an attempt, the
// final jobs still held, the active tasks of each worker. Every change to a job's record goes
// through Reindex, which is what keeps the indexes true. It holds the jobs not finished and the
// final jobs something still needs (trainers stopping, a job resuming from their checkpoints);
// other final jobs are evicted to the store, and only counted here. Not thread-safe: the
// JobManager holds it under its lock.
class JobTable {
 public:
  // Queue order: higher priority first, then submission order.
  using QueueKey = std::pair<int, int64_t>;  // (-priority, seq)
  static QueueKey KeyOf(const JobEntry& entry) { return {-entry.job.spec().priority(), entry.seq}; }

  // A task of the job's current attempt, not ended, while the job is SCHEDULED or RUNNING: what
  // its worker should run.
  static bool IsActiveTask(const trainyard::v1::Job& job, const trainyard::v1::TaskInfo& task);

  // Adds a job loaded from the store or just submitted, indexed. Its id and seq must be new.
  JobEntry& Add(int64_t seq, trainyard::v1::Job job);

  // Brings the indexes from `before` to entry.job (after the caller changed it). Returns the
  // workers whose set of active tasks changed.
  std::set<std::string> Reindex(JobEntry& entry, const trainyard::v1::Job& before);

  // Forgets a job and everything the indexes hold of it.
  void Remove(absl::string_view id);

  // Takes a final job out of memory (it is in the store): it still counts in counts(). No-op for
  // a job not final.
  void Evict(absl::string_view id);
  // Brings back a final job that was evicted (read from the store): not counted again, and not
  // stopping.
  JobEntry& Readmit(int64_t seq, trainyard::v1::Job job);
  // Counts `n` more final jobs in `state` that are in the store only (negative: removed from it).
  void CountStored(trainyard::v1::JobState state, int n);

  JobEntry* Find(absl::string_view id);
  const JobEntry* Find(absl::string_view id) const;
  JobEntry* FindBySeq(int64_t seq);
  const JobEntry* FindBySeq(int64_t seq) const;
  // The job a task id belongs to; nullptr when unknown.
  JobEntry* FindByTask(absl::string_view task_id);
  const JobEntry* FindByTask(absl::string_view task_id) const;

  // The active tasks on `worker_id`, with their jobs.
  std::vector<std::pair<const JobEntry*, const trainyard::v1::TaskInfo*>> ActiveTasksOn(
      absl::string_view worker_id) const;

  size_t size() const { return jobs_.size(); }
  // Jobs in each state, evicted ones included.
  const std::map<trainyard::v1::JobState, int>& counts() const { return counts_; }
  // Every job in memory by submission order (seq -> id).
  const std::map<int64_t, std::string>& by_seq() const { return by_seq_; }
  // Non-final jobs.
  const std::set<int64_t>& active() const { return active_; }
  // Non-final jobs that have had an attempt (generation > 0): the only ones that hold capacity,
  // run tasks, report progress or can stall.
  const std::set<int64_t>& attempts() const { return attempts_; }
  // Final jobs in memory by (finished_unix_ms, seq).
  const std::set<std::pair<int64_t, int64_t>>& finished() const { return finished_; }
  // Final jobs whose trainers may still be stopping (capacity not yet free): added when a job
  // becomes final, taken out by the caller with StoppedHolding.
  const std::set<int64_t>& stopping() const { return stopping_; }
  void StoppedHolding(int64_t seq) { stopping_.erase(seq); }

  // Whether a job not finished resumes from job `id`'s checkpoints (checkpoint.resume_from):
  // such a job is not removed, whatever its age.
  bool IsResumedFrom(absl::string_view id) const { return resumed_from_.count(id) > 0; }

  // PENDING jobs in queue order that the scheduler looks at, and those set aside (Park)
  // because they cannot run on the cluster as it is, until UnparkAll.
  const std::map<QueueKey, JobEntry*>& pending() const { return pending_; }
  void Park(const QueueKey& key);
  void UnparkAll();

 private:
  // Takes a job out of memory and the indexes, counts aside.
  void Erase(absl::string_view id);

  // Node-based: entries stay where they are, so the indexes may point at them.
  absl::node_hash_map<std::string, JobEntry> jobs_;
  std::map<int64_t, std::string> by_seq_;
  std::map<trainyard::v1::JobState, int> counts_;
  std::set<int64_t> active_;
  std::set<int64_t> attempts_;
  std::set<std::pair<int64_t, int64_t>> finished_;
  std::set<int64_t> stopping_;
  std::map<QueueKey, JobEntry*> pending_;
  std::map<QueueKey, JobEntry*> parked_;
  absl::flat_hash_map<std::string, std::string> job_of_task_;
  // checkpoint.resume_from of jobs not finished: how many name each job.
  absl::flat_hash_map<std::string, int> resumed_from_;
  absl::flat_hash_map<std::string, std::set<std::string>> active_tasks_by_worker_;
};

}  // namespace trainyard

#endif  // TRAINYARD_SERVER_JOBS_JOB_TABLE_H_
