// The trained model's export: to a local file first (a TorchScript module saves into one, a
// pipeline's rank 0 merges the final checkpoint into one), then to the store, and the report of
// where it went.

#include <torch/torch.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/storage/checkpoint_layout.h"
#include "common/storage/object_store.h"
#include "common/storage/uri.h"
#include "worker/trainer/checkpoint/checkpoint.h"
#include "worker/trainer/loop/run.h"
#include "worker/trainer/model/model.h"
#include "worker/trainer/model/transformer.h"
#include "worker/trainer/strategy/strategy.h"

namespace trainyard::trainer::internal {

namespace {

// A new empty file for an export on its way to the store, in $TMPDIR (the agent sets it to the
// task's folder).
absl::StatusOr<std::string> NewExportFile() {
  const char* tmp = std::getenv("TMPDIR");
  std::string path =
      absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/trainyard-export-XXXXXX");
  const int fd = mkstemp(path.data());
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("model export: cannot create ", path, ": ", std::strerror(errno)));
  }
  close(fd);
  return path;
}

}  // namespace

absl::Status Run::PutExportFile(const std::string& uri,
                                const std::function<absl::Status(const std::string&)>& write) {
  absl::StatusOr<std::string> path = NewExportFile();
  if (!path.ok()) return path.status();
  absl::Status status = write(*path);
  if (status.ok()) {
    RetryPolicy storage;
    storage.max_attempts = 4;
    absl::Status put =
        Retry(clock_, storage, UnlessRefused, [&] { return store_->PutFile(uri, *path); });
    if (!put.ok()) status = absl::UnavailableError(absl::StrCat("model export: ", put.message()));
  }
  std::remove(path->c_str());
  return status;
}

absl::Status Run::PutStageFiles(const std::string& uri,
                                const std::function<absl::Status(int, const std::string&)>& write) {
  absl::Status status;
  for (int i = 0; i < spec_.model().stages_size() && status.ok(); ++i) {
    status = PutExportFile(JoinUri(uri, absl::StrCat(i, ".pt")),
                           [&](const std::string& path) { return write(i, path); });
  }
  return status;
}

absl::Status Run::Export(TrainResult& result) {
  const std::string uri =
      JoinUri(JoinUri(task_.checkpoint_uri(), kFinalModelFolder), model_->ExportName());
  absl::Status exported;
  const bool script = !spec_.model().torchscript().empty() || spec_.model().stages_size() > 0;
  if (pipeline_ != nullptr && script) {
    exported = ExportScriptFromCheckpoint(result.step, uri);
  } else if (spec_.model().stages_size() > 0) {
    exported = PutStageFiles(
        uri, [&](int i, const std::string& path) { return ExportScriptStage(*model_, i, path); });
  } else if (pipeline_ != nullptr) {
    // The stages' layers, streamed from the final checkpoint they have just saved together:
    // no process holds the whole model.
    absl::StatusOr<std::map<std::string, std::string>> metadata =
        TransformerExportMetadata(spec_.model().args());
    if (!metadata.ok()) return metadata.status();
    exported = PutExportFile(uri, [&](const std::string& path) {
      // Reading the checkpoint back is the store's trouble, as the upload is.
      absl::Status merged = WriteMergedModel(
          *store_, CheckpointStepUri(task_.checkpoint_uri(), result.step), *metadata, path);
      return merged.ok() ? merged
                         : absl::UnavailableError(absl::StrCat("model export: ", merged.message()));
    });
  } else if (absl::StatusOr<SafetensorsPieces> pieces = model_->ExportPieces(); pieces.ok()) {
    // Sent from the model's own tensors: the export does not hold the model a second time.
    RetryPolicy storage;
    storage.max_attempts = 4;
    absl::Status put = Retry(clock_, storage, UnlessRefused,
                             [&] { return store_->PutPieces(uri, pieces->Pieces()).status(); });
    if (!put.ok()) {
      exported = absl::UnavailableError(absl::StrCat("model export: ", put.message()));
    }
  } else if (pieces.status().code() == absl::StatusCode::kUnimplemented) {
    // A TorchScript module, saved straight into a file.
    exported =
        PutExportFile(uri, [&](const std::string& path) { return model_->ExportToFile(path); });
  } else {
    exported = pieces.status();
  }
  if (!exported.ok()) return exported;
  result.model_uri = uri;
  LogInfo("model exported to ", uri);
  if (options_.coordinator != nullptr) {
    absl::Status report =
        Retry(clock_, CoordinatorRetry(clock_.Now() + options_.coordinator_retry_for),
              IsRetryableCoordinatorError, [&] { return options_.coordinator->ReportModel(uri); });
    if (!report.ok()) {
      return absl::UnavailableError(absl::StrCat("ReportModel: ", report.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status Run::ExportScriptFromCheckpoint(int64_t step, const std::string& uri) {
  // The model's objects of the final checkpoint (not the optimizer's), checked and merged once
  // into a local file.
  absl::StatusOr<std::string> merged = NewExportFile();
  if (!merged.ok()) return merged.status();
  absl::Status status =
      WriteMergedModel(*store_, CheckpointStepUri(task_.checkpoint_uri(), step), {}, *merged);
  if (!status.ok()) {
    status = absl::UnavailableError(absl::StrCat("model export: ", status.message()));
  }
  // The module (`file` -1) or the file model.stages[file], loaded and given its tensors from
  // there, saved to `path`.
  auto export_module = [&](int file, const std::string& path) -> absl::Status {
    absl::StatusOr<std::unique_ptr<Model>> model;
    if (file < 0) {
      model = BuildModel(spec_.model(), spec_.seed(), data_->FeatureWidth(), 0, data_->max_ids(),
                         options_.stores);
    } else if (options_.stores == nullptr) {
      model = absl::FailedPreconditionError("model.stages: no object stores to read them from");
    } else {
      model = LoadScriptStages(*options_.stores, spec_.model(), file, file + 1);
    }
    if (!model.ok()) return model.status();
    NamedTensors tensors = (*model)->NamedParameters();
    for (auto& buffer : (*model)->NamedBuffers()) tensors.push_back(std::move(buffer));
    if (absl::Status loaded = ReadTensorsInto(*merged, tensors); !loaded.ok()) {
      // A tensor missing or of another shape in what this job saved is a fault of ours; a file
      // that cannot be read, the machine's.
      const bool local = loaded.code() == absl::StatusCode::kUnavailable;
      return absl::Status(local ? loaded.code() : absl::StatusCode::kInternal,
                          absl::StrCat("model export: ", loaded.message()));
    }
    return file < 0 ? (*model)->ExportToFile(path) : ExportScriptStage(**model, file, path);
  };
  if (status.ok()) {
    status =
        spec_.model().stages_size() > 0
            ? PutStageFiles(uri, export_module)
            : PutExportFile(uri, [&](const std::string& path) { return export_module(-1, path); });
  }
  std::remove(merged->c_str());
  return status;
}

}  // namespace trainyard::trainer::internal
