#include "server/worker_registry.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace trainyard {

WorkerRegistry::WorkerRegistry(const Clock& clock, LeasePolicy policy)
    : clock_(clock),
      policy_(policy),
      // Versions start from the clock so that a restarted coordinator never hands out a version
      // an agent already knows from before the restart.
      next_version_(static_cast<uint64_t>(std::max<int64_t>(absl::ToUnixMillis(clock.Now()), 1))) {}

const WorkerRecord& WorkerRegistry::Register(v1::Worker info,
                                             std::shared_ptr<const WorkerRuntime> runtime) {
  const absl::Time now = clock_.Now();
  if (info.state() != v1::DRAINING) info.set_state(v1::READY);
  info.set_registered_unix_ms(absl::ToUnixMillis(now));
  info.set_last_seen_unix_ms(absl::ToUnixMillis(now));
  std::string id = info.id();
  WorkerRecord& record = workers_[id];
  record.info = std::move(info);
  record.runtime = std::move(runtime);
  record.lease_expiry = now + policy_.timeout;
  record.desired_version = ++next_version_;
  record.restored = false;
  ++record.registration;
  record.lease_streams = 0;
  record.streamed = false;
  record.unreachable_since = absl::InfiniteFuture();
  record.hold_ended = false;
  return record;
}

void WorkerRegistry::Restore(v1::Worker info) {
  std::string id = info.id();
  WorkerRecord& record = workers_[id];
  record.info = std::move(info);
  record.lease_expiry = clock_.Now() + policy_.timeout;
  record.desired_version = ++next_version_;
  record.restored = true;
  ++record.registration;
}

absl::Status WorkerRegistry::Renew(absl::string_view id) {
  auto it = workers_.find(id);
  if (it == workers_.end()) return absl::NotFoundError(absl::StrCat("worker '", id, "' unknown"));
  if (it->second.info.state() == v1::LOST) {
    return absl::FailedPreconditionError(absl::StrCat("worker '", id, "' is LOST"));
  }
  const absl::Time now = clock_.Now();
  WorkerRecord& record = it->second;
  if (!record.streamed) {
    record.lease_expiry = now + policy_.timeout;
  } else if (record.lease_streams > 0) {
    record.lease_expiry = absl::InfiniteFuture();
  }
  record.info.set_last_seen_unix_ms(absl::ToUnixMillis(now));
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> WorkerRegistry::OpenLease(absl::string_view id) {
  auto it = workers_.find(id);
  if (it == workers_.end()) return absl::NotFoundError(absl::StrCat("worker '", id, "' unknown"));
  WorkerRecord& record = it->second;
  if (record.info.state() == v1::LOST) {
    return absl::FailedPreconditionError(absl::StrCat("worker '", id, "' is LOST"));
  }
  ++record.lease_streams;
  record.streamed = true;
  record.lease_expiry = absl::InfiniteFuture();
  record.hold_ended = false;
  record.info.set_last_seen_unix_ms(absl::ToUnixMillis(clock_.Now()));
  return record.registration;
}

void WorkerRegistry::CloseLease(absl::string_view id, uint64_t registration) {
  auto it = workers_.find(id);
  if (it == workers_.end() || it->second.registration != registration) return;
  WorkerRecord& record = it->second;
  if (record.lease_streams == 0) return;
  if (--record.lease_streams > 0) return;
  const absl::Time now = clock_.Now();
  // The link was alive until now, as far as the transport could tell.
  record.info.set_last_seen_unix_ms(absl::ToUnixMillis(now));
  record.lease_expiry = now + policy_.stream_grace;
}

WorkerRegistry::Expiry WorkerRegistry::ExpireLeases() {
  const absl::Time now = clock_.Now();
  Expiry out;
  int live = 0;
  int closing = 0;  // streams closed, still within their grace
  std::vector<WorkerRecord*> expired;
  for (auto& [id, record] : workers_) {
    if (record.info.state() == v1::LOST) continue;
    ++live;
    if (now >= record.lease_expiry) {
      expired.push_back(&record);
    } else {
      if (record.streamed && record.lease_streams == 0) ++closing;
      if (record.unreachable() && !record.hold_ended) {
        record.unreachable_since = absl::InfiniteFuture();
        out.returned.push_back(id);
      }
    }
  }
  // Connections to a coordinator that was cut off break within a ping interval of one another:
  // while others are still within their grace, an expired lease waits (up to a grace more) to see
  // whether this is a mass loss.
  const int down = static_cast<int>(expired.size()) + closing;
  const bool mass_loss = down >= 2 && 2 * down > live;
  out.down = down;
  out.live = live;
  if (!mass_loss && closing > 0) {
    std::vector<WorkerRecord*> now_due;
    for (WorkerRecord* record : expired) {
      if (now >= record->lease_expiry + policy_.stream_grace) now_due.push_back(record);
    }
    expired.swap(now_due);
  }
  for (WorkerRecord* record : expired) {
    if (mass_loss &&
        (!record->unreachable() || now - record->unreachable_since < policy_.mass_loss_hold)) {
      if (!record->unreachable()) {
        record->unreachable_since = now;
        out.held.push_back(record->info.id());
      }
      continue;
    }
    if (!mass_loss && record->unreachable() && !record->hold_ended &&
        now - record->unreachable_since < policy_.mass_loss_hold) {
      // The others are back: the rest of the partition heals a moment apart.
      record->hold_ended = true;
      record->lease_expiry = now + policy_.timeout;
      continue;
    }
    record->info.set_state(v1::LOST);
    record->unreachable_since = absl::InfiniteFuture();
    record->hold_ended = false;
    record->desired_version = ++next_version_;
    out.lost.push_back(record->info.id());
  }
  return out;
}

absl::Status WorkerRegistry::SetState(absl::string_view id, v1::WorkerState state) {
  auto it = workers_.find(id);
  if (it == workers_.end()) return absl::NotFoundError(absl::StrCat("worker '", id, "' unknown"));
  it->second.info.set_state(state);
  return absl::OkStatus();
}

void WorkerRegistry::PutBack(WorkerRecord record) {
  std::string id = record.info.id();
  record.desired_version = ++next_version_;
  workers_[id] = std::move(record);
}

void WorkerRegistry::Remove(absl::string_view id) {
  auto it = workers_.find(id);
  if (it != workers_.end()) workers_.erase(it);
}

void WorkerRegistry::BumpVersion(absl::string_view id) {
  auto it = workers_.find(id);
  if (it != workers_.end()) it->second.desired_version = ++next_version_;
}

const WorkerRecord* WorkerRegistry::Find(absl::string_view id) const {
  auto it = workers_.find(id);
  return it == workers_.end() ? nullptr : &it->second;
}

std::vector<const WorkerRecord*> WorkerRegistry::All() const {
  std::vector<const WorkerRecord*> out;
  out.reserve(workers_.size());
  for (const auto& [id, record] : workers_) out.push_back(&record);
  return out;
}

}  // namespace trainyard
