#include "client/format.h"

#include "absl/strings/str_cat.h"
#include "client/commands.h"
#include "client/views.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "yaml-cpp/yaml.h"

namespace trainyard::cli {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(FormatTest, ProgressBar) {
  EXPECT_EQ(ProgressBar(0), "[----------]");
  EXPECT_EQ(ProgressBar(0.24), "[##--------]");
  EXPECT_EQ(ProgressBar(0.5), "[#####-----]");
  EXPECT_EQ(ProgressBar(1), "[##########]");
  EXPECT_EQ(ProgressBar(1.7), "[##########]");
  EXPECT_EQ(ProgressBar(-1, 4), "[----]");
}

TEST(FormatTest, ProgressLine) {
  v1::JobProgress p;
  p.set_step(120);
  p.set_total_steps(500);
  p.set_loss(0.43121);
  p.set_samples_per_second(1234.4);
  EXPECT_EQ(ProgressLine(p, absl::Seconds(42)),
            "[##--------] step 120/500 24%  loss 0.4312  1,234 samples/s  ETA 0:42");
  EXPECT_EQ(ProgressLine(p, std::nullopt),
            "[##--------] step 120/500 24%  loss 0.4312  1,234 samples/s");
  p.set_total_steps(0);
  p.set_samples_per_second(0);
  EXPECT_EQ(ProgressLine(p, absl::Seconds(42)), "step 120  loss 0.4312");
  p.set_has_val_accuracy(true);
  p.set_val_accuracy(0.9712);
  EXPECT_THAT(ProgressLine(p, std::nullopt), HasSubstr("val acc 97.1%"));
  EXPECT_THAT(ProgressLine(p, std::nullopt), Not(HasSubstr("val loss")));
  p.set_has_val_loss(true);
  p.set_val_loss(1.23456);
  EXPECT_THAT(ProgressLine(p, std::nullopt), HasSubstr("val acc 97.1%  val loss 1.2346"));
}

TEST(FormatTest, Numbers) {
  EXPECT_EQ(GroupThousands(0), "0");
  EXPECT_EQ(GroupThousands(999), "999");
  EXPECT_EQ(GroupThousands(1234), "1,234");
  EXPECT_EQ(GroupThousands(1234567), "1,234,567");
  EXPECT_EQ(GroupThousands(-1000), "-1,000");
  // Counts say "1 shard", never "1 shards".
  EXPECT_EQ(Counted(1, "shard"), "1 shard");
  EXPECT_EQ(Counted(0, "shard"), "0 shards");
  EXPECT_EQ(Counted(1500, "sample"), "1,500 samples");
}

TEST(FormatTest, Durations) {
  EXPECT_EQ(ClockDuration(absl::Seconds(42)), "0:42");
  EXPECT_EQ(ClockDuration(absl::Seconds(725)), "12:05");
  EXPECT_EQ(ClockDuration(absl::Seconds(3723)), "1:02:03");
  EXPECT_EQ(ClockDuration(absl::Seconds(-5)), "0:00");
  EXPECT_EQ(ShortAge(absl::Seconds(45)), "45s");
  EXPECT_EQ(ShortAge(absl::Minutes(12)), "12m");
  EXPECT_EQ(ShortAge(absl::Hours(3)), "3h");
  EXPECT_EQ(ShortAge(absl::Hours(50)), "2d");
}

TEST(FormatTest, Sizes) {
  EXPECT_EQ(HumanBytes(0), "0 B");
  EXPECT_EQ(HumanBytes(512), "512 B");
  EXPECT_EQ(HumanBytes(1536), "1.5 KiB");
  EXPECT_EQ(HumanBytes(20 * 1024 * 1024), "20.0 MiB");
  EXPECT_EQ(HumanBytes(int64_t{3} * 1024 * 1024 * 1024 + 200 * 1024 * 1024), "3.2 GiB");
}

TEST(FormatTest, TimesAndTruncation) {
  EXPECT_EQ(LocalTime(0), "-");
  EXPECT_EQ(LocalTime(1'700'000'000'000, absl::UTCTimeZone()), "2023-11-14T22:13:20+00:00");
  EXPECT_EQ(Truncate("short", 10), "short");
  EXPECT_EQ(Truncate("a much longer reason", 10), "a much ...");
}

TEST(FormatTest, TableAlignsColumns) {
  EXPECT_EQ(Table({"ID", "STATE"}, {{"j-1", "RUNNING"}, {"job-22", "PENDING"}}),
            "ID      STATE\n"
            "j-1     RUNNING\n"
            "job-22  PENDING\n");
  EXPECT_EQ(Table({"A", "B"}, {}), "A  B\n");
}

TEST(FormatTest, StateNames) {
  EXPECT_EQ(JobStateName(v1::RUNNING), "RUNNING");
  EXPECT_EQ(TaskStateName(v1::TASK_EXITED), "EXITED");
  EXPECT_EQ(ParseJobState("failed"), v1::FAILED);
  EXPECT_EQ(ParseJobState("bogus"), v1::JOB_STATE_UNSPECIFIED);
}

TEST(FormatTest, EtaFromTheObservedStepRate) {
  EtaEstimator eta;
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  eta.Observe(t0, 100);
  EXPECT_FALSE(eta.Eta(500).has_value());
  eta.Observe(t0 + absl::Seconds(10), 200);  // 10 steps/s
  ASSERT_TRUE(eta.Eta(500).has_value());
  EXPECT_EQ(*eta.Eta(500), absl::Seconds(30));
}

TEST(ViewsTest, JobsTable) {
  v1::Job job;
  job.set_id("j-1");
  job.set_name("mnist");
  job.set_owner("alice");
  job.set_state(v1::FAILED);
  job.set_reason(std::string(100, 'x'));
  job.set_created_unix_ms(1'700'000'000'000);
  job.mutable_progress()->set_step(10);
  job.mutable_progress()->set_total_steps(100);
  job.mutable_progress()->set_loss(1.5);
  const absl::Time now = absl::FromUnixMillis(1'700'000'000'000) + absl::Minutes(5);
  const std::string tty = JobsTable({job}, now, /*terminal=*/true);
  EXPECT_THAT(tty, HasSubstr("ID   NAME   OWNER  STATE   STEP    LOSS    AGE  REASON"));
  EXPECT_THAT(tty, HasSubstr("j-1  mnist  alice  FAILED  10/100  1.5000  5m   xxx"));
  EXPECT_THAT(tty, HasSubstr("..."));
  EXPECT_THAT(JobsTable({job}, now, /*terminal=*/false), HasSubstr(std::string(100, 'x')));
}

TEST(ViewsTest, WorkersAndCheckpointsTables) {
  v1::Worker w;
  w.set_id("worker-1");
  w.set_address("127.0.0.1");
  w.set_state(v1::READY);
  w.set_slots(4);
  w.set_slots_used(1);
  w.set_last_seen_unix_ms(1'700'000'000'000);
  EXPECT_EQ(
      WorkersTable({w}, absl::FromUnixMillis(1'700'000'002'000)),
      "ID        ADDRESS    HOST  PID  STATE  SLOTS  GPUS  MEMORY  LIMITS  LIBTORCH  LAST SEEN  "
      "TASKS\n"
      "worker-1  127.0.0.1  -     -    READY  1/4    0/0   -       -       -         2s ago     "
      "-\n");
  w.set_hostname("gpu-7");
  w.set_pid(4321);
  w.set_libtorch_version("2.6.0");
  w.add_features("cuda");
  w.add_features("nccl");
  w.add_task_ids("j-1.g1.r0");
  w.add_task_ids("j-2.g3.r1");
  w.set_memory_bytes(int64_t{16} << 30);
  w.set_memory_used_bytes(int64_t{4} << 30);
  w.set_isolation("cgroup v2");
  EXPECT_EQ(WorkersTable({w}, absl::FromUnixMillis(1'700'000'002'000)),
            "ID        ADDRESS    HOST   PID   STATE  SLOTS  GPUS  MEMORY            LIMITS     "
            "LIBTORCH         LAST SEEN  TASKS\n"
            "worker-1  127.0.0.1  gpu-7  4321  READY  1/4    0/0   4.0 GiB/16.0 GiB  cgroup v2  "
            "2.6.0+cuda+nccl  2s ago     j-1.g1.r0,j-2.g3.r1\n");
  // A worker the coordinator doubts: the state, its drain kept, and why under the table.
  w.set_state(v1::SUSPECT);
  w.set_draining(true);
  w.set_state_reason("no word for 1m12s (its long poll is overdue): its agent is held or gone");
  const std::string suspect = WorkersTable({w}, absl::FromUnixMillis(1'700'000'002'000));
  EXPECT_THAT(suspect, HasSubstr("  SUSPECT+DRAINING  "));
  EXPECT_THAT(suspect, HasSubstr("\nworker-1 is SUSPECT: no word for 1m12s (its long poll is "
                                 "overdue): its agent is held or gone\n"));
  EXPECT_THAT(suspect, Not(HasSubstr("READY")));
  v1::Checkpoint c;
  c.set_step(200);
  c.set_size_bytes(1536);
  c.set_created_unix_ms(1'700'000'000'000);
  c.set_uri("file:///ck/j-1/step-000000000200");
  EXPECT_EQ(CheckpointsTable({c}, absl::UTCTimeZone()),
            "STEP  TIME                       SIZE     URI\n"
            "200   2023-11-14T22:13:20+00:00  1.5 KiB  file:///ck/j-1/step-000000000200\n");
}

TEST(ViewsTest, DescribeShowsTasksAndEvents) {
  v1::Job job;
  job.set_id("j-1");
  job.set_state(v1::FAILED);
  job.set_reason("rank 0 exited with code 2");
  job.set_generation(2);
  job.set_committed_step(-1);
  v1::TaskInfo* task = job.add_tasks();
  task->set_rank(0);
  task->set_generation(2);
  task->set_worker_id("worker-1");
  task->set_state(v1::TASK_EXITED);
  task->set_exit_code(2);
  task->set_message("optimizer.lr: must be > 0");
  v1::TaskInfo* shard = job.add_tasks();
  shard->set_role(v1::TASK_ROLE_SHARD);
  shard->set_shard(1);
  shard->set_generation(2);
  shard->set_worker_id("worker-2");
  shard->set_state(v1::TASK_RUNNING);
  v1::JobEvent* event = job.add_events();
  event->set_time_unix_ms(1'700'000'000'000);
  event->set_from(v1::RUNNING);
  event->set_to(v1::FAILED);
  event->set_reason("rank 0 exited with code 2");
  const std::string text = DescribeJob(job, absl::UTCTimeZone());
  EXPECT_THAT(text, HasSubstr("State:            FAILED"));
  EXPECT_THAT(text, HasSubstr("Committed step:   -"));
  EXPECT_THAT(text, HasSubstr("TASK     GEN  WORKER    STATE    EXIT"));
  EXPECT_THAT(
      text, HasSubstr("rank 0   2    worker-1  EXITED   2     -       optimizer.lr: must be > 0"));
  EXPECT_THAT(text, HasSubstr("shard 1  2    worker-2  RUNNING  -"));
  // A rank killed for memory: OOM, and the most it held of its limit.
  v1::TaskInfo* oom = job.mutable_tasks(0);
  oom->set_signal(9);
  oom->set_out_of_memory(true);
  oom->set_memory_limit_bytes(256 << 20);
  oom->set_memory_peak_bytes(255 << 20);
  job.mutable_spec()->mutable_resources()->set_memory_bytes(256 << 20);
  job.mutable_spec()->mutable_resources()->set_cpus(2);
  const std::string oom_text = DescribeJob(job, absl::UTCTimeZone());
  EXPECT_THAT(oom_text, HasSubstr("EXITED   OOM   255.0 MiB/256.0 MiB"));
  EXPECT_THAT(oom_text, HasSubstr("Per rank:         2 CPUs, 256.0 MiB"));
  job.mutable_spec()->clear_resources();
  oom->clear_out_of_memory();
  EXPECT_THAT(text, Not(HasSubstr("Param servers:")));
  job.mutable_spec()->set_strategy(v1::PARAMETER_SERVER);
  job.mutable_spec()->mutable_parameter_servers()->set_shards(2);
  job.mutable_spec()->mutable_parameter_servers()->set_mode("sync");
  job.mutable_spec()->mutable_parameter_servers()->set_dense("shards");
  EXPECT_THAT(DescribeJob(job, absl::UTCTimeZone()),
              HasSubstr("Param servers:    2 shards, sync, dense shards\n"));
  EXPECT_THAT(text,
              HasSubstr("2023-11-14T22:13:20+00:00  RUNNING -> FAILED: rank 0 exited with code 2"));
}

TEST(ViewsTest, DescribeSaysWhatTheCoordinatorDidNotKeep) {
  v1::Job job;
  job.set_id("j-1");
  job.set_state(v1::RUNNING);
  for (int i = 0; i < 12; ++i) {
    v1::JobEvent* e = job.add_events();
    e->set_to(v1::RUNNING);
    e->set_reason(absl::StrCat("event ", i < 10 ? i : i + 500));
  }
  job.set_events_dropped(500);
  job.add_restarts()->set_reason(v1::PREEMPTED);
  job.set_restarts_dropped(40);
  job.set_dropped_preemption_restarts(40);
  const std::string text = DescribeJob(job, absl::UTCTimeZone());
  EXPECT_THAT(text, HasSubstr("event 9\n  (500 events not kept)\n"));
  EXPECT_THAT(text, HasSubstr("  (40 earlier restarts not kept)\n"));
  EXPECT_THAT(text, HasSubstr("Restarts:         41 ("));
  EXPECT_THAT(text, HasSubstr("preemptions and lost workers 41 of unlimited"));
}

TEST(ViewsTest, DescribeShowsRestartsAndTheirRecovery) {
  v1::Job job;
  job.set_id("j-1");
  job.set_state(v1::RUNNING);
  job.set_generation(2);
  job.mutable_spec()->mutable_restart()->set_max_failures(3);
  v1::Restart* r = job.add_restarts();
  r->set_generation(1);
  r->set_reason(v1::PREEMPTED);
  r->set_message("preemption notice for worker w2 (SIGTERM)");
  r->set_detected_unix_ms(1'700'000'000'000);
  r->set_last_step(40);
  r->set_recovered(true);
  r->set_resumed_step(40);
  r->set_steps_lost(0);
  r->set_recovery_seconds(3.2);
  r->set_scheduling_seconds(1.0);
  const std::string text = DescribeJob(job, absl::UTCTimeZone());
  EXPECT_THAT(text, HasSubstr("Restarts:         1 (failures 0 of 3 allowed; hangs and "
                              "infrastructure errors 0 of 10; preemptions and lost workers 1 of "
                              "unlimited)"));
  EXPECT_THAT(text, HasSubstr("1    preempted  2023-11-14T22:13:20+00:00  40         40       0  "
                              "   3.2s (detect 0.0, schedule 1.0"));
  EXPECT_THAT(text, HasSubstr("preemption notice for worker w2 (SIGTERM)"));
}

TEST(ViewsTest, StateLineNamesTheWorkers) {
  v1::Job job;
  job.set_state(v1::RUNNING);
  job.set_generation(1);
  for (const char* w : {"w2", "w1"}) {
    v1::TaskInfo* t = job.add_tasks();
    t->set_generation(1);
    t->set_worker_id(w);
  }
  EXPECT_EQ(StateLine(job), "RUNNING on w1, w2");
  job.set_state(v1::PENDING);
  job.set_reason("waiting for 2 slots");
  EXPECT_EQ(StateLine(job), "PENDING: waiting for 2 slots");
}

TEST(ViewsTest, SearchProgressLineCountsTrialsAndNamesTheBest) {
  v1::Search s;
  s.set_id("lr-s1");
  s.set_state(v1::SEARCH_RUNNING);
  s.mutable_spec()->mutable_searcher()->set_metric("val_accuracy");
  s.mutable_spec()->mutable_searcher()->set_max_trials(6);
  s.set_best_trial(-1);
  for (v1::TrialState state : {v1::TRIAL_RUNNING, v1::TRIAL_RUNNING, v1::TRIAL_COMPLETED}) {
    s.add_trials()->set_state(state);
  }
  s.set_trials_running(2);
  EXPECT_EQ(SearchProgressLine(s), "search lr-s1 RUNNING: 2 running, 1 done of 6 trials");
  s.add_trials()->set_state(v1::TRIAL_FAILED);
  s.set_trials_failed(1);
  s.set_best_trial(2);
  s.set_best_metric(0.91234);
  EXPECT_EQ(SearchProgressLine(s),
            "search lr-s1 RUNNING: 2 running, 2 done (1 failed) of 6 trials; best val_accuracy "
            "0.9123 (trial 2)");
  s.mutable_spec()->mutable_searcher()->set_max_trials(0);  // a whole grid
  EXPECT_THAT(SearchProgressLine(s), HasSubstr("2 done (1 failed) trials;"));
}

TEST(ViewsTest, JsonIsProtobufJson) {
  v1::Worker w;
  w.set_id("worker-1");
  w.set_slots(2);
  const std::string json = ToJson(w);
  EXPECT_THAT(json, HasSubstr("\"id\": \"worker-1\""));
  EXPECT_THAT(json, HasSubstr("\"slots\": 2"));
  EXPECT_THAT(json, Not(HasSubstr("slotsUsed")));
}

TEST(ViewsTest, TheSearchTableSaysWhichTrialCountIsWhich) {
  v1::Search search;
  search.set_id("s-s1");
  search.set_name("s");
  search.set_trials_running(1);
  search.set_trials_created(2);
  search.mutable_spec()->mutable_searcher()->set_max_trials(24);
  search.set_best_trial(-1);
  const std::string table = SearchesTable({search}, absl::Now(), false);
  EXPECT_THAT(table, HasSubstr("TRIALS RUN/MADE/MAX"));
  EXPECT_THAT(table, HasSubstr("1/2/24"));
}

TEST(ViewsTest, APendingJobShowsItsPlaceInLineAndStart) {
  v1::Job job;
  job.set_id("big-3");
  job.set_state(v1::PENDING);
  job.set_reason("waiting for capacity: needs 16 GPUs, 8 free");
  job.set_position(1);
  job.set_estimated_start_unix_ms(1'700'000'000'000);
  EXPECT_EQ(WaitText(job, absl::UTCTimeZone()),
            "#1 in line: waiting for capacity: needs 16 GPUs, 8 free; starts by "
            "2023-11-14T22:13:20+00:00");
  job.clear_estimated_start_unix_ms();
  job.set_position(0);
  EXPECT_EQ(WaitText(job), "waiting for capacity: needs 16 GPUs, 8 free");
  job.set_position(2);
  job.mutable_spec()->set_queue("nlp");
  job.mutable_spec()->set_priority(3);
  const std::string described = DescribeJob(job, absl::UTCTimeZone());
  EXPECT_THAT(described, HasSubstr("Reason:           #2 in line: waiting for capacity"));
  EXPECT_THAT(described, HasSubstr("Queue:            nlp, priority 3, preemptible"));
}

TEST(ViewsTest, AQueueShowsItsLimitsAndUse) {
  v1::Queue q;
  q.set_name("nlp");
  q.set_quota_slots(8);
  q.set_quota_gpus(4);
  q.set_borrow_slots(-1);
  q.set_borrow_gpus(2);
  q.set_weight(2);
  q.add_users("carol");
  v1::QueueStatus* s = q.mutable_status();
  s->set_quota_slots(8);
  s->set_quota_gpus(4);
  s->set_used_gpus(6);
  s->set_borrowed_gpus(2);
  s->set_pending_jobs(3);
  s->set_running_jobs(2);
  s->set_preemptions(1);
  const std::string text = DescribeQueue(q);
  EXPECT_THAT(text, HasSubstr("Quota:            8 slots, 4 GPUs\n"));
  EXPECT_THAT(text, HasSubstr("Borrowing:        up to unlimited slots, 2 GPUs beyond the quota"));
  EXPECT_THAT(text, HasSubstr("Users:            carol"));
  EXPECT_THAT(text, HasSubstr("Holds:            0 slots (0 borrowed), 6 GPUs (2 borrowed)"));
  EXPECT_THAT(text, HasSubstr("Jobs:             2 running, 3 pending"));
  // The queue's jobs: waiting ones in line order first.
  v1::Job first;
  first.set_id("a-1");
  first.set_state(v1::PENDING);
  first.set_position(2);
  first.set_reason("queued behind a-2");
  v1::Job second = first;
  second.set_id("a-2");
  second.set_position(1);
  second.set_reason("waiting for capacity");
  v1::Job running = first;
  running.set_id("a-0");
  running.set_state(v1::RUNNING);
  running.set_position(0);
  const std::string table = QueueJobsTable({running, first, second}, false);
  EXPECT_LT(table.find("a-2"), table.find("a-1"));
  EXPECT_LT(table.find("a-1"), table.find("a-0"));
  EXPECT_THAT(table, HasSubstr("#2 in line: queued behind a-2"));
}

TEST(CommandsTest, AnUnreadableSpecFileSaysWhy) {
  absl::StatusOr<std::string> spec = ReadSpecFile("/nonexistent/spec.yaml");
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(spec.status().message(),
            "cannot read /nonexistent/spec.yaml: No such file or directory");
}

}  // namespace
}  // namespace trainyard::cli
