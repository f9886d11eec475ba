#ifndef TRAINYARD_SERVER_JOBS_JOB_MANAGER_H_
#define TRAINYARD_SERVER_JOBS_JOB_MANAGER_H_

// Room jobs/: the job manager, the coordinator's logic: submissions, the job table, placement
// through scheduling/, tasks and workers (leases, limits), checkpoints and their retention,
// restarts, rendezvous. It may call store/, scheduling/, auth/ (who may do what) and
// lifecycle/; it holds no gRPC types (api/ adapts it).

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/storage/object_store.h"
#include "server/auth/auth.h"
#include "server/jobs/capacity.h"
#include "server/jobs/debug_asks.h"
#include "server/jobs/job_table.h"
#include "server/jobs/metric_history.h"
#include "server/jobs/metrics_sink.h"
#include "server/jobs/rendezvous.h"
#include "server/jobs/worker_limits.h"
#include "server/jobs/worker_registry.h"
#include "server/scheduling/scheduler.h"
#include "server/store/group_commit.h"
#include "server/store/job_store.h"
#include "server/store/log_store.h"
#include "trainyard/v1/agent_service.pb.h"
#include "trainyard/v1/job.pb.h"
#include "trainyard/v1/job_service.pb.h"

namespace trainyard {

struct JobManagerOptions {
  // Base URI for jobs whose spec sets no checkpoint.uri; a job's checkpoints go to {base}/{id}.
  std::string checkpoint_root = "file:///tmp/trainyard-checkpoints";
  // A worker whose agent holds no lease stream (an older agent) is LOST this long after its last
  // Sync; one whose lease stream closed, worker_stream_grace after (unless the agent opens a new
  // one); and when more than half lose their lease at once, none is LOST before mass_loss_hold
  // (LeasePolicy, worker_registry.h).
  absl::Duration worker_timeout = absl::Seconds(10);
  absl::Duration worker_stream_grace = absl::Milliseconds(500);
  absl::Duration mass_loss_hold = absl::Minutes(5);
  // Agents that beat do so every third of this while they run tasks; one silent this long is
  // treated as its stream broken (LeasePolicy::beat_timeout). Zero: no beats asked for.
  absl::Duration lease_beat_timeout = absl::Milliseconds(1500);
  int max_active_jobs = 100000;           // non-final jobs; beyond: RESOURCE_EXHAUSTED
  int64_t max_spec_yaml_bytes = 1 << 20;  // beyond: INVALID_ARGUMENT
  absl::Duration max_sync_wait = absl::Seconds(60);
  absl::Duration max_rendezvous_wait = absl::Seconds(30);
  // Restarts back off exponentially with jitter: the n-th restart in a row of attempts that
  // made no step progress waits uniformly in [d/2, d], d = min(restart_backoff * 2^(n-1),
  // restart_backoff_max); an attempt that got further than its start restarts at once
  // (RestartBackoff). Zero: restart at once.
  absl::Duration restart_backoff = absl::Seconds(1);
  absl::Duration restart_backoff_max = absl::Seconds(60);
  // How long ranks of an ended attempt may take to stop before the job restarts anyway (their
  // agents were told to stop them; a lost worker's ranks count as stopped at once).
  absl::Duration restart_stop_hold = absl::Seconds(60);
  // Ranks of an attempt still STARTING this long after it was placed end the attempt as an
  // infrastructure error (restart.max_infrastructure_errors).
  absl::Duration start_timeout = absl::Minutes(10);
  // Finished jobs are removed this long after they finished, with their events, tasks, logs and
  // checkpoint rows (not the checkpoints' objects); InfiniteDuration keeps them.
  absl::Duration job_retention = absl::Hours(24 * 7);
  // LOST workers are forgotten this long after they were last seen.
  absl::Duration lost_worker_retention = absl::Hours(24);
  // A job keeps at most this many events (its first ten and the latest; at least 20) and restart
  // records (the latest); what is dropped is counted on the job.
  int max_job_events = 1000;
  int max_job_restart_records = 100;
  // Told about submissions, transitions, progress, commits and lost workers (metrics); may be
  // null. Not owned; must outlive the manager.
  JobEventSink* event_sink = nullptr;
  // Folders under which a spec's local paths (data.train, model.torchscript, distill.teacher,
  // checkpoint.uri) must lie (CheckLocalPaths); nullopt: anywhere.
  std::optional<std::vector<std::string>> allowed_local_paths;
  // Reads s3:// models at submission, to learn the operators they need (ReadModelNeeds); null:
  // only models on this machine's disk are read. Not owned; must outlive the manager.
  const ObjectStoreResolver* model_stores = nullptr;
  // What each agent may claim for its worker (RegisterWorker): more is refused.
  WorkerLimits worker_limits;
  // Signs each task's credential (Task.credential, common/rpc/credentials.h); empty: tasks carry
  // none.
  std::string task_credential_key;
  // DeleteJob of a job that has just ended waits this long for its trainers to be seen gone
  // before it refuses: a `delete` right after a `cancel` then just works.
  absl::Duration delete_stop_wait = absl::Seconds(30);
  // Backfill, fair share between queues and preemption (scheduler.h); each can be turned off.
  SchedPolicy scheduler_policy;
  // A job the scheduler preempts for another must have saved and stopped within this long; its
  // ranks save at the next step they agree on, as for a preemption notice.
  absl::Duration preemption_grace = absl::Seconds(60);
  // A job the scheduler preempted is not preempted again until its next attempt has run this
  // long (SchedRunning::protected_until_ms).
  absl::Duration preemption_exempt = absl::Minutes(10);
  // What each job's metric history keeps (metric_history.h).
  MetricHistoryBound metric_history;
};

// Which tasks' logs StreamLogs sends.
struct LogSelection {
  int rank = -1;             // -1: every rank and every shard
  std::optional<int> shard;  // set: only this parameter-server shard (rank is ignored)
};

// How a job is submitted on behalf of a hyperparameter search (SearchManager).
struct SubmitOptions {
  // The job's id instead of "{name}-{seq}": submitting the same id again is ALREADY_EXISTS, so a
  // search that retries a submission after a restart never runs a trial twice.
  std::string id;
  trainyard::v1::TrialLink trial;  // Job.trial
  bool validate_only = false;      // every check, nothing written
  // Set: replaces the spec's checkpoint.resume_from (SubmitJobRequest.resume_from).
  std::string resume_from;
};

// ListJobs's filters; each empty one lets every job through.
struct JobFilter {
  std::string owner;
  std::string name_contains;  // case-insensitive
  std::string queue;          // the spec's queue; "default" also matches jobs that name none
  bool Matches(const trainyard::v1::Job& job) const;
  bool by_content() const { return !name_contains.empty() || !queue.empty(); }
};

struct ListJobsResult {
  std::vector<trainyard::v1::Job> jobs;  // newest first, without events
  std::string next_page_token;           // empty on the last page
};

// The coordinator's logic: jobs and their state machine, the scheduler loop, workers and their
// desired state, progress, checkpoints and logs. No gRPC types: the services are thin adapters.
//
// Every state change is written to the JobStore in one transaction before it becomes visible in
// memory; when the write fails the call returns the store's error and nothing changes.
// Thread-safe: one mutex guards all state; the blocking calls (Sync, WatchJob, StreamLogs) wait
// on condition variables without holding it. Time for leases, runtimes and events comes from the
// injected clock; only the deadlines of those blocking waits use real time.
class JobManager {
 public:
  // Loads everything from `store`. `clock` must outlive the manager.
  static absl::StatusOr<std::unique_ptr<JobManager>> Create(const Clock& clock,
                                                            std::unique_ptr<JobStore> store,
                                                            std::unique_ptr<LogStore> logs,
                                                            JobManagerOptions options);
  ~JobManager();

