#ifndef TRAINYARD_SERVER_WORKER_REGISTRY_H_
#define TRAINYARD_SERVER_WORKER_REGISTRY_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "trainyard/v1/job.pb.h"

namespace trainyard {

struct WorkerRecord {
  trainyard::v1::Worker info;  // slots_used, gpus_used and task_ids are left to the caller
  absl::Time lease_expiry;
  uint64_t desired_version = 0;  // changes whenever the tasks it should run change
  // Loaded from the store and not registered since this coordinator started: its agent is asked
  // to register again, reporting what it runs, so that tasks it lost meanwhile are found.
  bool restored = false;
};

// The workers the coordinator knows and their leases. A worker is READY (or DRAINING) while its
// lease is renewed within `lease_timeout`, and LOST from the first ExpireLeases() call at or
// after the moment the timeout has fully elapsed. A LOST worker must register again.
// Not thread-safe: JobManager calls it under its own lock. `clock` must outlive the registry.
class WorkerRegistry {
 public:
  WorkerRegistry(const Clock& clock, absl::Duration lease_timeout);

  absl::Duration lease_timeout() const { return lease_timeout_; }

  // Adds or replaces the worker `info.id()`: READY (or DRAINING when `info` says so), registered
  // and seen now, a fresh lease and a new desired-state version. Returns the stored record.
  const WorkerRecord& Register(trainyard::v1::Worker info);

  // Puts back a worker loaded from the store, keeping its state; its lease starts now and it is
  // marked `restored` until it registers.
  void Restore(trainyard::v1::Worker info);

  // Extends the lease from now. NOT_FOUND for an unknown worker, FAILED_PRECONDITION for a LOST
  // one (it has to register again).
  absl::Status Renew(absl::string_view id);

  // Marks every READY/DRAINING worker whose lease has run out as LOST and returns their ids.
  std::vector<std::string> ExpireLeases();

  // Sets the state (READY, DRAINING, LOST). NOT_FOUND for an unknown worker.
  absl::Status SetState(absl::string_view id, trainyard::v1::WorkerState state);

  // Puts `record` back as it was (undoing a change that could not be written), with a new
  // desired-state version.
  void PutBack(WorkerRecord record);

  // Forgets the worker.
  void Remove(absl::string_view id);

  // Gives the worker a new desired-state version so that its waiting Sync answers.
  void BumpVersion(absl::string_view id);

  // nullptr when unknown. Valid until the next Register/Restore.
  const WorkerRecord* Find(absl::string_view id) const;

  // All workers, by id.
  std::vector<const WorkerRecord*> All() const;

 private:
  const Clock& clock_;
  const absl::Duration lease_timeout_;
  uint64_t next_version_;
  std::map<std::string, WorkerRecord, std::less<>> workers_;
};

}  // namespace trainyard

#endif  // TRAINYARD_SERVER_WORKER_REGISTRY_H_
