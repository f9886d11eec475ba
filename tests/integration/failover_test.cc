// More than one coordinator on one PostgreSQL store (docs/operations.md, "More than one
// coordinator"): the real coordinators, agents and trainers as processes on loopback, and a
// PostgreSQL server the test starts. A standby takes over from a leader killed or frozen without a
// training job noticing: same attempt, no step lost, every acknowledged submission kept.
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/rpc/channel.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/common/postgres_server.h"
#include "tests/common/tcp_proxy.h"
#include "tests/integration/cluster.h"

namespace trainyard::testing {
namespace {

using ::testing::HasSubstr;
using v1::Job;

// A job that checkpoints every 25 steps and trains for a few seconds.
std::string TrainingJob(const std::string& name, int64_t max_steps) {
  return absl::StrCat("name: ", name, R"(
strategy: single
model:
  builtin: mlp
  args: {inputs: 32, hidden: [256, 256], classes: 4}
data:
  synthetic: {samples: 4096, features: 32, classes: 4, noise: 0.5}
batch_size: 48
optimizer: {name: sgd, lr: 0.02, momentum: 0.9}
log_every_steps: 10
seed: 11
checkpoint: {every_steps: 25, keep_last: 2}
max_steps: )",
                      max_steps, "\n");
}

class FailoverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = PostgresServer::Start();
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    auto uri = server_->CreateDatabase("trainyard");
    ASSERT_TRUE(uri.ok()) << uri.status();
    uri_ = *uri;
  }
  ClusterOptions Options() const {
    ClusterOptions options;
    options.workers = 2;
    options.slots_per_worker = 1;
    options.worker_timeout = absl::Seconds(2);
    options.store = uri_;
    options.coordinators = 2;
    options.coordinator_args = {"--leader_lease=2s", "--restart_backoff=200ms"};
    options.worker_args = {"--sync_wait=500ms"};
    return options;
  }
  // Submits through the cluster's list of coordinators until one acknowledges (the new leader
  // may not serve yet); the time that took.
  static absl::StatusOr<Job> SubmitWhenLed(Cluster& cluster, const std::string& yaml) {
    absl::StatusOr<Job> job = absl::UnavailableError("not tried");
    PollUntil(
        [&] {
          job = cluster.Submit(yaml);
          return job.ok() || job.status().code() != absl::StatusCode::kUnavailable;
        },
        absl::Seconds(30));
    return job;
  }

  // The job ends SUCCEEDED in its first attempt, never restarted (the trainers it ran were adopted
  // across coordinators), at `steps` when given.
  static void ExpectFinishedInItsFirstAttempt(Cluster& cluster, const std::string& id,
                                              int64_t steps = -1) {
    auto done = cluster.WaitForFinal(id, absl::Seconds(180));
    ASSERT_TRUE(done.ok()) << done.status();
    EXPECT_EQ(done->state(), v1::SUCCEEDED) << done->reason();
    EXPECT_EQ(done->generation(), 1) << id;
    EXPECT_EQ(done->restarts_size(), 0) << id;
    if (steps >= 0) {
      EXPECT_EQ(done->progress().step(), steps) << id;
    }
  }

  // Runs a 30-step TrainingJob to success and takes its whole log, once its agent has shipped
  // the last line (at its next sync after the end).
  static void RunWithLog(Cluster& cluster, const std::string& name, Job* job, std::string* log) {
    auto submitted = cluster.Submit(TrainingJob(name, 30));
    ASSERT_TRUE(submitted.ok()) << submitted.status();
    auto done = cluster.WaitForFinal(submitted->id());
    ASSERT_TRUE(done.ok()) << done.status();
    ASSERT_EQ(done->state(), v1::SUCCEEDED) << done->reason();
    *job = *done;
    ASSERT_TRUE(PollUntil(
        [&] {
          auto text = cluster.Logs(job->id());
          if (!text.ok() || !absl::StrContains(*text, "done: step=30")) return false;
          *log = *text;
          return true;
        },
        absl::Seconds(30)));
  }

  std::unique_ptr<PostgresServer> server_;
  std::string uri_;
};