  // ---- JobService ----

  // Parses, validates and queues a job (PENDING, event "submitted"). INVALID_ARGUMENT with the
  // parser's message for a bad spec (nothing stored), for a spec_yaml over the size limit, or for
  // a checkpoint.resume_from naming no job; RESOURCE_EXHAUSTED when too many jobs are active.
  // With `by`, the job is theirs (Job.owner, event "submitted by NAME") and a resume_from job
  // must be theirs too (PERMISSION_DENIED otherwise); without, it has no owner.
  absl::StatusOr<trainyard::v1::Job> SubmitJobYaml(absl::string_view spec_yaml,
                                                   const Principal* by = nullptr,
                                                   const SubmitOptions& options = {});
  // Same for a spec message; defaults are applied first. With options.id, ALREADY_EXISTS when a
  // job has that id (in memory or in the store); with validate_only, the job that would be
  // submitted, written nowhere.
  absl::StatusOr<trainyard::v1::Job> SubmitJob(trainyard::v1::JobSpec spec,
                                               const Principal* by = nullptr,
                                               const SubmitOptions& options = {});

  // Who owns a job (empty: nobody). NOT_FOUND for an unknown id.
  absl::StatusOr<std::string> JobOwner(absl::string_view id) const;

  // NOT_FOUND for an unknown id. With events and tasks of every attempt.
  absl::StatusOr<trainyard::v1::Job> GetJob(absl::string_view id) const;

  // Newest first, filtered by `states` (empty = all) and `filter`. page_size 0 = 100, capped at
  // 1000. INVALID_ARGUMENT for a page token this manager did not hand out. A page filtered by
  // name or queue reads at most kMaxListScan finished jobs from the store; it may then hold fewer
  // jobs than page_size, with a token to read on.
  absl::StatusOr<ListJobsResult> ListJobs(const std::vector<trainyard::v1::JobState>& states,
                                          int page_size, absl::string_view page_token,
                                          const JobFilter& filter = {}) const;

  // Moves a non-final job to CANCELLED; its tasks leave their workers' desired state, so agents
  // stop them. NOT_FOUND for an unknown job, FAILED_PRECONDITION for a final one. The event
  // names `by` when given.
  absl::StatusOr<trainyard::v1::Job> CancelJob(absl::string_view id, absl::string_view reason,
                                               absl::string_view by = "");

