// A search spec in YAML, as any user with a token sends it: parsed and checked as the coordinator
// does (the template checked as a job spec with each hyperparameter's extremes), then the first
// trials' values drawn and their job specs made, as the search manager makes them.

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "server/searches/search_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view yaml(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<trainyard::v1::SearchSpec> spec = trainyard::ParseSearchYaml(yaml);
  if (!spec.ok()) return 0;
  (void)trainyard::GridSize(*spec);
  const int trials = std::min(3, spec->searcher().max_trials());
  for (int number = 0; number < trials; ++number) {
    trainyard::TrialJobSpec(*spec, trainyard::ValuesOfTrial(*spec, number)).IgnoreError();
  }
  return 0;
}