// kill -9 of the leader while two jobs train and 1,000 wait: a standby leads within 5 s, the
// running jobs keep their attempt and lose no step, every acknowledged submission is there, and
// none is scheduled twice.
TEST_F(FailoverTest, KillingTheLeaderLosesNoStepAndNoSubmission) {
  Cluster cluster(Options());
  const int leader = cluster.Leader();
  ASSERT_GE(leader, 0);
  // A client given the standby's address alone is told where the leader serves.
  auto to_standby = NewClientChannel(cluster.coordinator_address(1 - leader), {});
  ASSERT_TRUE(to_standby.ok()) << to_standby.status();
  grpc::Status refused;
  EXPECT_TRUE(PollUntil(
      [&] {
        grpc::ClientContext context;
        v1::ListJobsResponse listed;
        refused = v1::JobService::NewStub(*to_standby)
                      ->ListJobs(&context, v1::ListJobsRequest(), &listed);
        return absl::StrContains(refused.error_message(), "leader serves at");
      },
      absl::Seconds(10)));
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(refused.error_message(),
              HasSubstr("the leader serves at " + cluster.coordinator_address(leader)));
  // A job that ends before the takeover: its agent ships its log once, to the old leader.
  Job logged;
  std::string log_before;
  ASSERT_NO_FATAL_FAILURE(RunWithLog(cluster, "logged", &logged, &log_before));
  // Its metric history (what the console charts), read from the leader before the kill.
  auto history = [&](const std::string& id) {
    grpc::ClientContext context;
    v1::GetJobMetricsRequest request;
    request.set_id(id);
    v1::JobMetrics metrics;
    const grpc::Status status = cluster.jobs().GetJobMetrics(&context, request, &metrics);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return metrics;
  };
  const v1::JobMetrics history_before = history(logged.id());
  ASSERT_GE(history_before.points_size(), 1);
  EXPECT_EQ(history_before.points(history_before.points_size() - 1).progress().step(), 30);
  auto a = SubmitAndHold(cluster, "train-a", TrainingJob("train-a", 400), 30, 25);
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = SubmitAndHold(cluster, "train-b", TrainingJob("train-b", 400), 30, 25);
  ASSERT_TRUE(b.ok()) << b.status();
  std::vector<std::string> queued;
  for (int i = 0; i < 1000; ++i) {
    auto job = cluster.Submit(SyntheticJobYaml("queued", 5));
    ASSERT_TRUE(job.ok()) << job.status();
    queued.push_back(job->id());
  }
  // a trains on through the takeover; b stays held until the queue has been checked.
  cluster.Release("train-a");
  const absl::Time killed = absl::Now();
  cluster.coordinator(leader).Signal(SIGKILL);
  const int next = cluster.WaitForLeader(absl::Seconds(30), leader);
  const absl::Duration to_lead = absl::Now() - killed;
  ASSERT_GE(next, 0) << "no standby took over";
  auto acknowledged = SubmitWhenLed(cluster, SyntheticJobYaml("after-takeover", 5));
  const absl::Duration to_submit = absl::Now() - killed;
  ASSERT_TRUE(acknowledged.ok()) << acknowledged.status();
  std::cout << "takeover: kill -9 -> new leader serving " << absl::FormatDuration(to_lead)
            << ", -> first acknowledged submission " << absl::FormatDuration(to_submit) << "\n";
  EXPECT_LT(to_lead, absl::Seconds(5));
  const std::string new_log = cluster.coordinator(next).Log();
  EXPECT_THAT(new_log, HasSubstr("leading (lease token 2)"));
  // It took over a warm copy (a, b and the 1,000 queued) that had followed the submissions while
  // it stood by: the takeover read only the jobs changed since the copy's last read.
  const size_t warm = new_log.find("took over the warm copy of the state");
  ASSERT_NE(warm, std::string::npos) << new_log;
  const std::string warm_line = new_log.substr(warm, new_log.find('\n', warm) - warm);
  std::vector<std::string> words = absl::StrSplit(warm_line, ' ');
  int changed = -1;
  for (size_t i = 1; i < words.size(); ++i) {
    if (words[i] == "changed" && !absl::SimpleAtoi(words[i - 1], &changed)) changed = -1;
  }
  EXPECT_GE(changed, 0) << warm_line;
  EXPECT_LT(changed, 100) << warm_line;
  EXPECT_THAT(warm_line, HasSubstr("(1002 jobs;")) << warm_line;

  // Every acknowledged submission is there, each at most in its first attempt.
  for (const std::string& id : queued) {
    auto job = cluster.Get(id);
    ASSERT_TRUE(job.ok()) << id << ": " << job.status();
    EXPECT_LE(job->generation(), 1) << id;
    EXPECT_EQ(job->restarts_size(), 0) << id;
  }
  // The new leader serves the log the old one was sent (it is in the database, not in the old
  // leader's folder).
  auto log_after = cluster.Logs(logged.id());
  ASSERT_TRUE(log_after.ok()) << log_after.status();
  EXPECT_EQ(*log_after, log_before);
  // And the whole metric history.
  EXPECT_TRUE(
      google::protobuf::util::MessageDifferencer::Equals(history_before, history(logged.id())));
  cluster.Release("train-b");
  // The trainers kept training: the same attempt, adopted by the new leader, never a second.
  for (const auto& running : {*a, *b}) {
    ASSERT_NO_FATAL_FAILURE(ExpectFinishedInItsFirstAttempt(cluster, running.id(), 400));
  }
}

