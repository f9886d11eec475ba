#include <cstdint>

#include "common/restart_reason.h"
#include "common/spec/job_spec.h"

namespace trainyard {
namespace {

using trainyard::v1::JobSpec;

// What a spec that leaves these out gets (the rest of the defaults are in job_spec.h, where
// other programs read them).
constexpr double kDefaultLr = 0.01;
constexpr double kDefaultBeta1 = 0.9;
constexpr double kDefaultBeta2 = 0.999;
constexpr double kDefaultEps = 1e-8;
constexpr int kDefaultKeepLast = 3;
constexpr int kDefaultLogEverySteps = 10;
constexpr int kDefaultBatchSize = 32;
constexpr int64_t kDefaultCollectiveTimeoutSeconds = 60;
constexpr int kDefaultBucketSizeMb = 25;

// What every job gets, its own program's as much as the trainer loop's.
void ApplyCommonDefaults(JobSpec& spec) {
  v1::WorkerRange& workers = *spec.mutable_workers();
  if (workers.min() == 0 && workers.max() == 0) {
    workers.set_min(1);
    workers.set_max(1);
  } else if (workers.max() == 0) {
    workers.set_max(workers.min());
  } else if (workers.min() == 0) {
    workers.set_min(1);
  }
  if (spec.checkpoint().keep_last() == 0)
    spec.mutable_checkpoint()->set_keep_last(kDefaultKeepLast);
  if (spec.stall_timeout_seconds() == 0)
    spec.set_stall_timeout_seconds(kDefaultStallTimeoutSeconds);
  if (!spec.restart().has_max_infrastructure_errors()) {
    spec.mutable_restart()->set_max_infrastructure_errors(kDefaultMaxInfrastructureErrors);
  }
}

}  // namespace

void ApplyJobSpecDefaults(JobSpec& spec) {
  ApplyCommonDefaults(spec);
  if (spec.has_program()) {
    // The program trains in its own way: none of the loop's fields gets a value.
    if (spec.strategy() == v1::STRATEGY_UNSPECIFIED) spec.set_strategy(v1::PROGRAM);
    return;
  }
  if (spec.strategy() == v1::STRATEGY_UNSPECIFIED) spec.set_strategy(v1::SINGLE);
  if (spec.precision() == v1::PRECISION_UNSPECIFIED) spec.set_precision(v1::FP32);
  if (spec.has_model() && spec.model().memory_format().empty()) {
    spec.mutable_model()->set_memory_format("auto");
  }
  if (spec.model().builtin() == "transformer") {
    v1::ModelArgs& args = *spec.mutable_model()->mutable_args();
    if (args.mlp_ratio() == 0) args.set_mlp_ratio(4);
    if (!args.has_tie_embeddings()) args.set_tie_embeddings(true);
  }
  if (spec.strategy() == v1::PARAMETER_SERVER) {
    v1::ParameterServerSpec& ps = *spec.mutable_parameter_servers();
    if (ps.shards() == 0) ps.set_shards(1);
    if (ps.mode().empty()) ps.set_mode("sync");
    if (ps.mode() == "async" && ps.max_staleness() == 0) {
      ps.set_max_staleness(kDefaultMaxStaleness);
    }
    if (ps.dense().empty()) ps.set_dense("shards");
    if (ps.slots() == 0) ps.set_slots(1);
  }
  if (spec.strategy() == v1::PIPELINE) {
    v1::PipelineSpec& pipeline = *spec.mutable_pipeline();
    // A model in files: one stage each unless the spec groups them.
    if (pipeline.stages() == 0 && pipeline.partition_counts_size() == 0) {
      pipeline.set_stages(spec.model().stages_size());
    }
    if (pipeline.stages() == 0) pipeline.set_stages(pipeline.partition_counts_size());
    if (pipeline.microbatches() == 0) pipeline.set_microbatches(std::max(1, pipeline.stages()));
    if (pipeline.schedule().empty()) pipeline.set_schedule("1f1b");
    if (pipeline.partition().empty()) pipeline.set_partition("balanced");
  }
  if (spec.loss().empty()) spec.set_loss("cross_entropy");
  v1::DataSpec& data = *spec.mutable_data();
  if (data.features().empty()) data.set_features(data.tokens().empty() ? "x" : "tokens");
  if (data.labels().empty()) data.set_labels("y");
  if (!data.has_shuffle()) data.set_shuffle(true);
  if (data.prefetch_shards() == 0) data.set_prefetch_shards(kDefaultPrefetchShards);
  v1::OptimizerSpec& opt = *spec.mutable_optimizer();
  if (opt.name().empty()) opt.set_name("sgd");
  if (opt.lr() == 0) opt.set_lr(kDefaultLr);
  if (opt.name() == "adam" || opt.name() == "adamw") {
    if (opt.beta1() == 0 && opt.beta2() == 0) {
      opt.set_beta1(kDefaultBeta1);
      opt.set_beta2(kDefaultBeta2);
    }
    if (opt.eps() == 0) opt.set_eps(kDefaultEps);
  }
  if (opt.schedule().name().empty()) opt.mutable_schedule()->set_name("constant");
  if (spec.log_every_steps() == 0) spec.set_log_every_steps(kDefaultLogEverySteps);
  if (spec.batch_size() == 0) spec.set_batch_size(kDefaultBatchSize);
  if (spec.collective_timeout_seconds() == 0) {
    spec.set_collective_timeout_seconds(kDefaultCollectiveTimeoutSeconds);
  }
  if (spec.accumulate_steps() == 0) spec.set_accumulate_steps(1);
  if (spec.bucket_size_mb() == 0) spec.set_bucket_size_mb(kDefaultBucketSizeMb);
}

}  // namespace trainyard
