// Hyperparameter searches: the spec, the searchers' values, and SearchManager over a fake job
// table, with ASHA's decisions checked against Optuna's SuccessiveHalvingPruner.

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "server/searches/search_manager.h"
#include "server/searches/search_spec.h"
#include "server/store/sqlite_job_store.h"
#include "tests/common/fake_clock.h"
#include "tests/common/run_shell.h"
#include "tests/server/fake_job_store.h"
#include "tests/server/test_util.h"

namespace trainyard {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using trainyard::v1::Job;
using trainyard::v1::JobSpec;
using trainyard::v1::Search;
using trainyard::v1::Trial;

constexpr char kTemplate[] = R"(
template:
  name: mlp
  model: {builtin: mlp, args: {inputs: 8, hidden: [16], classes: 2}}
  data: {synthetic: {samples: 512, features: 8, classes: 2}, validation_split: 0.25}
  optimizer: {name: sgd, lr: 0.1}
  max_steps: 100
)";

std::string SearchYaml(const std::string& searcher, const std::string& space) {
  return absl::StrCat("name: s\nsearcher: ", searcher, "\nhyperparameters:\n", space, kTemplate);
}

// ---- the spec ----

TEST(SearchSpecTest, BadSearchesAreRefusedNamingTheField) {
  const std::string lr = "  optimizer.lr: {type: log, min: 1e-4, max: 1e-1}\n";
  const std::string ok = "{name: random, metric: val_accuracy, max_trials: 4}";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {SearchYaml("{name: bayes, metric: loss, max_trials: 4}", lr), "searcher.name: unknown"},
      {SearchYaml("{name: random, metric: loss}", lr), "searcher.max_trials: required"},
      {SearchYaml("{name: random, metric: f1, max_trials: 4}", lr), "searcher.metric: unknown"},
      {SearchYaml("{name: random, metric: loss, max_trials: 4, divisor: 3}", lr),
       "searcher.divisor: only for the asha searcher"},
      {SearchYaml("{name: asha, metric: loss, max_trials: 4}", lr),
       "searcher.max_length: required for asha"},
      {SearchYaml("{name: asha, metric: loss, max_trials: 4, max_length: 8, max_rungs: 3}", lr),
       "searcher.max_length: 8 steps cannot hold 3 rungs"},
      {SearchYaml(ok, "  optimizer.lr: {type: log, min: 0, max: 1}\n"),
       "hyperparameters.optimizer.lr.min: must be > 0 for log"},
      {SearchYaml(ok, "  optimizer.lr: {type: double, min: 1, max: 0.1}\n"),
       "hyperparameters.optimizer.lr.max: must be >= min"},
      {SearchYaml(ok, "  optimizer.lr: {type: uniform, min: 0, max: 1}\n"),
       "hyperparameters.optimizer.lr.type: unknown type 'uniform'"},
      {SearchYaml(ok, "  optimizer.lr: {type: double, min: 0, max: 1}\n"),
       "hyperparameters.optimizer.lr: 0 makes optimizer.lr: must be > 0"},
      {SearchYaml(ok, "  optimizer.lrr: {type: double, min: 0.1, max: 1}\n"),
       "hyperparameters.optimizer.lrr: 0.1 makes optimizer.lrr: unknown key"},
      {SearchYaml(ok, "  batch_size: {type: categorical, values: [32, 0]}\n"),
       "hyperparameters.batch_size: 0 makes batch_size: must be > 0"},
      {SearchYaml(ok,
                  "  optimizer: {type: const, value: adam}\n  optimizer.lr: {type: const, "
                  "value: 0.1}\n"),
       "hyperparameters.optimizer.lr: overlaps hyperparameters.optimizer"},
      {SearchYaml(ok, "  checkpoint.resume_from: {type: const, value: x}\n"),
       "hyperparameters.checkpoint.resume_from: is set by the search"},
      {SearchYaml("{name: grid, metric: loss}", lr),
       "hyperparameters.optimizer.lr.count: required by the grid searcher"},
      {SearchYaml("{name: grid, metric: loss, max_trials: 5}",
                  "  batch_size: {type: int, min: 16, max: 17}\n"),
       "searcher.max_trials: 5 is more than the grid's 2 points"},
      {SearchYaml("{name: asha, metric: loss, max_trials: 4, max_length: 90}",
                  "  max_steps: {type: int, min: 10, max: 20}\n"),
       "hyperparameters.max_steps: asha sets it"},
      {"name: s\nsearcher: {name: random, metric: val_accuracy, max_trials: 2}\n"
       "hyperparameters: {optimizer.lr: {type: const, value: 0.1}}\n"
       "template: {model: {builtin: mlp, args: {inputs: 8, classes: 2}},\n"
       "  data: {synthetic: {samples: 64, features: 8, classes: 2}}, max_steps: 10}\n",
       "searcher.metric: val_accuracy needs template.data.validation_split > 0"},
      {"name: s\nsearcher: {name: random, metric: loss, max_trials: 2}\n"
       "hyperparameters: {optimizer.lr: {type: const, value: 0.1}}\n"
       "template: {model: {builtin: mlp}, max_steps: 10}\n",
       "template.model.args"},
      {"name: s\nsearcher: {name: random, metric: loss, max_trials: 2}\n"
       "hyperparameters: {optimizer.lr: {type: const, value: 0.1}}\n",
       "template: required"},
      {"name: s\nsearcher: [1]\n", "searcher: expected a mapping"},
      {"name: s\nsearcherr: {}\n", "searcherr: unknown key (did you mean 'searcher'?)"},
  };
  for (const auto& [yaml, expected] : cases) {
    absl::StatusOr<v1::SearchSpec> spec = ParseSearchYaml(yaml);
    ASSERT_FALSE(spec.ok()) << yaml;
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(spec.status().message()), StartsWith(expected)) << yaml;
  }
}

