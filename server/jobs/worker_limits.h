#ifndef TRAINYARD_SERVER_JOBS_WORKER_LIMITS_H_
#define TRAINYARD_SERVER_JOBS_WORKER_LIMITS_H_

// What an agent may claim for its worker at registration. An agent token names one worker, but
// the capacity it reports is its own word: without a bound, one compromised agent could claim a
// million GPUs and draw every job (with its spec and task credentials) to itself. An admin
// bounds the claims by worker name in a file (--worker_limits_file); every claim is bounded by
// the defaults below at least.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace trainyard {

struct WorkerLimit {
  std::string name = "*";  // a glob on the worker name (fnmatch)
  int slots = 4096;
  int gpus = 64;
  int64_t memory_bytes = int64_t{64} << 40;  // 64 TiB
};

class WorkerLimits {
 public:
  // The defaults alone.
  WorkerLimits() = default;
  // From YAML: a list of {name: GLOB, slots: N, gpus: N, memory: SIZE}; the first entry whose
  // name matches a worker applies to it (fields it leaves out keep the defaults); a worker no
  // entry matches gets the defaults. INVALID_ARGUMENT naming the entry and the field for
  // anything else (an unknown field, a negative number, a bad size).
  static absl::StatusOr<WorkerLimits> Parse(absl::string_view yaml);

  // Parse of the file at `path`; NOT_FOUND when it cannot be read.
  static absl::StatusOr<WorkerLimits> Load(const std::string& path);

  // The limit that applies to worker `name`.
  const WorkerLimit& For(absl::string_view name) const;

  // OK when the claim is within the worker's limit; INVALID_ARGUMENT naming the field, the
  // claim and the bound otherwise.
  absl::Status Check(absl::string_view name, int slots, int gpus, int64_t memory_bytes) const;

 private:
  std::vector<WorkerLimit> entries_;
  WorkerLimit defaults_;
};

}  // namespace trainyard

#endif  // TRAINYARD_SERVER_JOBS_WORKER_LIMITS_H_
