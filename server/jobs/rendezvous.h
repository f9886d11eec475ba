#ifndef TRAINYARD_SERVER_JOBS_RENDEZVOUS_H_
#define TRAINYARD_SERVER_JOBS_RENDEZVOUS_H_

// The coordinator's rendezvous store: where the ranks of one attempt of a job meet before they
// talk to each other directly (Gloo exchanges its listening addresses here, NCCL its unique id).
// Keys live in a namespace per (job id, generation); an attempt that ends takes its namespace
// with it, and waiters on it are woken with an error instead of waiting out their timeout.

#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace trainyard {

struct RendezvousOptions {
  int max_keys_per_namespace = 1024;
  int64_t max_value_bytes = 64 << 10;
  int64_t max_key_bytes = 256;
  // A namespace nothing has touched for this long is dropped the next time a namespace is
  // created: a safety net for attempts whose end was never announced (EndAttempts).
  absl::Duration idle_ttl = absl::Hours(6);
};

// Fencing (is this generation current?) is the caller's business: the store keeps whatever
// namespaces it is given. Thread-safe. Idle expiry reads the injected clock; the waits in Get
// use real time, as gRPC deadlines do.
class Rendezvous {
 public:
  // `clock` must outlive the store.
  Rendezvous(const Clock& clock, RendezvousOptions options = {});
  ~Rendezvous();

  // Stores `value` under `key` (replacing an earlier value) and wakes its waiters.
  // INVALID_ARGUMENT for an empty or too long key; RESOURCE_EXHAUSTED when the value is too
  // large or the namespace already holds max_keys_per_namespace other keys; FAILED_PRECONDITION
  // when the attempt has ended; UNAVAILABLE after Shutdown().
  absl::Status Set(absl::string_view job_id, int64_t generation, absl::string_view key,
                   std::string value);

  // The value of `key`, waiting up to `wait` for it to be set. NOT_FOUND when it is unset and
  // `wait` is zero; DEADLINE_EXCEEDED when it stays unset for `wait`; FAILED_PRECONDITION when
  // the attempt ends meanwhile (or had ended); UNAVAILABLE on Shutdown(). Blocks.
  absl::StatusOr<std::string> Get(absl::string_view job_id, int64_t generation,
                                  absl::string_view key, absl::Duration wait);

  // Drops the namespaces of `job_id` with generation <= `last_generation` and refuses them from
  // now on. Waiters get FAILED_PRECONDITION. Idempotent.
  void EndAttempts(absl::string_view job_id, int64_t last_generation);

  // Forgets the job (removed from the coordinator): its namespaces and the record that its
  // attempts ended. Only for a job whose attempts all ended (EndAttempts).
  void Forget(absl::string_view job_id);

  // Wakes every waiter with UNAVAILABLE; later calls fail with UNAVAILABLE.
  void Shutdown();

  // Namespaces held now (for tests and metrics).
  int NamespaceCount() const;
  // Get calls blocked waiting now: tests wait for this before they wake them.
  int WaitersForTesting() const;

 private:
  using NamespaceKey = std::pair<std::string, int64_t>;
  struct Namespace {
    std::map<std::string, std::string, std::less<>> values;
    absl::Time last_used;
  };

  // FAILED_PRECONDITION for an ended attempt, UNAVAILABLE after Shutdown.
  absl::Status CheckOpenLocked(absl::string_view job_id, int64_t generation) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  Namespace& NamespaceLocked(absl::string_view job_id, int64_t generation)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Clock& clock_;
  const RendezvousOptions options_;

  mutable absl::Mutex mu_;
  int waiters_ ABSL_GUARDED_BY(mu_) = 0;
  absl::CondVar changed_;  // a value was set, an attempt ended, Shutdown()
  std::map<NamespaceKey, Namespace> namespaces_ ABSL_GUARDED_BY(mu_);
  // Per job, the newest generation that has ended: that one and older ones are refused.
  std::map<std::string, int64_t, std::less<>> ended_ ABSL_GUARDED_BY(mu_);
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace trainyard

#endif  // TRAINYARD_SERVER_JOBS_RENDEZVOUS_H_
