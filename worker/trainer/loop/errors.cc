#include "worker/trainer/loop/errors.h"

#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/exit_codes.h"
#include "common/log.h"

namespace trainyard::trainer {

int ExitCodeForStatus(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return kExitOk;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kUnimplemented:
    case absl::StatusCode::kPermissionDenied:  // a file the job may not use (its spec's choice)
      return kExitUserError;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kDataLoss:
      return kExitInfrastructure;
    default:
      return kExitInternal;
  }
}

void WriteTerminationMessage(absl::string_view dir, absl::string_view message) {
  const std::string path = dir.empty() ? std::string(kTerminationMessageFile)
                                       : absl::StrCat(dir, "/", kTerminationMessageFile);
  const std::string line = absl::StrReplaceAll(message, {{"\r", " "}, {"\n", " "}});
  std::ofstream out(path, std::ios::trunc);
  out << line << "\n";
  if (!out) LogWarning("cannot write ", path);
}

}  // namespace trainyard::trainer
