#ifndef TRAINYARD_CLIENT_VIEWS_H_
#define TRAINYARD_CLIENT_VIEWS_H_

// What the CLI prints for each listing, as pure functions of the coordinator's answers.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "trainyard/v1/job.pb.h"
#include "trainyard/v1/job_service.pb.h"
#include "trainyard/v1/search_service.pb.h"

namespace trainyard::cli {

// ID NAME STATE STEP LOSS AGE REASON. Long reasons are cut when `terminal` is set.
std::string JobsTable(const std::vector<v1::Job>& jobs, absl::Time now, bool terminal);
// ID ADDRESS STATE SLOTS GPUS LAST SEEN, with used/total slots and GPUs.
std::string WorkersTable(const std::vector<v1::Worker>& workers, absl::Time now);
// STEP TIME SIZE URI.
std::string CheckpointsTable(const std::vector<v1::Checkpoint>& checkpoints,
                             absl::TimeZone zone = absl::LocalTimeZone());
// Everything about one job, restarts and events included.
// `trainyard debug`: each rank's phase and step, its latest collectives and messages, its stacks
// when asked for, and the diagnosis. Durations are counted to when each record was read.
std::string DebugView(const v1::DebugJobResponse& debug, absl::Time now);
std::string DescribeJob(const v1::Job& job, absl::TimeZone zone = absl::LocalTimeZone());

// ID NAME OWNER STATE SEARCHER "TRIALS RUN/MADE/MAX" (running/created/max) BEST AGE REASON.
std::string SearchesTable(const std::vector<v1::Search>& searches, absl::Time now, bool terminal);
// One search: its searcher, best trial (metric, model) and every trial's hyperparameters, rung,
// step, metric, state and job.
std::string DescribeSearch(const v1::Search& search, absl::TimeZone zone = absl::LocalTimeZone());

// `trainyard queue describe`: a queue's limits, users and use.
std::string DescribeQueue(const v1::Queue& queue);
// A queue's jobs not finished: waiting ones first in line order, then the others.
std::string QueueJobsTable(std::vector<v1::Job> jobs, bool terminal);
// "#3 in line: queued behind x-1; starts by 12:04:10": why a pending job waits.
std::string WaitText(const v1::Job& job, absl::TimeZone zone = absl::LocalTimeZone());
// "RUNNING", "SUCCEEDED", ... without the enum's prefix.
// One line on a search's way: "search S RUNNING: 2 running, 3 done (1 failed) of 6 trials; best
// val_accuracy 0.9120 (trial 4)", as `search submit --wait` shows it.
std::string SearchProgressLine(const v1::Search& search);
std::string SearchStateName(v1::SearchState state);
std::string TrialStateName(v1::TrialState state);

// "RUNNING on worker-1, worker-2" from the job's running tasks; just the state otherwise.
std::string StateLine(const v1::Job& job);

// protobuf JSON of a message, indented.
std::string ToJson(const google::protobuf::Message& message);

}  // namespace trainyard::cli

#endif  // TRAINYARD_CLIENT_VIEWS_H_
