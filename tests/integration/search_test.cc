// Hyperparameter searches on a real cluster: trials run as jobs on the workers, ASHA promotes
// trials by resuming their jobs' checkpoints, and a coordinator killed with SIGKILL mid-search
// carries the search on with no trial lost or run twice.

#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/wait.h>

#include <cmath>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster.h"
#include "trainyard/v1/search_service.grpc.pb.h"

namespace trainyard::testing {
namespace {

using ::testing::HasSubstr;

// A job that learns in a few dozen steps and measures itself on a validation split.
constexpr char kTemplate[] = R"(template:
  name: trial-mlp
  strategy: single
  model: {builtin: mlp, args: {inputs: 16, hidden: [32], classes: 4}}
  data:
    synthetic: {samples: 2048, features: 16, classes: 4, noise: 0.5}
    validation_split: 0.25
  batch_size: 32
  optimizer: {name: adamw}
  log_every_steps: 3
  seed: 7
)";

class SearchClusterTest : public ::testing::Test {
 protected:
  SearchClusterTest() : cluster_(Options()) {}
  static ClusterOptions Options() {
    ClusterOptions options;
    options.workers = 2;
    return options;
  }
  std::unique_ptr<v1::SearchService::Stub> Stub() {
    return v1::SearchService::NewStub(cluster_.NewChannel());
  }
  // GetSearch, surviving a coordinator restart (UNAVAILABLE is retried by the poll).
  absl::StatusOr<v1::Search> GetSearch(const std::string& id) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    v1::GetSearchRequest request;
    request.set_id(id);
    v1::Search search;
    grpc::Status status = Stub()->GetSearch(&context, request, &search);
    if (!status.ok()) return absl::UnavailableError(status.error_message());
    return search;
  }
  bool WaitForSearch(const std::string& id, const std::function<bool(const v1::Search&)>& done,
                     v1::Search* last, absl::Duration timeout = absl::Seconds(240)) {
    return PollUntil(
        [&] {
          absl::StatusOr<v1::Search> search = GetSearch(id);
          if (!search.ok()) return false;
          *last = *search;
          return done(*search);
        },
        timeout);
  }
  std::string WriteSpec(const std::string& name, const std::string& yaml) {
    const std::string path = absl::StrCat(cluster_.state_dir(), "/../", name);
    std::ofstream(path) << yaml;
    return path;
  }
  // `trainyard search submit`: the new search's id, empty (and a test failure) when refused.
  std::string SubmitSearch(const std::string& name, const std::string& yaml) {
    Cluster::CliResult submitted = cluster_.Cli({"search", "submit", WriteSpec(name, yaml)});
    EXPECT_EQ(submitted.exit_code, 0) << submitted.output;
    return submitted.exit_code == 0 ? submitted.FirstLine() : "";
  }
  // Trials at `min_rung` or later whose job is RUNNING.
  int RunningTrialJobs(const v1::Search& search, int min_rung = 0) {
    int running = 0;
    for (const v1::Trial& t : search.trials()) {
      if (t.rung() < min_rung || t.state() != v1::TRIAL_RUNNING || !t.job_submitted()) continue;
      absl::StatusOr<v1::Job> job = cluster_.Get(t.job_id());
      running += job.ok() && job->state() == v1::RUNNING;
    }
    return running;
  }

  Cluster cluster_;
};