  // Deletes a finished job now, as retention would: its record, events, tasks, logs, checkpoint
  // records and rendezvous (not its checkpoint objects). With `validate_only`, only says whether
  // it could. A job whose trainers may still be stopping is waited for (options'
  // delete_stop_wait). FAILED_PRECONDITION for a job not finished, one whose trainers are still
  // stopping after that, or one a job not finished resumes from; NOT_FOUND for an unknown job.
  absl::Status DeleteJob(absl::string_view id, bool validate_only);

  // Calls `sink` with the job now and after every change of state, reason or progress, and
  // returns OK after sending a final state. Stops early with OK when `sink` returns false,
  // CANCELLED when `cancelled()` turns true (checked at least twice a second), UNAVAILABLE on
  // Shutdown(). NOT_FOUND for an unknown job. Blocks; call from any thread.
  absl::Status WatchJob(absl::string_view id,
                        const std::function<bool(const trainyard::v1::Job&)>& sink,
                        const std::function<bool()>& cancelled);

  // Sends the logs of the selected tasks of every attempt, by generation with ranks before
  // shards, as (task, bytes) pieces. With `follow` keeps sending what arrives until the job is
  // final and no more data comes. Same early-stop rules as WatchJob. NOT_FOUND for an unknown
  // job, INVALID_ARGUMENT for rank < -1 or a negative shard.
  absl::Status StreamLogs(
      absl::string_view id, LogSelection selection, bool follow,
      const std::function<bool(const trainyard::v1::TaskInfo& task, absl::string_view data)>& sink,
      const std::function<bool()>& cancelled);

  // Every worker with its capacity in use and its active tasks, by id.
  std::vector<trainyard::v1::Worker> ListWorkers() const;
  // An admin returns GPU `index` of a worker that its agent took out of service: the agent is
  // asked (SyncResponse.return_gpus, for kGpuReturnFor) to check it again and to take it back
  // if the check passes. NOT_FOUND for an unknown worker, FAILED_PRECONDITION for a GPU in
  // service, a LOST worker, or an index it does not have.
  absl::StatusOr<trainyard::v1::Worker> ReturnGpu(absl::string_view worker_id, int index);
  static constexpr absl::Duration kGpuReturnFor = absl::Minutes(2);

  // Committed, not retired checkpoints of a job, newest first. NOT_FOUND for an unknown job.
  absl::StatusOr<std::vector<trainyard::v1::Checkpoint>> ListCheckpoints(
      absl::string_view job_id) const;

  // ---- Queues (AdminService, JobService.ListQueues) ----

  // Creates a queue; `by` is recorded. INVALID_ARGUMENT for a bad name, quota, weight or user
  // list; ALREADY_EXISTS for a queue of that name ("default" may be created once, to give the
  // default queue a quota of its own); RESOURCE_EXHAUSTED beyond 1000 queues.
  absl::StatusOr<trainyard::v1::Queue> CreateQueue(trainyard::v1::Queue queue,
                                                   absl::string_view by);
  // Replaces a queue's quotas, weight and users. NOT_FOUND for an unknown queue. Jobs already
  // admitted stay; what they hold beyond a lowered quota is borrowed from then on.
  absl::StatusOr<trainyard::v1::Queue> UpdateQueue(trainyard::v1::Queue queue,
                                                   absl::string_view by);
  // NOT_FOUND for an unknown queue; FAILED_PRECONDITION while jobs of it are not finished.
  absl::Status DeleteQueue(absl::string_view name);
  // Every queue by name, the default one included, each with its status.
  std::vector<trainyard::v1::Queue> ListQueues() const;

  // ---- AgentService ----

  // Adds or replaces the worker named request.name() (READY) and reconciles the tasks it
  // reports. INVALID_ARGUMENT for a missing name or negative capacity.
  absl::StatusOr<trainyard::v1::RegisterWorkerResponse> RegisterWorker(
      const trainyard::v1::RegisterWorkerRequest& request);

  // Long poll: renews the lease, applies the reported task statuses, then answers as soon as the
  // worker's desired-state version differs from known_version, or after wait_ms (capped at
  // max_sync_wait). An unknown or LOST worker, or one not registered since this coordinator
  // started, gets reregister=true. Blocks.
  absl::StatusOr<trainyard::v1::SyncResponse> Sync(const trainyard::v1::SyncRequest& request);

  // The agent's lease stream (HoldLease) for `worker_id` opened: the worker's lease holds until
  // CloseLease. With `beats`, its agent beats while it runs tasks (LeaseBeat), every
  // BeatInterval(); `end` ends the stream, for when it goes silent (called under the manager's
  // lock: it must not block; never after CloseLease). Returns the ticket to beat and close it
  // with; NOT_FOUND or FAILED_PRECONDITION when the worker must register again.
  absl::StatusOr<LeaseTicket> OpenLease(absl::string_view worker_id, bool beats = false,
                                        std::function<void()> end = nullptr);
  void LeaseBeat(absl::string_view worker_id, const LeaseTicket& ticket);
  // The stream ended (the agent closed it, its transport broke: a killed, cut off or frozen
  // host, or `end` was called); see LeasePolicy::stream_grace.
  void CloseLease(absl::string_view worker_id, const LeaseTicket& ticket);
  // How often agents that beat are asked to; zero: never.
  absl::Duration BeatInterval() const { return options_.lease_beat_timeout / 3; }

