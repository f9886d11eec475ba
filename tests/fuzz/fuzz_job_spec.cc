// A job spec in YAML, as any user with a token sends it: parsed, given its defaults and
// validated, as the coordinator does at submission (JobManager::SubmitJobYaml). Whatever the
// bytes, the answer is a spec or an error, never a crash, a leak or a hang.

#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "common/spec/job_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view yaml(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<trainyard::v1::JobSpec> spec = trainyard::ParseJobSpecYaml(yaml);
  if (!spec.ok()) return 0;
  trainyard::ApplyJobSpecDefaults(*spec);
  trainyard::ValidateJobSpec(*spec).IgnoreError();
  return 0;
}
