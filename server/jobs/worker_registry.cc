#include "server/jobs/worker_registry.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/rpc/channel.h"

namespace trainyard {

namespace {
// "1m12s", "800ms": to the second from ten seconds on.
std::string Rounded(absl::Duration d) {
  return absl::FormatDuration(
      absl::Trunc(d, d < absl::Seconds(10) ? absl::Milliseconds(100) : absl::Seconds(1)));
}
}  // namespace

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
  record.lease_streams = 0;
  record.streamed = false;
  record.unreachable_since = absl::InfiniteFuture();
  record.hold_ended = false;
  // Streams of the earlier registration end nothing now, and are not ended by the coordinator.
  record.stream_ends.clear();
  record.beating_stream = 0;
  record.heard = now;
  record.beats_due_from = now;
  record.probed_at = absl::InfiniteFuture();
  record.silenced = false;
  return record;
}

static_assert(kSeveralCoordinatorsPingMs + kSeveralCoordinatorsPingTimeoutMs == 3000,
              "LeasePolicy::restored_grace: an agent's time to give up a frozen coordinator");

void WorkerRegistry::Restore(v1::Worker info) {
  std::string id = info.id();
  WorkerRecord& record = workers_[id];
  record.info = std::move(info);
  record.lease_expiry = clock_.Now() + policy_.timeout + policy_.restored_grace;
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
  WorkerRecord& record = it->second;
  if (!record.streamed) {
    record.lease_expiry = now + policy_.timeout;
  } else if (record.lease_streams > 0) {
    record.lease_expiry = absl::InfiniteFuture();
  }
  record.info.set_last_seen_unix_ms(absl::ToUnixMillis(now));
  return absl::OkStatus();
}

void WorkerRegistry::Heard(absl::string_view id) {
  auto it = workers_.find(id);
  if (it == workers_.end()) return;
  it->second.heard = clock_.Now();
  it->second.probed_at = absl::InfiniteFuture();
}

absl::StatusOr<LeaseTicket> WorkerRegistry::OpenLease(absl::string_view id, bool beats,
                                                      std::function<void()> end) {
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
  const absl::Time now = clock_.Now();
  record.info.set_last_seen_unix_ms(absl::ToUnixMillis(now));
  record.heard = now;
  record.probed_at = absl::InfiniteFuture();
  record.silenced = false;
  const LeaseTicket ticket{++next_stream_};
  record.stream_ends.emplace(ticket.stream, std::move(end));
  if (beats) {
    record.beating_stream = ticket.stream;
    record.beats_due_from = now;
  }
  return ticket;
}

void WorkerRegistry::Beat(absl::string_view id, const LeaseTicket& ticket) {
  auto it = workers_.find(id);
  if (it == workers_.end() || it->second.beating_stream != ticket.stream) return;
  it->second.heard = clock_.Now();
  it->second.probed_at = absl::InfiniteFuture();
}

void WorkerRegistry::CloseLease(absl::string_view id, const LeaseTicket& ticket) {
  auto it = workers_.find(id);
  if (it == workers_.end()) return;
  WorkerRecord& record = it->second;
  // Not there: a stream of an earlier registration, or one CheckBeats ended (and counted closed).
  auto stream = record.stream_ends.find(ticket.stream);
  if (stream == record.stream_ends.end()) return;
  record.stream_ends.erase(stream);
  if (record.beating_stream == ticket.stream) record.beating_stream = 0;
  if (--record.lease_streams > 0) return;
  const absl::Time now = clock_.Now();
  // The link was alive until now, as far as the transport could tell.
  record.info.set_last_seen_unix_ms(absl::ToUnixMillis(now));
  record.lease_expiry = now + policy_.stream_grace;
}