TEST(SearchSpecTest, DefaultsFollowTheMetricAndTheSearcher) {
  absl::StatusOr<v1::SearchSpec> spec =
      ParseSearchYaml(SearchYaml("{name: asha, metric: loss, max_trials: 8, max_length: 90}",
                                 "  optimizer.lr: {type: log, min: 1e-3, max: 1}\n"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->searcher().smaller_is_better());
  EXPECT_EQ(spec->searcher().max_concurrent_trials(), kDefaultMaxConcurrentTrials);
  EXPECT_EQ(spec->searcher().divisor(), 3);
  EXPECT_EQ(spec->searcher().max_rungs(), 3);
  // 90 / 3^2 = 10: rungs end at 10 and 30 steps, the last at 90.
  EXPECT_EQ(RungEndSteps(spec->searcher()), (std::vector<int64_t>{10, 30, 90}));
  absl::StatusOr<JobSpec> job = TrialJobSpec(*spec, ValuesOfTrial(*spec, 3));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->max_steps(), 90);  // asha owns the length
}

TEST(SearchSpecTest, GridTakesEveryPointOnceAndRandomStaysInRange) {
  absl::StatusOr<v1::SearchSpec> grid = ParseSearchYaml(
      SearchYaml("{name: grid, metric: val_accuracy}",
                 "  optimizer.lr: {type: log, min: 1e-3, max: 1e-1, count: 3}\n"
                 "  model.args.hidden: {type: categorical, values: [[8], [16, 8]]}\n"
                 "  batch_size: {type: int, min: 31, max: 32}\n"));
  ASSERT_TRUE(grid.ok()) << grid.status();
  EXPECT_EQ(GridSize(*grid), 12);
  EXPECT_EQ(grid->searcher().max_trials(), 12);
  std::set<TrialValues> points;
  for (int i = 0; i < 12; ++i) points.insert(ValuesOfTrial(*grid, i));
  EXPECT_EQ(points.size(), 12u);
  EXPECT_EQ(ValuesOfTrial(*grid, 0).at("optimizer.lr"), "0.001");
  EXPECT_EQ(ValuesOfTrial(*grid, 4).at("optimizer.lr"), "0.01");
  EXPECT_EQ(ValuesOfTrial(*grid, 11).at("optimizer.lr"), "0.1");
  EXPECT_EQ(ValuesOfTrial(*grid, 2).at("model.args.hidden"), "[16, 8]");
  absl::StatusOr<JobSpec> job = TrialJobSpec(*grid, ValuesOfTrial(*grid, 3));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->model().args().hidden_size(), 2);
  EXPECT_EQ(job->batch_size(), 32);

  absl::StatusOr<v1::SearchSpec> random =
      ParseSearchYaml(SearchYaml("{name: random, metric: val_accuracy, max_trials: 200, seed: 5}",
                                 "  optimizer.lr: {type: log, min: 1e-4, max: 1e-1}\n"
                                 "  optimizer.momentum: {type: double, min: 0, max: 0.9}\n"
                                 "  batch_size: {type: int, min: 16, max: 64}\n"));
  ASSERT_TRUE(random.ok()) << random.status();
  int below_1e3 = 0;
  std::set<std::string> batch_sizes;
  for (int i = 0; i < 200; ++i) {
    const TrialValues v = ValuesOfTrial(*random, i);
    EXPECT_EQ(v, ValuesOfTrial(*random, i));  // drawn again after a restart: the same
    absl::StatusOr<JobSpec> trial = TrialJobSpec(*random, v);
    ASSERT_TRUE(trial.ok()) << trial.status();
    EXPECT_GE(trial->optimizer().lr(), 1e-4);
    EXPECT_LE(trial->optimizer().lr(), 1e-1);
    EXPECT_GE(trial->optimizer().momentum(), 0);
    EXPECT_LE(trial->optimizer().momentum(), 0.9);
    EXPECT_GE(trial->batch_size(), 16);
    EXPECT_LE(trial->batch_size(), 64);
    below_1e3 += trial->optimizer().lr() < 1e-3;
    batch_sizes.insert(v.at("batch_size"));
  }
  // Log-uniform: a third of the draws in each decade.
  EXPECT_GT(below_1e3, 40);
  EXPECT_LT(below_1e3, 95);
  EXPECT_GT(batch_sizes.size(), 30u);
}

