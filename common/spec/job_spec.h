#ifndef TRAINYARD_COMMON_SPEC_JOB_SPEC_H_
#define TRAINYARD_COMMON_SPEC_JOB_SPEC_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "trainyard/v1/job.pb.h"

namespace trainyard {

// Maps a YAML job spec (docs/user-guide.md, "The job spec") onto the JobSpec proto, fills
// defaults and validates it. INVALID_ARGUMENT whose message starts with the dotted field path,
// for example "optimizer.lr: must be > 0", "model.args.hiden: unknown key", "batch_size:
// expected an integer, got 'abc'". Nothing is returned on error. Never throws; a YAML syntax
// error reads "yaml: line L, column C: <problem>".
//
// Every key is checked (unknown keys are refused, with a suggestion when one is close); list
// items are named like "model.args.hidden[1]". A null value ("key:" with nothing) means unset.
// Short forms: `workers: N` is {min: N, max: N}; `workers: {max: N}` is {min: 1, max: N};
// `workers: {min: N}` is {min: N, max: N}; `parameter_servers: N` is {shards: N};
// `optimizer: adam` and `schedule: cosine` name only;
// `hidden: 64` is [64]; `max_runtime`, `collective_timeout` and `stall_timeout` take a duration
// ("12h", see ParseDurationSeconds) or plain seconds; integer fields accept integral numbers such
// as 1e4. max_steps and epochs may both be set: training stops at whichever comes first.
//
// YAML-only defaults and checks, since a zero in the proto cannot be told from "unset":
// adamw without weight_decay gets 0.01 (an explicit 0 stays 0), and explicit zeros are refused
// for fields whose zero means "default": batch_size, workers, checkpoint.keep_last,
// log_every_steps, optimizer.lr, optimizer.eps, accumulate_steps, bucket_size_mb,
// parameter_servers (shards, max_staleness, slots). A `distill` section must give all three of
// teacher, temperature and alpha.
absl::StatusOr<trainyard::v1::JobSpec> ParseJobSpecYaml(absl::string_view yaml);

// stall_timeout when a spec leaves it unset (zero): 10 minutes.
inline constexpr int64_t kDefaultStallTimeoutSeconds = 600;
// data.prefetch_shards when a spec leaves it unset (zero).
inline constexpr int32_t kDefaultPrefetchShards = 2;
// parameter_servers.max_staleness of an async job that leaves it unset.
inline constexpr int32_t kDefaultMaxStaleness = 4;
// The most parameter-server shards a job may have.
inline constexpr int32_t kMaxParameterServerShards = 256;
// Rows of one embedding_mlp table.
inline constexpr int64_t kMaxEmbeddingRows = int64_t{1} << 32;
// resources.cpus at most; resources.memory and parameter_servers.memory, when set, at least (a
// trainer of a small model peaked at 62 MiB in its cgroup, page cache included).
inline constexpr double kMaxTaskCpus = 1024;
inline constexpr int64_t kMinTaskMemoryBytes = int64_t{128} << 20;

// Fills defaults in place. Idempotent. Zero/empty means unset:
//   strategy single; workers 1/1 ({0, N} -> {1, N}, {N, 0} -> {N, N}); for the
//   parameter_server strategy parameter_servers {shards: 1, mode: sync, dense: shards, slots: 1}
//   and max_staleness 4 in mode async; for the pipeline strategy pipeline {microbatches: stages,
//   schedule: 1f1b, partition: balanced}; loss cross_entropy; data.features "x", data.labels "y",
//   data.shuffle true, data.prefetch_shards 2; optimizer.name sgd, lr 0.01, schedule constant;
//   for adam/adamw betas 0.9/0.999 (when both are 0) and eps 1e-8; checkpoint.keep_last 3
//   (every_steps 0 = only at the end); log_every_steps 10; batch_size 32; collective_timeout
//   60 s; stall_timeout 10 min; accumulate_steps 1; bucket_size_mb 25. seed,
//   restart.max_failures and priority stay 0; restart.max_preemptions stays unset (unlimited);
//   restart.max_infrastructure_errors 10.
void ApplyJobSpecDefaults(trainyard::v1::JobSpec& spec);

// Checks a spec that already has its defaults; returns the first problem found. Same error form
// as ParseJobSpecYaml ("<field>: <problem>"), INVALID_ARGUMENT.
absl::Status ValidateJobSpec(const trainyard::v1::JobSpec& spec);

// The one rule for the names people give jobs and searches (they become parts of ids, folders
// and metric labels): kNameRule, a lower-case letter then up to 62 lower-case letters, digits or
// '-'.
inline constexpr char kNameRule[] = "[a-z][a-z0-9-]{0,62}";
bool IsValidName(absl::string_view name);

// "90s", "15m", "12h", "2d", "1h30m" -> seconds. INVALID_ARGUMENT otherwise.
absl::StatusOr<int64_t> ParseDurationSeconds(absl::string_view text);

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_SPEC_JOB_SPEC_H_
