#ifndef TRAINYARD_SERVER_CAPACITY_CAPACITY_LOOP_H_
#define TRAINYARD_SERVER_CAPACITY_CAPACITY_LOOP_H_

#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "server/capacity/capacity_asker.h"
#include "server/capacity/capacity_provider.h"
#include "server/jobs/job_manager.h"
#include "trainyard/v1/job.pb.h"

namespace trainyard {

// The pending jobs that wait for capacity (no workers, none that fit, or waiting for some to free
// up, not for a queue's quota or a preemption under way), in queue order, with their gangs' needs.
std::vector<WaitingJob> WaitingForCapacity(const std::vector<trainyard::v1::Job>& pending);

// Runs the CapacityAsker every `interval` beside the job manager: the waiting jobs and the
// workers from the manager, the notes back into the jobs' reasons.
class CapacityLoop {
 public:
  CapacityLoop(JobManager& manager, std::unique_ptr<CapacityProvider> provider,
               CapacityOptions options, absl::Duration interval, const Clock& clock);
  ~CapacityLoop();
  CapacityLoop(const CapacityLoop&) = delete;
  CapacityLoop& operator=(const CapacityLoop&) = delete;

  void Start();
  void Stop();  // waits for a round under way to end
  void RoundOnce();

 private:
  JobManager& manager_;
  std::unique_ptr<CapacityProvider> provider_;
  CapacityAsker asker_;
  const absl::Duration interval_;
  const Clock& clock_;
  absl::Mutex mu_;
  absl::CondVar wake_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace trainyard

#endif  // TRAINYARD_SERVER_CAPACITY_CAPACITY_LOOP_H_
