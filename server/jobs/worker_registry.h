#ifndef TRAINYARD_SERVER_JOBS_WORKER_REGISTRY_H_
#define TRAINYARD_SERVER_JOBS_WORKER_REGISTRY_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "trainyard/v1/job.pb.h"

namespace trainyard {

// What a worker's trainer can load (its TrainerRuntime less the flags in Worker), shared by the
// workers that run the same LibTorch.
struct WorkerRuntime {
  std::string key;  // names it in SchedWorker::runtime: a digest of the rest
  std::string libtorch_version;
  std::vector<std::string> ops;  // sorted
  int64_t max_model_format_version = 0;
};

struct WorkerRecord {
  trainyard::v1::Worker info;  // slots_used, gpus_used and task_ids are left to the caller
  // Null when unknown: the agent did not say, or the record was restored from the store.
  std::shared_ptr<const WorkerRuntime> runtime;
  absl::Time lease_expiry;
  uint64_t desired_version = 0;  // changes whenever the tasks it should run change
  // Loaded from the store and not registered since this coordinator started: its agent is asked
  // to register again, reporting what it runs, so that tasks it lost meanwhile are found.
  bool restored = false;
  int lease_streams = 0;  // open now
  bool streamed = false;  // a lease stream was opened since it registered: streams keep its lease
  // Its lease ran out together with those of most workers: held, not LOST (see ExpireLeases).
  absl::Time unreachable_since = absl::InfiniteFuture();
  // The mass loss it was held in is over (the others came back): it has one lease timeout more
  // to come back too before it is LOST.
  bool hold_ended = false;
  bool unreachable() const { return unreachable_since != absl::InfiniteFuture(); }
  // The open lease streams of this registration (lease_streams of them), by id
  // (LeaseTicket::stream), each with how to end it (may be null): the coordinator ends those of
  // an agent gone silent. Beats come on the latest stream whose agent beats (0: none).
  std::map<uint64_t, std::function<void()>> stream_ends;
  uint64_t beating_stream = 0;
  absl::Time heard = absl::InfinitePast();  // its agent's last word: a beat, a Sync, a stream
  // Beats are due from the later of `heard` and this: the last change of its tasks.
  absl::Time beats_due_from = absl::InfinitePast();
  absl::Time probed_at = absl::InfiniteFuture();  // asked for a word then, not answered yet
  bool silenced = false;  // its last stream was ended because its agent went silent (CheckBeats)
  bool probed() const { return probed_at != absl::InfiniteFuture(); }
};

// An open lease stream, by its id: unique while the coordinator runs, so a stream opened for an
// earlier registration of the worker (whose ids a registration forgets) ends nothing.
struct LeaseTicket {
  uint64_t stream = 0;
};

struct LeasePolicy {
  // Without a lease stream: LOST this long after the last renewal (a Sync).
  absl::Duration timeout = absl::Seconds(10);
  // With one: held while a stream is open; LOST this long after the last one closed, unless the
  // agent opens another meanwhile (it reopens at once after a stream it did not mean to end).
  absl::Duration stream_grace = absl::Milliseconds(500);
  // When more than half of the live workers (and at least two) run out of lease at once, the
  // coordinator is far more likely to be the one cut off than they all to have died: they are
  // held unreachable (given nothing new) for up to this long before they are LOST.
  absl::Duration mass_loss_hold = absl::Minutes(5);
  // An agent that beats on its lease stream while it runs tasks (LeaseRequest.beats) is silent
  // after this long without one, and so is any agent asked for a word (a probe) that has not
  // answered within it. Zero: no beats are asked for.
  absl::Duration beat_timeout = absl::Milliseconds(1500);
  // A worker restored from the store (a coordinator that took over or restarted) has this much
  // more than `timeout` to come: its agent may still be tied to a frozen old leader until its
  // pings give that connection up (common/rpc/channel.h: 2 s apart, 1 s to answer).
  // (worker_registry.cc checks that the two agree).
  absl::Duration restored_grace = absl::Seconds(3);
};

// The workers the coordinator knows and their leases. A worker is READY (or DRAINING) while its
// lease holds (LeasePolicy), and LOST from the first ExpireLeases() call at or after the moment
// it has run out, unless a mass loss holds it. A LOST worker must register again.
// Not thread-safe: JobManager calls it under its own lock. `clock` must outlive the registry.
class WorkerRegistry {
 public:
  WorkerRegistry(const Clock& clock, LeasePolicy policy);

  absl::Duration lease_timeout() const { return policy_.timeout; }

  // Adds or replaces the worker `info.id()`: READY (or DRAINING when `info` says so), registered
  // and seen now, a fresh lease and a new desired-state version. Returns the stored record.
  const WorkerRecord& Register(trainyard::v1::Worker info,
                               std::shared_ptr<const WorkerRuntime> runtime = nullptr);

  // Puts back a worker loaded from the store, keeping its state; its lease starts now and it is
  // marked `restored` until it registers.
  void Restore(trainyard::v1::Worker info);