  // Applies one task status. Idempotent. NOT_FOUND for an unknown task, FAILED_PRECONDITION when
  // the task belongs to another worker.
  absl::Status ReportTaskStatus(absl::string_view worker_id,
                                const trainyard::v1::TaskStatus& status);

  // Appends log data of a known task (LogStore::Append). NOT_FOUND for an unknown task.
  absl::StatusOr<int64_t> ShipLogs(absl::string_view worker_id, absl::string_view task_id,
                                   int64_t offset, absl::string_view data);

  // Fenced by generation: FAILED_PRECONDITION "stale generation 1, current 2" for an older
  // attempt (or a newer one than exists, or a final job); NOT_FOUND for an unknown job. The
  // progress is written to the store before it is shown or the call returns (reports of many
  // jobs share a transaction); rank 0's reports win over other ranks' older steps.
  absl::Status ReportProgress(absl::string_view job_id, int64_t generation, int rank,
                              const trainyard::v1::JobProgress& progress);
  // The reports that speak for a job (those shown as its progress) are also its metric history,
  // written with them and thinned as options.metric_history says. This reads it from the store:
  // the points taken after `after_unix_ms`, oldest first.
  absl::StatusOr<std::vector<trainyard::v1::MetricPoint>> MetricHistoryOf(
      absl::string_view job_id, int64_t after_unix_ms) const;

  // Fenced like ReportProgress, except that the attempt a cancel stopped may still commit: its
  // rank 0 saves the step it stopped at, and a job submitted with --resume-from this one starts
  // there. Records the checkpoint (its folder derived from the job's checkpoint URI and the step)
  // and the job's committed step in one transaction, retires committed checkpoints beyond the
  // spec's keep_last (a spec without one keeps all) and returns their URIs. Committing the same
  // step again changes nothing and returns the URIs that commit retired. INVALID_ARGUMENT for a
  // negative step.
  absl::StatusOr<std::vector<std::string>> CommitCheckpoint(
      const trainyard::v1::CommitCheckpointRequest& request);

  // Fenced like ReportProgress. Stores the exported model's URI on the job.
  absl::Status ReportModel(absl::string_view job_id, int64_t generation, absl::string_view uri);

  // Fenced like ReportProgress. Records a trainer's warning (say, a corrupt checkpoint it
  // skipped) as a job event from and to the current state, reason "warning: <message>" (cut to
  // 1 KiB). INVALID_ARGUMENT for an empty message.
  absl::Status ReportEvent(absl::string_view job_id, int64_t generation, absl::string_view message);

  // `trainyard debug`: the flight record (with `stacks`, also the threads' stacks) of every
  // running rank of the job's attempt, asked of their agents on their next Sync; blocks until all
  // answered or `wait` passed (ranks not answered say so). NOT_FOUND for an unknown job,
  // FAILED_PRECONDITION when no rank of it runs. ReportDebug keeps an agent's answer: NOT_FOUND
  // once the ask is over, PERMISSION_DENIED for a worker it did not ask.
  absl::StatusOr<trainyard::v1::DebugJobResponse> DebugJob(absl::string_view job_id, bool stacks,
                                                           absl::Duration wait);
  absl::Status ReportDebug(const trainyard::v1::ReportDebugRequest& answer);

  // A preemption notice from a worker's agent: the worker becomes DRAINING (nothing new is
  // placed there) and every rank of each job with a rank there is asked to save at the next step
  // its gang agrees on and to exit by the deadline; the job then restarts elsewhere (PREEMPTED).
  // Idempotent. NOT_FOUND for an unknown worker, INVALID_ARGUMENT for a missing worker id.
  absl::Status ReportPreemption(const trainyard::v1::ReportPreemptionRequest& request);

  // Rendezvous of the ranks of one attempt, fenced like ReportProgress (NOT_FOUND for an unknown
  // job, FAILED_PRECONDITION for another generation or a final job); see Rendezvous::Set and
  // Rendezvous::Get for the rest. The namespace goes when the attempt ends. RendezvousGet blocks
  // up to `wait` (capped at max_rendezvous_wait) without holding the manager's lock.
  absl::Status RendezvousSet(absl::string_view job_id, int64_t generation, absl::string_view key,
                             std::string value);
  absl::StatusOr<std::string> RendezvousGet(absl::string_view job_id, int64_t generation,
                                            absl::string_view key, absl::Duration wait);

  // The state the coordinator's gauges show, taken at once under the lock. Thread-safe.
  ClusterMetricsSnapshot MetricsSnapshot() const;

