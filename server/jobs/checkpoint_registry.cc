#include "server/jobs/checkpoint_registry.h"

#include <algorithm>

namespace trainyard {

CheckpointCommitPlan PlanCheckpointCommit(const std::vector<StoredCheckpoint>& records,
                                          const StoredCheckpoint& added, int keep_last) {
  CheckpointCommitPlan plan;
  const int64_t step = added.checkpoint.step();
  for (const StoredCheckpoint& c : records) {
    if (c.checkpoint.step() == step && c.checkpoint.uri() == added.checkpoint.uri()) {
      plan.retry = true;
      plan.records = records;
      for (const StoredCheckpoint& r : records) {
        if (r.retired && r.retired_by_step == step) plan.retired.push_back(r.checkpoint.uri());
      }
      return plan;
    }
  }
  for (const StoredCheckpoint& c : records) {
    if (c.checkpoint.step() == step) continue;
    if (c.retired) {
      plan.removals.emplace_back(c.checkpoint.job_id(), c.checkpoint.step());
      continue;
    }
    plan.records.push_back(c);
  }
  plan.records.push_back(added);
  std::sort(plan.records.begin(), plan.records.end(),
            [](const StoredCheckpoint& a, const StoredCheckpoint& b) {
              return a.checkpoint.step() < b.checkpoint.step();
            });
  plan.upserts.push_back(added);
  const int keep = std::max(keep_last, 0);
  if (keep > 0) {
    int kept = 0;
    for (auto it = plan.records.rbegin(); it != plan.records.rend(); ++it) {
      if (it->retired) continue;
      if (kept < keep) {
        kept++;
        continue;
      }
      it->retired = true;
      it->retired_by_step = step;
      plan.retired.push_back(it->checkpoint.uri());
      plan.upserts.push_back(*it);
    }
  }
  return plan;
}

}  // namespace trainyard
