#include "worker/agent/trainer_runtime.h"

#include <signal.h>

#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/exit_codes.h"
#include "google/protobuf/text_format.h"
#include "worker/agent/subprocess.h"

namespace trainyard {
namespace {

struct TrainerRun {
  ExitInfo exit;
  std::string output;  // stdout and stderr
};

// Runs the trainer with `args` and `env`, its output through `scratch_file` (replaced, then
// removed), until it ends or `timeout` of `clock`'s time has passed: then it is killed,
// DEADLINE_EXCEEDED. The launch's error when it cannot start.
absl::StatusOr<TrainerRun> RunTrainer(const std::string& trainer_path,
                                      const std::vector<std::string>& args,
                                      const std::map<std::string, std::string>& env,
                                      const std::string& scratch_file, absl::Duration timeout,
                                      const Clock& clock) {
  std::remove(scratch_file.c_str());
  SubprocessOptions options;
  options.argv = {trainer_path};
  options.argv.insert(options.argv.end(), args.begin(), args.end());
  options.env.assign(env.begin(), env.end());
  options.output_file = scratch_file;
  absl::StatusOr<pid_t> pid = StartSubprocess(options);
  if (!pid.ok()) return pid.status();
  const absl::Time deadline = clock.Now() + timeout;
  std::optional<ExitInfo> exit;
  while (!exit.has_value()) {
    absl::StatusOr<std::optional<ExitInfo>> ended = TryWaitSubprocess(*pid);
    if (!ended.ok()) return ended.status();
    exit = *ended;
    if (exit.has_value()) break;
    if (clock.Now() >= deadline) {
      SignalSubprocess(*pid, SIGKILL, /*group=*/true).IgnoreError();
      WaitSubprocess(*pid).IgnoreError();
      std::remove(scratch_file.c_str());
      return absl::DeadlineExceededError(absl::StrCat(trainer_path, " ", absl::StrJoin(args, " "),
                                                      " did not end within ",
                                                      absl::FormatDuration(timeout)));
    }
    clock.SleepFor(absl::Milliseconds(20));
  }
  std::ifstream in(scratch_file);
  std::stringstream text;
  text << in.rdbuf();
  std::remove(scratch_file.c_str());
  return TrainerRun{*exit, text.str()};
}

std::string Tail(const std::string& output, size_t bytes) {
  return output.substr(output.size() > bytes ? output.size() - bytes : 0);
}

std::string LastLine(const std::string& output) {
  std::vector<absl::string_view> lines = absl::StrSplit(output, '\n', absl::SkipWhitespace());
  return lines.empty() ? "" : std::string(absl::StripAsciiWhitespace(lines.back()));
}

}  // namespace

absl::StatusOr<v1::TrainerRuntime> QueryTrainerRuntime(
    const std::string& trainer_path, const std::map<std::string, std::string>& env,
    const std::string& scratch_file, absl::Duration timeout) {
  // Once, at start-up, before anything else runs: a plain wait with a bound.
  absl::StatusOr<TrainerRun> run =
      RunTrainer(trainer_path, {"--runtime"}, env, scratch_file, timeout, RealClock::Get());
  if (!run.ok()) return run.status();
  const std::string tail = Tail(run->output, 500);
  if (run->exit.signal != 0 || run->exit.exit_code != 0) {
    return absl::InternalError(
        absl::StrCat(trainer_path, " --runtime ", DescribeExit(run->exit), ": ", tail));
  }
  v1::TrainerRuntime runtime;
  if (!google::protobuf::TextFormat::ParseFromString(run->output, &runtime) ||
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

absl::StatusOr<std::string> RunTrainerGpuCheck(const std::string& trainer_path,
                                               const std::map<std::string, std::string>& env,
                                               int gpu, const std::string& scratch_file,
                                               const Clock& clock, absl::Duration timeout) {
  std::map<std::string, std::string> check_env = env;
  check_env["CUDA_VISIBLE_DEVICES"] = absl::StrCat(gpu);
  check_env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID";
  absl::StatusOr<TrainerRun> run =
      RunTrainer(trainer_path, {"--gpu_check=0"}, check_env, scratch_file, timeout, clock);
  if (absl::IsDeadlineExceeded(run.status())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "it did not end within ", absl::FormatDuration(timeout), " (a GPU that hangs)"));
  }
  if (!run.ok()) return run.status();
  const std::string last = LastLine(run->output);
  if (run->exit.signal == 0 && run->exit.exit_code == kExitOk) return last;
  if (run->exit.signal != 0 || run->exit.exit_code == kExitInfrastructure) {
    return absl::FailedPreconditionError(
        run->exit.signal != 0 ? absl::StrCat("it was ", DescribeExit(run->exit), ": ", last)
                              : last);
  }
  return absl::InternalError(absl::StrCat(trainer_path, " --gpu_check ", DescribeExit(run->exit),
                                          ": ", Tail(run->output, 500)));
}

}  // namespace trainyard
