#include "worker/agent/trainer_runtime.h"

#include <signal.h>

#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "google/protobuf/text_format.h"
#include "worker/agent/subprocess.h"

namespace trainyard {

absl::StatusOr<v1::TrainerRuntime> QueryTrainerRuntime(
    const std::string& trainer_path, const std::map<std::string, std::string>& env,
    const std::string& scratch_file, absl::Duration timeout) {
  std::remove(scratch_file.c_str());
  SubprocessOptions options;
  options.argv = {trainer_path, "--runtime"};
  options.env.assign(env.begin(), env.end());
  options.output_file = scratch_file;
  absl::StatusOr<pid_t> pid = StartSubprocess(options);
  if (!pid.ok()) return pid.status();
  // Once, at start-up, before anything else runs: a plain wait with a bound.
  const absl::Time deadline = RealClock::Get().Now() + timeout;
  std::optional<ExitInfo> exit;
  while (!exit.has_value()) {
    absl::StatusOr<std::optional<ExitInfo>> ended = TryWaitSubprocess(*pid);
    if (!ended.ok()) return ended.status();
    exit = *ended;
    if (exit.has_value()) break;
    if (RealClock::Get().Now() >= deadline) {
      SignalSubprocess(*pid, SIGKILL, /*group=*/true).IgnoreError();
      WaitSubprocess(*pid).IgnoreError();
      std::remove(scratch_file.c_str());
      return absl::DeadlineExceededError(absl::StrCat(
          trainer_path, " --runtime did not answer within ", absl::FormatDuration(timeout)));
    }
    RealClock::Get().SleepFor(absl::Milliseconds(20));
  }
  std::ifstream in(scratch_file);
  std::stringstream text;
  text << in.rdbuf();
  std::remove(scratch_file.c_str());
  const std::string output = text.str();
  const std::string tail = output.substr(output.size() > 500 ? output.size() - 500 : 0);
  if (exit->signal != 0 || exit->exit_code != 0) {
    return absl::InternalError(
        absl::StrCat(trainer_path, " --runtime ", DescribeExit(*exit), ": ", tail));
  }
  v1::TrainerRuntime runtime;
  if (!google::protobuf::TextFormat::ParseFromString(output, &runtime) ||
      runtime.libtorch_version().empty()) {
    return absl::InternalError(
        absl::StrCat(trainer_path, " --runtime printed no TrainerRuntime: ", tail));
  }
  return runtime;
}

std::string DescribeTrainerRuntime(const v1::TrainerRuntime& runtime) {
  std::vector<std::string> features;
  if (runtime.cuda()) features.push_back("cuda");
  if (runtime.nccl()) features.push_back("nccl");
  return absl::StrCat(
      "LibTorch ", runtime.libtorch_version(),
      features.empty() ? "" : absl::StrCat(" (", absl::StrJoin(features, ", "), ")"), ", ",
      runtime.ops_size(), " operators");
}

}  // namespace trainyard
