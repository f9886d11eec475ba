#ifndef TRAINYARD_SERVER_CAPACITY_CAPACITY_ASKER_H_
#define TRAINYARD_SERVER_CAPACITY_CAPACITY_ASKER_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/clock.h"
#include "server/capacity/capacity_provider.h"

namespace trainyard {

struct CapacityOptions {
  NodeShape shape;    // what each node of the provider offers
  int max_nodes = 4;  // the most nodes held at once, asked for or running
  // An allocation whose agents have run nothing for this long is given back.
  absl::Duration idle_timeout = absl::Minutes(5);
  // After the provider refuses an ask, the job's next ask waits this long, doubling to 10 min.
  absl::Duration retry_after = absl::Seconds(30);
  std::string worker_prefix;  // an agent's worker name: this and its node's name
};

// A job that waits for capacity, and what its gang needs.
struct WaitingJob {
  std::string id;
  int ranks = 1;
  int slots_per_rank = 1;
  int gpus_per_rank = 0;
  int64_t memory_per_rank = 0;
  int shards = 0;
  int slots_per_shard = 1;
  int64_t memory_per_shard = 0;
};

// A worker as the asker sees it: whether it runs anything.
struct WorkerView {
  std::string id;
  bool busy = false;
};

// Decides when to ask a CapacityProvider for nodes and when to give them back. Each Round:
//  - a waiting job without an allocation of its own gets one, of as many nodes as its gang needs
//    (never past max_nodes in all); a refused ask, or an allocation that ended before its agents
//    ran anything, is retried after a backoff;
//  - an allocation still pending for a job that no longer waits is cancelled; a running one
//    whose agents have run nothing for idle_timeout (and whose job does not wait for it) is given
//    back;
//  - every waiting job gets a note for its reason: what was asked, with the provider's ids and
//    words.
// Not thread-safe: one loop calls it (CapacityLoop).
class CapacityAsker {
 public:
  CapacityAsker(CapacityOptions options, CapacityProvider& provider, const Clock& clock);

  // `waiting` in queue order. Returns job id -> note.
  std::map<std::string, std::string> Round(const std::vector<WaitingJob>& waiting,
                                           const std::vector<WorkerView>& workers);

  // The nodes of this shape a job needs; 0 when one of its tasks fits no node (`why` says so).
  int NodesFor(const WaitingJob& job, std::string* why) const;

 private:
  struct Refusal {
    absl::Time retry_at;
    absl::Duration backoff;
    std::string words;
  };
  std::string Ask(const WaitingJob& job, int nodes, int& held);
  void Refuse(const std::string& job_id, std::string words);
  // Allocations that ended before their agents ran anything count as refusals of their jobs.
  void NoteEnded(const std::vector<Allocation>& allocations, const std::set<std::string>& waiting);
  void GiveBack(const std::vector<Allocation>& allocations, const std::set<std::string>& waiting,
                const std::map<std::string, bool>& busy);
  static std::string Describe(const std::vector<const Allocation*>& mine);

  const CapacityOptions options_;
  CapacityProvider& provider_;
  const Clock& clock_;
  std::map<std::string, Refusal> refused_;  // by job id
  // The allocations seen, by id (dropped once they leave the provider's list): their job,
  // whether their agents ever ran anything, and since when they have run nothing.
  struct Seen {
    std::string job_id;
    bool used = false;
    std::optional<absl::Time> idle_since;
  };
  std::map<std::string, Seen> seen_;
  std::string last_error_;  // of the provider's List, logged once
};

}  // namespace trainyard

#endif  // TRAINYARD_SERVER_CAPACITY_CAPACITY_ASKER_H_
