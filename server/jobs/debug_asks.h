#ifndef TRAINYARD_SERVER_JOBS_DEBUG_ASKS_H_
#define TRAINYARD_SERVER_JOBS_DEBUG_ASKS_H_

// `trainyard debug`'s asks in flight: which tasks each worker's agent must read (their flight
// records, and stacks when asked), and what came back. The JobManager hands each worker its asks
// on Sync and waits for the answers (ReportDebug). Not thread-safe: the JobManager holds it under
// its lock.

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "trainyard/v1/agent_service.pb.h"

namespace trainyard {

class DebugAsks {
 public:
  struct Ask {
    bool stacks = false;
    std::map<std::string, std::vector<std::string>> tasks;     // by worker id
    std::map<std::string, trainyard::v1::RankRecord> records;  // by task id
    std::set<std::string> answered;                            // worker ids
  };

  // Keeps `ask` until Remove; returns its id.
  std::string Add(Ask ask);
  void Remove(const std::string& id);
  // Null once removed.
  const Ask* Find(const std::string& id) const;
  // Every worker asked has answered.
  bool Done(const std::string& id) const;
  // The asks `worker_id` has not answered yet, as Sync carries them.
  std::vector<trainyard::v1::DebugAsk> For(const std::string& worker_id) const;
  // Keeps a worker's answer: the records of the tasks it was asked about (others are ignored).
  // NOT_FOUND for an ask that is over (answered late); PERMISSION_DENIED for a worker not asked.
  absl::Status Answer(const trainyard::v1::ReportDebugRequest& answer);

 private:
  uint64_t next_ = 0;
  std::map<std::string, Ask> asks_;
};

}  // namespace trainyard

#endif  // TRAINYARD_SERVER_JOBS_DEBUG_ASKS_H_
