#include "server/jobs/model_needs.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/formats/torchscript_archive.h"
#include "common/log.h"
#include "common/storage/file_object_store.h"
#include "common/storage/uri.h"

namespace trainyard {
namespace {

TorchScriptNeeds FromProto(const v1::ModelNeeds& needs) {
  TorchScriptNeeds out;
  out.ops.assign(needs.ops().begin(), needs.ops().end());
  out.format_version = needs.format_version();
  return out;
}

// "w1, w2, w3 and 2 more"
std::string SomeWorkers(const std::vector<std::string>& ids) {
  constexpr size_t kShown = 3;
  std::vector<std::string> shown(ids.begin(), ids.begin() + std::min(ids.size(), kShown));
  std::string out = absl::StrJoin(shown, ", ");
  if (ids.size() > kShown) absl::StrAppend(&out, " and ", ids.size() - kShown, " more");
  return out;
}

}  // namespace

absl::StatusOr<std::optional<v1::ModelNeeds>> ReadModelNeeds(const v1::JobSpec& spec,
                                                             const ObjectStoreResolver* stores) {
  std::vector<std::pair<std::string, const std::string*>> fields = {
      {"model.torchscript", &spec.model().torchscript()},
      {"distill.teacher", &spec.distill().teacher()}};
  for (int i = 0; i < spec.model().stages_size(); ++i) {
    fields.emplace_back(absl::StrCat("model.stages[", i, "]"), &spec.model().stages(i));
  }
  std::set<std::string> ops;
  v1::ModelNeeds needs;
  std::vector<int64_t> stage_bytes;  // model.stages': all or none
  FileObjectStore files;
  for (const auto& [field, uri] : fields) {
    if (uri->empty()) continue;
    std::shared_ptr<ObjectStore> store;
    std::string where = *uri;
    if (absl::StatusOr<std::string> path = LocalPath(*uri); path.ok()) {
      // A worker's disk: readable here only when this machine has the same folder.
      std::error_code ec;
      if (!std::filesystem::is_directory(std::filesystem::path(*path).parent_path(), ec)) continue;
      where = absl::StrCat("file://", *path);
    } else if (stores == nullptr) {
      continue;
    } else if (absl::StatusOr<std::shared_ptr<ObjectStore>> opened = stores->Open(*uri);
               opened.ok()) {
      store = *std::move(opened);
    } else {
      continue;  // no credentials for it here: the trainer checks
    }
    absl::StatusOr<TorchScriptNeeds> read =
        ReadTorchScriptNeeds(store != nullptr ? *store : files, where);
    if (absl::IsNotFound(read.status()) || absl::IsInvalidArgument(read.status()) ||
        absl::IsResourceExhausted(read.status())) {
      return absl::Status(read.status().code(), absl::StrCat(field, ": ", read.status().message()));
    }
    if (!read.ok()) {
      LogWarning(field, ": cannot read ", *uri,
                 " to check its operators (the trainer will): ", read.status().message());
      continue;
    }
    ops.insert(read->ops.begin(), read->ops.end());
    needs.set_format_version(std::max(needs.format_version(), read->format_version));
    if (uri == &spec.distill().teacher()) {
      needs.set_teacher_tensor_bytes(read->tensor_bytes);
    } else {
      needs.set_model_tensor_bytes(needs.model_tensor_bytes() + read->tensor_bytes);
      if (uri != &spec.model().torchscript()) stage_bytes.push_back(read->tensor_bytes);
    }
    needs.add_read(*uri);
  }
  if (needs.read().empty()) return std::nullopt;
  if (static_cast<int>(stage_bytes.size()) == spec.model().stages_size()) {
    for (int64_t bytes : stage_bytes) needs.add_stage_tensor_bytes(bytes);
  } else {
    needs.set_model_tensor_bytes(0);  // some file unread: its size is unknown
  }
  for (const std::string& op : ops) needs.add_ops(op);
  return needs;
}

std::string RuntimeLacks(const v1::ModelNeeds& needs, const WorkerRuntime& runtime) {
  return MissingFromRuntime(FromProto(needs), runtime.ops, runtime.max_model_format_version);
}

std::string NoWorkerRuns(const v1::ModelNeeds& needs,
                         const std::vector<const WorkerRecord*>& workers) {
  // By what each kind of worker lacks: "LibTorch 1.13.0 (w1, w2) lacks aten::x".
  std::map<std::pair<std::string, std::string>, std::vector<std::string>> lacking;
  std::vector<std::string> silent;
  std::map<const WorkerRuntime*, std::string> checked;  // workers share a few runtimes
  for (const WorkerRecord* w : workers) {
    if (w->runtime == nullptr) {
      silent.push_back(w->info.id());
      continue;
    }
    auto it = checked.find(w->runtime.get());
    if (it == checked.end()) {
      it = checked.emplace(w->runtime.get(), RuntimeLacks(needs, *w->runtime)).first;
    }
    const std::string& lacks = it->second;
    if (lacks.empty()) return "";
    lacking[{w->runtime->libtorch_version, lacks}].push_back(w->info.id());
  }
  if (lacking.empty() && silent.empty()) return "";
  std::vector<std::string> parts;
  for (const auto& [what, ids] : lacking) {
    parts.push_back(
        absl::StrCat("LibTorch ", what.first, " (", SomeWorkers(ids), ") lacks ", what.second));
  }
  if (!silent.empty()) {
    parts.push_back(
        absl::StrCat(SomeWorkers(silent), " did not say what LibTorch they run (older agents)"));
  }
  return absl::StrCat("no worker can run its model: ", absl::StrJoin(parts, "; "));
}

}  // namespace trainyard