WorkerRegistry::Silence WorkerRegistry::CheckBeats(
    const std::function<bool(const std::string&)>& busy) {
  Silence out;
  if (policy_.beat_timeout <= absl::ZeroDuration()) return out;
  const absl::Time now = clock_.Now();
  bool busy_silent = false;
  for (auto& [id, record] : workers_) {
    if (record.info.state() == v1::LOST || record.restored) continue;
    bool silent = false;
    if (record.probed()) {
      silent = now - record.probed_at >= policy_.beat_timeout;
    } else if (record.beating_stream != 0 && record.lease_streams > 0 &&
               now - std::max(record.heard, record.beats_due_from) >= policy_.beat_timeout) {
      if (busy(id)) {
        silent = true;
        busy_silent = true;
      } else {
        // Idle, and it stays so until its tasks change (BumpVersion): not asked again before.
        record.beats_due_from = now;
      }
    }
    if (!silent) continue;
    record.probed_at = absl::InfiniteFuture();
    record.beating_stream = 0;
    record.silenced = true;
    // What it failed after: its agent's last word (a restart record's detection counts from it).
    record.info.set_last_seen_unix_ms(absl::ToUnixMillis(record.heard));
    if (record.streamed) {
      // Its streams count as closed from now (their handlers' CloseLease, which follows, finds
      // them gone), so that ExpireLeases sees every silent worker of this tick as down together.
      if (record.lease_streams > 0) {
        for (auto& [stream, end] : record.stream_ends) {
          if (end != nullptr) end();
        }
        record.stream_ends.clear();
        record.lease_streams = 0;
        record.lease_expiry = now + policy_.stream_grace;
      }
    } else {
      record.lease_expiry = std::min(record.lease_expiry, now);  // a lease kept by Syncs
    }
    out.silent.push_back(id);
  }
  if (!busy_silent) return out;
  for (auto& [id, record] : workers_) {
    if (record.info.state() == v1::LOST || record.restored || record.probed()) continue;
    // Only a lease that holds now is in question (one held unreachable, or closing, is down).
    if (record.unreachable() ||
        (record.streamed ? record.lease_streams == 0 : now >= record.lease_expiry)) {
      continue;
    }
    if (std::find(out.silent.begin(), out.silent.end(), id) != out.silent.end()) continue;
    if (now - record.heard < policy_.beat_timeout) continue;
    record.probed_at = now;
    out.probe.push_back(id);
  }
  return out;
}

v1::WorkerState WorkerRegistry::ShownState(const WorkerRecord& record, absl::Duration quiet_limit,
                                           std::string* reason) const {
  const v1::WorkerState stored = record.info.state();
  if (stored == v1::LOST) return stored;
  const absl::Time now = clock_.Now();
  std::string why;
  if (record.unreachable()) {
    if (reason != nullptr) {
      *reason = absl::StrCat(
          "unreachable with most workers for ", Rounded(now - record.unreachable_since),
          ": nothing new is placed on it; LOST if it is not back within ",
          Rounded(std::max(absl::ZeroDuration(),
                           record.unreachable_since + policy_.mass_loss_hold - now)));
    }
    return v1::UNREACHABLE;
  }
  if (record.probed()) {
    why = absl::StrCat("asked for a word ", Rounded(now - record.probed_at), " ago, no answer yet");
  } else if (record.silenced) {
    why = "its beats stopped";
  } else if (record.streamed && record.lease_streams == 0) {
    why = "its lease stream closed; it has until its grace ends to open another";
  } else if (now >= record.lease_expiry) {
    why = "its lease ran out; deciding whether it or the coordinator is cut off";
  } else if (record.heard == absl::InfinitePast()) {
    why = "not heard from since this coordinator started";
  } else if (now - record.heard > quiet_limit) {
    why = absl::StrCat("no word for ", Rounded(now - record.heard),
                       " (its long poll is overdue): its agent is held or gone");
  } else {
    return stored;
  }
  if (reason != nullptr) *reason = std::move(why);
  return v1::SUSPECT;
}