  // What was asked of a capacity provider for each waiting job (server/capacity/), shown after
  // the scheduler's reason ("no ready workers; asked Slurm for 2 nodes (job 7 PENDING)") until
  // the next call. Not stored: the asker says it again each round. Thread-safe.
  void SetCapacityNotes(std::map<std::string, std::string> notes);

  // ---- Background ----

  // One round of housekeeping at clock time: expire leases, restart attempts that lost a worker,
  // stalled (stall_timeout) or did not start (start_timeout), move RESTARTING jobs whose old ranks
  // have stopped back to PENDING (or FAILED when their restart budget is spent), enforce
  // max_runtime (in every non-final state once the job has started), schedule pending jobs whose
  // backoff has passed. Non-blocking apart from store writes. Level-triggered: a
  // condition whose store write failed is acted on again next time.
  void Tick();

  // Blocks until something asked for a Tick (a submit, an exit, a cancel, a new worker) or
  // `timeout` passes; true when asked. For the coordinator's tick thread.
  bool WaitForTickRequest(absl::Duration timeout);

  // Wakes every blocked call; they return UNAVAILABLE, and later blocking calls return at once.
  void Shutdown();
  bool IsShutDown() const;

  // The task a worker receives for `task_id`. NOT_FOUND for an unknown task. For tests.
  absl::StatusOr<trainyard::v1::Task> TaskFor(absl::string_view task_id) const;
  // How many Sync calls are blocked waiting for a change now. For tests that must know a long
  // poll is really waiting before they change something.
  int BlockedSyncsForTesting() const;
  // How many jobs are held in memory (the other finished ones are in the store only). For tests.
  size_t JobsInMemoryForTesting() const {
    absl::MutexLock lock(&mu_);
    return table_.size();
  }
  // How many rendezvous Gets are blocked now. For tests.
  int RendezvousWaitersForTesting() const { return rendezvous_.WaitersForTesting(); }

 private:
  using JobEntry = ::trainyard::JobEntry;
  using QueueKey = JobTable::QueueKey;

  // What ended an attempt, for the restart policy.
  struct AttemptEnd {
    trainyard::v1::RestartReason reason = trainyard::v1::RESTART_REASON_UNSPECIFIED;
    std::string message;
    absl::Time failed = absl::InfinitePast();  // when it happened, as far as is known
    bool user_error = false;  // TaskReportOutcome::user_error: the job fails, whatever its budget
    int64_t last_step = -1;   // the last update a rank of it said it completed (TaskStatus)
  };

  JobManager(const Clock& clock, std::unique_ptr<JobStore> store, std::unique_ptr<LogStore> logs,
             JobManagerOptions options);
  absl::Status Load();

