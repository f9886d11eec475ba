#ifndef TRAINYARD_WORKER_TRAINER_PIPELINE_PLAN_H_
#define TRAINYARD_WORKER_TRAINER_PIPELINE_PLAN_H_

// Part pipeline/ of the trainer (worker/trainer/PARTS): pipeline parallelism. This file is its
// plan, free of LibTorch types: which layers each stage holds, and in which order each stage runs
// the forward and backward passes of an update's micro-batches.
//
// Schedules, for K stages and M micro-batches (stage s of 0..K-1):
// - GPipe: every forward, then every backward in reverse order (the last micro-batch's gradient
//   is the first to come back). A stage keeps the activations of all M micro-batches.
// - 1F1B (PipeDream-Flush, as Megatron and torch.distributed.pipelining run it): K - 1 - s
//   forwards to fill the pipeline, then one forward and one backward in turn, then the remaining
//   backwards. A stage keeps at most min(M, K - s) micro-batches' activations.
// Both take the same time (with equal stages, an idle share of (K - 1) / (M + K - 1) per stage,
// the bubble) and apply the same update: the gradients of all M micro-batches, summed.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/spec/pipeline_partition.h"

namespace trainyard::trainer::pipeline {

enum class Schedule { kGpipe, k1F1B };

// "gpipe" or "1f1b"; INVALID_ARGUMENT "pipeline.schedule: ..." otherwise.
absl::StatusOr<Schedule> ParseSchedule(absl::string_view name);

struct Action {
  enum Kind { kForward, kBackward };
  Kind kind = kForward;
  int microbatch = 0;
  friend bool operator==(const Action& a, const Action& b) {
    return a.kind == b.kind && a.microbatch == b.microbatch;
  }
};

// The order in which `stage` of `stages` runs the passes of `microbatches` micro-batches: every
// micro-batch's forward once and its backward once, after its forward. Requires
// 0 <= stage < stages and microbatches >= 1.
std::vector<Action> StageActions(Schedule schedule, int stage, int stages, int microbatches);

// The most micro-batches whose activations a stage holds at once running `actions` (forwards
// done whose backward is not).
int PeakActivations(const std::vector<Action>& actions);

// The bubble of a pipeline of equal stages: the share of each stage's time spent idle,
// (stages - 1) / (microbatches + stages - 1).
double IdealBubble(int stages, int microbatches);

// What running every stage's actions in order takes, where a forward of micro-batch m on stage
// s waits for the forward of m on s - 1, a backward waits for the backward of m on s + 1, and a
// forward and a backward cost forward_cost and backward_cost on every stage (transfers free).
struct Timeline {
  double makespan = 0;                // the update, from the first forward to the last backward
  std::vector<double> busy;           // per stage
  std::vector<double> bubble;         // per stage: 1 - busy / makespan
  std::vector<int> peak_activations;  // per stage
};
// FAILED_PRECONDITION naming the stage and action where the stages would wait on each other
// forever (a schedule that deadlocks).
absl::StatusOr<Timeline> Simulate(Schedule schedule, int stages, int microbatches,
                                  double forward_cost, double backward_cost);

// PartitionLayers (common/spec/pipeline_partition.h): how the layers are split into stages; the
// coordinator's memory estimate uses the same split.
using trainyard::PartitionLayers;

}  // namespace trainyard::trainer::pipeline

#endif  // TRAINYARD_WORKER_TRAINER_PIPELINE_PLAN_H_