WorkerRegistry::Expiry WorkerRegistry::ExpireLeases() {
  const absl::Time now = clock_.Now();
  Expiry out;
  int live = 0;
  int probing = 0;  // asked for a word, not answered yet
  int closing = 0;  // streams closed, still within their grace
  std::vector<WorkerRecord*> expired;
  std::vector<WorkerRecord*> left;  // DRAINING: their agents said they were leaving
  for (auto& [id, record] : workers_) {
    if (record.info.state() == v1::LOST) continue;
    if (record.info.state() == v1::DRAINING && now >= record.lease_expiry) {
      // Gone as announced: no sign of a coordinator cut off, so it counts neither way.
      left.push_back(&record);
      continue;
    }
    ++live;
    if (record.probed()) ++probing;
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
  if (!mass_loss && probing > 0) {
    // Whether this is a mass loss is known once the probes are answered or run out.
    expired.clear();
  } else if (!mass_loss && closing > 0) {
    std::vector<WorkerRecord*> now_due;
    for (WorkerRecord* record : expired) {
      if (now >= record->lease_expiry + policy_.stream_grace) now_due.push_back(record);
    }
    expired.swap(now_due);
  }
  auto mark_lost = [&](WorkerRecord* record) {
    record->info.set_state(v1::LOST);
    record->unreachable_since = absl::InfiniteFuture();
    record->hold_ended = false;
    record->desired_version = ++next_version_;
    out.lost.push_back(record->info.id());
  };
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
    mark_lost(record);
  }
  for (WorkerRecord* record : left) mark_lost(record);  // held by nothing: gone as announced
  return out;
}

absl::Status WorkerRegistry::SetState(absl::string_view id, v1::WorkerState state) {
  auto it = workers_.find(id);
  if (it == workers_.end()) return absl::NotFoundError(absl::StrCat("worker '", id, "' unknown"));
  it->second.info.set_state(state);
  return absl::OkStatus();
}

bool WorkerRegistry::SetGpuFaults(absl::string_view id,
                                  const google::protobuf::RepeatedPtrField<v1::GpuFault>& faults) {
  auto it = workers_.find(id);
  if (it == workers_.end()) return false;
  v1::Worker& info = it->second.info;
  google::protobuf::RepeatedPtrField<v1::GpuFault> kept;
  for (const v1::GpuFault& f : faults) {
    if (f.index() >= 0 && f.index() < info.gpus()) *kept.Add() = f;
  }
  bool same = kept.size() == info.gpu_faults_size();
  for (int i = 0; same && i < kept.size(); ++i) {
    same = kept[i].index() == info.gpu_faults(i).index() &&
           kept[i].reason() == info.gpu_faults(i).reason();
  }
  if (same) return false;
  *info.mutable_gpu_faults() = std::move(kept);
  return true;
}

void WorkerRegistry::PutBack(WorkerRecord record) {
  std::string id = record.info.id();
  record.desired_version = ++next_version_;
  if (auto it = workers_.find(id); it != workers_.end()) {
    // The lease as it is now, not as it was: streams opened and closed meanwhile (the store
    // write lets others in) are the handlers' to close, and must be found.
    const WorkerRecord& now = it->second;
    record.lease_expiry = now.lease_expiry;
    record.lease_streams = now.lease_streams;
    record.streamed = now.streamed;
    record.stream_ends = now.stream_ends;
    record.beating_stream = now.beating_stream;
    record.heard = now.heard;
    record.beats_due_from = now.beats_due_from;
    record.probed_at = now.probed_at;
    record.silenced = now.silenced;
  } else {
    record.stream_ends.clear();
    record.lease_streams = 0;
    record.beating_stream = 0;
  }
  workers_[id] = std::move(record);
}

void WorkerRegistry::Remove(absl::string_view id) {
  auto it = workers_.find(id);
  if (it != workers_.end()) workers_.erase(it);
}

void WorkerRegistry::BumpVersion(absl::string_view id) {
  auto it = workers_.find(id);
  if (it == workers_.end()) return;
  it->second.desired_version = ++next_version_;
  it->second.beats_due_from = clock_.Now();
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
