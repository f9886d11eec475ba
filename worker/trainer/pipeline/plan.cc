#include "worker/trainer/pipeline/plan.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace trainyard::trainer::pipeline {

absl::StatusOr<Schedule> ParseSchedule(absl::string_view name) {
  if (name == "gpipe") return Schedule::kGpipe;
  if (name == "1f1b") return Schedule::k1F1B;
  return absl::InvalidArgumentError(
      absl::StrCat("pipeline.schedule: unknown schedule '", name, "', expected gpipe or 1f1b"));
}

std::vector<Action> StageActions(Schedule schedule, int stage, int stages, int microbatches) {
  std::vector<Action> actions;
  actions.reserve(static_cast<size_t>(2 * microbatches));
  if (schedule == Schedule::kGpipe) {
    for (int m = 0; m < microbatches; ++m) actions.push_back({Action::kForward, m});
    for (int m = microbatches - 1; m >= 0; --m) actions.push_back({Action::kBackward, m});
    return actions;
  }
  // 1F1B: fill, then alternate, then drain; backwards in micro-batch order.
  const int warmup = std::min(microbatches, stages - 1 - stage);
  int forwards = 0, backwards = 0;
  for (; forwards < warmup; ++forwards) actions.push_back({Action::kForward, forwards});
  while (forwards < microbatches) {
    actions.push_back({Action::kForward, forwards++});
    actions.push_back({Action::kBackward, backwards++});
  }
  while (backwards < microbatches) actions.push_back({Action::kBackward, backwards++});
  return actions;
}

int PeakActivations(const std::vector<Action>& actions) {
  int held = 0, peak = 0;
  for (const Action& a : actions) {
    held += a.kind == Action::kForward ? 1 : -1;
    peak = std::max(peak, held);
  }
  return peak;
}

double IdealBubble(int stages, int microbatches) {
  return static_cast<double>(stages - 1) / static_cast<double>(microbatches + stages - 1);
}

absl::StatusOr<Timeline> Simulate(Schedule schedule, int stages, int microbatches,
                                  double forward_cost, double backward_cost) {
  constexpr double kNotYet = -1;
  std::vector<std::vector<Action>> actions;
  for (int s = 0; s < stages; ++s) {
    actions.push_back(StageActions(schedule, s, stages, microbatches));
  }
  // When each stage's pass of each micro-batch ends; kNotYet until it has run.
  std::vector<std::vector<double>> forward_end(
      stages, std::vector<double>(static_cast<size_t>(microbatches), kNotYet));
  std::vector<std::vector<double>> backward_end = forward_end;
  std::vector<size_t> next(static_cast<size_t>(stages), 0);
  std::vector<double> clock(static_cast<size_t>(stages), 0);
  Timeline timeline;
  timeline.busy.assign(static_cast<size_t>(stages), 0);
  size_t remaining = static_cast<size_t>(stages) * 2 * static_cast<size_t>(microbatches);
  while (remaining > 0) {
    bool progressed = false;
    for (int s = 0; s < stages; ++s) {
      while (next[s] < actions[s].size()) {
        const Action& a = actions[s][next[s]];
        const size_t m = static_cast<size_t>(a.microbatch);
        double ready = clock[s];
        double cost = forward_cost;
        if (a.kind == Action::kForward) {
          if (s > 0) {
            if (forward_end[s - 1][m] == kNotYet) break;
            ready = std::max(ready, forward_end[s - 1][m]);
          }
        } else {
          if (forward_end[s][m] == kNotYet) break;
          if (s + 1 < stages) {
            if (backward_end[s + 1][m] == kNotYet) break;
            ready = std::max(ready, backward_end[s + 1][m]);
          }
          cost = backward_cost;
        }
        clock[s] = ready + cost;
        timeline.busy[s] += cost;
        (a.kind == Action::kForward ? forward_end : backward_end)[s][m] = clock[s];
        ++next[s];
        --remaining;
        progressed = true;
      }
    }
    if (!progressed) {
      for (int s = 0; s < stages; ++s) {
        if (next[s] < actions[s].size()) {
          const Action& a = actions[s][next[s]];
          return absl::FailedPreconditionError(
              absl::StrCat("pipeline: the schedule deadlocks: stage ", s, " waits forever at its ",
                           a.kind == Action::kForward ? "forward" : "backward", " of micro-batch ",
                           a.microbatch));
        }
      }
    }
  }
  timeline.makespan = *std::max_element(clock.begin(), clock.end());
  for (int s = 0; s < stages; ++s) {
    timeline.bubble.push_back(1 - timeline.busy[s] / timeline.makespan);
    timeline.peak_activations.push_back(PeakActivations(actions[s]));
  }
  return timeline;
}

}  // namespace trainyard::trainer::pipeline
