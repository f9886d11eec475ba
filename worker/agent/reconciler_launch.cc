// How a task's trainer is started: its command, environment and user.

#include <filesystem>
#include <set>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/exit_codes.h"
#include "common/rpc/ps_tls.h"
#include "common/storage/uri.h"
#include "worker/agent/reconciler.h"

namespace trainyard {

namespace fs = std::filesystem;

absl::StatusOr<SubprocessOptions> Reconciler::TaskLaunch(const v1::Task& task,
                                                         const std::string& dir,
                                                         const std::vector<int>& gpus) {
  SubprocessOptions launch;
  launch.argv = {options_.trainer_path, "--task_file=" + dir + "/task.pb",
                 "--coordinator=" + options_.coordinator};
  launch.working_dir = dir;
  launch.output_file = absl::StrCat(dir, "/", kTaskOutputFile);
  launch.env = {{"OMP_NUM_THREADS", absl::StrCat(task.slots() > 0 ? task.slots() : 1)},
                {"CUDA_VISIBLE_DEVICES", absl::StrJoin(gpus, ",")},
                // The indices above are NVML's (PCI bus order), as the GPU metrics number them;
                // CUDA's own default order puts the fastest first.
                {"CUDA_DEVICE_ORDER", "PCI_BUS_ID"},
                // Models and datasets from object storage, cached by ETag across restarts.
                {"TRAINYARD_CACHE_DIR", options_.work_dir + "/cache"},
                // Temporary files (a pipeline's model export) go with the task's folder.
                {"TMPDIR", dir}};
  for (const auto& [key, value] : options_.trainer_env) {
    // A shard's certificate key is for shards: ranks run the user's model.
    const bool shard_only = key == kPsTlsCertEnv || key == kPsTlsKeyEnv;
    if (shard_only && task.role() != v1::TASK_ROLE_SHARD) continue;
    launch.env.emplace_back(key, value);
  }
  // The agent's own secrets stay with it: trainers inherit only what they need.
  const bool gateway = options_.s3_gateway != nullptr;
  launch.inherit = [extra = options_.trainer_env_pass, gateway](absl::string_view name) {
    // With the gateway, its key is the only S3 credential a trainer has.
    if (gateway && absl::StartsWith(name, "AWS_")) return false;
    return PassesToTrainers(name, extra);
  };
  if (gateway) {
    absl::StatusOr<ObjectScope> scope = TaskObjectScope(task);
    if (!scope.ok()) return scope.status();
    for (auto& [name, value] : options_.s3_gateway->Grant(task.task_id(), *std::move(scope))) {
      launch.env.emplace_back(name, value);
    }
  }
  launch.output_mode = 0600;
  return launch;
}

absl::StatusOr<int> Reconciler::PrepareTaskUser(const v1::Task& task, const std::string& dir,
                                                SubprocessOptions& launch) {
  if (options_.task_uids.empty()) return -1;
  std::set<int> taken;  // by other jobs' trainers running here
  for (const auto& [id, record] : records_) {
    if (record.running && record.uid >= 0 && record.task.job_id() != task.job_id()) {
      taken.insert(record.uid);
    }
  }
  const int uid = TaskUid(options_.task_uids, task.job_id(), taken);
  // Its folder and credential are its alone; its cache is its job's (what one job caches,
  // another cannot plant or read); its local checkpoints are written by it.
  const std::string cache = absl::StrCat(options_.work_dir, "/cache/uid-", uid);
  std::error_code ec;
  fs::create_directories(cache, ec);
  std::vector<std::pair<std::string, int>> given = {
      {dir, 0700}, {dir + "/task.pb", 0600}, {cache, 0700}};
  if (absl::StatusOr<std::string> local = LocalPath(task.checkpoint_uri()); local.ok()) {
    fs::create_directories(*local, ec);
    given.emplace_back(*local, 0755);
  }
  for (const auto& [path, mode] : given) {
    if (absl::Status s = GiveTo(path, uid, mode); !s.ok()) return s;
  }
  for (auto& [name, value] : launch.env) {
    if (name == "TRAINYARD_CACHE_DIR") value = cache;
    // A shard's certificate and key, which its user could not read where the agent keeps them:
    // a copy of its own in its folder.
    if (name == kPsTlsCertEnv || name == kPsTlsKeyEnv) {
      const std::string copy =
          absl::StrCat(dir, "/", name == kPsTlsKeyEnv ? "ps-tls.key" : "ps-tls.pem");
      fs::copy_file(value, copy, fs::copy_options::overwrite_existing, ec);
      if (ec) return absl::InternalError(absl::StrCat("cannot copy ", value, ": ", ec.message()));
      if (absl::Status s = GiveTo(copy, uid, 0600); !s.ok()) return s;
      value = copy;
    }
  }
  launch.uid = uid;
  return uid;
}

}  // namespace trainyard
