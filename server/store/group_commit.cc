#include "server/store/group_commit.h"

#include <algorithm>
#include <iterator>
#include <utility>
#include <vector>

namespace trainyard {
namespace {

template <typename T>
void Append(std::vector<T>& into, std::vector<T>& from) {
  if (into.empty()) {
    into = std::move(from);
    return;
  }
  into.insert(into.end(), std::make_move_iterator(from.begin()),
              std::make_move_iterator(from.end()));
}

}  // namespace

void MergeMutation(StoreMutation& into, StoreMutation from) {
  // Removals apply after the writes of a transaction: what `from` writes again after `into`
  // removed it stays.
  auto unremove = [](std::vector<std::string>& removed, const std::string& id) {
    removed.erase(std::remove(removed.begin(), removed.end(), id), removed.end());
  };
  for (const StoredJob& j : from.jobs) unremove(into.removed_jobs, j.job.id());
  for (const trainyard::v1::Worker& w : from.workers) unremove(into.removed_workers, w.id());
  for (const StoredCheckpoint& c : from.checkpoints) {
    const std::pair<std::string, int64_t> key(c.checkpoint.job_id(), c.checkpoint.step());
    into.removed_checkpoints.erase(
        std::remove(into.removed_checkpoints.begin(), into.removed_checkpoints.end(), key),
        into.removed_checkpoints.end());
  }
  Append(into.jobs, from.jobs);
  Append(into.events, from.events);
  Append(into.tasks, from.tasks);
  Append(into.workers, from.workers);
  Append(into.checkpoints, from.checkpoints);
  Append(into.progress, from.progress);
  if (from.next_job_seq.has_value()) {
    into.next_job_seq = std::max(into.next_job_seq.value_or(0), *from.next_job_seq);
  }
  Append(into.removed_jobs, from.removed_jobs);
  Append(into.removed_workers, from.removed_workers);
  // Trims remove from the middle of a job's events, after every insert of the transaction: as
  // long as each one left at least its own count after keep_first, the result is the same.
  Append(into.trimmed_events, from.trimmed_events);
  Append(into.removed_checkpoints, from.removed_checkpoints);
  Append(into.tokens, from.tokens);
}

std::shared_ptr<GroupCommitter::Ticket> GroupCommitter::Enqueue(StoreMutation mutation) {
  auto ticket = std::make_shared<Ticket>();
  ticket->mutation = std::move(mutation);
  absl::MutexLock lock(&mu_);
  queue_.push_back(ticket);
  return ticket;
}

absl::Status GroupCommitter::Wait(const std::shared_ptr<Ticket>& ticket) {
  absl::MutexLock lock(&mu_);
  while (!ticket->done) {
    if (committing_) {
      done_.Wait(&mu_);
      continue;
    }
    // Lead: commit everything queued so far, ours included.
    committing_ = true;
    std::vector<std::shared_ptr<Ticket>> group(queue_.begin(), queue_.end());
    queue_.clear();
    mu_.Unlock();
    int64_t transactions = 0;
    std::vector<absl::Status> results(group.size());
    if (group.size() == 1) {
      results[0] = store_->Apply(group[0]->mutation);
      transactions = 1;
    } else {
      StoreMutation merged;
      for (const auto& t : group) MergeMutation(merged, t->mutation);
      const absl::Status all = store_->Apply(merged);
      transactions = 1;
      if (all.ok()) {
        std::fill(results.begin(), results.end(), absl::OkStatus());
      } else {
        // Find who is to blame: each on its own, in order.
        for (size_t i = 0; i < group.size(); ++i) {
          results[i] = store_->Apply(group[i]->mutation);
          transactions++;
        }
      }
    }
    mu_.Lock();
    for (size_t i = 0; i < group.size(); ++i) {
      group[i]->status = results[i];
      group[i]->done = true;
      group[i]->mutation = StoreMutation();  // free it now, not when the last owner lets go
      mutations_ += results[i].ok();
    }
    transactions_ += transactions;
    committing_ = false;
    done_.SignalAll();
  }
  return ticket->status;
}

int64_t GroupCommitter::transactions() const {
  absl::MutexLock lock(&mu_);
  return transactions_;
}

int64_t GroupCommitter::mutations() const {
  absl::MutexLock lock(&mu_);
  return mutations_;
}

}  // namespace trainyard
