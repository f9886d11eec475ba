// GPUs that their agents took out of service, as the JobManager keeps them: nothing is placed
// on them, a rank whose GPU failed restarts as for a lost worker, and an admin's return asks the
// agent to check a GPU again.

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/jobs/job_manager.h"
#include "tests/server/job_manager_fixture.h"

namespace trainyard {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

v1::GpuFault Fault(int index, const std::string& reason) {
  v1::GpuFault f;
  f.set_index(index);
  f.set_reason(reason);
  f.set_since_unix_ms(1'700'000'000'000);
  return f;
}

class GpuFaultsTest : public JobManagerTest {
 protected:
  v1::SyncResponse SyncWith(const std::string& worker, const std::vector<v1::GpuFault>& faults,
                            uint64_t known = 0) {
    v1::SyncRequest request;
    request.set_worker_id(worker);
    request.set_known_version(known);
    for (const v1::GpuFault& f : faults) *request.add_gpu_faults() = f;
    auto response = manager_->Sync(request);
    EXPECT_TRUE(response.ok()) << response.status();
    return response.ok() ? *response : v1::SyncResponse();
  }
  v1::Worker WorkerNamed(const std::string& id) {
    for (const v1::Worker& w : manager_->ListWorkers()) {
      if (w.id() == id) return w;
    }
    ADD_FAILURE() << "no worker " << id;
    return v1::Worker();
  }
};

TEST_F(GpuFaultsTest, NothingIsPlacedOnAGpuOutOfServiceUntilItIsBack) {
  Register("g1", 4, /*gpus=*/2);
  SyncWith("g1", {Fault(1, "XID 79 (the GPU fell off the bus)")});
  EXPECT_THAT(WorkerNamed("g1").gpu_faults(), testing::SizeIs(1));
  EXPECT_EQ(WorkerNamed("g1").gpu_faults(0).reason(), "XID 79 (the GPU fell off the bus)");
  const std::string two = Submit(TestSpec("two-gpus", 1, 1, /*gpus=*/2));
  manager_->Tick();
  EXPECT_EQ(Get(two).state(), v1::PENDING);
  EXPECT_THAT(Get(two).reason(), HasSubstr("GPU"));
  // One GPU still serves.
  const std::string one = Submit(TestSpec("one-gpu", 1, 1, /*gpus=*/1));
  manager_->Tick();
  EXPECT_EQ(Get(one).state(), v1::SCHEDULED);
  ASSERT_TRUE(manager_->CancelJob(one, "").ok());
  ASSERT_TRUE(Report("g1", one + ".g1.r0", v1::TASK_STOPPED, 143).ok());
  // The agent reports it back in service: the job that needs both is placed.
  SyncWith("g1", {});
  EXPECT_THAT(WorkerNamed("g1").gpu_faults(), IsEmpty());
  manager_->Tick();
  EXPECT_EQ(Get(two).state(), v1::SCHEDULED) << Get(two).reason();
}

TEST_F(GpuFaultsTest, ARegistrationCarriesItsFaultsAndIgnoresGpusItLacks) {
  v1::RegisterWorkerRequest request;
  request.set_name("g2");
  request.set_slots(2);
  request.set_gpus(2);
  *request.add_gpu_faults() = Fault(0, "2 uncorrectable ECC errors");
  *request.add_gpu_faults() = Fault(7, "no such GPU");
  ASSERT_TRUE(manager_->RegisterWorker(request).ok());
  const v1::Worker w = WorkerNamed("g2");
  ASSERT_EQ(w.gpu_faults_size(), 1);
  EXPECT_EQ(w.gpu_faults(0).index(), 0);
  // Kept across a coordinator restart with the worker's record.
  Reopen();
  const v1::Worker again = WorkerNamed("g2");
  ASSERT_EQ(again.gpu_faults_size(), 1);
  EXPECT_EQ(again.gpu_faults(0).reason(), "2 uncorrectable ECC errors");
}

TEST_F(GpuFaultsTest, ARankWhoseGpuFailedRestartsAsForALostWorker) {
  Register("g1", 1, /*gpus=*/1);
  const std::string id = Submit(TestSpec("on-gpu", 1, 1, /*gpus=*/1));
  manager_->Tick();
  ASSERT_TRUE(Report("g1", id + ".g1.r0", v1::TASK_RUNNING).ok());
  v1::TaskStatus status;
  status.set_task_id(id + ".g1.r0");
  status.set_state(v1::TASK_STOPPED);
  status.set_signal(9);
  status.set_message("GPU 0 failed: XID 79 (the GPU fell off the bus); stopped");
  status.set_gpu_fault("XID 79 (the GPU fell off the bus)");
  ASSERT_TRUE(manager_->ReportTaskStatus("g1", status).ok());
  const v1::Job job = Get(id);
  ASSERT_EQ(job.restarts_size(), 1) << job.reason();
  EXPECT_EQ(job.restarts(0).reason(), v1::WORKER_LOST);
  EXPECT_EQ(job.tasks(0).gpu_fault(), "XID 79 (the GPU fell off the bus)");
}

TEST_F(GpuFaultsTest, AReturnedGpuIsAskedOfItsAgentUntilSettled) {
  Register("g1", 2, /*gpus=*/2);
  EXPECT_EQ(manager_->ReturnGpu("nope", 0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(manager_->ReturnGpu("g1", 1).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(manager_->ReturnGpu("g1", 5).status().code(), absl::StatusCode::kFailedPrecondition);
  const v1::SyncResponse first = SyncWith("g1", {Fault(1, "PCIe link x8 of x16")});
  EXPECT_THAT(first.return_gpus(), IsEmpty());
  auto returned = manager_->ReturnGpu("g1", 1);
  ASSERT_TRUE(returned.ok()) << returned.status();
  EXPECT_EQ(returned->id(), "g1");
  // The return wakes the agent's long poll and rides on each answer while the fault stands.
  v1::SyncResponse asked = SyncWith("g1", {Fault(1, "PCIe link x8 of x16")}, first.version());
  EXPECT_THAT(asked.return_gpus(), ElementsAre(1));
  EXPECT_THAT(SyncWith("g1", {Fault(1, "PCIe link x8 of x16")}).return_gpus(), ElementsAre(1));
  // The check passed: the agent reports no fault, and is asked no more.
  EXPECT_THAT(SyncWith("g1", {}).return_gpus(), IsEmpty());
  // A check that keeps failing: asked for kGpuReturnFor, then no more.
  SyncWith("g1", {Fault(0, "HW slowdown")});
  ASSERT_TRUE(manager_->ReturnGpu("g1", 0).ok());
  EXPECT_THAT(SyncWith("g1", {Fault(0, "HW slowdown")}).return_gpus(), ElementsAre(0));
  clock_.Advance(JobManager::kGpuReturnFor + absl::Seconds(1));
  EXPECT_THAT(SyncWith("g1", {Fault(0, "HW slowdown")}).return_gpus(), IsEmpty());
}

}  // namespace
}  // namespace trainyard