  absl::StatusOr<trainyard::v1::Job> SubmitValidated(trainyard::v1::JobSpec spec,
                                                     const Principal* by,
                                                     const SubmitOptions& options = {});
  // SubmitValidated's checks under the lock (job_manager_submit.cc): the id free, room among
  // the active jobs, the job it resumes from the caller's to read, a worker that runs its models
  // and holds its tasks, and a queue that takes it (which may set spec.queue).
  absl::Status AdmitLocked(trainyard::v1::JobSpec& spec, const Principal* by,
                           const SubmitOptions& options,
                           const std::optional<trainyard::v1::ModelNeeds>& needs,
                           const trainyard::v1::MemoryEstimate& estimate)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The new job numbered `seq`: PENDING, its checkpoint folder, its first event.
  trainyard::v1::Job NewJobLocked(trainyard::v1::JobSpec spec, const Principal* by,
                                  const SubmitOptions& options, int64_t seq) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  absl::StatusOr<trainyard::v1::Job> CancelLocked(JobEntry& entry, absl::string_view reason,
                                                  absl::string_view by)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Other jobs' checkpoints and exports are their owners': `spec` (submitted by `by`; null:
  // no authentication, one user; admins go anywhere) may read below a job's checkpoint folder
  // only where `by` may see that job, and below the checkpoint root only within such a folder or
  // `by`'s own ({root}/{OwnerFolder}); it may write below no job's folder, and below the root
  // only in `by`'s own folder (the root itself standing for it). PERMISSION_DENIED naming the
  // field and the job or folder; INVALID_ARGUMENT for a checkpoint.uri inside a job's folder.
  absl::Status CheckJobSpaces(const trainyard::v1::JobSpec& spec, const Principal* by) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Where job `id` of `owner` keeps its checkpoints: {checkpoint.uri}/{id}, or, when the spec
  // names none (or the root itself), {checkpoint_root}/{OwnerFolder(owner)}/{id}
  // ({checkpoint_root}/{id} without an owner).
  std::string CheckpointFolder(const trainyard::v1::JobSpec& spec, absl::string_view owner,
                               absl::string_view id) const;
  // What a registration must be before it is looked at: a safe name, no negative capacity, a
  // claim within the worker's limit (worker_limits). INVALID_ARGUMENT naming the field.
  absl::Status CheckRegistration(const trainyard::v1::RegisterWorkerRequest& request) const;
  // A job not in memory, read from the store: a finished job that was evicted (EvictLocked).
  // NOT_FOUND ("job 'x' not found") when the store has none either. Call without the lock: a
  // job leaves memory only once all of it is in the store.
  absl::StatusOr<StoredJobRecord> LoadEvicted(absl::string_view id) const ABSL_LOCKS_EXCLUDED(mu_);
  // The job that checkpoint.resume_from names, brought back into memory from the store if it was
  // evicted (the placements of the job that resumes from it need its checkpoint records).
  // NOT_FOUND when there is no such job.
  absl::StatusOr<const JobEntry*> ResumeSourceLocked(absl::string_view id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes the final jobs that nothing needs any more out of memory: not stopping, not a resume
  // source of a job not finished (nor of a submission being written), no progress write in flight.
  void EvictFinishedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  JobEntry* FindLocked(absl::string_view id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const JobEntry* FindLocked(absl::string_view id) const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  // Writes `updated` (the new version of entry.job), the given events and tasks and `extra` in
  // one transaction, then makes it current, wakes waiters and refreshes the desired state of
  // every worker whose active tasks changed. Inside a unit of work the write is deferred to the
  // unit's end (and this returns OK).
  absl::Status CommitLocked(JobEntry& entry, trainyard::v1::Job updated,
                            const std::vector<trainyard::v1::JobEvent>& events,
                            const std::vector<std::string>& changed_task_ids,
                            StoreMutation extra = {}) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Drops `job`'s events and restart records beyond the caps (max_job_events,
  // max_job_restart_records), counting them on the job; `m` deletes the dropped events.
  static constexpr int kKeptFirstEvents = 10;
  void CapHistory(trainyard::v1::Job& job, StoreMutation& m) const;

  // Moves the job to `to` with `reason` and commits it with the given task changes.
  absl::Status TransitionLocked(JobEntry& entry, trainyard::v1::Job updated,
                                trainyard::v1::JobState to, absl::string_view reason,
                                const std::vector<std::string>& changed_task_ids)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Status ApplyTaskStatusLocked(absl::string_view worker_id,
                                     const trainyard::v1::TaskStatus& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The part of ApplyTaskStatusLocked after the checks: records the news about task `index` of
  // the job and carries out what it means (task_report.h).
  absl::Status RecordTaskStatusLocked(JobEntry& entry, int index,
                                      const trainyard::v1::TaskStatus& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job of a call from attempt `generation`: FAILED_PRECONDITION for a stale or unknown
  // generation and for a finished job (a CANCELLED one too, unless `cancelled_ok`: the cancelled
  // attempt's last checkpoint).
  absl::StatusOr<JobEntry*> FencedLocked(absl::string_view job_id, int64_t generation,
                                         bool cancelled_ok = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status PersistWorkerLocked(absl::string_view id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // A unit of work makes a request that changes several jobs and workers (RegisterWorker,
  // ReportPreemption) one transaction: inside it, changes apply in memory at once, so each step
  // sees the ones before, but their writes are gathered; EndUnitLocked writes them together or,
  // when that fails, puts every job and worker the unit touched back as it was, so that neither
  // the store nor memory holds half a result. What must not happen for a change that may be
  // undone (metrics, ending rendezvous) waits for the commit: AfterCommitLocked.
  struct UnitOfWork {
    StoreMutation mutation;
    std::map<int64_t, JobEntry> saved_jobs;  // by seq, as before the unit
    std::map<std::string, std::optional<WorkerRecord>, std::less<>>
        saved_workers;  // nullopt: was unknown
    std::vector<std::function<void()>> after_commit;
  };
  void BeginUnitLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status EndUnitLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Before a unit changes worker `id` in memory: keeps it to put back.
  void SaveWorkerLocked(absl::string_view id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes `m` now, or as part of the open unit.
  absl::Status WriteLocked(StoreMutation m) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs `fn` now, or once the open unit is committed (never, if it is undone).
  void AfterCommitLocked(std::function<void()> fn) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Brings the indexes (queue, attempts, active tasks by worker, active and stopping jobs) from
  // `before` to entry.job, and wakes the workers whose active tasks changed.
  void ReindexLocked(JobEntry& entry, const trainyard::v1::Job& before)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Ends the current attempt of an active job for `end`: RESTARTING (its ranks leave their
  // workers' desired state, so agents stop them) or, when the restart budget of the end's kind
  // is spent, FAILED. `updated` carries other changes to commit in the same transaction.
  absl::Status EndAttemptLocked(JobEntry& entry, trainyard::v1::Job updated, AttemptEnd end,
                                const std::vector<std::string>& changed_task_ids)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // RESTARTING -> PENDING (with backoff) once every rank of the ended attempt has stopped, or
  // FAILED when the budget is spent. No-op otherwise.
  void MaybeFinishRestartLocked(JobEntry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fills in the recovery of the job's last restart on the first step report of the next
  // attempt, and records it (event, metrics).
  void RecordRecoveryLocked(JobEntry& entry, const trainyard::v1::JobProgress& progress)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RestartLostOrStalledLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A hang's or a timed-out collective's culprit, from the flight records of the ended attempt's
  // ranks (JobEntry::ended_ranks): on the last restart (diagnosis) and in an event. Once.
  void RecordDiagnosisLocked(JobEntry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A worker's GPUs out of service changed: logged, written, and the queue looked at again.
  void GpuFaultsChangedLocked(const std::string& worker_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The returned GPUs to ask the agent to check again (those settled or expired forgotten).
  std::vector<int> GpuReturnsLocked(const WorkerRecord& record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ExpireWorkersLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes the finished jobs in `expired` (from JobStore::FinishedBefore, read by Tick without
  // the lock) that are past job_retention and not back in memory; returns their ids, whose logs
  // the caller removes without the lock. Also forgets LOST workers past lost_worker_retention.
  // A batch at a time: a coordinator that was down for long catches up over a few ticks without
  // holding the lock for one long transaction. Otherwise once per period.
  static constexpr int kRetentionBatch = 500;
  static constexpr absl::Duration kRetentionPeriod = absl::Seconds(10);
  std::vector<std::string> ForgetExpiredLocked(
      const std::vector<std::pair<std::string, trainyard::v1::JobState>>& expired)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EnforceRuntimeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One scheduler pass (job_manager_schedule.cc), and its steps: the workers' capacity; the
  // queue in order (up to `blocker` and the new submissions behind it, where not null), the
  // earliest end of a restart's backoff lowering `next`; capacity of stopping jobs let go; one
  // placement applied; the reasons and places in line shown (true when any changed).
  void ScheduleLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<SchedWorker> SchedWorkersLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  std::vector<SchedJob> QueuedJobsLocked(const JobEntry* blocker, absl::Time now,
                                         absl::Time* next) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void ReleaseStoppedLocked(absl::Time now, absl::Time* next) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PlaceLocked(const Placement& placement) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Job.data_memory_bytes for the first placement of `job`: the smallest task memory of its
  // ranks' workers, or 0 when its spec decides (resources.memory, data.shuffle_window, a program)
  // or a worker did not say.
  int64_t DataMemoryLocked(const v1::Job& job, const Placement& placement) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  bool ShowReasonsLocked(const ScheduleDecision& decision, bool whole)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A pending job's reason with its capacity note after it.
  std::string WithCapacityNoteLocked(const std::string& job_id, const std::string& reason) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Workers came, went or changed state: parked jobs are looked at again.
  void ClusterChangedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  SchedJob SchedJobLocked(const JobEntry& entry) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // ListQueues under the lock.
  std::vector<trainyard::v1::Queue> ListQueuesLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The queues and the jobs that hold capacity, as the scheduler sees them.
  SchedContext SchedContextLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The queue a submission goes to (spec.queue, else the submitter's, else the default), set on
  // `spec`: INVALID_ARGUMENT for an unknown queue or a job larger than it allows ever,
  // PERMISSION_DENIED for a user it does not list.
  absl::Status AdmitToQueueLocked(trainyard::v1::JobSpec& spec, const Principal* by) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Asks every rank and shard of the job's current attempt that was not asked yet to save at the
  // next step its gang agrees on and to stop by `deadline_ms`, with a job event `reason`; wakes
  // their agents. False when nothing was left to ask.
  bool AskToStopLocked(JobEntry& entry, int64_t deadline_ms, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Carries out the scheduler's preemption: the victim saves and stops, then waits in its queue.
  void PreemptLocked(const Preemption& preemption) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RequestTickLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Each worker's long polls wait on their own condition, signalled when its desired state or
  // registration changes (and on Shutdown).
  std::shared_ptr<absl::CondVar> WorkerWakeupLocked(absl::string_view worker_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WakeWorkerLocked(absl::string_view worker_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds the ranks of `entry`'s attempt `generation` still running on reachable workers to
  // kill_tasks_ and wakes their agents: the attempt ended by a failure, and its survivors can
  // neither save nor finish a step.
  // " lost (...)": how the worker's lease ended, for messages.
  std::string LeaseEndLocked(const WorkerRecord& worker) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Ends the lease streams of agents gone silent and probes the others when one busy agent has
  // (WorkerRegistry::CheckBeats).
  void CheckBeatsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void KillSurvivorsLocked(const JobEntry& entry, int64_t generation)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Tasks of non-final jobs, current generation, not ended: what workers should run.
  static bool IsActiveTask(const JobEntry& entry, const trainyard::v1::TaskInfo& task) {
    return JobTable::IsActiveTask(entry.job, task);
  }
  // Those of one worker.
  std::vector<std::pair<const JobEntry*, const trainyard::v1::TaskInfo*>> ActiveTasksLocked(
      absl::string_view worker_id) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  trainyard::v1::Task BuildTaskLocked(const JobEntry& entry,
                                      const trainyard::v1::TaskInfo& info) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The one shared copy of a worker's runtime, by its content.
  std::shared_ptr<const WorkerRuntime> InternRuntimeLocked(
      const trainyard::v1::TrainerRuntime& runtime) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The live workers (not LOST), for NoWorkerRuns.
  std::vector<const WorkerRecord*> LiveWorkersLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Why no live worker can hold a rank (or a shard) of `spec` in memory: its resources.memory,
  // else the `estimate`, against the largest memory a worker offers. Empty when one can, or no
  // live worker said how much it has.
  std::string NoWorkerHoldsLocked(const v1::JobSpec& spec, const v1::MemoryEstimate& estimate) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // How long an agent may say nothing before it is shown SUSPECT (WorkerRegistry::ShownState):
  // its long poll (max_sync_wait) and a lease timeout more.
  absl::Duration QuietLimitLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return options_.max_sync_wait + workers_.lease_timeout();
  }
  trainyard::v1::Worker WorkerViewLocked(const WorkerRecord& record,
                                         const std::map<std::string, WorkerUsage>& used) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // UsedCapacity (capacity.h) of the jobs now, with kStoppingHold: the one count of used
  // capacity, for scheduling, the workers' views and the metrics.
  std::map<std::string, WorkerUsage> UsedCapacityLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  // Fixed at construction.
  const Clock& clock_;
  const JobManagerOptions options_;
  const std::unique_ptr<JobStore> store_;
  GroupCommitter committer_;  // every write to store_ goes through it
  const std::unique_ptr<LogStore> logs_;
  Rendezvous rendezvous_;  // thread-safe on its own; fenced under mu_ before use

  mutable absl::Mutex mu_;
  absl::CondVar changed_;  // any job, worker or desired-state change; Shutdown()
  absl::CondVar tick_wanted_;
  // The jobs and their indexes (the queue, attempts, active tasks by worker, ...).
  JobTable table_ ABSL_GUARDED_BY(mu_);
  // Jobs that cannot run on the cluster as it is are parked in table_ until a worker comes, goes
  // or changes state (cluster_epoch_).
  uint64_t cluster_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t parked_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  int submitting_ ABSL_GUARDED_BY(mu_) = 0;  // submissions waiting for their commit
  // checkpoint.resume_from of those submissions: kept in memory until the job is added.
  absl::flat_hash_map<std::string, int> pinned_sources_ ABSL_GUARDED_BY(mu_);
  // When Tick next looks for finished jobs past job_retention (sooner while it catches up).
  absl::Time next_retention_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // Scheduling follows what changed: a pass after anything that may free capacity or change the
  // queue (schedule_all_), when something timed comes due (next_full_schedule_) or for new
  // submissions (new_pending_). A pass stops at the job that blocked the queue last time
  // (schedule_blocker_) unless that job's fate changed: what waits behind it waits on.
  bool schedule_all_ ABSL_GUARDED_BY(mu_) = true;
  absl::Time next_full_schedule_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::set<QueueKey> new_pending_ ABSL_GUARDED_BY(mu_);
  std::string schedule_blocker_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> capacity_notes_ ABSL_GUARDED_BY(mu_);  // by job id
  int blocked_syncs_ ABSL_GUARDED_BY(mu_) = 0;
  // Per worker, ranks of attempts that a failure ended, still running there: killed at once
  // (SyncResponse.kill_task_ids) until their agent reports them ended.
  absl::flat_hash_map<std::string, std::set<std::string>> kill_tasks_ ABSL_GUARDED_BY(mu_);
  std::optional<UnitOfWork> unit_ ABSL_GUARDED_BY(mu_);
  DebugAsks debug_asks_ ABSL_GUARDED_BY(mu_);
  // Per worker, GPUs an admin returned and when (ReturnGpu), until its agent's report settles it.
  std::map<std::string, std::map<int, absl::Time>> gpu_returns_ ABSL_GUARDED_BY(mu_);
  // Shared: a waiting long poll keeps its condition alive while a forgotten worker's goes.
  absl::flat_hash_map<std::string, std::shared_ptr<absl::CondVar>> worker_wakeups_
      ABSL_GUARDED_BY(mu_);
  int64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  WorkerRegistry workers_ ABSL_GUARDED_BY(mu_);
  // The runtimes workers reported, by WorkerRuntime::key (a few LibTorch versions at most).
  std::map<std::string, std::shared_ptr<const WorkerRuntime>> runtimes_ ABSL_GUARDED_BY(mu_);
  bool tick_requested_ ABSL_GUARDED_BY(mu_) = false;
  absl::BitGen jitter_ ABSL_GUARDED_BY(mu_);  // restart backoff
  // The queues the admins made, by name; what the last scheduling pass found of each; the
  // scheduler's preemptions of each queue's jobs since start.
  std::map<std::string, trainyard::v1::Queue> queues_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, QueueUsage> queue_usage_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int64_t> queue_preemptions_ ABSL_GUARDED_BY(mu_);
  std::string reserved_for_ ABSL_GUARDED_BY(mu_);  // the last pass's reservation
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace trainyard

#endif  // TRAINYARD_SERVER_JOBS_JOB_MANAGER_H_