// One coordinator on SQLite, moved to PostgreSQL with --migrate_state: refused while that
// coordinator runs; then everything is there under the coordinator started on the database (a
// finished job with its log, a job still waiting, a token, a queue), a job that trained through
// it is adopted (same attempt, no restart), the workers re-register with their tokens, new job
// ids carry on from the old ones and run, and a second migration into the same database is
// refused.
TEST_F(FailoverTest, ASqliteStateMigratesIntoPostgres) {
  ClusterOptions options;
  options.workers = 2;
  options.slots_per_worker = 1;
  Cluster cluster(options);
  Job finished;
  std::string log_before;
  ASSERT_NO_FATAL_FAILURE(RunWithLog(cluster, "done-before", &finished, &log_before));
  // Waits for three workers, which this cluster does not have.
  auto waiting = cluster.Submit(absl::StrReplaceAll(
      TrainingJob("waiting", 20), {{"strategy: single", "strategy: data_parallel\nworkers: 3"}}));
  ASSERT_TRUE(waiting.ok()) << waiting.status();
  // Trains through the migration: held at step 30 while the coordinators change.
  auto running = SubmitAndHold(cluster, "through", TrainingJob("through", 200), 30, 25);
  ASSERT_TRUE(running.ok()) << running.status();
  const std::string token = cluster.CreateToken("alice", v1::TOKEN_USER);
  auto queue = cluster.Cli({"queue", "create", "team-a", "--slots", "1"});
  ASSERT_EQ(queue.exit_code, 0) << queue.output;

  auto migrate = [&](const std::string& log) {
    Process process(std::vector<std::string>{BinDir() + "/trainyard-coordinator",
                                             "--state_dir=" + cluster.state_dir(),
                                             "--store=" + uri_, "--migrate_state"},
                    cluster.state_dir() + "/../" + log);
    std::optional<int> status = process.Wait(absl::Seconds(120));
    EXPECT_TRUE(status.has_value());
    return std::make_pair(status.has_value() && WIFEXITED(*status) ? WEXITSTATUS(*status) : -1,
                          process.Log());
  };
  auto [busy_rc, busy_log] = migrate("migrate-busy.log");
  EXPECT_EQ(busy_rc, 1) << busy_log;
  EXPECT_THAT(busy_log, HasSubstr("is in use by another coordinator"));
  EXPECT_EQ(server_->Psql("trainyard", "SELECT to_regclass('jobs') IS NULL").value_or(""), "t\n")
      << "the refused migration touched the database";

  cluster.KillCoordinator(SIGTERM);
  auto [rc, log] = migrate("migrate.log");
  ASSERT_EQ(rc, 0) << log;
  std::cout << "migration:\n" << log;
  EXPECT_THAT(log, HasSubstr("migrated: 3 jobs, "));
  EXPECT_THAT(log, HasSubstr(" tokens, 0 searches, "));

  cluster.set_store(uri_);
  cluster.StartCoordinator();
  // The folder's state.db, kept as a backup, is known for migrated: no warning about it.
  EXPECT_THAT(cluster.coordinator().Log(), ::testing::Not(HasSubstr("that --store does not use")));
  auto job = cluster.Get(finished.id());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::SUCCEEDED);
  EXPECT_EQ(job->progress().step(), 30);
  EXPECT_EQ(job->events_size(), finished.events_size());
  auto log_after = cluster.Logs(finished.id());
  ASSERT_TRUE(log_after.ok()) << log_after.status();
  EXPECT_EQ(*log_after, log_before);
  // The user's token still works; the queue is there.
  v1::ListJobsRequest list;
  v1::ListJobsResponse listed;
  grpc::ClientContext context;
  EXPECT_TRUE(
      v1::JobService::NewStub(cluster.NewChannel(token))->ListJobs(&context, list, &listed).ok());
  auto queues = cluster.Cli({"queue", "list"});
  EXPECT_THAT(queues.output, HasSubstr("team-a"));
  // The running job was adopted, not restarted.
  cluster.Release("through");
  ASSERT_NO_FATAL_FAILURE(ExpectFinishedInItsFirstAttempt(cluster, running->id(), 200));
  auto still = cluster.Get(waiting->id());
  ASSERT_TRUE(still.ok()) << still.status();
  EXPECT_EQ(still->state(), v1::PENDING);
  // Ids go on from the old ones, and the workers (re-registered with their migrated tokens) run
  // the new job.
  auto next = cluster.Submit(SyntheticJobYaml("after", 5));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->id(), "after-4");
  auto ran = cluster.WaitForFinal(next->id(), absl::Seconds(120));
  ASSERT_TRUE(ran.ok()) << ran.status();
  EXPECT_EQ(ran->state(), v1::SUCCEEDED) << ran->reason();

  // Into a database that holds jobs: refused, nothing written.
  cluster.KillCoordinator(SIGTERM);
  auto [again_rc, again_log] = migrate("migrate-again.log");
  EXPECT_EQ(again_rc, 1) << again_log;
  EXPECT_THAT(again_log, HasSubstr("the database already holds"));
}

