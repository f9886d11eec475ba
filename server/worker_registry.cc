#include "server/worker_registry.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace trainyard {

WorkerRegistry::WorkerRegistry(const Clock& clock, absl::Duration lease_timeout)
    : clock_(clock),
      lease_timeout_(lease_timeout),
      // Versions start from the clock so that a restarted coordinator never hands out a version
      // an agent already knows from before the restart.
      next_version_(static_cast<uint64_t>(std::max<int64_t>(absl::ToUnixMillis(clock.Now()), 1))) {}

const WorkerRecord& WorkerRegistry::Register(v1::Worker info) {
  const absl::Time now = clock_.Now();
  if (info.state() != v1::DRAINING) info.set_state(v1::READY);
  info.set_registered_unix_ms(absl::ToUnixMillis(now));
  info.set_last_seen_unix_ms(absl::ToUnixMillis(now));
  std::string id = info.id();
  WorkerRecord& record = workers_[id];
  record.info = std::move(info);
  record.lease_expiry = now + lease_timeout_;
  record.desired_version = ++next_version_;
  record.restored = false;
  return record;
}

void WorkerRegistry::Restore(v1::Worker info) {
  std::string id = info.id();
  WorkerRecord& record = workers_[id];
  record.info = std::move(info);
  record.lease_expiry = clock_.Now() + lease_timeout_;
  record.desired_version = ++next_version_;
  record.restored = true;
}

absl::Status WorkerRegistry::Renew(absl::string_view id) {
  auto it = workers_.find(id);
  if (it == workers_.end()) return absl::NotFoundError(absl::StrCat("worker '", id, "' unknown"));
  if (it->second.info.state() == v1::LOST) {
    return absl::FailedPreconditionError(absl::StrCat("worker '", id, "' is LOST"));
  }
  const absl::Time now = clock_.Now();
  it->second.lease_expiry = now + lease_timeout_;
  it->second.info.set_last_seen_unix_ms(absl::ToUnixMillis(now));
  return absl::OkStatus();
}

std::vector<std::string> WorkerRegistry::ExpireLeases() {
  const absl::Time now = clock_.Now();
  std::vector<std::string> lost;
  for (auto& [id, record] : workers_) {
    if (record.info.state() == v1::LOST) continue;
    if (now >= record.lease_expiry) {
      record.info.set_state(v1::LOST);
      record.desired_version = ++next_version_;
      lost.push_back(id);
    }
  }
  return lost;
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