TEST_F(SearchClusterTest, AshaOverAProgramStopsItAtRungsAndResumesItFromItsOwnCheckpoints) {
  const std::string id = SubmitSearch(
      "program.yaml",
      absl::StrCat(
          "name: asha-program\n"
          "searcher: {name: asha, metric: score, max_trials: 3, max_concurrent_trials: 2,\n"
          "  max_length: 9, divisor: 3, max_rungs: 2}\n"
          "hyperparameters:\n"
          "  lr: {type: categorical, values: [0.01, 0.3, 0.05]}\n"
          "template:\n"
          "  name: trial-program\n"
          "  program:\n"
          "    command: [/usr/bin/python3, search_trial.py, --lr, \"{lr}\"]\n"
          "    workdir: file://",
          SourceDir(), "/tests/integration/programs\n", "    env: {LR: \"{lr}\"}\n"));
  ASSERT_FALSE(id.empty());
  v1::Search search;
  ASSERT_TRUE(WaitForSearch(
      id, [](const v1::Search& s) { return s.state() != v1::SEARCH_RUNNING; }, &search))
      << search.DebugString();
  ASSERT_EQ(search.state(), v1::SEARCH_SUCCEEDED) << search.DebugString();
  ASSERT_EQ(search.trials_size(), 3);
  // The largest step gets w^2 lowest at every rung: that trial is the best, and went on from
  // step 3.
  const v1::Trial& best = search.trials(search.best_trial());
  EXPECT_EQ(best.state(), v1::TRIAL_COMPLETED) << best.DebugString();
  ASSERT_EQ(best.job_ids_size(), 2) << best.DebugString();
  absl::StatusOr<v1::Job> first = cluster_.Get(best.job_ids(0));
  absl::StatusOr<v1::Job> second = cluster_.Get(best.job_ids(1));
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_THAT(first->spec().program().command(3), "0.3");
  EXPECT_EQ(first->spec().program().env().at("LR"), "0.3");
  EXPECT_EQ(first->progress().step(), 3);                 // stopped at the rung's end
  EXPECT_EQ(first->committed_step(), 3);                  // having saved there
  EXPECT_EQ(second->progress().attempt_start_step(), 3);  // restored, not started over
  EXPECT_EQ(second->progress().step(), 9);
  const double w = 5.0 * std::pow(1 - 2 * 0.3, 9);
  EXPECT_NEAR(search.best_metric(), -w * w, 1e-9);
  // ASHA promotes as trials arrive (the first to finish a rung is the best of one): at least one
  // other trial stopped at step 3, and every promoted one went on from its checkpoint.
  int stopped = 0;
  for (const v1::Trial& t : search.trials()) {
    stopped += t.state() == v1::TRIAL_STOPPED;
    if (t.job_ids_size() < 2) continue;
    absl::StatusOr<v1::Job> next = cluster_.Get(t.job_ids(1));
    ASSERT_TRUE(next.ok());
    EXPECT_EQ(next->progress().attempt_start_step(), 3) << next->id();
  }
  EXPECT_GE(stopped, 1);
}

