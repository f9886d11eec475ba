#ifndef TRAINYARD_SERVER_SEARCHES_SEARCH_SPEC_H_
#define TRAINYARD_SERVER_SEARCHES_SEARCH_SPEC_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "trainyard/v1/job.pb.h"
#include "trainyard/v1/search_service.pb.h"
#include "yaml-cpp/yaml.h"

namespace trainyard {

// The most trials one search may have, and the most values of one categorical hyperparameter.
inline constexpr int kMaxSearchTrials = 10000;
inline constexpr int kMaxCategoricalValues = 256;
inline constexpr int kDefaultMaxConcurrentTrials = 4;

// A hyperparameter's values for one trial: path -> value as YAML.
using TrialValues = std::map<std::string, std::string>;

// Maps a search spec in YAML onto SearchSpec, fills its defaults and checks it:
//
//   name: mlp-lr
//   searcher: {name: asha, metric: val_accuracy, max_trials: 32, max_length: 810}
//   hyperparameters:
//     optimizer.lr: {type: log, min: 1e-4, max: 1e-1}
//     model.args.hidden: {type: categorical, values: [[64], [128, 64]]}
//   template: {...a job spec...}
//
// Defaults: searcher.smaller_is_better true for loss and val_loss (any metric ending in "loss"),
// false for val_accuracy and other figures;
// max_concurrent_trials 4; asha divisor 3 and max_rungs 3; grid max_trials the grid's size.
// Besides each field, every corner of the space (each range's ends, each categorical value) is
// put into the template and checked as a job spec, so a value that makes a bad job is refused now,
// not when its trial would start. INVALID_ARGUMENT naming the field: "searcher.max_trials: must
// be > 0", "template.optimizer.lr: must be > 0", "hyperparameters.optimizer.lr: 0 makes
// optimizer.lr: must be > 0". Nothing is returned on error.
absl::StatusOr<trainyard::v1::SearchSpec> ParseSearchYaml(absl::string_view yaml);

// Points of the grid: the product of each hyperparameter's values (every integer of an int range,
// `count` points of a double or log range). Saturates at kMaxSearchTrials + 1.
int64_t GridSize(const trainyard::v1::SearchSpec& spec);

// The values of trial `number`: the grid's point `number` (the last hyperparameter varies
// fastest) for grid, otherwise drawn from (searcher.seed, number, hyperparameter) alone, so a
// coordinator that restarts draws the same values again. Doubles keep 12 significant digits.
TrialValues ValuesOfTrial(const trainyard::v1::SearchSpec& spec, int number);

// The job spec of a trial: the template with `values` put in at their paths, parsed as a job
// spec; for asha also max_steps = max_length (epochs unset). A template without a name takes the
// search's. INVALID_ARGUMENT naming the job
// spec's field as ParseJobSpecYaml does.
absl::StatusOr<trainyard::v1::JobSpec> TrialJobSpec(const trainyard::v1::SearchSpec& spec,
                                                    const TrialValues& values);

// A program's template (its `program` mapping): every {name} of `values` in its command words
// and its env values replaced by the value (a quoted YAML string without its quotes). Returns
// the values it did not use, which go in at their paths in the job spec.
TrialValues SubstituteIntoProgram(YAML::Node& program, const TrialValues& values);

// A trial's objective from its job's progress: loss, val_accuracy and val_loss (the trainer's;
// a program's too), or a figure a program reported by name; nullopt when it was never reported.
std::optional<double> TrialMetric(const trainyard::v1::JobProgress& progress,
                                  const std::string& metric);
// Whether the trainer's loop reports `metric` (the others only programs do).
bool IsTrainerMetric(const std::string& metric);

// asha: the step at which each rung ends, max_rungs of them, the last at max_length.
std::vector<int64_t> RungEndSteps(const trainyard::v1::SearcherSpec& searcher);

// Whether a trial whose metric at the end of a rung is `value` goes on to the next rung, given
// the metrics at the end of that rung of every trial that reached it, its own included: when it
// is among the best max(1, floor(n / divisor)) of those n. The rule of Optuna's
// SuccessiveHalvingPruner (ties go on).
bool PromotedAtRung(double value, std::vector<double> reached, int divisor, bool smaller_is_better);

}  // namespace trainyard

#endif  // TRAINYARD_SERVER_SEARCHES_SEARCH_SPEC_H_