// A frozen leader (its machine paused) is replaced once its lease runs out; woken, it finds the
// lease gone and exits without acting, and the job it ran carries on under the new leader.
TEST_F(FailoverTest, AFrozenLeaderIsReplacedAndExitsWhenItWakes) {
  Cluster cluster(Options());
  const int leader = cluster.Leader();
  ASSERT_GE(leader, 0);
  auto a = SubmitAndHold(cluster, "frozen-a", TrainingJob("frozen-a", 200), 30, 25);
  ASSERT_TRUE(a.ok()) << a.status();
  // The test's channel is connected to both coordinators, as agents' and the CLI's are.
  v1::GetJobRequest get;
  get.set_id(a->id());
  ASSERT_TRUE(PollUntil(
      [&] {
        grpc::ClientContext context;
        context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
        v1::Job job;
        return cluster.jobs().GetJob(&context, get, &job).ok();
      },
      absl::Seconds(30)));
  cluster.coordinator(leader).Signal(SIGSTOP);
  const absl::Time frozen_at = absl::Now();
  // Once the new leader answers, no call goes to the frozen one: the client's pings (2 s, given
  // 1 s) left it about when the standby took over. Before they were tuned, round_robin sent every
  // other call to it until a keepalive 10 s long gave up.
  absl::Time first_answer = absl::InfiniteFuture(), last_failure = absl::InfinitePast();
  int failed_after = 0;
  while (absl::Now() < std::max(frozen_at + absl::Seconds(12), first_answer + absl::Seconds(4))) {
    ASSERT_LT(absl::Now(), frozen_at + absl::Seconds(40)) << "no coordinator answered";
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Milliseconds(300)));
    v1::Job job;
    const bool ok = cluster.jobs().GetJob(&context, get, &job).ok();
    if (ok && first_answer == absl::InfiniteFuture()) first_answer = absl::Now();
    if (!ok) {
      last_failure = absl::Now();
      if (first_answer != absl::InfiniteFuture()) ++failed_after;
    }
    absl::SleepFor(absl::Milliseconds(50));  // the pace of the probe, not a wait for anything
  }
  std::cout << "frozen leader: the new leader answered " << (first_answer - frozen_at)
            << " after the freeze; calls failed until " << (last_failure - frozen_at) << " ("
            << failed_after << " after the first answer)" << std::endl;
  // Tuned, the pings leave the frozen one within 3 s (2 s apart, 1 s to answer), a little more on
  // a loaded machine (3.7 s seen during make test); untuned, calls failed for 10 s.
  EXPECT_LT(last_failure - first_answer, absl::Seconds(5))
      << failed_after << " calls failed after the new leader answered";
  const int next = cluster.WaitForLeader(absl::Seconds(30), leader);
  ASSERT_GE(next, 0) << "no standby took over";
  auto acknowledged = SubmitWhenLed(cluster, SyntheticJobYaml("while-frozen", 5));
  ASSERT_TRUE(acknowledged.ok()) << acknowledged.status();
  cluster.coordinator(leader).Signal(SIGCONT);
  std::optional<int> status = cluster.coordinator(leader).Wait(absl::Seconds(20));
  ASSERT_TRUE(status.has_value()) << "the deposed leader did not exit";
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 3) << *status;
  EXPECT_THAT(cluster.coordinator(leader).Log(), HasSubstr("no longer the leader"));
  cluster.Release("frozen-a");
  ASSERT_NO_FATAL_FAILURE(ExpectFinishedInItsFirstAttempt(cluster, a->id()));
  auto other = cluster.WaitForFinal(acknowledged->id(), absl::Seconds(120));
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(other->state(), v1::SUCCEEDED) << other->reason();
}

