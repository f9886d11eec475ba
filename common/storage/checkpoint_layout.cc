#include "common/storage/checkpoint_layout.h"

#include <string>

#include "absl/strings/str_format.h"
#include "common/storage/uri.h"

namespace trainyard {

std::string CheckpointStepUri(const std::string& checkpoint_uri, int64_t step) {
  return JoinUri(checkpoint_uri, absl::StrFormat("%s%012d", kCheckpointStepPrefix, step));
}

}  // namespace trainyard