std::string SourceDir() {
  const char* source = std::getenv("TRAINYARD_SOURCE_DIR");
  return source != nullptr ? source : TRAINYARD_SOURCE_DIR_FALLBACK;
}

TEST(SearchSpecTest, TheExampleSearchIsValid) {
  std::ifstream in(SourceDir() + "/examples/search-asha-mlp.yaml");
  const std::string yaml((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_FALSE(yaml.empty());
  absl::StatusOr<v1::SearchSpec> spec = ParseSearchYaml(yaml);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(RungEndSteps(spec->searcher()), (std::vector<int64_t>{10, 30, 90, 270}));
  absl::StatusOr<JobSpec> job = TrialJobSpec(*spec, ValuesOfTrial(*spec, 0));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->name(), "search-asha-mlp");  // the template has none: the search's
}

TEST(SearchSpecTest, AProgramsValuesGoIntoItsCommandAndEnvironmentAndItsOwnFiguresCount) {
  absl::StatusOr<v1::SearchSpec> spec = ParseSearchYaml(
      "name: prog\n"
      "searcher: {name: asha, metric: f1, max_trials: 4, max_length: 90}\n"
      "hyperparameters:\n"
      "  lr: {type: categorical, values: [0.1, 0.2]}\n"
      "  opt: {type: categorical, values: [adam, sgd]}\n"
      "  checkpoint.every_steps: {type: const, value: 30}\n"
      "template:\n"
      "  program:\n"
      "    command: [python3, train.py, \"--lr={lr}\", --opt, \"{opt}\"]\n"
      "    env: {OPT: \"{opt}\", KEEP: \"{unknown}\"}\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_FALSE(spec->searcher().smaller_is_better());  // f1 is not a loss
  absl::StatusOr<JobSpec> job =
      TrialJobSpec(*spec, {{"lr", "0.2"}, {"opt", "sgd"}, {"checkpoint.every_steps", "30"}});
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_THAT(
      std::vector<std::string>(job->program().command().begin(), job->program().command().end()),
      ::testing::ElementsAre("python3", "train.py", "--lr=0.2", "--opt", "sgd"));
  EXPECT_EQ(job->program().env().at("OPT"), "sgd");
  EXPECT_EQ(job->program().env().at("KEEP"), "{unknown}");  // not a hyperparameter's name
  EXPECT_EQ(job->checkpoint().every_steps(), 30);           // a path in the spec, as ever
  EXPECT_EQ(job->max_steps(), 0);  // a program runs as long as it says; rungs stop it

  // A hyperparameter a program's template names nowhere is a field it does not have.
  absl::StatusOr<v1::SearchSpec> unused = ParseSearchYaml(
      "name: prog\nsearcher: {name: random, metric: loss, max_trials: 2}\n"
      "hyperparameters: {lr: {type: double, min: 0.1, max: 0.2}}\n"
      "template: {program: {command: [python3, train.py]}}\n");
  ASSERT_FALSE(unused.ok());
  EXPECT_THAT(unused.status().message(), HasSubstr("hyperparameters.lr"));
  // Only programs report figures of their own.
  absl::StatusOr<v1::SearchSpec> trainer =
      ParseSearchYaml(SearchYaml("{name: random, metric: f1, max_trials: 4}",
                                 "  optimizer.lr: {type: log, min: 1e-4, max: 1e-1}\n"));
  ASSERT_FALSE(trainer.ok());
  EXPECT_THAT(trainer.status().message(), HasSubstr("searcher.metric: unknown metric 'f1'"));

  v1::JobProgress progress;
  progress.set_loss(0.5);
  (*progress.mutable_metrics())["f1"] = 0.75;
  EXPECT_EQ(TrialMetric(progress, "loss"), 0.5);
  EXPECT_EQ(TrialMetric(progress, "f1"), 0.75);
  EXPECT_EQ(TrialMetric(progress, "val_accuracy"), std::nullopt);
  EXPECT_EQ(TrialMetric(progress, "bleu"), std::nullopt);
}

TEST(SearchSpecTest, PromotionKeepsTheBestFractionAndTheFirstArrivals) {
  // Fewer than `divisor` results: only the best so far goes on.
  EXPECT_TRUE(PromotedAtRung(0.5, {0.5}, 3, false));
  EXPECT_FALSE(PromotedAtRung(0.4, {0.5, 0.4}, 3, false));
  EXPECT_TRUE(PromotedAtRung(0.6, {0.5, 0.4, 0.6}, 3, false));
  // 6 results, divisor 3: the best 2.
  EXPECT_TRUE(PromotedAtRung(0.8, {0.9, 0.1, 0.2, 0.3, 0.4, 0.8}, 3, false));
  EXPECT_FALSE(PromotedAtRung(0.4, {0.9, 0.1, 0.2, 0.3, 0.8, 0.4}, 3, false));
  EXPECT_TRUE(PromotedAtRung(0.2, {0.9, 0.1, 0.3, 0.4, 0.8, 0.2}, 3, true));
  EXPECT_FALSE(PromotedAtRung(0.3, {0.9, 0.1, 0.2, 0.4, 0.8, 0.3}, 3, true));
}

// ---- SearchManager ----

// The coordinator's job table as searches see it: jobs a test finishes by hand.
class FakeTrialJobs : public TrialJobs {
 public:
  struct Submitted {
    JobSpec spec;
    v1::TrialLink trial;
    std::string owner;
  };

  absl::Status Submit(JobSpec spec, const std::string& id, const v1::TrialLink& trial,
                      const std::string& owner, bool validate_only) override {
    absl::MutexLock lock(&mu_);
    if (validate_only) return absl::OkStatus();
    if (!submit_error_.ok()) return submit_error_;
    if (jobs_.count(id) > 0) return absl::AlreadyExistsError(id);
    Job job;
    job.set_id(id);
    job.set_state(v1::PENDING);
    *job.mutable_trial() = trial;
    jobs_[id] = job;
    submitted_[id] = {std::move(spec), trial, owner};
    order_.push_back(id);
    return absl::OkStatus();
  }
  absl::StatusOr<Job> Get(absl::string_view id) override {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(std::string(id));
    if (it == jobs_.end()) return absl::NotFoundError(id);
    return it->second;
  }
  absl::Status Cancel(absl::string_view id, absl::string_view reason) override {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(std::string(id));
    if (it == jobs_.end()) return absl::NotFoundError(id);
    if (Final(it->second)) return absl::FailedPreconditionError("final");
    it->second.set_state(v1::CANCELLED);
    it->second.set_reason(std::string(reason));
    ++cancelled_;
    return absl::OkStatus();
  }

  // Ends job `id` as SUCCEEDED at `step` with `value` as both its val_accuracy and its loss.
  void Succeed(const std::string& id, int64_t step, double value) {
    absl::MutexLock lock(&mu_);
    Job& job = jobs_.at(id);
    job.set_state(v1::SUCCEEDED);
    job.mutable_progress()->set_step(step);
    job.mutable_progress()->set_has_val_accuracy(true);
    job.mutable_progress()->set_val_accuracy(value);
    job.mutable_progress()->set_loss(value);
    job.set_model_uri(absl::StrCat("file:///models/", id));
  }
  void Fail(const std::string& id) {
    absl::MutexLock lock(&mu_);
    jobs_.at(id).set_state(v1::FAILED);
    jobs_.at(id).set_reason("rank 0 exited with code 2");
  }
  void FailSubmissions(absl::Status error) {
    absl::MutexLock lock(&mu_);
    submit_error_ = std::move(error);
  }
  // Jobs not final, in the order they were submitted.
  std::vector<std::string> Active() const {
    absl::MutexLock lock(&mu_);
    std::vector<std::string> out;
    for (const std::string& id : order_) {
      if (!Final(jobs_.at(id))) out.push_back(id);
    }
    return out;
  }
  std::vector<std::string> SubmittedIds() const {
    absl::MutexLock lock(&mu_);
    return order_;
  }
  Submitted Of(const std::string& id) const {
    absl::MutexLock lock(&mu_);
    return submitted_.at(id);
  }
  int cancelled() const {
    absl::MutexLock lock(&mu_);
    return cancelled_;
  }

 private:
  static bool Final(const Job& job) {
    return job.state() == v1::SUCCEEDED || job.state() == v1::FAILED ||
           job.state() == v1::CANCELLED;
  }
  mutable absl::Mutex mu_;
  std::map<std::string, Job> jobs_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Submitted> submitted_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> order_ ABSL_GUARDED_BY(mu_);
  absl::Status submit_error_ ABSL_GUARDED_BY(mu_);
  int cancelled_ ABSL_GUARDED_BY(mu_) = 0;
};

class SearchManagerTest : public ::testing::Test {
 protected:
  void Start() {
    // The store outlives each manager, as the database outlives a coordinator process.
    absl::StatusOr<std::unique_ptr<SqliteJobStore>> store =
        SqliteJobStore::Open(dir_.path() + "/state.db");
    ASSERT_TRUE(store.ok()) << store.status();
    manager_.reset();
    absl::StatusOr<std::unique_ptr<SearchManager>> manager =
        SearchManager::Create(clock_, jobs_, *std::move(store));
    ASSERT_TRUE(manager.ok()) << manager.status();
    manager_ = *std::move(manager);
  }
  Search Get(const std::string& id) {
    absl::StatusOr<Search> search = manager_->Get(id);
    EXPECT_TRUE(search.ok()) << search.status();
    return search.ok() ? *search : Search();
  }

  TempDir dir_;
  FakeClock clock_;
  FakeTrialJobs jobs_;
  std::unique_ptr<SearchManager> manager_;
};

TEST_F(SearchManagerTest, RandomTrialsRunAsJobsWithinTheConcurrencyLimit) {
  Start();
  absl::StatusOr<Search> search = manager_->Submit(
      SearchYaml("{name: random, metric: val_accuracy, max_trials: 5, max_concurrent_trials: 2}",
                 "  optimizer.lr: {type: log, min: 1e-3, max: 1e-1}\n"));
  ASSERT_TRUE(search.ok()) << search.status();
  EXPECT_EQ(search->id(), "s-s1");
  manager_->Tick();
  ASSERT_THAT(jobs_.Active(), ::testing::ElementsAre("s-s1.t0.r0", "s-s1.t1.r0"));
  const FakeTrialJobs::Submitted first = jobs_.Of("s-s1.t0.r0");
  EXPECT_EQ(first.trial.search_id(), "s-s1");
  EXPECT_EQ(absl::StrCat(first.spec.optimizer().lr()).substr(0, 4),
            Get("s-s1").trials(0).hyperparameters().at("optimizer.lr").substr(0, 4));
  EXPECT_EQ(first.spec.stop_at_step(), 0);  // random trials run their whole length

  const double accuracy[] = {0.6, 0.9, 0.7, 0.5, 0.8};
  for (int done = 0; done < 5; ++done) {
    const std::vector<std::string> active = jobs_.Active();
    ASSERT_FALSE(active.empty());
    EXPECT_LE(active.size(), 2u);
    const int number = jobs_.Of(active.front()).trial.trial();
    jobs_.Succeed(active.front(), 100, accuracy[number]);
    manager_->Tick();
  }
  const Search done = Get("s-s1");
  EXPECT_EQ(done.state(), v1::SEARCH_SUCCEEDED);
  EXPECT_EQ(done.trials_size(), 5);
  EXPECT_EQ(jobs_.SubmittedIds().size(), 5u);
  EXPECT_EQ(done.best_trial(), 1);
  EXPECT_DOUBLE_EQ(done.best_metric(), 0.9);
  EXPECT_EQ(done.best_model_uri(), "file:///models/s-s1.t1.r0");
  for (const Trial& t : done.trials()) EXPECT_EQ(t.state(), v1::TRIAL_COMPLETED);
}

// One rule for the names of jobs and searches (a search's name starts its trials' job ids).
TEST_F(SearchManagerTest, ASearchNameFollowsTheRuleForJobNames) {
  Start();
  const std::string yaml = SearchYaml("{name: random, metric: loss, max_trials: 1}",
                                      "  optimizer.lr: {type: log, min: 1e-3, max: 1e-1}\n");
  for (const std::string& bad :
       std::vector<std::string>{"Big", "a_b", "a.b", std::string(64, 'a')}) {
    std::string named = yaml;
    named.replace(named.find("name: s\n"), 8, "name: " + bad + "\n");
    absl::StatusOr<Search> search = manager_->Submit(named);
    EXPECT_EQ(search.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(search.status().message()), HasSubstr("must match [a-z][a-z0-9-]"))
        << bad;
  }
}

TEST_F(SearchManagerTest, AshaPromotesByResumingFromTheRungBefore) {
  Start();
  ASSERT_TRUE(manager_
                  ->Submit(SearchYaml("{name: asha, metric: loss, max_trials: 3, "
                                      "max_concurrent_trials: 1, max_length: 90}",
                                      "  optimizer.lr: {type: log, min: 1e-3, max: 1e-1}\n"))
                  .ok());
  manager_->Tick();
  EXPECT_EQ(jobs_.Of("s-s1.t0.r0").spec.stop_at_step(), 10);
  EXPECT_EQ(jobs_.Of("s-s1.t0.r0").spec.max_steps(), 90);
  jobs_.Succeed("s-s1.t0.r0", 10, 0.5);  // the first to arrive goes on
  manager_->Tick();
  const FakeTrialJobs::Submitted rung1 = jobs_.Of("s-s1.t0.r1");
  EXPECT_EQ(rung1.spec.checkpoint().resume_from(), "s-s1.t0.r0");
  EXPECT_EQ(rung1.spec.stop_at_step(), 30);
  EXPECT_EQ(rung1.trial.rung(), 1);
  jobs_.Succeed("s-s1.t0.r1", 30, 0.4);
  manager_->Tick();
  const FakeTrialJobs::Submitted rung2 = jobs_.Of("s-s1.t0.r2");
  EXPECT_EQ(rung2.spec.checkpoint().resume_from(), "s-s1.t0.r1");
  EXPECT_EQ(rung2.spec.stop_at_step(), 0);  // the last rung runs to max_length
  jobs_.Succeed("s-s1.t0.r2", 90, 0.3);
  manager_->Tick();
  // Trial 1 is worse at rung 0 than trial 0 was (loss: smaller is better): stopped there.
  jobs_.Succeed("s-s1.t1.r0", 10, 0.7);
  manager_->Tick();
  const Search search = Get("s-s1");
  EXPECT_EQ(search.trials(0).state(), v1::TRIAL_COMPLETED);
  EXPECT_THAT(search.trials(0).job_ids(),
              ::testing::ElementsAre("s-s1.t0.r0", "s-s1.t0.r1", "s-s1.t0.r2"));
  EXPECT_THAT(search.trials(0).rung_metrics(), ::testing::ElementsAre(0.5, 0.4, 0.3));
  EXPECT_EQ(search.trials(1).state(), v1::TRIAL_STOPPED);
  EXPECT_EQ(search.trials(1).rung(), 0);
  EXPECT_THAT(search.trials(1).message(), HasSubstr("stopped at the end of rung 0"));
  EXPECT_EQ(search.best_trial(), 0);
}

// A coordinator killed between recording a trial and submitting its job, or between submitting
// it and recording that it did, runs the trial exactly once after it restarts.
TEST_F(SearchManagerTest, ARestartAtAnyPointNeitherLosesNorRepeatsATrial) {
  Start();
  ASSERT_TRUE(manager_
                  ->Submit(SearchYaml("{name: random, metric: loss, max_trials: 2, "
                                      "max_concurrent_trials: 2}",
                                      "  optimizer.lr: {type: log, min: 1e-3, max: 1e-1}\n"))
                  .ok());
  // Recorded, not submitted (the job table refused for now): the restart submits them.
  jobs_.FailSubmissions(absl::UnavailableError("busy"));
  manager_->Tick();
  EXPECT_TRUE(jobs_.SubmittedIds().empty());
  EXPECT_EQ(Get("s-s1").trials_size(), 2);
  jobs_.FailSubmissions(absl::OkStatus());
  Start();
  EXPECT_EQ(Get("s-s1").trials_size(), 2);
  EXPECT_FALSE(Get("s-s1").trials(0).job_submitted());
  manager_->Tick();
  EXPECT_THAT(jobs_.SubmittedIds(), ::testing::ElementsAre("s-s1.t0.r0", "s-s1.t1.r0"));

  // Submitted, with the record that says so lost: the restart finds the jobs (ALREADY_EXISTS).
  Search search = Get("s-s1");
  StoreMutation rollback;
  rollback.searches.push_back({1, search});
  for (Trial trial : search.trials()) {
    trial.set_job_submitted(false);
    rollback.trials.emplace_back("s-s1", trial);
  }
  {
    absl::StatusOr<std::unique_ptr<SqliteJobStore>> store =
        SqliteJobStore::Open(dir_.path() + "/state.db");
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE((*store)->Apply(rollback).ok());
  }
  Start();
  manager_->Tick();
  EXPECT_EQ(jobs_.SubmittedIds().size(), 2u);
  search = Get("s-s1");
  EXPECT_TRUE(search.trials(0).job_submitted());
  EXPECT_EQ(search.trials_running(), 2);
  jobs_.Succeed("s-s1.t0.r0", 100, 0.2);
  jobs_.Succeed("s-s1.t1.r0", 100, 0.1);
  manager_->Tick();
  EXPECT_EQ(Get("s-s1").state(), v1::SEARCH_SUCCEEDED);
  EXPECT_EQ(Get("s-s1").best_trial(), 1);
}

TEST_F(SearchManagerTest, CancelStopsRunningTrialsAndFailuresPastTheLimitFailTheSearch) {
  Start();
  const std::string space = "  optimizer.lr: {type: log, min: 1e-3, max: 1e-1}\n";
  ASSERT_TRUE(manager_
                  ->Submit(SearchYaml("{name: random, metric: loss, max_trials: 6, "
                                      "max_concurrent_trials: 3}",
                                      space))
                  .ok());
  manager_->Tick();
  ASSERT_EQ(jobs_.Active().size(), 3u);
  absl::StatusOr<Search> cancelled = manager_->Cancel("s-s1", "enough", "ana");
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state(), v1::SEARCH_CANCELLED);
  EXPECT_TRUE(jobs_.Active().empty());
  EXPECT_EQ(jobs_.cancelled(), 3);
  for (const Trial& t : cancelled->trials()) EXPECT_EQ(t.state(), v1::TRIAL_CANCELLED);
  EXPECT_EQ(manager_->Cancel("s-s1", "", "").status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(manager_->Extend("s-s1", 10).status().code(), absl::StatusCode::kFailedPrecondition);
  manager_->Tick();
  EXPECT_EQ(jobs_.SubmittedIds().size(), 3u);  // nothing new starts

  ASSERT_TRUE(manager_
                  ->Submit(SearchYaml("{name: random, metric: loss, max_trials: 6, "
                                      "max_concurrent_trials: 3, max_failed_trials: 1}",
                                      space))
                  .ok());
  manager_->Tick();
  std::vector<std::string> active = jobs_.Active();
  ASSERT_EQ(active.size(), 3u);
  jobs_.Fail(active[0]);
  manager_->Tick();
  EXPECT_EQ(Get("s-s2").state(), v1::SEARCH_RUNNING);  // one failure is allowed
  active = jobs_.Active();
  jobs_.Fail(active[0]);
  manager_->Tick();
  const Search failed = Get("s-s2");
  EXPECT_EQ(failed.state(), v1::SEARCH_FAILED);
  EXPECT_THAT(failed.reason(), HasSubstr("2 trials failed"));
  EXPECT_TRUE(jobs_.Active().empty());
  EXPECT_EQ(failed.trials_failed(), 2);
}

TEST_F(SearchManagerTest, ExtendRunsMoreTrialsAndSurvivesARestart) {
  Start();
  ASSERT_TRUE(manager_
                  ->Submit(SearchYaml("{name: grid, metric: loss}",
                                      "  batch_size: {type: int, min: 16, max: 19}\n"))
                  .ok());
  // The grid's default is all of it; a smaller search may be extended up to it.
  EXPECT_EQ(Get("s-s1").spec().searcher().max_trials(), 4);
  EXPECT_EQ(manager_->Extend("s-s1", 5).status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(manager_
                  ->Submit(SearchYaml("{name: random, metric: loss, max_trials: 1}",
                                      "  batch_size: {type: int, min: 16, max: 19}\n"))
                  .ok());
  manager_->Tick();
  for (const std::string& id : jobs_.Active()) jobs_.Succeed(id, 100, 0.5);
  manager_->Tick();
  EXPECT_EQ(Get("s-s2").state(), v1::SEARCH_SUCCEEDED);
  EXPECT_EQ(manager_->Extend("s-s2", 1).status().code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<Search> extended = manager_->Extend("s-s2", 3);
  ASSERT_TRUE(extended.ok()) << extended.status();
  EXPECT_EQ(extended->state(), v1::SEARCH_RUNNING);
  Start();
  manager_->Tick();
  EXPECT_EQ(Get("s-s2").trials_size(), 3);
  EXPECT_EQ(Get("s-s2").spec().searcher().max_trials(), 3);
  std::vector<std::string> searches;
  for (const Search& s : manager_->List()) searches.push_back(s.id());
  EXPECT_THAT(searches, ::testing::ElementsAre("s-s2", "s-s1"));  // newest first
}

// ---- ASHA against Optuna ----

// A learning curve per trial: it rises (or, for a loss, falls) towards its own plateau at its own
// speed, with a little noise, so trials cross each other between rungs.
double Curve(int trial, int64_t step, bool loss) {
  std::mt19937_64 rng(static_cast<uint64_t>(trial) * 7919 + 13);
  std::uniform_real_distribution<double> u(0, 1);
  const double plateau = 0.5 + 0.45 * u(rng);
  const double speed = 5 + 200 * u(rng);
  std::mt19937_64 noise_rng(static_cast<uint64_t>(trial) * 1000003 + static_cast<uint64_t>(step));
  const double value =
      plateau * (1 - std::exp(-static_cast<double>(step) / speed)) + 0.01 * u(noise_rng);
  return loss ? 1 - value : value;
}

struct AshaCase {
  std::string name;
  int concurrency;
  std::string metric;
};

class AshaOptunaTest : public SearchManagerTest, public ::testing::WithParamInterface<AshaCase> {};

// Runs a 32-trial ASHA search over the curves, one job ending per tick (picked at random among
// those running, so rungs interleave as they do on a cluster), then replays the same results in
// the same order through Optuna's SuccessiveHalvingPruner configured the same way: every trial
// must stop at the same rung.
TEST_P(AshaOptunaTest, StopsTheSameTrialsAtTheSameRungsAsOptuna) {
  const AshaCase& c = GetParam();
  const bool loss = c.metric == "loss";
  Start();
  ASSERT_TRUE(manager_
                  ->Submit(SearchYaml(
                      absl::StrCat("{name: asha, metric: ", c.metric,
                                   ", max_trials: 32, max_concurrent_trials: ", c.concurrency,
                                   ", max_length: 270, divisor: 3, max_rungs: 4}"),
                      "  optimizer.lr: {type: log, min: 1e-3, max: 1e-1}\n"))
                  .ok());
  const std::vector<int64_t> ends = {10, 30, 90, 270};
  nlohmann::json events = nlohmann::json::array();
  std::mt19937 pick(static_cast<uint32_t>(c.concurrency));
  manager_->Tick();
  for (int round = 0; round < 1000; ++round) {
    const std::vector<std::string> active = jobs_.Active();
    if (active.empty()) break;
    const std::string id = active[pick() % active.size()];
    const v1::TrialLink link = jobs_.Of(id).trial;
    const double value = Curve(link.trial(), ends[link.rung()], loss);
    jobs_.Succeed(id, ends[link.rung()], value);
    events.push_back({{"trial", link.trial()}, {"rung", link.rung()}, {"value", value}});
    manager_->Tick();
  }
  const Search search = Get("s-s1");
  ASSERT_EQ(search.state(), v1::SEARCH_SUCCEEDED);
  ASSERT_EQ(search.trials_size(), 32);

  nlohmann::json config = {{"divisor", 3},       {"min_resource", 10},
                           {"rung_steps", ends}, {"direction", loss ? "minimize" : "maximize"},
                           {"trials", 32},       {"events", events}};
  const std::string input = dir_.path() + "/events.json";
  std::ofstream(input) << config.dump();
  const char* source = std::getenv("TRAINYARD_SOURCE_DIR");
  const std::string script = absl::StrCat(
      source != nullptr ? source : TRAINYARD_SOURCE_DIR_FALLBACK, "/tests/server/asha_optuna.py");
  const auto [code, output] =
      testing::RunShell(absl::StrCat("/usr/bin/python3 ", script, " < ", input));
  ASSERT_EQ(code, 0) << output;
  const nlohmann::json optuna = nlohmann::json::parse(output.substr(output.rfind('{')));
  int stopped = 0, completed = 0;
  for (const Trial& t : search.trials()) {
    const int ours = t.state() == v1::TRIAL_COMPLETED ? -1 : t.rung();
    ASSERT_TRUE(t.state() == v1::TRIAL_COMPLETED || t.state() == v1::TRIAL_STOPPED);
    EXPECT_EQ(ours, optuna["pruned_at"][t.number()].get<int>()) << "trial " << t.number();
    stopped += ours >= 0;
    completed += ours < 0;
  }
  // Most trials stop early, and some go the whole way: the test exercises both.
  EXPECT_GT(stopped, 16);
  EXPECT_GT(completed, 0);
}

INSTANTIATE_TEST_SUITE_P(Searches, AshaOptunaTest,
                         ::testing::Values(AshaCase{"OneAtATime", 1, "val_accuracy"},
                                           AshaCase{"FourAtATime", 4, "val_accuracy"},
                                           AshaCase{"EightAtATimeOnLoss", 8, "loss"}),
                         [](const ::testing::TestParamInfo<AshaCase>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace trainyard