// The leader cut off from the database (its link to it silently dropped): it stops within its
// lease and exits, the standby takes over, and no write of the old leader lands after the new
// leader's first: every row written is stamped, by a trigger, with the writing connection's name
// (which carries its coordinator's lease holder name) and the database's clock.
TEST_F(FailoverTest, ALeaderCutOffFromTheDatabaseStopsAndNothingItWritesLandsLater) {
  ClusterOptions options = Options();
  std::vector<std::unique_ptr<TcpProxy>> links;
  for (int i = 0; i < 2; ++i) {
    auto proxy = TcpProxy::Start(server_->port());
    ASSERT_TRUE(proxy.ok()) << proxy.status();
    links.push_back(*std::move(proxy));
    options.coordinator_stores.push_back(absl::StrCat(
        "postgres://", server_->user(), "@127.0.0.1:", links.back()->port(), "/trainyard"));
  }
  Cluster cluster(options);
  const int leader = cluster.Leader();
  ASSERT_GE(leader, 0);
  ASSERT_TRUE(server_
                  ->Psql("trainyard", R"sql(
CREATE TABLE audit(writer TEXT NOT NULL, at TIMESTAMPTZ NOT NULL);
CREATE FUNCTION stamp() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO audit VALUES(current_setting('application_name'), clock_timestamp());
  RETURN NULL;
END $$;
CREATE TRIGGER stamp_jobs AFTER INSERT OR UPDATE ON jobs FOR EACH ROW EXECUTE FUNCTION stamp();
CREATE TRIGGER stamp_events AFTER INSERT ON events FOR EACH ROW EXECUTE FUNCTION stamp();
CREATE TRIGGER stamp_progress AFTER INSERT OR UPDATE ON progress
  FOR EACH ROW EXECUTE FUNCTION stamp();
)sql")
                  .ok());
  auto a = SubmitAndHold(cluster, "cut-a", TrainingJob("cut-a", 200), 30, 25);
  ASSERT_TRUE(a.ok()) << a.status();
  // It keeps training (and reporting) while its coordinator loses the database.
  cluster.Release("cut-a");
  links[leader]->Cut();
  const absl::Time cut = absl::Now();
  std::optional<int> status = cluster.coordinator(leader).Wait(absl::Seconds(20));
  const absl::Duration to_stop = absl::Now() - cut;
  ASSERT_TRUE(status.has_value()) << "the cut-off leader did not stop";
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 3) << *status;
  EXPECT_THAT(cluster.coordinator(leader).Log(), HasSubstr("no longer the leader"));
  // Its lease is 2 s: it stops by then, give or take a renewal period and the exit.
  EXPECT_LT(to_stop, absl::Seconds(4));
  const int next = cluster.WaitForLeader(absl::Seconds(30), leader);
  ASSERT_GE(next, 0) << "no standby took over";
  auto acknowledged = SubmitWhenLed(cluster, SyntheticJobYaml("after-cut", 5));
  ASSERT_TRUE(acknowledged.ok()) << acknowledged.status();
  links[leader]->Heal();  // whatever the old connections still held may arrive now
  ASSERT_NO_FATAL_FAILURE(ExpectFinishedInItsFirstAttempt(cluster, a->id()));

  // Each writer's span of writes, in order: no overlap.
  auto spans = server_->Psql(
      "trainyard",
      "SELECT writer, extract(epoch FROM min(at)), extract(epoch FROM max(at)) FROM audit GROUP "
      "BY writer ORDER BY min(at)");
  ASSERT_TRUE(spans.ok()) << spans.status();
  std::vector<std::vector<std::string>> rows;
  for (absl::string_view line : absl::StrSplit(*spans, '\n', absl::SkipEmpty())) {
    rows.push_back(absl::StrSplit(line, '|'));
  }
  ASSERT_EQ(rows.size(), 2u) << *spans;
  double old_last = 0, new_first = 0;
  ASSERT_TRUE(absl::SimpleAtod(rows[0][2], &old_last) && absl::SimpleAtod(rows[1][1], &new_first))
      << *spans;
  EXPECT_LT(old_last, new_first) << "the old leader wrote after the new one:\n" << *spans;
}

