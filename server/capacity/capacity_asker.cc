#include "server/capacity/capacity_asker.h"

#include <algorithm>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/byte_size.h"
#include "common/log.h"

namespace trainyard {
namespace {

constexpr absl::Duration kMaxBackoff = absl::Minutes(10);
constexpr int kNoLimit = 1 << 20;

// How many tasks of (slots, gpus, memory) fit one node of `shape`.
int PerNode(const NodeShape& shape, int slots, int gpus, int64_t memory) {
  int n = kNoLimit;
  if (slots > 0) n = std::min(n, shape.slots / slots);
  if (gpus > 0) n = std::min(n, shape.gpus / gpus);
  if (memory > 0 && shape.memory_bytes > 0) {
    n = static_cast<int>(std::min<int64_t>(n, shape.memory_bytes / memory));
  }
  return n;
}

int CeilDiv(int a, int b) { return (a + b - 1) / b; }

}  // namespace

CapacityAsker::CapacityAsker(CapacityOptions options, CapacityProvider& provider,
                             const Clock& clock)
    : options_(std::move(options)), provider_(provider), clock_(clock) {}

int CapacityAsker::NodesFor(const WaitingJob& job, std::string* why) const {
  const NodeShape& s = options_.shape;
  const int ranks_per_node = PerNode(s, job.slots_per_rank, job.gpus_per_rank, job.memory_per_rank);
  const int shards_per_node = PerNode(s, job.slots_per_shard, 0, job.memory_per_shard);
  const std::string node =
      absl::StrCat(s.slots, " slots, ", s.gpus, " GPUs",
                   s.memory_bytes > 0 ? absl::StrCat(", ", HumanBytes(s.memory_bytes)) : "");
  if (ranks_per_node == 0) {
    *why = absl::StrCat("a rank needs ", job.slots_per_rank, " slots and ", job.gpus_per_rank,
                        " GPUs; a ", provider_.Name(), " node offers ", node);
    return 0;
  }
  if (job.shards > 0 && shards_per_node == 0) {
    *why = absl::StrCat("a parameter-server shard does not fit a ", provider_.Name(), " node (",
                        node, ")");
    return 0;
  }
  int nodes = CeilDiv(job.ranks, std::min(ranks_per_node, job.ranks));
  if (job.shards > 0) nodes += CeilDiv(job.shards, std::min(shards_per_node, job.shards));
  return nodes;
}

std::string CapacityAsker::Describe(const std::vector<const Allocation*>& mine) {
  std::vector<std::string> parts;
  int nodes = 0;
  for (const Allocation* a : mine) {
    nodes += a->nodes;
    std::string part = absl::StrCat("job ", a->id, " ", a->detail);
    if (a->state == AllocationState::kRunning) absl::StrAppend(&part, ", its agents starting");
    parts.push_back(std::move(part));
  }
  return absl::StrCat(nodes, " node", nodes == 1 ? "" : "s", " (", absl::StrJoin(parts, "; "), ")");
}

std::string CapacityAsker::Ask(const WaitingJob& job, int nodes, int& held) {
  const absl::Time now = clock_.Now();
  const std::string name = provider_.Name();
  if (auto r = refused_.find(job.id); r != refused_.end() && now < r->second.retry_at) {
    return absl::StrCat(
        name, " ", r->second.words, "; asking again in ",
        absl::FormatDuration(absl::Ceil(r->second.retry_at - now, absl::Seconds(1))));
  }
  if (held + nodes > options_.max_nodes) {
    return absl::StrCat("needs ", nodes, " ", name, " nodes; ", held, " of at most ",
                        options_.max_nodes, " are held");
  }
  absl::StatusOr<std::string> id = provider_.Request(job.id, nodes);
  if (!id.ok()) {
    Refuse(job.id, absl::StrCat("refused ", nodes, " node", nodes == 1 ? "" : "s", ": ",
                                id.status().message()));
    const Refusal& r = refused_[job.id];
    return absl::StrCat(name, " ", r.words, "; asking again in ", absl::FormatDuration(r.backoff));
  }
  seen_[*id].job_id = job.id;
  held += nodes;
  LogInfo(absl::StrCat("capacity: asked ", name, " for ", nodes, " nodes for job ", job.id,
                       ": job ", *id));
  return absl::StrCat("asked ", name, " for ", nodes, " node", nodes == 1 ? "" : "s", " (job ", *id,
                      ")");
}

void CapacityAsker::Refuse(const std::string& job_id, std::string words) {
  Refusal& r = refused_[job_id];
  r.backoff = r.backoff == absl::ZeroDuration() ? options_.retry_after
                                                : std::min(r.backoff * 2, kMaxBackoff);
  r.retry_at = clock_.Now() + r.backoff;
  r.words = std::move(words);
  LogWarning(absl::StrCat("capacity: for job ", job_id, ", ", provider_.Name(), " ", r.words));
}

void CapacityAsker::NoteEnded(const std::vector<Allocation>& allocations,
                              const std::set<std::string>& waiting) {
  std::set<std::string> listed;
  for (const Allocation& a : allocations) {
    listed.insert(a.id);
    if (!seen_.count(a.id)) seen_[a.id].job_id = a.job_id;
  }
  for (auto it = seen_.begin(); it != seen_.end();) {
    if (listed.count(it->first)) {
      ++it;
      continue;
    }
    const Seen& gone = it->second;
    if (!gone.used && !gone.job_id.empty() && waiting.count(gone.job_id)) {
      const std::string how = provider_.HowItEnded(it->first);
      Refuse(gone.job_id, absl::StrCat("job ", it->first, " ended before its agents ran anything",
                                       how.empty() ? "" : ": ", how));
    }
    it = seen_.erase(it);
  }
}

std::map<std::string, std::string> CapacityAsker::Round(const std::vector<WaitingJob>& waiting,
                                                        const std::vector<WorkerView>& workers) {
  std::map<std::string, std::string> notes;
  absl::StatusOr<std::vector<Allocation>> listed = provider_.List();
  if (!listed.ok()) {
    const std::string words(listed.status().message());
    if (words != last_error_) LogWarning(absl::StrCat("capacity: ", words));
    last_error_ = words;
    for (const WaitingJob& job : waiting) {
      notes[job.id] = absl::StrCat("cannot ask ", provider_.Name(), " for nodes: ", words);
    }
    return notes;
  }
  last_error_.clear();
  std::set<std::string> waiting_ids;
  for (const WaitingJob& job : waiting) waiting_ids.insert(job.id);
  NoteEnded(*listed, waiting_ids);
  int held = 0;
  std::map<std::string, std::vector<const Allocation*>> by_job;
  for (const Allocation& a : *listed) {
    held += a.nodes;
    if (!a.job_id.empty()) by_job[a.job_id].push_back(&a);
  }
  for (const WaitingJob& job : waiting) {
    std::string why;
    const int nodes = NodesFor(job, &why);
    if (nodes == 0) {
      notes[job.id] = absl::StrCat("no ", provider_.Name(), " node fits it: ", why);
    } else if (auto mine = by_job.find(job.id); mine != by_job.end()) {
      notes[job.id] = absl::StrCat("asked ", provider_.Name(), " for ", Describe(mine->second));
    } else {
      notes[job.id] = Ask(job, nodes, held);
    }
  }
  std::map<std::string, bool> busy;
  for (const WorkerView& w : workers) busy[w.id] = w.busy;
  GiveBack(*listed, waiting_ids, busy);
  for (auto it = refused_.begin(); it != refused_.end();) {
    it = waiting_ids.count(it->first) ? std::next(it) : refused_.erase(it);
  }
  return notes;
}

void CapacityAsker::GiveBack(const std::vector<Allocation>& allocations,
                             const std::set<std::string>& waiting,
                             const std::map<std::string, bool>& busy) {
  const absl::Time now = clock_.Now();
  for (const Allocation& a : allocations) {
    Seen& seen = seen_[a.id];  // every listed allocation is there (NoteEnded)
    const bool wanted = !a.job_id.empty() && waiting.count(a.job_id);
    std::string why;
    if (a.state == AllocationState::kPending) {
      if (!wanted) why = "no job waits for it any more";
    } else if (a.state == AllocationState::kRunning) {
      bool ran = false;
      for (const std::string& node : a.node_names) {
        auto w = busy.find(options_.worker_prefix + node);
        ran = ran || (w != busy.end() && w->second);
      }
      seen.used = seen.used || ran;
      if (wanted || ran) {
        seen.idle_since.reset();
        continue;
      }
      if (!seen.idle_since.has_value()) seen.idle_since = now;
      if (now - *seen.idle_since >= options_.idle_timeout) {
        why = absl::StrCat("its agents ran nothing for ",
                           absl::FormatDuration(now - *seen.idle_since));
      }
    }
    if (why.empty()) continue;
    if (absl::Status s = provider_.Release(a.id); !s.ok()) {
      LogWarning(absl::StrCat("capacity: could not give back ", provider_.Name(), " job ", a.id,
                              ": ", s.message()));
      continue;
    }
    LogInfo(absl::StrCat("capacity: gave back ", provider_.Name(), " job ", a.id, ": ", why));
  }
}

}  // namespace trainyard
