#include "worker/trainer/program/environment.h"

#include <unistd.h>

#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/spec/program_env.h"

namespace trainyard::trainer::program {

Layout LayoutOf(const std::vector<Peer>& peers, int rank) {
  Layout layout;
  std::vector<std::string> machines;  // in the order of their lowest rank
  for (const Peer& peer : peers) {
    bool seen = false;
    for (const std::string& m : machines) seen = seen || m == peer.address;
    if (!seen) machines.push_back(peer.address);
  }
  layout.group_world_size = static_cast<int>(machines.size());
  const std::string& mine = peers[rank].address;
  for (size_t g = 0; g < machines.size(); ++g) {
    if (machines[g] == mine) layout.group_rank = static_cast<int>(g);
  }
  std::vector<std::string> gpus;
  layout.local_world_size = 0;
  for (int r = 0; r < static_cast<int>(peers.size()); ++r) {
    if (peers[r].address != mine) continue;
    if (r == rank) layout.local_rank = layout.local_world_size;
    layout.local_world_size++;
    if (!peers[r].gpus.empty()) gpus.push_back(peers[r].gpus);
  }
  layout.cuda_visible_devices = absl::StrJoin(gpus, ",");
  return layout;
}

std::vector<std::pair<std::string, std::string>> ProgramEnvironment(
    const v1::Task& task, const Layout& layout, const StorePlace& store, const Paths& paths,
    int64_t restore_step, const std::vector<std::pair<std::string, std::string>>& inherited) {
  std::map<std::string, std::string> env;
  for (const auto& [name, value] : inherited) {
    // What the trainer was given for itself does not describe the program's world.
    if (IsProgramEnvSetByTrainyard(name) && !absl::StartsWith(name, "AWS_")) continue;
    env[name] = value;
  }
  for (const auto& [name, value] : task.spec().program().env()) env[name] = value;
  const std::string python_path =
      env.count("PYTHONPATH") > 0 && !env["PYTHONPATH"].empty()
          ? absl::StrCat(paths.python_module_dir, ":", env["PYTHONPATH"])
          : paths.python_module_dir;
  env["PYTHONPATH"] = python_path;
  // Python's output goes to the log as it is written, not when a buffer fills.
  if (env.count("PYTHONUNBUFFERED") == 0) env["PYTHONUNBUFFERED"] = "1";
  const std::string& master = store.master;
  const size_t colon = master.rfind(':');
  env[kEnvRank] = absl::StrCat(task.rank());
  env[kEnvWorldSize] = absl::StrCat(task.world_size());
  env[kEnvLocalRank] = absl::StrCat(layout.local_rank);
  env[kEnvLocalWorldSize] = absl::StrCat(layout.local_world_size);
  env[kEnvGroupRank] = absl::StrCat(layout.group_rank);
  env[kEnvGroupWorldSize] = absl::StrCat(layout.group_world_size);
  env[kEnvRoleRank] = absl::StrCat(task.rank());
  env[kEnvRoleWorldSize] = absl::StrCat(task.world_size());
  env[kEnvMasterAddr] = master.substr(0, colon);
  env[kEnvMasterPort] = colon == std::string::npos ? "" : master.substr(colon + 1);
  env[kEnvTorchelasticRestartCount] = absl::StrCat(std::max<int64_t>(task.generation() - 1, 0));
  if (store.on_host) env[kEnvTorchelasticUseAgentStore] = "True";
  // A name of PyTorch's, which the program (or the worker's own environment) may set itself.
  if (store.without_libuv && env.count("USE_LIBUV") == 0) env["USE_LIBUV"] = "0";
  env[kEnvCudaVisibleDevices] = layout.cuda_visible_devices;
  env[kEnvJobId] = task.job_id();
  env[kEnvAttempt] = absl::StrCat(task.generation());
  env[kEnvCheckpointDir] = paths.checkpoint_dir;
  if (restore_step > 0 || !paths.restore_dir.empty()) {
    env[kEnvRestoreDir] = paths.restore_dir;
    env[kEnvRestoreStep] = absl::StrCat(restore_step);
  }
  env[kEnvSocket] = paths.socket;
  env[kEnvStepFile] = paths.step_file;
  env[kEnvCheckpointEvery] = absl::StrCat(task.spec().checkpoint().every_steps());
  env[kEnvStopAtStep] = absl::StrCat(task.spec().stop_at_step());
  return {env.begin(), env.end()};
}

absl::StatusOr<std::string> FindCommand(const std::string& command, const std::string& path,
                                        const std::string& workdir) {
  auto runnable = [](const std::string& file) { return ::access(file.c_str(), X_OK) == 0; };
  if (absl::StrContains(command, '/')) {
    const std::string file =
        absl::StartsWith(command, "/") ? command : absl::StrCat(workdir, "/", command);
    if (runnable(file)) return file;
    return absl::InvalidArgumentError(absl::StrCat(
        "program.command: '", command, "' is not an executable file",
        absl::StartsWith(command, "/") ? " on this worker" : " in the program's workdir"));
  }
  for (absl::string_view dir : absl::StrSplit(path, ':', absl::SkipEmpty())) {
    const std::string file = absl::StrCat(dir, "/", command);
    if (runnable(file)) return file;
  }
  const std::string local = absl::StrCat(workdir, "/", command);
  if (runnable(local)) return local;
  return absl::InvalidArgumentError(absl::StrCat("program.command: '", command,
                                                 "' was not found on this worker (PATH=", path,
                                                 ") nor in the program's workdir"));
}

}  // namespace trainyard::trainer::program
