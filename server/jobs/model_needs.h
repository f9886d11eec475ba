#ifndef TRAINYARD_SERVER_JOBS_MODEL_NEEDS_H_
#define TRAINYARD_SERVER_JOBS_MODEL_NEEDS_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/storage/object_store.h"
#include "server/jobs/worker_registry.h"
#include "trainyard/v1/job.pb.h"

namespace trainyard {

// What the TorchScript models of `spec` (model.torchscript, distill.teacher) ask of a worker's
// LibTorch, read at submission where this machine can read them: a local file whose folder is
// here, or an object through `stores` (null: none; a store it cannot open, for want of
// credentials say, is skipped). nullopt when there is no model to read or none could be read
// here: the trainer then checks before it loads. INVALID_ARGUMENT naming the field for a file
// that is not a TorchScript archive, NOT_FOUND for a missing object; a store that fails
// otherwise (UNAVAILABLE) is skipped too. Blocks on the reads; thread-safe.
absl::StatusOr<std::optional<trainyard::v1::ModelNeeds>> ReadModelNeeds(
    const trainyard::v1::JobSpec& spec, const ObjectStoreResolver* stores);

// What `needs` asks that `runtime` lacks (MissingFromRuntime); empty when it runs the models.
std::string RuntimeLacks(const trainyard::v1::ModelNeeds& needs, const WorkerRuntime& runtime);

// Why no worker of `workers` (the live ones) runs a job with `needs`: per LibTorch version, what
// it lacks and which workers run it, and the workers that did not say what they run. Empty when
// one of them runs it, or there are none.
std::string NoWorkerRuns(const trainyard::v1::ModelNeeds& needs,
                         const std::vector<const WorkerRecord*>& workers);

}  // namespace trainyard

#endif  // TRAINYARD_SERVER_JOBS_MODEL_NEEDS_H_
