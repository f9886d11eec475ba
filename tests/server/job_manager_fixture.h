#ifndef TRAINYARD_TESTS_SERVER_JOB_MANAGER_FIXTURE_H_
#define TRAINYARD_TESTS_SERVER_JOB_MANAGER_FIXTURE_H_

// A JobManager on a SQLite store in a temp dir and a fake clock, with helpers that act as the
// agents would.

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "server/jobs/job_manager.h"
#include "server/store/sqlite_job_store.h"
#include "tests/common/fake_clock.h"
#include "tests/server/test_util.h"

namespace trainyard {

class JobManagerTest : public ::testing::Test {
 protected:
  void SetUp() override { Open(); }

  void Open(JobManagerOptions options = {}) {
    options.checkpoint_root = "file:///ckpt";
    options.worker_timeout = absl::Seconds(10);
    // Nothing ticks by itself here: a DeleteJob would wait in vain unless a test ticks beside it.
    options.delete_stop_wait = delete_stop_wait_;
    auto store = SqliteJobStore::Open(dir_.path() + "/state.db");
    ASSERT_TRUE(store.ok()) << store.status();
    auto manager = JobManager::Create(
        clock_, *std::move(store),
        std::make_unique<LogStore>(dir_.path() + "/logs", max_task_log_bytes_), options);
    ASSERT_TRUE(manager.ok()) << manager.status();
    manager_ = *std::move(manager);
  }

  void Reopen(JobManagerOptions options = {}) {
    manager_.reset();
    Open(options);
  }

  void Register(const std::string& name, int slots, int gpus = 0) {
    v1::RegisterWorkerRequest request;
    request.set_name(name);
    request.set_slots(slots);
    request.set_gpus(gpus);
    auto response = manager_->RegisterWorker(request);
    ASSERT_TRUE(response.ok()) << response.status();
    EXPECT_EQ(response->worker_id(), name);
    EXPECT_EQ(response->lease_timeout_ms(), 10000);
  }

  v1::SyncResponse Sync(const std::string& worker, uint64_t known = 0, int64_t wait_ms = 0) {
    v1::SyncRequest request;
    request.set_worker_id(worker);
    request.set_known_version(known);
    request.set_wait_ms(wait_ms);
    auto response = manager_->Sync(request);
    EXPECT_TRUE(response.ok()) << response.status();
    return response.ok() ? *response : v1::SyncResponse();
  }

  absl::Status Report(const std::string& worker, const std::string& task_id, v1::TaskState state,
                      int exit_code = 0, const std::string& message = "", int signal = 0) {
    v1::TaskStatus status;
    status.set_task_id(task_id);
    status.set_state(state);
    status.set_exit_code(exit_code);
    status.set_signal(signal);
    status.set_message(message);
    return manager_->ReportTaskStatus(worker, status);
  }

  std::string Submit(const v1::JobSpec& spec) {
    auto job = manager_->SubmitJob(spec);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? job->id() : "";
  }

  v1::Job Get(const std::string& id) {
    auto job = manager_->GetJob(id);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *job : v1::Job();
  }

  // Submits a one-rank job with `spec` and runs it on w1 (registered) to success as its agent
  // would: placed, running, `log` shipped, a checkpoint of step 10 committed if `checkpoint`,
  // exited 0. Returns its id.
  std::string RunOneRankJob(const v1::JobSpec& spec, const std::string& log,
                            bool checkpoint = false) {
    const std::string id = Submit(spec);
    manager_->Tick();
    const std::string task = id + ".g1.r0";
    EXPECT_TRUE(Report("w1", task, v1::TASK_RUNNING).ok()) << id;
    EXPECT_TRUE(manager_->ShipLogs("w1", task, 0, log).ok()) << id;
    if (checkpoint) {
      v1::CommitCheckpointRequest commit;
      commit.set_job_id(id);
      commit.set_generation(1);
      commit.set_step(10);
      EXPECT_TRUE(manager_->CommitCheckpoint(commit).ok()) << id;
    }
    EXPECT_TRUE(Report("w1", task, v1::TASK_EXITED, 0).ok()) << id;
    return id;
  }

  // Time passes on the fake clock in 5 s steps; the workers in `alive` keep their leases (they
  // sync), and the manager ticks after each step.
  void PassTime(absl::Duration d, const std::vector<std::string>& alive = {}) {
    for (absl::Duration t; t < d; t += absl::Seconds(5)) {
      clock_.Advance(absl::Seconds(5));
      for (const std::string& w : alive) Sync(w);
      manager_->Tick();
    }
  }

  // Every log of the job, as `trainyard logs` (with `follow`, `logs -f`) would print it.
  std::string AllLogs(const std::string& id, bool follow = false) {
    std::string text;
    absl::Status s = manager_->StreamLogs(
        id, {}, follow,
        [&](const v1::TaskInfo&, absl::string_view data) {
          text.append(data.data(), data.size());
          return true;
        },
        [] { return false; });
    EXPECT_TRUE(s.ok()) << s;
    return text;
  }

  static std::vector<std::string> Reasons(const v1::Job& job) {
    std::vector<std::string> out;
    for (const v1::JobEvent& e : job.events()) out.push_back(e.reason());
    return out;
  }

  TempDir dir_;
  int64_t max_task_log_bytes_ = int64_t{64} << 20;
  absl::Duration delete_stop_wait_ = absl::ZeroDuration();
  FakeClock clock_;
  std::unique_ptr<JobManager> manager_;
};

}  // namespace trainyard

#endif  // TRAINYARD_TESTS_SERVER_JOB_MANAGER_FIXTURE_H_