// The database goes away: the leader stops acting within its lease and exits, the standby waits,
// training goes on; when the database is back the standby leads and adopts the job (its attempt
// unchanged), and what was acknowledged before is there.
TEST_F(FailoverTest, WhileTheDatabaseIsDownTrainingGoesOnAndNothingIsLost) {
  Cluster cluster(Options());
  const int leader = cluster.Leader();
  ASSERT_GE(leader, 0);
  auto a = SubmitAndHold(cluster, "dbdown-a", TrainingJob("dbdown-a", 200), 30, 25);
  ASSERT_TRUE(a.ok()) << a.status();
  auto acknowledged = cluster.Submit(SyntheticJobYaml("before-down", 5));
  ASSERT_TRUE(acknowledged.ok()) << acknowledged.status();
  server_->Kill();
  std::optional<int> status = cluster.coordinator(leader).Wait(absl::Seconds(20));
  ASSERT_TRUE(status.has_value()) << "the leader went on without its database";
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 3) << *status;
  cluster.Release("dbdown-a");  // it trains on with no coordinator at all
  EXPECT_EQ(cluster.Leader(), -1);
  ASSERT_TRUE(server_->StartAgain().ok());
  const int next = cluster.WaitForLeader(absl::Seconds(30), leader);
  ASSERT_GE(next, 0) << "no coordinator leads once the database is back";
  ASSERT_NO_FATAL_FAILURE(ExpectFinishedInItsFirstAttempt(cluster, a->id(), 200));
  auto other = cluster.WaitForFinal(acknowledged->id(), absl::Seconds(120));
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(other->state(), v1::SUCCEEDED) << other->reason();
}

// Both coordinators killed and started again: everything is back, as with SQLite. With TLS, as
// the operations guide sets it up: one certificate names every coordinator, and agents, trainers
// and the test's client verify it whichever of the list answers.
TEST_F(FailoverTest, BothCoordinatorsKilledAndStartedAgainLoseNothing) {
  TempDir dir;
  TestCertificates certs(dir.path());
  ClusterOptions options = Options();
  options.coordinator_args.push_back("--tls_cert=" + certs.Path("server.pem"));
  options.coordinator_args.push_back("--tls_key=" + certs.Path("server.key"));
  options.ca_file = certs.Path("ca.pem");
  Cluster cluster(options);
  auto a = SubmitAndHold(cluster, "both-a", TrainingJob("both-a", 200), 30, 25);
  ASSERT_TRUE(a.ok()) << a.status();
  auto waiting = cluster.Submit(SyntheticJobYaml("both-waiting", 5));
  ASSERT_TRUE(waiting.ok()) << waiting.status();
  for (int i = 0; i < 2; ++i) {
    cluster.coordinator(i).Signal(SIGKILL);
    cluster.coordinator(i).Wait(absl::Seconds(10));
  }
  cluster.Release("both-a");
  for (int i = 0; i < 2; ++i) cluster.StartCoordinator(i);
  ASSERT_GE(cluster.WaitForLeader(absl::Seconds(30)), 0);
  auto done = cluster.WaitForFinal(a->id(), absl::Seconds(180));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::SUCCEEDED) << done->reason();
  EXPECT_EQ(done->generation(), 1);
  auto other = cluster.WaitForFinal(waiting->id(), absl::Seconds(120));
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(other->state(), v1::SUCCEEDED) << other->reason();
}

}  // namespace
}  // namespace trainyard::testing
