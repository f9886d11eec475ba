#include "server/jobs/rendezvous.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/clock.h"

namespace trainyard {

Rendezvous::Rendezvous(const Clock& clock, RendezvousOptions options)
    : clock_(clock), options_(options) {}

Rendezvous::~Rendezvous() { Shutdown(); }

absl::Status Rendezvous::CheckOpenLocked(absl::string_view job_id, int64_t generation) const {
  if (shutdown_) return absl::UnavailableError("rendezvous: the coordinator is shutting down");
  auto it = ended_.find(job_id);
  if (it != ended_.end() && generation <= it->second) {
    return absl::FailedPreconditionError(
        absl::StrCat("rendezvous: attempt ", generation, " of job ", job_id, " has ended"));
  }
  return absl::OkStatus();
}

Rendezvous::Namespace& Rendezvous::NamespaceLocked(absl::string_view job_id, int64_t generation) {
  const absl::Time now = clock_.Now();
  NamespaceKey key(std::string(job_id), generation);
  auto it = namespaces_.find(key);
  if (it == namespaces_.end()) {
    // New namespaces are rare (one per attempt): the moment to drop the forgotten ones.
    for (auto old = namespaces_.begin(); old != namespaces_.end();) {
      old = now - old->second.last_used > options_.idle_ttl ? namespaces_.erase(old) : ++old;
    }
    it = namespaces_.emplace(std::move(key), Namespace{}).first;
  }
  it->second.last_used = now;
  return it->second;
}

absl::Status Rendezvous::Set(absl::string_view job_id, int64_t generation, absl::string_view key,
                             std::string value) {
  if (key.empty()) return absl::InvalidArgumentError("rendezvous: empty key");
  if (static_cast<int64_t>(key.size()) > options_.max_key_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("rendezvous: key of ", key.size(),
                                                   " bytes, at most ", options_.max_key_bytes));
  }
  if (static_cast<int64_t>(value.size()) > options_.max_value_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("rendezvous: value of ", value.size(),
                                                     " bytes, at most ", options_.max_value_bytes));
  }
  absl::MutexLock lock(&mu_);
  if (absl::Status open = CheckOpenLocked(job_id, generation); !open.ok()) return open;
  Namespace& ns = NamespaceLocked(job_id, generation);
  auto it = ns.values.find(key);
  if (it == ns.values.end()) {
    if (static_cast<int>(ns.values.size()) >= options_.max_keys_per_namespace) {
      return absl::ResourceExhaustedError(absl::StrCat("rendezvous: attempt ", generation,
                                                       " of job ", job_id, " already holds ",
                                                       ns.values.size(), " keys"));
    }
    ns.values.emplace(std::string(key), std::move(value));
  } else {
    it->second = std::move(value);
  }
  changed_.SignalAll();
  return absl::OkStatus();
}

absl::StatusOr<std::string> Rendezvous::Get(absl::string_view job_id, int64_t generation,
                                            absl::string_view key, absl::Duration wait) {
  const absl::Time deadline = RealClock::Get().Now() + wait;
  absl::MutexLock lock(&mu_);
  while (true) {
    if (absl::Status open = CheckOpenLocked(job_id, generation); !open.ok()) return open;
    Namespace& ns = NamespaceLocked(job_id, generation);
    auto it = ns.values.find(key);
    if (it != ns.values.end()) return it->second;
    if (wait <= absl::ZeroDuration()) {
      return absl::NotFoundError(absl::StrCat("rendezvous: key '", key, "' is not set"));
    }
    ++waiters_;
    const bool timed_out = changed_.WaitWithDeadline(&mu_, deadline);
    --waiters_;
    if (timed_out) {
      // Timed out; one last look, in case the value came with the deadline.
      if (absl::Status open = CheckOpenLocked(job_id, generation); !open.ok()) return open;
      Namespace& last = NamespaceLocked(job_id, generation);
      auto found = last.values.find(key);
      if (found != last.values.end()) return found->second;
      return absl::DeadlineExceededError(
          absl::StrCat("rendezvous: key '", key, "' not set within ", absl::FormatDuration(wait)));
    }
  }
}

void Rendezvous::EndAttempts(absl::string_view job_id, int64_t last_generation) {
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = ended_.emplace(std::string(job_id), last_generation);
  if (!inserted && it->second < last_generation) it->second = last_generation;
  for (auto ns = namespaces_.begin(); ns != namespaces_.end();) {
    const bool ended = ns->first.first == job_id && ns->first.second <= last_generation;
    ns = ended ? namespaces_.erase(ns) : ++ns;
  }
  changed_.SignalAll();
}

void Rendezvous::Forget(absl::string_view job_id) {
  absl::MutexLock lock(&mu_);
  if (auto it = ended_.find(job_id); it != ended_.end()) ended_.erase(it);
  for (auto ns = namespaces_.begin(); ns != namespaces_.end();) {
    ns = ns->first.first == job_id ? namespaces_.erase(ns) : ++ns;
  }
  changed_.SignalAll();
}

void Rendezvous::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutdown_ = true;
  changed_.SignalAll();
}

int Rendezvous::WaitersForTesting() const {
  absl::MutexLock lock(&mu_);
  return waiters_;
}

int Rendezvous::NamespaceCount() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(namespaces_.size());
}

}  // namespace trainyard
