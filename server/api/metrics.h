#ifndef TRAINYARD_SERVER_API_METRICS_H_
#define TRAINYARD_SERVER_API_METRICS_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"
#include "server/jobs/metrics_sink.h"

namespace trainyard {

// The coordinator's Prometheus metrics (listed in docs/operations.md, "Metrics"). Counters and
// histograms are updated as the JobManager reports events; gauges are computed from a JobManager
// snapshot on every scrape, so they always agree with the state (jobs by state add up to the jobs
// the coordinator knows). Per-job series carry the label `job` (the job id) and exist while the
// job has been placed and is not final.
//
// Register it with an Exposer through a shared_ptr. Thread-safe.
class CoordinatorMetrics final : public JobEventSink, public prometheus::Collectable {
 public:
  CoordinatorMetrics();
  ~CoordinatorMetrics() override;

  // Where the gauges come from; until set, Collect returns the counters and histograms only.
  // `source` is called on the scraping thread without any of this class's locks held.
  void SetSnapshotSource(std::function<ClusterMetricsSnapshot()> source);
  // Whether this coordinator leads (trainyard_coordinator_leader); 0 until set.
  void SetLeader(bool leading);

  // JobEventSink.
  void OnJobSubmitted(const trainyard::v1::Job& job) override;
  void OnJobTransition(const trainyard::v1::Job& job, trainyard::v1::JobState from,
                       trainyard::v1::JobState to, absl::string_view reason,
                       absl::Time now) override;
  void OnProgress(absl::string_view job_id, int64_t step, absl::Time now) override;
  void OnCheckpointCommitted(absl::string_view job_id, int64_t step, absl::Time now,
                             absl::Time save_started) override;
  void OnWorkerLost(absl::string_view worker_id) override;
  void OnRestart(const trainyard::v1::Job& job, const trainyard::v1::Restart& restart) override;
  void OnTaskOutOfMemory(const trainyard::v1::Job& job,
                         const trainyard::v1::TaskInfo& task) override;
  void OnRecovered(const trainyard::v1::Job& job, const trainyard::v1::Restart& restart) override;

  // prometheus::Collectable.
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  struct JobTrack {
    // (step, when a report first showed it), oldest first, bounded: for commit latency.
    std::deque<std::pair<int64_t, absl::Time>> steps;
    double last_commit_latency_seconds = -1;
  };

  static void AddSearchFamilies(const ClusterMetricsSnapshot& snap,
                                std::vector<prometheus::MetricFamily>& out);
  static void AddJobFamilies(const ClusterMetricsSnapshot& snap,
                             const absl::flat_hash_map<std::string, double>& commit_latency,
                             std::vector<prometheus::MetricFamily>& out);

  const std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Counter& submissions_;
  prometheus::Family<prometheus::Counter>& finished_;
  prometheus::Histogram& scheduling_latency_;
  prometheus::Family<prometheus::Counter>& restarts_;
  prometheus::Family<prometheus::Counter>& preemptions_;
  prometheus::Family<prometheus::Counter>& out_of_memory_;
  prometheus::Gauge& leader_;
  prometheus::Counter& steps_lost_;
  prometheus::Histogram& recovery_;
  prometheus::Family<prometheus::Histogram>& recovery_phases_;
  prometheus::Histogram& commit_latency_;
  prometheus::Counter& workers_lost_;

  mutable absl::Mutex mu_;
  std::function<ClusterMetricsSnapshot()> source_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, JobTrack> tracks_ ABSL_GUARDED_BY(mu_);
};

// The `reason` label of trainyard_preemptions_total for a preemption restart's message (which
// names how the notice came): "cloud_notice", "termination_signal" or "other".
std::string PreemptionReasonLabel(absl::string_view message);

}  // namespace trainyard

#endif  // TRAINYARD_SERVER_API_METRICS_H_