TEST_F(SearchClusterTest, AshaPromotesFromCheckpointsAndSurvivesACoordinatorKill) {
  // Every trial's job waits after its first update until released: the coordinator is killed
  // while two trials are mid-run.
  cluster_.Hold("trial-mlp", 1);
  const std::string id = SubmitSearch(
      "asha.yaml", absl::StrCat("name: asha-mlp\n"
                                "searcher: {name: asha, metric: val_accuracy, max_trials: 6,\n"
                                "  max_concurrent_trials: 2, max_length: 27, divisor: 3,\n"
                                "  max_rungs: 3, seed: 3}\n"
                                "hyperparameters:\n"
                                "  optimizer.lr: {type: log, min: 1e-4, max: 3e-2}\n"
                                "  model.args.hidden: {type: categorical, values: [[8], [32]]}\n",
                                kTemplate));
  ASSERT_EQ(id, "asha-mlp-s1");

  v1::Search search;
  ASSERT_TRUE(WaitForSearch(
      id, [&](const v1::Search& s) { return RunningTrialJobs(s) == 2; }, &search))
      << search.DebugString();
  // The gauges show the running trials.
  const auto [curl_code, metrics] = RunShell(
      absl::StrCat("curl -s http://127.0.0.1:", cluster_.coordinator_metrics_port(), "/metrics"));
  ASSERT_EQ(curl_code, 0) << metrics;
  EXPECT_THAT(metrics, HasSubstr(absl::StrCat("trainyard_search_trials{search=\"", id,
                                              "\",state=\"running\"} 2")));
  EXPECT_THAT(metrics, HasSubstr("trainyard_searches{state=\"running\"} 1"));

  cluster_.KillCoordinator(SIGKILL);
  cluster_.StartCoordinator();
  // Rung 0 ends at step 3, before 4 updates: trials finish it; a promoted trial's next job then
  // waits at step 7, so the search is still running with a best trial.
  cluster_.Hold("trial-mlp", 4);
  ASSERT_TRUE(WaitForSearch(
      id, [&](const v1::Search& s) { return RunningTrialJobs(s, /*min_rung=*/1) > 0; }, &search))
      << search.DebugString();
  ASSERT_GE(search.best_trial(), 0);
  const auto [code, running] = RunShell(absl::StrCat(
      "curl -s http://127.0.0.1:", cluster_.coordinator_metrics_port(), "/metrics | tee ",
      cluster_.state_dir(), "/../search.metrics | promtool check metrics"));
  EXPECT_EQ(code, 0) << running;
  const std::string scraped = ReadFile(cluster_.state_dir() + "/../search.metrics");
  EXPECT_THAT(scraped, HasSubstr(absl::StrCat("trainyard_search_best_metric{search=\"", id,
                                              "\",metric=\"val_accuracy\"} ")));
  EXPECT_THAT(scraped, HasSubstr(absl::StrCat("trainyard_search_trials{search=\"", id,
                                              "\",state=\"completed\"} 0")));
  cluster_.Release("trial-mlp");
  ASSERT_TRUE(WaitForSearch(
      id, [](const v1::Search& s) { return s.state() != v1::SEARCH_RUNNING; }, &search))
      << search.DebugString();
  ASSERT_EQ(search.state(), v1::SEARCH_SUCCEEDED) << search.DebugString();
  ASSERT_EQ(search.trials_size(), 6);

  // Every rung ran once: the jobs the coordinator knows are exactly the trials' jobs.
  std::multiset<std::string> expected;
  int promoted = 0, stopped = 0;
  for (const v1::Trial& t : search.trials()) {
    EXPECT_TRUE(t.state() == v1::TRIAL_COMPLETED || t.state() == v1::TRIAL_STOPPED)
        << t.DebugString();
    stopped += t.state() == v1::TRIAL_STOPPED;
    for (const std::string& job : t.job_ids()) expected.insert(job);
    EXPECT_EQ(t.rung_metrics_size(), t.job_ids_size());
    // A promoted trial's next rung resumed where the last one stopped: no step redone.
    const int64_t ends[] = {3, 9, 27};
    for (int rung = 1; rung < t.job_ids_size(); ++rung) {
      ++promoted;
      absl::StatusOr<v1::Job> job = cluster_.Get(t.job_ids(rung));
      ASSERT_TRUE(job.ok()) << job.status();
      EXPECT_EQ(job->state(), v1::SUCCEEDED);
      EXPECT_EQ(job->spec().checkpoint().resume_from(), t.job_ids(rung - 1));
      EXPECT_EQ(job->progress().attempt_start_step(), ends[rung - 1]) << job->id();
      EXPECT_EQ(job->progress().step(), ends[rung]) << job->id();
      EXPECT_EQ(job->trial().rung(), rung);
    }
  }
  EXPECT_GT(promoted, 0);
  EXPECT_GT(stopped, 0);
  v1::ListJobsRequest list;
  list.set_page_size(1000);
  v1::ListJobsResponse jobs;
  grpc::ClientContext context;
  ASSERT_TRUE(cluster_.jobs().ListJobs(&context, list, &jobs).ok());
  std::multiset<std::string> seen;
  for (const v1::Job& job : jobs.jobs()) {
    if (job.trial().search_id() == id) seen.insert(job.id());
  }
  EXPECT_EQ(seen, expected);

  // The best trial went furthest, and its model is there.
  ASSERT_GE(search.best_trial(), 0);
  const v1::Trial& best = search.trials(search.best_trial());
  EXPECT_EQ(best.state(), v1::TRIAL_COMPLETED);
  EXPECT_FALSE(search.best_model_uri().empty());
  EXPECT_GT(search.best_metric(), 0.5);

  Cluster::CliResult described = cluster_.Cli({"search", "describe", id});
  ASSERT_EQ(described.exit_code, 0) << described.output;
  EXPECT_THAT(described.output, HasSubstr("State:       SUCCEEDED"));
  EXPECT_THAT(described.output, HasSubstr("optimizer.lr"));
  EXPECT_THAT(described.output, HasSubstr(search.best_model_uri()));
  Cluster::CliResult listed = cluster_.Cli({"search", "list"});
  ASSERT_EQ(listed.exit_code, 0) << listed.output;
  EXPECT_THAT(listed.output, HasSubstr(id));
}