  // Notes the worker seen now and, unless its lease is kept by streams, extends the lease from
  // now. NOT_FOUND for an unknown worker, FAILED_PRECONDITION for a LOST one (it has to register
  // again).
  absl::Status Renew(absl::string_view id);
  // Its agent said something (a Sync arrived, a beat): it answers a probe. Unknown ids are
  // ignored.
  void Heard(absl::string_view id);

  // A lease stream of the worker opened: its lease holds until the last open stream closes.
  // `end`, when given, ends the stream (CheckBeats calls it, at most once); with `beats`, its agent
  // beats while it runs tasks. Returns the ticket to hand back to Beat and CloseLease. Errors as
  // Renew.
  absl::StatusOr<LeaseTicket> OpenLease(absl::string_view id, bool beats = false,
                                        std::function<void()> end = nullptr);
  // A beat came on the stream.
  void Beat(absl::string_view id, const LeaseTicket& ticket);
  // The stream closed: with none left open, the lease ends after stream_grace. Ignored when the
  // worker has registered again or is gone.
  void CloseLease(absl::string_view id, const LeaseTicket& ticket);

  struct Silence {
    std::vector<std::string> silent;  // their streams ended now (or, without one, lease run out)
    std::vector<std::string> probe;   // to ask for a word now (BumpVersion answers their Syncs)
  };
  // Finds the agents gone silent: one that beats, has tasks (`busy`) and sent no beat for
  // beat_timeout since it was heard or its tasks changed; or one probed beat_timeout ago that has
  // not answered. Their streams are ended (a stream without an `end`, or a lease kept by Syncs,
  // runs out now). When one busy agent goes silent, every other live worker not heard from within
  // beat_timeout is to be probed, and ExpireLeases waits for their answers before it decides: a
  // coordinator cut off hears from none of them (a mass loss), one that lost a machine from all.
  Silence CheckBeats(const std::function<bool(const std::string&)>& busy);

  struct Expiry {
    std::vector<std::string> lost;      // marked LOST now
    std::vector<std::string> held;      // newly held unreachable by a mass loss
    std::vector<std::string> returned;  // held until now, and their lease holds again
    int down = 0;                       // workers out of lease or with their stream closed, of
    int live = 0;                       // the workers not LOST (nor DRAINING and out of lease)
  };
  // Marks every READY/DRAINING worker whose lease has run out as LOST, unless more than half of
  // the workers not LOST (at least two) are out of lease or have lost their stream at once:
  // those out of lease are held unreachable instead, and LOST only once held for mass_loss_hold,
  // or a lease timeout after the loss stopped being a mass loss (the others came back) if they
  // have not come back too. While other streams are
  // closed but within their grace, a lease that ran out waits up to stream_grace more, to tell
  // a coordinator cut off (its connections break within a ping interval of each other) from one
  // machine lost; while probes await their answers (CheckBeats), it waits for them. A DRAINING
  // worker out of lease left as its agent said it would (a preemption notice, a drain): LOST at
  // once, and counted neither among the workers down nor among the live ones.
  Expiry ExpireLeases();

  // The state a person should see (trainyard workers, the metrics), which the stored one (READY,
  // DRAINING, LOST) alone would overstate: UNREACHABLE while a mass loss holds it (nothing new is
  // placed on it, its tasks train on, and it is LOST if it does not come back); SUSPECT while the
  // coordinator misses what it expects of it: a probe unanswered, its beats missed, its last
  // lease stream closed, its lease run out and not yet decided, no word since this coordinator
  // started, or none for longer than `quiet_limit` (an idle agent long-polls: its next Sync is
  // overdue, so its agent is held by something or gone). `reason` (may be null) gets why, for
  // those two.
  trainyard::v1::WorkerState ShownState(const WorkerRecord& record, absl::Duration quiet_limit,
                                        std::string* reason) const;

  // Sets the state (READY, DRAINING, LOST). NOT_FOUND for an unknown worker.
  absl::Status SetState(absl::string_view id, trainyard::v1::WorkerState state);

  // Sets the GPUs its agent holds out of service (as the agent reported them; indices beyond
  // its GPUs are dropped). Whether they changed (by index and reason); false for an unknown
  // worker.
  bool SetGpuFaults(absl::string_view id,
                    const google::protobuf::RepeatedPtrField<trainyard::v1::GpuFault>& faults);

  // Puts `record` back as it was (undoing a change that could not be written), with a new
  // desired-state version; its lease (streams, beats) stays as it is now.
  void PutBack(WorkerRecord record);

  // Forgets the worker.
  void Remove(absl::string_view id);

  // Gives the worker a new desired-state version so that its waiting Sync answers; its beats are
  // due from now (its tasks changed, or it is probed).
  void BumpVersion(absl::string_view id);

  // nullptr when unknown. Valid until the next Register/Restore.
  const WorkerRecord* Find(absl::string_view id) const;

  // All workers, by id.
  std::vector<const WorkerRecord*> All() const;

 private:
  const Clock& clock_;
  const LeasePolicy policy_;
  uint64_t next_version_;
  uint64_t next_stream_ = 0;
  std::map<std::string, WorkerRecord, std::less<>> workers_;
};

}  // namespace trainyard

#endif  // TRAINYARD_SERVER_JOBS_WORKER_REGISTRY_H_
