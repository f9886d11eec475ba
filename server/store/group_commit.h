#ifndef TRAINYARD_SERVER_STORE_GROUP_COMMIT_H_
#define TRAINYARD_SERVER_STORE_GROUP_COMMIT_H_

#include <cstdint>
#include <deque>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "server/store/job_store.h"

namespace trainyard {

// Writes StoreMutations to a JobStore in the order they were queued, many in one transaction:
// while one thread commits, the mutations queued meanwhile wait, and the next thread to wait
// commits all of them together (a leader, no thread of its own). One fsync then acknowledges
// a whole group, which is what makes thousands of durable submissions a second possible.
//
// A group whose transaction fails is retried one mutation at a time, in order, so that one bad
// mutation fails only its own caller. Thread-safe.
class GroupCommitter {
 public:
  // `store` must outlive the committer.
  explicit GroupCommitter(JobStore* store) : store_(store) {}

  struct Ticket;

  // Queues `mutation` and returns at once. Writes land in the order of Enqueue calls: callers
  // that need an order among themselves enqueue under their own lock.
  std::shared_ptr<Ticket> Enqueue(StoreMutation mutation);

  // Blocks until the ticket's mutation is durable, committing queued groups meanwhile; returns
  // the store's status for it.
  absl::Status Wait(const std::shared_ptr<Ticket>& ticket);

  // Enqueue and Wait.
  absl::Status Apply(StoreMutation mutation) { return Wait(Enqueue(std::move(mutation))); }

  // Transactions and mutations committed so far. For benchmarks and tests.
  int64_t transactions() const;
  int64_t mutations() const;

 private:
  JobStore* const store_;
  mutable absl::Mutex mu_;
  absl::CondVar done_;
  std::deque<std::shared_ptr<Ticket>> queue_ ABSL_GUARDED_BY(mu_);
  bool committing_ ABSL_GUARDED_BY(mu_) = false;
  int64_t transactions_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t mutations_ ABSL_GUARDED_BY(mu_) = 0;
};

struct GroupCommitter::Ticket {
  StoreMutation mutation;
  bool done = false;  // guarded by the committer's mutex
  absl::Status status;
};

// Appends `from` to `into`: the writes of both in one mutation, `from`'s after `into`'s.
void MergeMutation(StoreMutation& into, StoreMutation from);

}  // namespace trainyard

#endif  // TRAINYARD_SERVER_STORE_GROUP_COMMIT_H_