// `search submit --wait` follows the search to its end and exits with its outcome: 0 for one that
// succeeds, 3 for one cancelled while its trials are held mid-run.
TEST_F(SearchClusterTest, SubmitWaitFollowsTheSearchAndExitsWithItsOutcome) {
  Cluster::CliResult done = cluster_.Cli(
      {"search", "submit", "--wait",
       WriteSpec("wait.yaml", absl::StrCat("name: wait-mlp\n"
                                           "searcher: {name: random, metric: val_accuracy,\n"
                                           "  max_trials: 2, max_concurrent_trials: 2}\n"
                                           "hyperparameters:\n"
                                           "  optimizer.lr: {type: log, min: 1e-3, max: 1e-2}\n",
                                           kTemplate, "  max_steps: 6\n"))});
  ASSERT_EQ(done.exit_code, 0) << done.output;
  EXPECT_EQ(done.FirstLine(), "wait-mlp-s1");
  EXPECT_THAT(done.output,
              HasSubstr("search wait-mlp-s1 SUCCEEDED: 0 running, 2 done of 2 trials; best "
                        "val_accuracy "));
  EXPECT_THAT(done.output, HasSubstr("best model: "));

  // The follower runs on its own, so that the test can read its live line while the only trial is
  // held mid-run, then cancel the search under it.
  cluster_.Hold("trial-mlp", 1);
  Process follower(
      {BinDir() + "/trainyard", "--coordinator=" + cluster_.address(), "search", "submit", "--wait",
       WriteSpec("held.yaml", absl::StrCat("name: held-mlp\n"
                                           "searcher: {name: random, metric: loss, max_trials: 3,\n"
                                           "  max_concurrent_trials: 1}\n"
                                           "hyperparameters:\n"
                                           "  optimizer.lr: {type: log, min: 1e-3, max: 1e-2}\n",
                                           kTemplate, "  max_steps: 50\n"))},
      cluster_.state_dir() + "/../follower.log", {{"TRAINYARD_TOKEN", cluster_.admin_token()}});
  // Search ids count every search the coordinator made: this one is the second.
  const std::string id = "held-mlp-s2";
  const std::string live = absl::StrCat("search ", id, " RUNNING: 1 running, 0 done of 3 trials");
  ASSERT_TRUE(
      PollUntil([&] { return follower.Log().find(live) != std::string::npos; }, absl::Seconds(120)))
      << follower.Log();
  EXPECT_EQ(follower.Log().substr(0, follower.Log().find('\n')), id);
  Cluster::CliResult cancel = cluster_.Cli({"search", "cancel", id});
  ASSERT_EQ(cancel.exit_code, 0) << cancel.output;
  const std::optional<int> ended = follower.Wait(absl::Seconds(60));
  ASSERT_TRUE(ended.has_value() && WIFEXITED(*ended)) << follower.Log();
  EXPECT_EQ(WEXITSTATUS(*ended), 3) << follower.Log();
  EXPECT_THAT(follower.Log(),
              HasSubstr(absl::StrCat("search ", id, " CANCELLED: 0 running, 1 done")));
}

TEST_F(SearchClusterTest, CancellingASearchCancelsItsTrialsAndBadSpecsAreRefused) {
  const std::string bad = WriteSpec(
      "bad.yaml", absl::StrCat("name: bad\n"
                               "searcher: {name: random, metric: val_accuracy, max_trials: 2}\n"
                               "hyperparameters:\n"
                               "  optimizer.lr: {type: double, min: 0, max: 0.1}\n",
                               kTemplate, "  max_steps: 10\n"));
  Cluster::CliResult refused = cluster_.Cli({"search", "submit", bad});
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_THAT(refused.output,
              HasSubstr("invalid search spec: hyperparameters.optimizer.lr: 0 makes "
                        "optimizer.lr: must be > 0"));

  cluster_.Hold("trial-mlp", 1);
  const std::string id = SubmitSearch(
      "random.yaml", absl::StrCat("name: random-mlp\n"
                                  "searcher: {name: random, metric: loss, max_trials: 5,\n"
                                  "  max_concurrent_trials: 2}\n"
                                  "hyperparameters:\n"
                                  "  optimizer.lr: {type: log, min: 1e-3, max: 1e-2}\n",
                                  kTemplate, "  max_steps: 50\n"));
  ASSERT_FALSE(id.empty());
  v1::Search search;
  ASSERT_TRUE(WaitForSearch(
      id, [&](const v1::Search& s) { return RunningTrialJobs(s) == 2; }, &search));
  Cluster::CliResult cancelled = cluster_.Cli({"search", "cancel", id});
  ASSERT_EQ(cancelled.exit_code, 0) << cancelled.output;
  EXPECT_THAT(cancelled.output, HasSubstr("CANCELLED"));
  absl::StatusOr<v1::Search> after = GetSearch(id);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->trials_size(), 2);
  for (const v1::Trial& t : after->trials()) {
    EXPECT_EQ(t.state(), v1::TRIAL_CANCELLED);
    absl::StatusOr<v1::Job> job = cluster_.WaitForFinal(t.job_id());
    ASSERT_TRUE(job.ok()) << job.status();
    EXPECT_EQ(job->state(), v1::CANCELLED);
  }
  Cluster::CliResult json = cluster_.Cli({"search", "describe", id, "-o", "json"});
  ASSERT_EQ(json.exit_code, 0) << json.output;
  EXPECT_THAT(json.output, HasSubstr("\"state\": \"SEARCH_CANCELLED\""));
}

}  // namespace
}  // namespace trainyard::testing
